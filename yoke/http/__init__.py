"""The HTTP API: FastAPI app, one module per surface."""
