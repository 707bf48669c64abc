"""Routing: event filters (JSONata and the cheap forms), their cost, and the
evaluator processes that run the expensive ones."""
