"""The Durable Streams protocol (ElectricSQL) on Yoke's streams: see
docs/advanced/durable-streams.md."""

from .routes import DurableStreams

__all__ = ["DurableStreams"]
