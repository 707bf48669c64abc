"""The failures inbox (docs/advanced/failures.md): every parked failure of a tenant
(actor dead letters, halted subscriptions, skipped events) in one model."""

from .inbox import Failures
from .model import Bulk, Failure, FailureServices, ReplayOutcome, Resolution, Selection

__all__ = ["Bulk", "Failure", "FailureServices", "Failures", "ReplayOutcome", "Resolution", "Selection"]
