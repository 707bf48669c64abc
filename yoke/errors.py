"""One error hierarchy for the whole API.

Every error Yoke raises on purpose is a ``YokeError`` with a stable ``code``
(a string clients can switch on), an ``http_status`` and optional ``details``
that are safe to show to the caller. The HTTP layer renders them as
``{"error": {"code", "message", ...details}}``.
"""

from __future__ import annotations

from typing import Any


class YokeError(Exception):
    code = "yoke_error"
    http_status = 500

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or self.__class__.__doc__ or self.code
        self.details = details
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


# --- 400: the caller sent something invalid -------------------------------


class InvalidInput(YokeError):
    """The request is invalid."""

    code = "invalid_input"
    http_status = 400


class InvalidEvent(InvalidInput):
    """The event is not a valid event."""

    code = "invalid_event"


class UnknownEventField(InvalidEvent):
    """The event has a key that is not part of the event input."""

    code = "unknown_field"


class InvalidEventType(InvalidEvent):
    """The event type is missing or not 1-256 characters of the allowed set."""

    code = "invalid_event_type"


class ReservedEventType(InvalidEvent):
    """Event types starting with 'yoke.' are reserved for the kernel."""

    code = "reserved_event_type"


class InvalidIdempotencyKey(InvalidEvent):
    """The idempotency key must be a string of 1-256 characters."""

    code = "invalid_idempotency_key"


class EphemeralWithIdempotencyKey(InvalidEvent):
    """An ephemeral event cannot carry an idempotency key."""

    code = "ephemeral_idempotency_key"


class ForgedSource(InvalidEvent):
    """Only the kernel may set source.copied_from."""

    code = "forged_source"


class InvalidPath(InvalidInput):
    """A stream path is '/' or '/'-separated segments of [A-Za-z0-9._~:@-]."""

    code = "invalid_path"


class InvalidTenant(InvalidInput):
    """A tenant is 1-64 characters of [A-Za-z0-9._-]."""

    code = "invalid_tenant"


class ReservedIdempotencyKey(InvalidEvent):
    """Idempotency keys starting with 'object:' or 'yoke:' are reserved for the kernel."""

    code = "reserved_idempotency_key"


class UnsupportedMediaType(InvalidInput):
    """The request body's Content-Type is not one this route accepts."""

    code = "unsupported_media_type"
    http_status = 415


class InvalidCursor(InvalidInput):
    """The cursor is beyond the stream's head (a future cursor is not a reset)."""

    code = "invalid_cursor"


class InvalidAck(InvalidInput):
    """An acknowledgement must be an offset between 0 and the stream's head."""

    code = "invalid_ack"


# --- 401 / 403: who is asking ------------------------------------------------


class Unauthorized(YokeError):
    """A valid bearer token is required."""

    code = "unauthorized"
    http_status = 401


class TokenExpired(Unauthorized):
    """The token is valid but expired (told apart only to its holder: the secret was right)."""

    code = "token_expired"


class Forbidden(YokeError):
    """The token does not allow this (scope or tenant)."""

    code = "forbidden"
    http_status = 403


class EgressRefused(YokeError):
    """The request declares a client region outside the stream's pinned egress regions."""

    code = "egress_refused"
    http_status = 403


class DataHandlingPinned(YokeError):
    """The stream pins its data handling: only its workflow surface serves it."""

    code = "data_handling_pinned"
    http_status = 403


class ContentClassRefused(InvalidInput):
    """A record's content class is not allowed on the stream (or on any stream)."""

    code = "content_class_refused"


class InvalidFilter(InvalidInput):
    """The filter is invalid (types, stream globs or its JSONata expression)."""

    code = "invalid_filter"


class UnknownActor(InvalidInput):
    """No actor with that name is registered in the application."""

    code = "unknown_actor"


class InvalidSchedule(InvalidInput):
    """The schedule needs exactly one of at, after_s or cron, and a valid event."""

    code = "invalid_schedule"


class InvalidSubscription(InvalidInput):
    """The subscription configuration is not allowed."""

    code = "invalid_subscription"


class GlobalStreamKept(InvalidInput):
    """The tenant's global stream ``/`` cannot be deleted."""

    code = "global_stream"


class InvalidTransform(InvalidFilter):
    """The transform is not a valid JSONata expression."""

    code = "invalid_transform"


# --- 404 / 409 / 410 / 413 / 429 / 507: state of the stream -----------------


class StreamNotFound(YokeError):
    """The stream does not exist."""

    code = "stream_not_found"
    http_status = 404


class EventNotFound(YokeError):
    """No event at that offset."""

    code = "event_not_found"
    http_status = 404


class InstanceNotFound(YokeError):
    """No such actor instance in this tenant."""

    code = "instance_not_found"
    http_status = 404


class ForkNotFound(YokeError):
    """No such fork in this tenant (or it expired)."""

    code = "fork_not_found"
    http_status = 404


class InputsPruned(YokeError):
    """The instance's first inputs were pruned by its actor's retention: a
    fork, which replays from the instance's creation, cannot be made."""

    code = "inputs_pruned"
    http_status = 409


class ForkRefused(YokeError):
    """A fork's run asked for something a fork cannot do (read the outside
    world where the original run did not): that run fails, in the report."""

    code = "fork_refused"
    http_status = 409


class PortalNotFound(YokeError):
    """No portal with that name."""

    code = "portal_not_found"
    http_status = 404


class PortalMethodNotFound(YokeError):
    """The portal has no method with that name."""

    code = "portal_method_not_found"
    http_status = 404


class ConsumerNotFound(YokeError):
    """No such consumer on this stream."""

    code = "consumer_not_found"
    http_status = 404


class TokenNotFound(YokeError):
    """No such token in this tenant."""

    code = "token_not_found"
    http_status = 404


class FailureNotFound(YokeError):
    """No open failure with that id in this tenant (never parked, or already
    replayed or discarded)."""

    code = "failure_not_found"
    http_status = 404


class FailureNotReplayable(YokeError):
    """This failure cannot be replayed that way (for example a corrected
    event for a processor, or a receiver this process cannot reach)."""

    code = "failure_not_replayable"
    http_status = 409


class ReplayFailed(YokeError):
    """The receiver failed the replayed event; the failure stays open."""

    code = "replay_failed"
    http_status = 502


class SubscriptionNotFound(YokeError):
    """No subscription with that name on this stream."""

    code = "subscription_not_found"
    http_status = 404


class StreamClosed(YokeError):
    """The stream is closed and accepts no more appends."""

    code = "stream_closed"
    http_status = 409


class IdempotencyConflict(YokeError):
    """The idempotency key was already used for a different event."""

    code = "idempotency_conflict"
    http_status = 409


class StreamExists(YokeError):
    """The stream already exists with another definition (retention, limits, metadata)."""

    code = "stream_exists"
    http_status = 409


class StreamPinned(YokeError):
    """The stream is a pinned definition: its retention, limits and metadata never change."""

    code = "stream_pinned"
    http_status = 409


class LegalHold(YokeError):
    """The stream is under legal hold: it cannot be deleted until the hold is lifted."""

    code = "legal_hold"
    http_status = 409


class StreamDeleted(YokeError):
    """The stream was deleted (or deleted and created again) while it was being read."""

    code = "stream_deleted"
    http_status = 410


class AckRegression(YokeError):
    """Acknowledgements only advance."""

    code = "ack_regression"
    http_status = 409


class ObjectNotFound(YokeError):
    """No such object on this stream."""

    code = "object_not_found"
    http_status = 404


class ObjectStateConflict(YokeError):
    """The object is not in a state that allows this step."""

    code = "object_state"
    http_status = 409


class ObjectNotCommitted(ObjectStateConflict):
    """The object's bytes are served only once its record is committed."""

    code = "object_not_committed"


class ObjectMismatch(YokeError):
    """The uploaded bytes do not match the prepared size and sha256 digest."""

    code = "object_mismatch"
    http_status = 422


class Backpressure(YokeError):
    """The stream's unread ceiling is reached: retry after consumers acknowledge."""

    code = "backpressure"
    http_status = 429


class TooManyExpensiveTails(YokeError):
    """This token (or its tenant) holds as many tails with an expensive ``where=`` open as it may;
    retry once one has ended (docs/reference/http.md#expensive-filters)."""

    code = "too_many_expensive_tails"
    http_status = 429


class QuotaExhausted(YokeError):
    """The stream's total ceiling is reached: nothing was appended."""

    code = "quota_exhausted"
    http_status = 507


class CursorGone(YokeError):
    """Events after the cursor were removed by retention; resync from 'earliest'."""

    code = "cursor_gone"
    http_status = 410


class EventTooLarge(YokeError):
    """The serialized event is larger than the limit."""

    code = "event_too_large"
    http_status = 413


class ObjectTooLarge(EventTooLarge):
    """Objects are at most 32 MiB."""

    code = "object_too_large"


class EphemeralTooLarge(EventTooLarge):
    """The ephemeral event is larger than the whole ephemeral buffer."""

    code = "ephemeral_too_large"


# --- 502 / 503 / 504: a callee failed, or the runtime cannot serve right now -------------------------


class NotProcessed(YokeError):
    """The subscription did not process through the offset within the timeout."""

    code = "not_processed"
    http_status = 504


class PortalCallFailed(YokeError):
    """A portal method called from an actor raised (``details["error"]``
    names the exception), or answered a value that is not JSON."""

    code = "portal_call_failed"
    http_status = 502


class PortalTimeout(YokeError):
    """A portal method called from an actor did not answer within its timeout."""

    code = "portal_timeout"
    http_status = 504


class Unavailable(YokeError):
    """The database could not be reached, refused the connection, or cancelled
    or rolled back the statement (``details["reason"]``); retry later (an
    append is safe to retry with the same idempotency key)."""

    code = "unavailable"
    http_status = 503


class RuntimeClosed(YokeError):
    """The runtime is shut down."""

    code = "runtime_closed"
    http_status = 503


# --- the HTTP connection (answered by yoke.http.connection_limits, before any route) ---


class MalformedRequest(YokeError):
    """The request is not valid HTTP/1.1."""

    code = "malformed_request"
    http_status = 400


class RequestTimeout(YokeError):
    """The request's head or body did not arrive in time; the connection is closed."""

    code = "request_timeout"
    http_status = 408


class UriTooLong(YokeError):
    """The request line (method, URL, version) is longer than the server accepts."""

    code = "uri_too_long"
    http_status = 414


class HeadersTooLarge(YokeError):
    """The request's head (request line and headers) is larger than the server accepts."""

    code = "headers_too_large"
    http_status = 431


class TooManyConnections(YokeError):
    """The server holds as many connections as it allows; retry later."""

    code = "too_many_connections"
    http_status = 503


# --- start-up: the database does not match this version of Yoke -------------


class SchemaMismatch(YokeError):
    """The database records a migration this version of Yoke does not have
    under that number (renumbered, renamed or edited): refusing to start."""

    code = "schema_mismatch"
    http_status = 500


class SchemaNewer(SchemaMismatch):
    """The database records migrations numbered above this build's newest: a
    newer Yoke migrated it, and this build refuses to start on it."""

    code = "schema_newer"


class DatabasePrivileges(YokeError):
    """The PostgreSQL login lacks what it needs: to migrate (the owner's
    job), or the runtime's grants (``yoke migrate --print-grants``)."""

    code = "database_privileges"
    http_status = 500


class NotificationsLost(YokeError):
    """PostgreSQL notifications do not reach this connection: a pooler in
    transaction or statement mode (PgBouncer ``pool_mode=transaction``)
    cannot carry LISTEN; connect directly or through a session-mode pooler."""

    code = "notifications_lost"
    http_status = 500


class SchemaPending(YokeError):
    """This build's migrations are not all applied and the process was told
    not to apply them (``--no-migrate``): refusing to start."""

    code = "schema_pending"


class StateElsewhere(YokeError):
    """The instances' state lives where this process does not reach it (another
    data directory, another storage mode or bucket): it refuses to run actors,
    and answers this rather than read an empty database."""

    code = "state_elsewhere"
    http_status = 500
