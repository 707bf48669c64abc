"""What the OpenAPI document says the routes take and answer.

The routes read their bodies themselves (``responses.json_body``): that
keeps Yoke's own answers to a bad body (400 ``invalid_input`` or
``invalid_event`` naming the field, 415 for another Content-Type) and its
value domain (no coercion: ``"1"`` is not ``1``). So the pydantic models here
validate nothing at run time; they describe the bodies and the answers for
``/openapi.json``, ``/docs`` and ``/redoc``:

- ``request_body(Model)`` is a route's ``openapi_extra``: its ``requestBody``, a
  reference to the model's schema (added to the document's components by
  ``complete``) with the model's examples, the first of which Swagger UI's
  "Try it out" fills in;
- ``answer(Model, description)`` is one entry of a route's ``responses``;
- ``complete(document)`` finishes the document FastAPI made.

Each model carries its examples (``model_config``), so a schema and its
example are written once, next to each other. Request models are closed
(``additionalProperties: false``), as the handlers are; answers are open
(a client must ignore fields it does not know).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.json_schema import models_json_schema

from ..actors.instances import MAX_KEY_CHARS as MAX_INSTANCE_KEY_CHARS
from ..events import MAX_INT, MAX_KEY_CHARS, MAX_OFFSET, PRIORITY_RANGE
from ..streams.stream import MAX_AGE_S, MAX_COUNT
from ..streams.objects import MAX_EXPIRY_S, MAX_OBJECT_BYTES
from ..subscriptions.catalogue import MAX_NAME_CHARS as MAX_SUBSCRIPTION_NAME_CHARS
from ..tokens import MAX_EXPIRY_S as MAX_TOKEN_EXPIRY_S

REF = "#/components/schemas/{model}"

# Models referenced by request bodies: FastAPI only adds to the components
# the models its routes declare as parameters or answers.
_REQUEST_MODELS: list[type[BaseModel]] = []


def examples_of(model: type[BaseModel]) -> list[Any]:
    extra = model.model_config.get("json_schema_extra")
    return list(extra.get("examples", [])) if isinstance(extra, dict) else []


def request_body(
    model: type[BaseModel],
    *,
    required: bool = True,
    description: str | None = None,
    media_type: str = "application/json",
) -> dict[str, Any]:
    """``openapi_extra`` documenting a body the route parses itself."""
    if model not in _REQUEST_MODELS:
        _REQUEST_MODELS.append(model)
    examples = examples_of(model)
    content: dict[str, Any] = {"schema": {"$ref": REF.format(model=model.__name__)}}
    if len(examples) == 1:
        content["example"] = examples[0]
    elif examples:  # several: Swagger UI offers them in a list, the first filled in
        content["examples"] = named_examples(model)
    documented: dict[str, Any] = {"required": required, "content": {media_type: content}}
    if description:
        documented["description"] = description
    return {"requestBody": documented}


def named_examples(model: type[BaseModel]) -> dict[str, Any]:
    names = getattr(model, "example_names", None) or []
    examples = examples_of(model)
    return {
        (names[i] if i < len(names) else f"example {i + 1}"): {"value": value}
        for i, value in enumerate(examples)
    }


def answer(model: type[BaseModel], description: str) -> dict[str, Any]:
    """One documented success answer of a route: its schema and example."""
    entry: dict[str, Any] = {"model": model, "description": description}
    examples = examples_of(model)
    if examples:
        entry["content"] = {"application/json": {"example": examples[0]}}
    return entry


def text_answer(media_type: str, description: str, example: str, **schema: Any) -> dict[str, Any]:
    """A success answer that is not JSON (SSE, Prometheus text, object bytes)."""
    return {
        "description": description,
        "content": {media_type: {"schema": {"type": "string", **schema}, "example": example}},
    }


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """Finish FastAPI's ``document``: add the request models' schemas (and
    the models they use) to its components; put back the examples' nulls
    (FastAPI drops every null value from the document, examples included:
    ``{"secret": null}`` would read ``{}``); remove the 422 answers FastAPI
    documents for routes with parameters (Yoke answers a bad parameter 400
    ``invalid_input``, documented with the other errors)."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for item in document.get("paths", {}).values():
        for operation in item.values():
            answers = operation.get("responses", {})
            if "HTTPValidationError" in repr(answers.get("422", "")):
                del answers["422"]
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    if _REQUEST_MODELS:
        _, top = models_json_schema([(m, "validation") for m in _REQUEST_MODELS], ref_template=REF)
        for name, schema in top.get("$defs", {}).items():
            schemas.setdefault(name, schema)
    models = _models()
    for name, schema in schemas.items():
        model = models.get(name)
        if model is not None and examples_of(model):
            schema["examples"] = examples_of(model)
    for operation in (op for item in document.get("paths", {}).values() for op in item.values()):
        contents = [operation.get("requestBody", {}).get("content", {})]
        contents += [answer.get("content", {}) for answer in operation.get("responses", {}).values()]
        for media in (m for content in contents for m in content.values()):
            ref = media.get("schema", {}).get("$ref", "")
            model = models.get(ref.rsplit("/", 1)[-1]) if ref.startswith("#/components/schemas/") else None
            if model is None:
                continue
            if "example" in media:
                media["example"] = examples_of(model)[0]
            if "examples" in media:
                media["examples"] = named_examples(model)
    return document


def _models() -> dict[str, type[BaseModel]]:
    """The models of this module, by name."""
    return {
        value.__name__: value
        for value in globals().values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == __name__
    }


def config(*examples: Any) -> ConfigDict:
    """An answer model with its examples."""
    return ConfigDict(json_schema_extra={"examples": list(examples)})


def closed_config(*examples: Any) -> ConfigDict:
    """A request model with its examples: no other fields (the handlers refuse them)."""
    return ConfigDict(extra="forbid", json_schema_extra={"examples": list(examples)})


Text = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)]  # keys, correlation, group ids
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET)]
Millis = Annotated[int, Field(description="Milliseconds since the epoch")]
Json = Annotated[Any, Field(description="Any JSON value")]
JsonObject = dict[str, Any]

STREAM_ID = "0190a3c4e5f6a7b8c9d0e1f2a3b4c5d6"
EVENT_ID = "0190a3c4e5f70a1b2c3d4e5f60718293"
AT = 1767225600000


# --- events -------------------------------------------------------------------------


class EventInput(BaseModel):
    """An event to append. Only ``type`` is required; see docs/reference/events.md for
    the value domain (64-bit integers, finite floats, at most 64 levels) and
    the 64 KiB limit of the serialized event."""

    model_config = closed_config(
        {"type": "order.placed", "payload": {"order_id": "A-1", "total": 42}},
        {
            "type": "order.paid", "payload": {"order_id": "A-1"}, "metadata": {"by": "checkout"},
            "correlation": "A-1", "group_id": "A-1", "idempotency_key": "pay-A-1",
        },
    )
    type: str = Field(
        pattern=r"^[A-Za-z0-9._:/@+\-]{1,256}$",
        description="Letters, digits and . _ - : / @ +; the yoke. prefix is the kernel's",
    )
    payload: Json = Field(default_factory=dict)
    metadata: JsonObject | None = Field(default=None, description="Default {}")
    source: JsonObject | None = Field(default=None, description="source.copied_from is set by the kernel only")
    correlation: Text | None = None
    priority: int | None = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    group_id: Text | None = None
    idempotency_key: Text | None = Field(
        default=None,
        description="Unique per stream: the same key and event again returns the original {offset, id};"
        " object: and yoke: prefixes are the kernel's",
    )
    ephemeral: bool | None = Field(
        default=False, description="Takes an offset but is never written; tails deliver it live"
    )


class AppendBody(RootModel[EventInput | Annotated[list[EventInput], Field(min_length=1, max_length=10_000)]]):
    """One event, or a batch (an array, appended atomically: consecutive
    offsets or nothing)."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"type": "order.placed", "payload": {"order_id": "A-1", "total": 42}},
        [
            {"type": "order.paid", "payload": {"order_id": "A-1"}},
            {"type": "order.shipped", "payload": {"order_id": "A-1"}},
        ],
    ]})  # fmt: skip
    example_names: ClassVar[list[str]] = ["one event", "a batch"]


class Appended(BaseModel):
    model_config = config({"offset": 1, "id": EVENT_ID})
    offset: int = Field(description="The event's offset in its stream")
    id: str


class AppendedBatch(BaseModel):
    model_config = config({"results": [{"offset": 2, "id": EVENT_ID}, {"offset": 3, "id": EVENT_ID}]})
    results: list[Appended]


class AppendAnswer(RootModel[Appended | AppendedBatch]):
    """``{offset, id}`` for one event, ``{results: [...]}`` for a batch."""

    model_config = config({"offset": 1, "id": EVENT_ID})


EVENT_EXAMPLE = {
    "offset": 1, "id": EVENT_ID, "at": AT, "type": "order.placed",
    "payload": {"order_id": "A-1", "total": 42}, "metadata": {}, "source": None, "correlation": None,
    "priority": 0, "group_id": None, "idempotency_key": None, "tenant": "default", "path": "/orders",
    "ephemeral": False,
}  # fmt: skip


class EventOutput(BaseModel):
    """A stored event."""

    model_config = config(EVENT_EXAMPLE)
    offset: int
    id: str
    at: Millis
    type: str
    payload: Json
    metadata: JsonObject
    source: JsonObject | None
    correlation: str | None
    priority: int
    group_id: str | None
    idempotency_key: str | None
    tenant: str
    path: str
    ephemeral: bool


class EventPage(BaseModel):
    """Events with offset > ``after``, ascending; read on from ``next_after``."""

    model_config = config({"events": [EVENT_EXAMPLE], "next_after": 1})
    events: list[EventOutput]
    next_after: int = Field(description="The last event's offset (the cursor given when there is none)")


# --- streams --------------------------------------------------------------------------


class Retention(BaseModel):
    model_config = closed_config({"max_age_s": 86400, "max_events": 1000000})
    max_age_s: float | None = Field(
        default=None, gt=0, le=MAX_AGE_S, description="Keep events younger than this (null: no limit)"
    )
    max_events: Count | None = Field(default=None, description="Keep the newest this many (null: no limit)")


class Limits(BaseModel):
    """Producer credit: unread counts durable events after the minimum
    acknowledgement (only when the stream has consumers), total every
    retained durable event; null is no ceiling."""

    model_config = closed_config({"max_unread_events": 10000, "overflow": "reject"})
    max_unread_events: Count | None = None
    max_unread_bytes: Count | None = None
    max_total_events: Count | None = None
    max_total_bytes: Count | None = None
    overflow: Literal["reject", "block"] = Field(
        default="reject", description="reject: 429/507 at once; block: wait up to block_timeout_s for an ack"
    )
    block_timeout_s: float = Field(default=5.0, gt=0, le=300)


class StreamDefinition(BaseModel):
    """A stream's definition; omitted parts take their defaults. Metadata is
    fixed at creation."""

    model_config = closed_config({"retention": {"max_age_s": 86400}, "limits": {"max_total_events": 1000000},
                           "metadata": {"team": "orders"}})  # fmt: skip
    retention: Retention | None = None
    limits: Limits | None = None
    metadata: JsonObject | None = None


class LegalHold(BaseModel):
    model_config = closed_config({"on": True})
    on: bool = Field(description="While on, retention removes nothing")


class RetentionInfo(BaseModel):
    max_age_s: float | None
    max_events: int | None


class LimitsInfo(BaseModel):
    max_unread_events: int | None
    max_unread_bytes: int | None
    max_total_events: int | None
    max_total_bytes: int | None
    overflow: Literal["reject", "block"]
    block_timeout_s: float


class Usage(BaseModel):
    durable_events: int
    durable_bytes: int
    unread_events: int
    unread_bytes: int
    min_ack: int | None = Field(description="The lowest acknowledged offset (null: no consumer)")


STREAM_INFO_EXAMPLE = {
    "stream_id": STREAM_ID, "tenant": "default", "path": "/orders", "created_at": AT, "head": 3, "earliest": 1,
    "closed": False, "legal_hold": False, "pinned": False, "metadata": {},
    "retention": {"max_age_s": None, "max_events": None},
    "limits": {"max_unread_events": None, "max_unread_bytes": None, "max_total_events": None,
               "max_total_bytes": None, "overflow": "reject", "block_timeout_s": 5.0},
    "usage": {"durable_events": 3, "durable_bytes": 180, "unread_events": 0, "unread_bytes": 0, "min_ack": None},
}  # fmt: skip


class StreamInfo(BaseModel):
    model_config = config(STREAM_INFO_EXAMPLE)
    stream_id: str = Field(description="Random, for the stream's lifetime")
    tenant: str
    path: str
    created_at: Millis
    head: int = Field(description="The highest offset ever assigned")
    earliest: int = Field(description="The lowest offset a read can still return")
    closed: bool
    legal_hold: bool
    pinned: bool = Field(description="A workflow stream definition: its settings never change")
    metadata: JsonObject
    retention: RetentionInfo
    limits: LimitsInfo
    usage: Usage


class StreamList(BaseModel):
    model_config = config({"streams": [STREAM_INFO_EXAMPLE]})
    streams: list[StreamInfo]


class Ack(BaseModel):
    model_config = closed_config({"offset": 1})
    offset: Offset = Field(description="Acknowledge through this offset (acks only advance)")


class WorkflowAck(BaseModel):
    model_config = closed_config({"sequence": 1}, {"offset": 1})
    sequence: Offset | None = Field(None, description="Acknowledge through this sequence (the workflow streams surface's word for offset)")
    offset: Offset | None = Field(None, description="The same (Yoke's word); give one of the two")


class Acked(BaseModel):
    model_config = config({"consumer": "billing", "acked": 1})
    consumer: str
    acked: int


class Consumer(BaseModel):
    consumer: str
    acked: int
    updated_at: Millis


class ConsumerList(BaseModel):
    model_config = config({"consumers": [{"consumer": "billing", "acked": 1, "updated_at": AT}]})
    consumers: list[Consumer]


# --- tokens ---------------------------------------------------------------------------


class TokenRequest(BaseModel):
    model_config = closed_config({"scopes": ["read", "append"], "name": "shop frontend"})
    scopes: list[Literal["read", "append", "admin"] | Annotated[str, Field(pattern=r"^[a-z][a-z0-9_.-]{0,31}:[a-z0-9_.-]{1,32}$")]] = Field(
        min_length=1,
        description="admin includes the others; scopes of your own (name:thing, such as pii:read) are named by"
        " workflow stream definitions (docs/advanced/workflow-streams.md)",
    )
    name: str = Field(default="", max_length=200)
    expires_in_s: int | None = Field(
        default=None, ge=1, le=MAX_TOKEN_EXPIRY_S,
        description="Refused (401 token_expired) this many seconds from now; omitted or null: never",
    )


TOKEN_EXAMPLE = {
    "token_id": "tok_0123456789abcdef", "tenant": "default", "name": "shop frontend", "scopes": ["read", "append"],
    "created_at": AT, "revoked_at": None, "revoked": False, "expires_at": None,
}  # fmt: skip


class Token(BaseModel):
    model_config = config(TOKEN_EXAMPLE)
    token_id: str
    tenant: str
    name: str
    scopes: list[str]
    created_at: Millis
    revoked_at: int | None
    revoked: bool
    expires_at: int | None = Field(description="When it stops working (ms since the epoch); null: never")


class NewToken(Token):
    model_config = config({"token": "yk_tok_0123456789abcdef.3q2-7wEXAMPLEsecretEXAMPLE", **TOKEN_EXAMPLE})
    token: str = Field(description="The bearer token; shown this once (only its hash is stored)")


class TokenList(BaseModel):
    model_config = config({"tokens": [TOKEN_EXAMPLE]})
    tokens: list[Token]


# --- objects --------------------------------------------------------------------------

HELLO_SHA256 = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"  # sha256("hello")


class ObjectPrepare(BaseModel):
    """Pin an upload; the same idempotency key returns the same object."""

    model_config = closed_config({"idempotency_key": "invoice-A-1", "sha256": HELLO_SHA256, "size": 5,
                           "content_type": "text/plain"})  # fmt: skip
    idempotency_key: Text
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Of the bytes to upload, lowercase hex")
    size: int = Field(ge=0, le=MAX_OBJECT_BYTES, description="In bytes")
    content_type: str = Field(default="application/octet-stream", pattern=r"^[\x20-\x7e]{1,255}$")
    expires_in_s: float = Field(default=3600, gt=0, le=MAX_EXPIRY_S, description="Until it is uploaded and committed")
    schema_: str | None = Field(
        None, alias="schema", pattern=r"^[\x20-\x7e]{1,512}$", description="What the bytes follow (a URI or id), pinned"
    )


class ObjectCommit(BaseModel):
    """The record appended for the object; its payload gains
    ``object: {object_id, sha256, size, content_type}``."""

    model_config = closed_config({"type": "invoice.attached", "payload": {"order_id": "A-1"}})
    type: str = Field(default="object.committed", pattern=r"^[A-Za-z0-9._:/@+\-]{1,256}$")
    payload: JsonObject | None = None
    metadata: JsonObject | None = None


OBJECT_EXAMPLE = {
    "object_id": "obj_0123456789abcdef01234567", "path": "/orders", "idempotency_key": "invoice-A-1",
    "sha256": HELLO_SHA256, "size": 5, "content_type": "text/plain", "state": "prepared", "created_at": AT,
    "expires_at": AT + 3_600_000, "committed_offset": None,
}  # fmt: skip


class ObjectInfo(BaseModel):
    model_config = config(OBJECT_EXAMPLE)
    object_id: str
    path: str
    idempotency_key: str
    sha256: str
    size: int
    content_type: str
    state: Literal["prepared", "uploaded", "committed", "aborted", "expired"]
    created_at: Millis
    expires_at: Millis
    committed_offset: int | None
    schema_: str | None = Field(None, alias="schema", description="Pinned at prepare")
    authorization: JsonObject | None = Field(
        None, description="The receipt of who prepared it: {subject, scopes, tenant, at, intent}"
    )


OBJECT_BYTES = {
    "requestBody": {
        "required": True,
        "description": "The object's bytes, exactly size bytes whose SHA-256 is sha256 (any Content-Type)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}, "example": "hello"}},
    }
}


# --- workflow streams --------------------------------------------------------------------


Region = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")]
ScopeName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_.-]{0,31}(:[a-z0-9_.-]{1,32})?$")]


class Placement(BaseModel):
    """Recorded as pinned; only client_egress_regions is enforced (one deployment
    keeps its data in one database: docs/advanced/workflow-streams.md)."""

    model_config = closed_config({"metadata_home": "eu-west-1", "client_egress_regions": ["eu-west-1"]})
    metadata_home: Region | None = None
    metadata_replicas: list[Region] | None = None
    object_regions: list[Region] | None = None
    client_egress_regions: list[Region] | None = Field(
        None, description="A request declaring another region (Client-Region header) is refused: 403 egress_refused"
    )
    log_region: Region | None = None


class RedactionRule(BaseModel):
    model_config = closed_config({"path": "$.payload.user.email", "lifted_by": ["pii:read"]})
    path: str = Field(description="$.payload... or $.metadata...: .name, [*] (every element) or [n] steps")
    lifted_by: list[ScopeName] = Field(default_factory=list, description="Token scopes that see the value")


class AccessRule(BaseModel):
    model_config = closed_config({"scopes": ["run:read"], "subjects": ["tok_0123456789abcdef"]})
    scopes: list[ScopeName] = Field(default_factory=list, description="A token holding one of these may")
    subjects: list[Annotated[str, Field(pattern=r"^tok_[0-9a-f]{16}$")]] = Field(
        default_factory=list, description="These tokens (ids) may"
    )


class Authorization(BaseModel):
    model_config = closed_config({"read": {"scopes": ["run:read"]}, "append": {"scopes": ["run:write"]}})
    read: AccessRule | None = None
    append: AccessRule | None = None


class DataHandling(BaseModel):
    model_config = config({
        "placement": {"metadata_home": "eu-west-1", "metadata_replicas": None, "object_regions": None,
                      "client_egress_regions": ["eu-west-1"], "log_region": None},
        "redaction": [{"path": "$.payload.user.email", "lifted_by": ["pii:read"]}],
        "authorization": {"read": {"scopes": ["run:read"], "subjects": []}},
        "content_classes": ["model_output"],
    })  # fmt: skip
    placement: JsonObject
    redaction: list[JsonObject]
    authorization: JsonObject
    content_classes: list[str] | None
    direction: str = "output"


class WorkflowDefinition(BaseModel):
    """A stream of the run, defined for life (pinned)."""

    model_config = closed_config(
        {"stream_id": "output", "retention": {"max_age_s": 604800}, "metadata": {"step": "render"}},
        {"stream_id": "answer", "placement": {"metadata_home": "eu-west-1", "client_egress_regions": ["eu-west-1"]},
         "redaction": [{"path": "$.payload.user.email", "lifted_by": ["pii:read"]}],
         "authorization": {"read": {"scopes": ["run:read"]}}, "content_classes": ["model_output"]},
    )
    stream_id: str = Field(pattern=r"^[A-Za-z0-9._~:@\-]{1,512}$", description="Not . .. or -")
    retention: Retention | None = None
    limits: Limits | None = None
    metadata: JsonObject | None = None
    placement: Placement | None = None
    redaction: list[RedactionRule] | None = None
    authorization: Authorization | None = None
    content_classes: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]] | None = Field(
        None, description="The classes records may declare (metadata.content_class); raw hidden model reasoning never"
    )
    direction: Literal["output", "input"] | None = Field(
        None, description="input: each record's wake event is published on /runs/{runID}, exactly once"
    )


RECEIPT_EXAMPLE = {
    "record_id": EVENT_ID, "sequence": 1, "at": AT,
    "digest": "sha256:9f2b5f0c2d6e4a1b8c3d7e9f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d",
}


class Receipt(BaseModel):
    """What proves a record was appended: its id, sequence, commit time and
    the digest of its content (docs/advanced/workflow-streams.md)."""

    model_config = config(RECEIPT_EXAMPLE)
    record_id: str
    sequence: int
    digest: str = Field(description="sha256:<hex> over the record's canonical JSON")
    at: Millis


class ReceiptedRecord(BaseModel):
    model_config = config({"offset": 1, "id": EVENT_ID, "receipt": RECEIPT_EXAMPLE})
    offset: int
    id: str
    receipt: Receipt | None = Field(description="None for an ephemeral record (it is not kept)")


class ReceiptedBatch(BaseModel):
    model_config = config({"results": [{"offset": 1, "id": EVENT_ID, "receipt": RECEIPT_EXAMPLE}]})
    results: list[ReceiptedRecord]


class ReceiptedAnswer(RootModel[ReceiptedRecord | ReceiptedBatch]):
    """``{offset, id, receipt}`` for one record, ``{results: [...]}`` for a batch."""

    model_config = config({"offset": 1, "id": EVENT_ID, "receipt": RECEIPT_EXAMPLE})


class Gap(BaseModel):
    model_config = config({"first": 3, "last": 5, "cause": "sweep", "detected_at": AT, "process": "host:4242"})
    first: int = Field(description="The first offset found without a wake-up")
    last: int
    cause: str = Field(description="What made the tail read: sweep (its periodic reread) or resync (a reconnect)")
    detected_at: Millis
    process: str = Field(description="host:pid of the process whose tail found it")


class GapList(BaseModel):
    """Evidence of live gaps repaired on the stream's tails, newest first (the newest 100 are kept)."""

    model_config = config({"gaps": [{"first": 3, "last": 5, "cause": "sweep", "detected_at": AT, "process": "host:4242"}]})
    gaps: list[Gap]


class WorkflowStream(StreamInfo):
    """The stream's info, named by run and stream id; ``stream_id`` is the
    name within the run, its random lifetime id is ``lifetime_id``."""

    model_config = config({
        **STREAM_INFO_EXAMPLE, "path": "/runs/run-1/output", "pinned": True, "stream_id": "output",
        "run_id": "run-1", "lifetime_id": STREAM_ID,
    })  # fmt: skip
    stream_id: str = Field(description="The stream's name within the run")
    run_id: str
    lifetime_id: str
    data_handling: DataHandling | None = Field(None, description="The pins of the definition (docs/advanced/workflow-streams.md)")


# --- subscriptions --------------------------------------------------------------------


class CopyReceiver(BaseModel):
    """Append a copy of each event to the stream target (same tenant)."""

    model_config = closed_config({"kind": "copy", "target": "/archive/orders"})
    kind: Literal["copy"]
    target: str = Field(pattern="^/")


class CallReceiver(BaseModel):
    """Call the application function registered with @app.receiver(function)."""

    model_config = closed_config({"kind": "call", "function": "audit"})
    kind: Literal["call"]
    function: str = Field(min_length=1, max_length=200)


class ProcessorReceiver(BaseModel):
    """Fold the stream into the processor registered with @app.processor(processor)."""

    model_config = closed_config({"kind": "processor", "processor": "totals"})
    kind: Literal["processor"]
    processor: str = Field(min_length=1, max_length=200)


class WebhookReceiver(BaseModel):
    """POST each event, signed per Standard Webhooks; without a secret one is
    generated and answered once."""

    model_config = closed_config({"kind": "webhook", "url": "https://example.com/hooks/orders"})
    kind: Literal["webhook"]
    url: str = Field(pattern="^https?://", max_length=2048)
    secret: str | None = Field(default=None, pattern="^whsec_", description="whsec_ + base64 of 24-64 bytes")


Receiver = Annotated[CopyReceiver | CallReceiver | ProcessorReceiver | WebhookReceiver, Field(discriminator="kind")]


class SubscriptionFilter(BaseModel):
    model_config = closed_config({"types": ["order.*"]})
    types: list[str] | None = Field(default=None, min_length=1, description="Event types, 'prefix.*' or '*'")
    where: str | None = Field(default=None, description="A JSONata expression that must be true")


class SubscriptionRequest(BaseModel):
    model_config = closed_config(
        {"name": "mirror", "receiver": {"kind": "copy", "target": "/archive/orders"}, "start": "beginning"}
    )
    name: str | None = Field(
        default=None, min_length=1, max_length=MAX_SUBSCRIPTION_NAME_CHARS,
        description="Default: generated (subscription:<offset>)",
    )
    receiver: Receiver
    filter: SubscriptionFilter | None = None
    transform: str | None = Field(
        default=None, description="JSONata producing {type?, payload?, metadata?} (not for processors)"
    )
    start: Literal["now", "beginning"] | None = "now"
    on_failing_event: Literal["halt", "skip"] | None = "halt"


class Subscribed(BaseModel):
    model_config = config(
        {"name": "mirror", "path": "/orders", "offset": 4, "id": EVENT_ID, "created": True, "replaced": False,
         "secret": None}
    )
    name: str
    path: str
    offset: int = Field(description="Of the yoke.subscription.configured event that stands")
    id: str
    created: bool = Field(description="False: an identical configuration already stood; nothing appended")
    replaced: bool = Field(
        description="True: another configuration of that name stood; replaced, a new delivery run starts"
    )
    secret: str | None = Field(description="A webhook secret generated by this call (shown once)")


class SubscriptionCursor(BaseModel):
    model_config = closed_config({"after_offset": 0, "resume": True})
    after_offset: Offset = Field(description="Deliver again from after_offset + 1 (not beyond the head)")
    resume: bool | None = Field(default=False, description="Also resume a halt")


SUBSCRIPTION_EXAMPLE = {
    "name": "mirror", "path": "/orders",
    "config": {"receiver": {"kind": "copy", "target": "/archive/orders"}, "filter": None, "transform": None,
               "start": "beginning", "on_failing_event": "halt"},
    "configured_at": 4, "generation": 1, "processed_through_offset": 3, "head": 4, "lag": 1, "halted": None,
    "last_error": None, "last_error_at": None, "attempts": 0, "next_retry_at": None, "delivered": 3, "failures": 0,
    "delivering": "wrk_0123456789abcdef", "parked": None, "state": "running",
    "source_stream_id": "str_0123456789abcdef01234567",
}  # fmt: skip


class SubscriptionStatus(BaseModel):
    model_config = config(SUBSCRIPTION_EXAMPLE)
    name: str
    path: str
    config: JsonObject
    configured_at: int = Field(description="The offset of its configuration event")
    generation: int
    processed_through_offset: int
    head: int
    lag: int
    halted: JsonObject | None
    last_error: str | None
    last_error_at: int | None = Field(
        default=None,
        description="When last_error happened (ms since the epoch); both are kept after it recovers",
    )
    attempts: int
    next_retry_at: int | None = Field(description="Milliseconds since the epoch, while a retry is pending")
    delivered: int
    failures: int
    delivering: str | None = Field(default=None, description="The process delivering it now (null: none)")
    parked: JsonObject | None = Field(
        default=None, description="Paused by the operator ({reason, offset, at_offset}); resume continues"
    )
    state: Literal["running", "retrying", "parked", "halted"] = "running"
    source_stream_id: str = Field(default="", description="The source stream lifetime it delivers")


class SubscriptionList(BaseModel):
    model_config = config({"subscriptions": [SUBSCRIPTION_EXAMPLE]})
    subscriptions: list[SubscriptionStatus]


HISTORY_EXAMPLE = {
    "name": "mirror", "path": "/orders",
    "changes": [{**EVENT_EXAMPLE, "offset": 3, "type": "yoke.subscription.configured",
                 "payload": {"name": "mirror", "config": SUBSCRIPTION_EXAMPLE["config"]}}],
    "from_offset": 1, "scanned_through": 10, "head": 10,
}  # fmt: skip


class SubscriptionHistory(BaseModel):
    """The subscription's control events from the source stream's log, one
    page: read on with ``after=scanned_through`` until it reaches ``head``."""

    model_config = config(HISTORY_EXAMPLE)
    name: str
    path: str
    changes: list[EventOutput] = Field(
        description="yoke.subscription.configured / halted / resumed / cursor_set / removed, by offset"
    )
    from_offset: int = Field(description="The first offset looked at (retention may have removed earlier ones)")
    scanned_through: int = Field(description="Looked at the events through this offset")
    head: int


# --- actor instances ------------------------------------------------------------------


class InstanceFilter(BaseModel):
    model_config = closed_config({"types": ["order.*"], "where": 'payload.order_id = "A-1"'})
    types: list[str] | None = Field(default=None, description="Event types, 'prefix.*' or '*'")
    streams: list[str] | None = Field(default=None, description="Stream path globs ('*', '**')")
    where: str | None = Field(default=None, description="A JSONata expression that must be true")


class InstanceRequest(BaseModel):
    model_config = closed_config({"actor": "order", "key": "A-1", "config": {"priority": "high"}})
    actor: str = Field(min_length=1, max_length=200)
    key: str | None = Field(default=None, min_length=1, max_length=MAX_INSTANCE_KEY_CHARS)
    config: JsonObject | None = None
    filter: InstanceFilter | None = Field(default=None, description="Default: the actor's filter")


INSTANCE_EXAMPLE = {
    "instance_id": "inst_0123456789abcdef", "id": "inst_0123456789abcdef", "tenant": "default",
    "actor": "order", "key": "A-1", "config": {}, "filter": None,
    "parent_id": None, "created_at": AT, "worker_id": None,
}  # fmt: skip


class Instance(BaseModel):
    model_config = config(INSTANCE_EXAMPLE)
    instance_id: str
    id: str = Field(description="The same as instance_id (what this answer first said)")
    tenant: str
    actor: str
    key: str | None
    config: JsonObject
    filter: JsonObject | None
    parent_id: str | None
    created_at: Millis
    worker_id: str | None = Field(description="The worker that owns it (null: none yet)")


class InstanceCreated(Instance):
    model_config = config({**INSTANCE_EXAMPLE, "created": True})
    created: bool = Field(description="False: it existed (200)")


class InstanceState(BaseModel):
    model_config = config({"value": {"total": 12, "lines": 3}, "version": 3})
    value: Json
    version: int


class QueueDepth(BaseModel):
    pending: int
    processing: int
    dead: int


class InstanceDetail(Instance):
    model_config = config({
        **INSTANCE_EXAMPLE, "state": {"value": {"status": "shipped"}, "version": 3},
        "queue": {"pending": 0, "processing": 0, "dead": 0},
    })  # fmt: skip
    state: InstanceState
    queue: QueueDepth


class InstanceList(BaseModel):
    model_config = config({"instances": [INSTANCE_EXAMPLE]})
    instances: list[Instance]


QUEUE_ROW_EXAMPLE = {
    "qid": 17, "status": "dead", "attempts": 5, "group_id": None, "priority": 0, "path": "/orders/A-1",
    "offset": 2, "event": EVENT_EXAMPLE, "available_at": AT, "last_error": "KeyError: 'total'",
    "last_traceback": "Traceback (most recent call last): ...", "enqueued_at": AT, "started_at": None,
}  # fmt: skip


class QueueRow(BaseModel):
    qid: int
    status: Literal["pending", "processing", "dead"]
    attempts: int
    group_id: str | None
    priority: int
    path: str
    offset: int
    event: JsonObject
    available_at: Millis
    last_error: str | None
    last_traceback: str | None
    enqueued_at: Millis
    started_at: int | None


class QueueRows(BaseModel):
    model_config = config({"rows": [QUEUE_ROW_EXAMPLE]})
    rows: list[QueueRow]


class DeadRows(BaseModel):
    """Some dead rows, or (no body, or no qids) all of them."""

    model_config = closed_config({"qids": [17]})
    qids: list[Annotated[int, Field(ge=1, le=MAX_INT)]] | None = Field(
        default=None, description="Default: all dead rows"
    )


class Redriven(BaseModel):
    model_config = config({"redriven": 1})
    redriven: int


class Dropped(BaseModel):
    model_config = config({"dropped": 1})
    dropped: int


INPUT_EXAMPLE = {
    "seq": 3, "kind": "event", "path": "/orders/A-1", "offset": 2, "event": EVENT_EXAMPLE, "attempts": 1,
    "outcome": "done", "error": None, "enqueued_at": AT, "started_at": AT, "processed_at": AT,
    "code_version": "2026.12.1",
    "ops": [{"op": "stream_append", "params": {"event": {"type": "order.billed"}, "stream": "/billing"},
             "answer": {"offset": 9, "id": "evt_01JQ..."}}],
}  # fmt: skip


class InputOp(BaseModel):
    op: str = Field(description="The op's name (stream_append, schedules_upsert, portal_call...)")
    params: JsonObject
    answer: Json | None = Field(default=None, description="What the op answered (absent: it failed)")
    error: JsonObject | None = Field(default=None, description="{code, message} of the error it raised")


class Input(BaseModel):
    seq: int = Field(description="The input's number in its instance: 1, 2, ... in the order runs ended")
    kind: Literal["event", "message", "schedule", "direct"]
    path: str | None = Field(description="The stream the event came from (null: sent directly)")
    offset: int | None
    event: JsonObject | None = Field(description="The event as the run got it (null: its stream pins its data)")
    attempts: int = Field(description="The attempt that ended it")
    outcome: Literal["done", "dead"] = Field(description="done: process() returned; dead: dead-lettered")
    error: str | None = Field(description="A dead-lettered input's last error")
    enqueued_at: Millis
    started_at: int | None
    processed_at: Millis
    code_version: str | None = Field(description="The code that ran it (the deployment's version)")
    ops: list[InputOp] = Field(description="What the run did and read outside its database, in call order")


class InputList(BaseModel):
    model_config = config({"inputs": [INPUT_EXAMPLE], "next_after": None})
    inputs: list[Input]
    next_after: int | None = Field(description="Pass as ?after= for the next page (null: the last page)")


FORK_EXAMPLE = {
    "fork_id": "fork_5d0c0e6c3b9a41f2e8d7", "instance_id": "inst_1f0c2a9d3e4b5c6d7e8f", "actor": "order",
    "key": "A-1", "upto": None, "app": None, "edits": [{"seq": 2, "action": "replace", "payload": {"total": 10}}],
    "summary": {"runs": 2, "failed": 0, "effects": 3, "refused": 0, "inputs": 2, "through": 2},
    "created_at": AT, "expires_at": AT + 604_800_000,
}  # fmt: skip


class ForkEdit(BaseModel):
    model_config = closed_config({"seq": 2, "action": "replace", "payload": {"total": 10}})
    seq: int = Field(ge=1, le=MAX_INT, description="The input it edits (insert: the input it goes before)")
    action: Literal["replace", "drop", "insert"]
    payload: Json | None = Field(default=None, description="replace: the input's new payload")
    event: JsonObject | None = Field(default=None, description="insert: the event to insert")


class ForkRequest(BaseModel):
    model_config = closed_config({"upto": 40}, {"edits": [{"seq": 2, "action": "drop"}]})
    upto: int | None = Field(default=None, ge=0, le=MAX_INT, description="Replay inputs 1..upto (default: all)")
    app: str | None = Field(default=None, description="The code to replay with, module:attribute (admin scope)")
    edits: list[ForkEdit] | None = Field(default=None, description="Edits of the inputs before they replay")


class DeployCheckRequest(BaseModel):
    model_config = closed_config({"app": "shop.next:app", "instances": 20, "inputs": 500})
    app: str = Field(description="The candidate code, module:attribute")
    current: str | None = Field(default=None, description="The deployed code (default: the live instances)")
    actors: list[str] | None = Field(default=None, description="Only these actors (default: all the candidate's)")
    instances: int = Field(default=100, ge=1, le=10_000, description="Instances of each actor, drawn at random")
    inputs: int = Field(default=1000, ge=1, le=MAX_INT, description="Runs compared: each instance's last inputs")


class DeployCheckResult(BaseModel):
    model_config = config({"diverged": 1, "checked": 20, "errors": 0, "tenants": [{
        "tenant": "default", "diverged": 1, "checked": 20, "actors": {"order": {
            "instances": 412, "checked": 20, "errors": [], "diverged": [{
                "instance_id": "inst_1f0c2a9d3e4b5c6d7e8f", "key": "A-1", "inputs": 31, "diverged": True,
                "first_input": 12, "state_differs": True, "diff": {}}]}}}]})
    diverged: int = Field(description="Instances whose state, tables or effects diverge")
    checked: int
    errors: int = Field(description="Instances that could not be checked (see each actor's errors)")
    tenants: list[JsonObject]


class FailureForkRequest(BaseModel):
    model_config = closed_config({"patch": {"payload": {"total": 10}}}, {"app": "shop.fixed:app"})
    event: JsonObject | None = Field(default=None, description="The input's fields replaced whole: type, payload, metadata")
    patch: JsonObject | None = Field(default=None, description="A JSON Merge Patch of the input's event")
    app: str | None = Field(default=None, description="The code to replay with, module:attribute (admin scope)")


class ForkCreated(BaseModel):
    model_config = config(FORK_EXAMPLE)
    fork_id: str
    instance_id: str
    actor: str
    key: str
    upto: int | None
    app: str | None
    edits: list[JsonObject]
    summary: JsonObject = Field(description="runs, failed, effects, refused; inputs replayed and the last one")
    created_at: Millis
    expires_at: Millis


class ForkList(BaseModel):
    model_config = config({"forks": [FORK_EXAMPLE]})
    forks: list[ForkCreated]


class ForkRuns(BaseModel):
    model_config = config({"runs": [{
        "seq": 1, "label": 1, "inserted": False, "edited": False, "event": EVENT_EXAMPLE, "outcome": "done",
        "error": None, "traceback": None, "ops": [], "refused": [], "live_outcome": "done",
    }], "next_after": None})
    runs: list[JsonObject] = Field(description="Each run: its input (seq, or null when inserted), outcome, error, ops")
    next_after: int | None


class ForkDiff(BaseModel):
    model_config = config({
        "fork_id": "fork_5d0c0e6c3b9a41f2e8d7", "against": "live", "instance_id": "inst_1f0c2a9d3e4b5c6d7e8f",
        "changed": True, "nondeterministic": False,
        "state": {"added": {}, "removed": {}, "changed": {"total": {"live": 12, "fork": 10}}},
        "tables": {"items": {"added": [], "removed": [], "changed": [
            {"key": ["sku-1"], "live": {"sku": "sku-1", "qty": 2}, "fork": {"sku": "sku-1", "qty": 1}}]}},
        "effects": [], "outcomes": [{"seq": 2, "live": "failed", "fork": "done", "live_error": "KeyError: 'total'",
                                     "fork_error": None}],
    })
    fork_id: str
    against: str = Field(description="live, or the other fork's id")
    instance_id: str
    changed: bool
    nondeterministic: bool = Field(description="Same code, no edits, and still a difference: see the docs")
    state: JsonObject
    tables: JsonObject
    effects: list[JsonObject]
    outcomes: list[JsonObject]


SCHEDULE_EXAMPLE = {
    "name": "reminder", "due_at": AT, "cron": "0 9 * * *", "event": {"type": "reminder.due", "payload": {}},
    "stream": None, "created_at": AT,
}  # fmt: skip


class ScheduleOutput(BaseModel):
    model_config = config(SCHEDULE_EXAMPLE)
    name: str
    due_at: Millis
    cron: str | None = Field(description="A cron expression: fires again after each due time")
    event: JsonObject = Field(description="What it enqueues (or appends to stream)")
    stream: str | None = Field(description="Appends to this stream instead of the instance's queue")
    created_at: Millis


class ScheduleList(BaseModel):
    model_config = config({"schedules": [SCHEDULE_EXAMPLE]})
    schedules: list[ScheduleOutput]


class SqlQuery(BaseModel):
    model_config = closed_config(
        {"sql": "SELECT name, total FROM orders ORDER BY total DESC", "max_rows": 100},
        {"sql": "SELECT * FROM orders WHERE id = ?", "params": ["A-1"], "timeout_s": 1},
    )
    sql: str = Field(min_length=1, description="One statement that only reads (SELECT, WITH, read-only pragmas)")
    params: list[Json] | None = Field(default=None, description="Values for the ? placeholders")
    max_rows: int | None = Field(default=None, ge=1, le=10_000, description="Default 500")
    timeout_s: float | None = Field(default=None, gt=0, le=30, description="Default 2 seconds")


class CatalogueQuery(BaseModel):
    model_config = closed_config(
        {"query": 'SELECT status, count(*), sum(total) FROM "order".orders GROUP BY status'},
        {"query": 'SELECT * FROM "order".items WHERE key = ?', "params": ["A-1"], "max_rows": 100},
    )
    query: str = Field(min_length=1, description=(
        "One read-only statement in the database's SQL (SQLite's, or PostgreSQL's): actor tables as"
        " ACTOR.TABLE, their state as ACTOR.yoke_state, Yoke's records as yoke.instances, yoke.streams,"
        " yoke.queue, yoke.schedules, yoke.subscriptions, yoke.failures, yoke.events"
    ))
    params: list[Json] | None = Field(default=None, description="Values for the ? placeholders")
    max_rows: int | None = Field(default=None, ge=1, le=100_000, description="Default: the sql_max_rows setting")
    timeout_s: float | None = Field(default=None, gt=0, le=300, description="Default: the sql_timeout_s setting")


class CatalogueColumn(BaseModel):
    name: str
    declared: str = Field(description="The declared SQLite type ('/' between types that differ between instances)")


class CatalogueTable(BaseModel):
    schema_: str = Field(alias="schema", description="The actor's name, or yoke")
    name: str
    columns: list[CatalogueColumn] = Field(description="An actor table's columns (empty for Yoke's records)")


class CatalogueTables(BaseModel):
    model_config = config({"tables": [{"schema": "order", "name": "items", "columns": [
        {"name": "instance_id", "declared": "TEXT"}, {"name": "key", "declared": "TEXT"},
        {"name": "sku", "declared": "TEXT"}, {"name": "qty", "declared": "INTEGER"}]}]})
    tables: list[CatalogueTable]


class SqlResult(BaseModel):
    model_config = config({"columns": ["name", "total"], "rows": [["A-1", 42]], "truncated": False})
    columns: list[str]
    rows: list[list[Json]]
    truncated: bool = Field(description="More rows than max_rows: only the first max_rows are answered")


OVERVIEW_EXAMPLE = {
    "at": AT, "streams": 12, "offsets": 5210, "open_tails": 3,
    "queue": {"pending": 4, "processing": 1, "dead": 2},
    "dead_letters": [{"instance_id": "inst_0190a3c4e5f6a7b8", "dead": 2}],
    "fanout": {"lag": 0, "streams": []},
    "subscriptions": {
        "count": 3, "halted": 1, "lag": 17,
        "attention": [{"path": "/orders", "name": "mirror", "halted": True, "lag": 17,
                       "last_error": "ValueError: total"}],
    },
}  # fmt: skip


class QueueCounts(BaseModel):
    pending: int
    processing: int
    dead: int


class DeadLetterCount(BaseModel):
    instance_id: str
    dead: int


class FanoutStream(BaseModel):
    path: str
    head: int
    through: int = Field(description="Fan-out has routed the events through this offset")
    lag: int


class FanoutLag(BaseModel):
    lag: int = Field(description="Events not yet routed to actor instances, over all streams")
    streams: list[FanoutStream] = Field(description="The streams furthest behind (at most 10)")


class SubscriptionAttention(BaseModel):
    path: str
    name: str
    halted: bool
    lag: int
    last_error: str | None


class SubscriptionTotals(BaseModel):
    count: int
    halted: int
    lag: int = Field(description="Events not yet processed, summed over the subscriptions")
    attention: list[SubscriptionAttention] = Field(
        description="Halted or lagging subscriptions, halted first then by lag (at most 10)"
    )


class Overview(BaseModel):
    """The tenant at a glance. ``offsets`` is the sum of the streams' heads:
    appends per second are the difference of two readings over their ``at``."""

    model_config = config(OVERVIEW_EXAMPLE)
    at: Millis
    streams: int
    offsets: int = Field(description="Offsets ever assigned, summed over the streams")
    open_tails: int = Field(description="Live tails (SSE) this server process serves for the tenant")
    queue: QueueCounts = Field(description="Actor queue rows of the tenant by status")
    dead_letters: list[DeadLetterCount] = Field(description="The instances with the most dead rows (at most 10)")
    fanout: FanoutLag
    subscriptions: SubscriptionTotals


class SignIn(BaseModel):
    """One of the two: the code of the link ``yoke serve`` printed (once), or a token."""

    model_config = closed_config({"code": "q3V1n0b4Lr9xN2mC5kPz8sT6yW1eH7aJ"}, {"token": "yk_tok_..."})
    code: str | None = Field(default=None, description="The one-time code of the printed /ui link")
    token: str | None = Field(default=None, description="An API token's secret")


class ConsoleSession(BaseModel):
    """A signed-in session (``signed_in: false`` and nothing else without one)."""

    model_config = config(
        {
            "signed_in": True, "tenant": "default", "scopes": ["admin"], "token_id": "tok_0190a3c4e5f6",
            "name": "console sign-in", "csrf": "5d41402abc4b2a76b9719d911017c592",
        },
        {"signed_in": False},
    )
    signed_in: bool
    tenant: str | None = None
    scopes: list[str] | None = None
    token_id: str | None = None
    name: str | None = None
    csrf: str | None = Field(
        default=None, description="Send it as X-Yoke-CSRF with every write made with the session cookie"
    )
    dev: bool | None = Field(
        default=None,
        description="true on a `yoke serve --dev` server without a session: the console's requests go without"
        " a token and act as tenant default with every scope, as the API's do (no cookie, no sign-out)",
    )


# --- operations and portals -----------------------------------------------------------


class Health(BaseModel):
    model_config = config({"status": "ok"})
    status: Literal["ok"]


class Ready(BaseModel):
    model_config = config({"status": "ready"})
    status: Literal["ready"]


class Idle(BaseModel):
    model_config = config({"idle": False, "busy": "not idle after 10s: busy instances: cart inst_3f… in default: 1"
                                                  " unfinished rows (1 processing)"})
    idle: bool
    busy: str = Field("", description="What is still busy, when not idle")


class NotReady(BaseModel):
    model_config = config({"status": "unavailable", "reason": "connection refused"})
    status: Literal["unavailable"]
    reason: str


class PortalBody(RootModel[Any]):
    """The raw request body, handed to the portal's handler as bytes (any
    Content-Type; the handler decides what it accepts)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"order_id": "A-1", "items": ["tea"], "total": 42}]})


class PortalAnswer(RootModel[Any]):
    """What the portal's handler answered (any JSON value, with its status;
    no body when it answered nothing)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"order_id": "A-1", "offset": 1}]})


SSE_EXAMPLE = (
    'id: 1\ndata: {"offset":1,"id":"' + EVENT_ID + '","type":"order.placed","payload":{"order_id":"A-1"},...}\n\n'
    ": ping\n\n"
    'event: closed\ndata: {"path":"/orders","closed":true}\n\n'
)
CONNECTION_EXAMPLE = (
    'event: opened\ndata: {"connection_id":"conn_0123456789abcdef","connection_key":"browser","after":0}\n\n'
    'id: 1\ndata: {"offset":1,"id":"' + EVENT_ID + '","type":"order.placed","payload":{"order_id":"A-1"},...}\n\n'
    ": ping\n\n"
    'event: ended\ndata: {"reason":"replaced"}\n\n'
)
CONNECTION_ANSWER = text_answer(
    "text/event-stream",
    "Server-Sent Events: `event: opened` (connection id), then each event as `id: <offset>` and"
    " `data: <event JSON>` (with events=false: `event: state` and the stream's reduced state as data);"
    " `: ping` comments while idle; `event: ended` with the reason (replaced, stream_closed, failed with"
    " its error, shutdown) when it ends. Disconnecting closes it.",
    CONNECTION_EXAMPLE,
)
SSE_ANSWER = text_answer(
    "text/event-stream",
    "Server-Sent Events: each event as `id: <offset>` and `data: <event JSON>`; `: ping` comments while idle;"
    " `event: error` (cursor_gone, filter_failed) and `event: closed` (the stream is closed and read through)"
    " end it. Reconnect with Last-Event-ID.",
    SSE_EXAMPLE,
)


# --- the failures inbox (docs/advanced/failures.md) --------------------------------------------

FAILURE_ID = "ht_WyIvb3JkZXJzIiwidG8tYXJjaGl2ZSIsNDNd"
FAILURE_EXAMPLE = {
    "id": FAILURE_ID, "kind": "halted", "receiver": "webhook", "path": "/orders", "offset": 42,
    "failed_at": AT, "attempt_count": 15, "error": "WebhookFailed: the receiver answered 500",
    "attempts": [{"number": 1, "error": "WebhookFailed: the receiver answered 500", "at": AT},
                 {"number": 15, "error": "WebhookFailed: the receiver answered 500", "at": AT}],
    "event": EVENT_EXAMPLE, "actor": None, "instance_id": None, "subscription": "to-billing", "traceback": None,
}  # fmt: skip
RESOLUTION_EXAMPLE = {
    "id": FAILURE_ID, "action": "replayed", "audit_path": "/orders", "audit_offset": 57, "delivered": True,
}  # fmt: skip
REPLAY_OUTCOME_EXAMPLE = {
    "state": "failed", "detail": "queue row 12 of instance inst_0123456789abcdef is dead again after 3 attempt(s)",
    "error": "ValueError: total", "error_at": 1767225600000,
}  # fmt: skip
FAILURE_FILTER_EXAMPLE = {"kind": "halted", "receiver": "webhook", "stream": "/orders"}
CORRECTION_EXAMPLE = {"payload": {"order_id": "A-1", "total": 42}}
PATCH_EXAMPLE = {"payload": {"total": 42}}


class FailureAttempt(BaseModel):
    number: int = Field(description="The attempt's number (1: the first)")
    error: str | None
    at: int | None = Field(description="When it failed, in milliseconds since the epoch")


class Failure(BaseModel):
    """One parked failure (docs/advanced/failures.md)."""

    model_config = config(FAILURE_EXAMPLE)
    id: str = Field(description="Opaque and stable while the failure is open")
    kind: Literal["dead_letter", "halted", "skipped"]
    receiver: Literal["actor", "copy", "webhook", "call", "processor"]
    path: str | None = Field(description="The event's stream (null: sent to the instance directly)")
    offset: int | None
    failed_at: Millis
    attempt_count: int
    error: str | None = Field(description="The last attempt's error")
    attempts: list[FailureAttempt] = Field(description="Every failed attempt, oldest first (the first 50)")
    event: JsonObject | None = Field(
        description="The event (null once retention removed it, or when its stream pins its data handling)"
    )
    actor: str | None
    instance_id: str | None
    subscription: str | None = Field(description="Halted and skipped events: the subscription on path")
    traceback: str | None


class FailureList(BaseModel):
    model_config = config({"failures": [FAILURE_EXAMPLE]})
    failures: list[Failure] = Field(description="Oldest first")


class Correction(BaseModel):
    """A corrected event: the fields given replace the original's."""

    model_config = closed_config(CORRECTION_EXAMPLE)
    type: str | None = None
    payload: Json = None
    metadata: JsonObject | None = None


PATCH_DESCRIPTION = (
    "A JSON Merge Patch (RFC 7386) of the event's type, payload and metadata: {\"payload\": {\"total\": 42}}"
    " changes that field and keeps the others; null removes one"
)


class EventPatch(BaseModel):
    """A JSON Merge Patch of the failed event's fields."""

    model_config = closed_config(PATCH_EXAMPLE)
    type: str | None = None
    payload: Json = None
    metadata: JsonObject | None = None


class ReplayRequest(BaseModel):
    """No body (or neither field): replay as it is. ``patch`` or ``event``, not both."""

    model_config = closed_config({"patch": PATCH_EXAMPLE})
    patch: EventPatch | None = Field(default=None, description=PATCH_DESCRIPTION)
    event: Correction | None = Field(default=None, description="A corrected event: the fields given replace the original's whole")


class DiscardRequest(BaseModel):
    model_config = closed_config({"reason": "duplicate order, refunded by hand"})
    reason: str = Field(min_length=1, max_length=1000)


class FailureFilter(BaseModel):
    """Which failures (every field optional; {}: all of them)."""

    model_config = closed_config(FAILURE_FILTER_EXAMPLE)
    kind: Literal["dead_letter", "halted", "skipped"] | None = None
    receiver: Literal["actor", "copy", "webhook", "call", "processor"] | None = None
    stream: str | None = None
    actor: str | None = None
    instance_id: str | None = None
    subscription: str | None = None
    since: int | None = Field(default=None, ge=0, le=MAX_INT, description="failed_at at or after (ms)")
    until: int | None = Field(default=None, ge=0, le=MAX_INT, description="failed_at before (ms)")


class BulkReplayRequest(BaseModel):
    model_config = closed_config({"filter": FAILURE_FILTER_EXAMPLE})
    filter: FailureFilter
    patch: EventPatch | None = Field(default=None, description=PATCH_DESCRIPTION + " (applied to each failure's event)")
    event: Correction | None = Field(default=None, description="A correction applied to each (fields replaced whole)")
    limit: int = Field(default=1000, ge=1, le=1000, description="At most this many, oldest first")


class BulkDiscardRequest(BaseModel):
    model_config = closed_config({"filter": {"stream": "/orders/test"}, "reason": "test data"})
    filter: FailureFilter
    reason: str = Field(min_length=1, max_length=1000)
    limit: int = Field(default=1000, ge=1, le=1000, description="At most this many, oldest first")


class ReplayOutcome(BaseModel):
    """What became of a replayed event (``?wait=true``)."""

    model_config = config(REPLAY_OUTCOME_EXAMPLE)
    state: Literal["done", "failed", "pending"] = Field(
        description="done: it went through; failed: a new error for it; pending: still on its way at the timeout"
    )
    detail: str = Field(description="What happened, or what is still pending, in one sentence")
    error: str | None = Field(
        description="failed: the new error (pending: a retry's, if one failed); null on a stream that pins"
                    " its data handling"
    )
    error_at: int | None = Field(description="When that error happened (ms since the epoch)")


class Resolution(BaseModel):
    model_config = config(RESOLUTION_EXAMPLE)
    id: str
    action: Literal["replayed", "discarded"]
    audit_path: str = Field(description="The stream holding the yoke.failure.* audit event")
    audit_offset: int | None
    delivered: bool = Field(description="Delivered by this call (a corrected halt, a skip)")
    outcome: ReplayOutcome | None = Field(
        default=None, description="A replay with ?wait=true: what became of the event (absent otherwise)"
    )


class BulkFailed(BaseModel):
    id: str
    error: JsonObject = Field(description="The error body: code, message, details")


class BulkResult(BaseModel):
    model_config = config({
        "done": [RESOLUTION_EXAMPLE],
        "failed": [{"id": "sk_WyIvb3JkZXJzIiwiYmlsbGluZyIsNDRd", "error": {
            "code": "webhook_failed", "message": "the receiver answered 500"}}],
    })  # fmt: skip
    done: list[Resolution]
    failed: list[BulkFailed]
