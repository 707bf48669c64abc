"""The failures inbox (docs/failures.md): every parked failure of a tenant
(actor dead letters, halted subscriptions, skipped events) in one model."""

from .inbox import Failures
from .model import Bulk, Failure, Resolution, Selection

__all__ = ["Bulk", "Failure", "Failures", "Resolution", "Selection"]
