"""Actors: keyed instances that process their queues (docs/basics/actors.md); built
from an ``ActorKernel`` (kernel.py), never from the runtime."""
