"""Data handling pinned by a workflow stream definition.

A definition pins, for the stream's life: placement (metadata home and
replicas, object regions, client-egress regions, log region), redaction,
authorization and the content classes its records may declare (retention
and limits are pinned by ``Stream.create(pinned=True)`` itself). What means
something on one deployment is enforced by the HTTP surfaces:

- authorization: which token scopes or subjects (token ids) may read and
  append (on top of the token's ``read`` / ``append`` scope);
- redaction: JSON paths of a record masked for readers without a scope
  that lifts them;
- client egress: a request declaring a client region outside the pinned
  set is refused;
- content classes: a record declares one; the allowed set is pinned; raw
  hidden model reasoning is never allowed.

Metadata home and replicas, object regions and the log region are recorded
as given: one Yoke deployment keeps everything in one database, so there
is nothing to place.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..events import Event

REGION_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
CLASS_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
SCOPE_RE = re.compile(r"[a-z][a-z0-9_.-]{0,31}(:[a-z0-9_.-]{1,32})?")
SUBJECT_RE = re.compile(r"tok_[0-9a-f]{16}")
# Never an allowed content class, whatever a definition says: raw hidden
# model reasoning is never stored in a workflow stream.
FORBIDDEN_CLASSES = {"raw_hidden_model_reasoning"}
MASK = "[redacted]"
PATH_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[\*\]|\[(\d+)\]")
MAX_RULES = 64

PLACEMENT = ("metadata_home", "metadata_replicas", "object_regions", "client_egress_regions", "log_region")
FIELDS = {"placement", "redaction", "authorization", "content_classes", "direction"}
DIRECTIONS = ("output", "input")


@dataclass(frozen=True)
class Access:
    """Who may: a token holding one of ``scopes``, or one of ``subjects``."""

    scopes: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()

    def allows(self, scopes: Iterable[str], subject: str) -> bool:
        return subject in self.subjects or any(s in self.scopes for s in scopes)


@dataclass(frozen=True)
class Redaction:
    path: str  # "$.payload.user.email", "$.payload.items[*].card", "$.metadata.ip"
    lifted_by: tuple[str, ...]  # scopes that see the value
    steps: tuple[str | int | None, ...] = field(compare=False, default=())  # None: every element


@dataclass(frozen=True)
class DataHandling:
    placement: dict[str, Any]
    redaction: tuple[Redaction, ...] = ()
    read: Access | None = None
    append: Access | None = None
    content_classes: tuple[str, ...] | None = None
    # "input": records are input records, appended with their delivery
    # outbox (streams/inputs.py); "output" (the default): ordinary records.
    direction: str = "output"

    # --- parsing and storing -----------------------------------------------------

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> DataHandling | None:
        """The pins of a definition body (None when it pins none)."""
        if not any(k in body for k in FIELDS):
            return None
        return cls(
            placement=_placement(body.get("placement")),
            redaction=_redactions(body.get("redaction")),
            read=_access(body.get("authorization"), "read"),
            append=_access(body.get("authorization"), "append"),
            content_classes=_classes(body.get("content_classes")),
            direction=_direction(body.get("direction")),
        )

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any] | None) -> DataHandling | None:
        return None if stored is None else cls.from_body(stored)

    def to_dict(self) -> dict[str, Any]:
        authorization = {
            name: {"scopes": list(rule.scopes), "subjects": list(rule.subjects)}
            for name, rule in (("read", self.read), ("append", self.append)) if rule is not None
        }
        return {
            "placement": dict(self.placement),
            "redaction": [{"path": r.path, "lifted_by": list(r.lifted_by)} for r in self.redaction],
            "authorization": authorization,
            "content_classes": None if self.content_classes is None else list(self.content_classes),
            "direction": self.direction,
        }

    # --- enforcing ------------------------------------------------------------------

    def check_access(self, action: str, scopes: Iterable[str], subject: str) -> None:
        rule = self.read if action == "read" else self.append
        if rule is not None and not rule.allows(scopes, subject):
            raise errors.Forbidden(
                f"this stream's definition does not let this token {action}", scope=action, pinned=True
            )

    def check_egress(self, region: str | None) -> None:
        allowed = self.placement.get("client_egress_regions")
        if region is None or allowed is None:
            return
        if region not in allowed:
            raise errors.EgressRefused(
                f"client region {region[:64]!r} is outside this stream's egress regions", region=region[:64],
                allowed=list(allowed),
            )

    def check_class(self, declared: Any) -> None:
        """A record's declared content class (None: not declared)."""
        check_not_forbidden(declared)
        if self.content_classes is None:
            return
        if declared is None:
            raise errors.ContentClassRefused(
                "this stream pins its content classes: each record declares one in metadata.content_class",
                allowed=list(self.content_classes),
            )
        if declared not in self.content_classes:
            raise errors.ContentClassRefused(
                f"content class {str(declared)[:64]!r} is not allowed on this stream",
                content_class=str(declared)[:64], allowed=list(self.content_classes),
            )

    def redactor(self, scopes: Iterable[str]) -> Redactor | None:
        """What a reader holding ``scopes`` must not see (None: everything visible)."""
        held = set(scopes)
        rules = tuple(r for r in self.redaction if not held.intersection(r.lifted_by))
        return Redactor(rules) if rules else None


@dataclass(frozen=True)
class Redactor:
    rules: tuple[Redaction, ...]

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(r.path for r in self.rules)

    def apply_event(self, event: Event) -> Event:
        """``event`` with its masked values replaced (a new Event; the stored
        one is never changed)."""
        masked = self.apply({"payload": event.payload, "metadata": event.metadata})
        if masked["payload"] is event.payload and masked["metadata"] is event.metadata:
            return event
        return dataclasses.replace(event, payload=masked["payload"], metadata=masked["metadata"])

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` (an event's dict) with the masked values replaced."""
        masked = None
        for rule in self.rules:
            root, rest = rule.steps[0], rule.steps[1:]
            if not isinstance(root, str) or root not in record or record[root] is None:
                continue
            if masked is None:
                masked = dict(record)
            if masked[root] is record[root]:
                masked[root] = copy.deepcopy(record[root])
            if not rest:
                masked[root] = MASK
            else:
                _mask(masked[root], rest)
        return record if masked is None else masked


def _mask(value: Any, steps: tuple[str | int | None, ...]) -> None:
    step, rest = steps[0], steps[1:]
    if step is None:
        targets = range(len(value)) if isinstance(value, list) else list(value) if isinstance(value, dict) else ()
    elif isinstance(step, int):
        targets = [step] if isinstance(value, list) and step < len(value) else []
    else:
        targets = [step] if isinstance(value, dict) and step in value else []
    for key in targets:
        if rest:
            _mask(value[key], rest)
        else:
            value[key] = MASK


def check_not_forbidden(declared: Any) -> None:
    """Raw hidden model reasoning is refused on every stream, however spelled."""
    if isinstance(declared, str) and re.sub(r"[-. ]", "_", declared.strip().lower()) in FORBIDDEN_CLASSES:
        raise errors.ContentClassRefused(
            "raw hidden model reasoning is never an allowed content class", content_class=declared[:64]
        )


# --- validation --------------------------------------------------------------------


def _strings(value: Any, pattern: re.Pattern[str], field_name: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and pattern.fullmatch(v) for v in value):
        raise errors.InvalidInput(f"{field_name} is a list of {what}", field=field_name)
    if len(value) > MAX_RULES:
        raise errors.InvalidInput(f"{field_name} holds at most {MAX_RULES} entries", field=field_name)
    return tuple(dict.fromkeys(value))


def _object(value: Any, field_name: str, allowed: Iterable[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise errors.InvalidInput(f"{field_name} must be an object", field=field_name)
    unknown = set(value) - set(allowed)
    if unknown:
        raise errors.InvalidInput(f"unknown field(s) in {field_name}: {', '.join(sorted(unknown))}", field=field_name)
    return value


def _placement(value: Any) -> dict[str, Any]:
    body = _object(value, "placement", PLACEMENT)
    placement: dict[str, Any] = {}
    for name in ("metadata_home", "log_region"):
        region = body.get(name)
        if region is not None and (not isinstance(region, str) or not REGION_RE.fullmatch(region)):
            raise errors.InvalidInput(f"placement.{name} is a region name (a-z, 0-9, -)", field=f"placement.{name}")
        placement[name] = region
    for name in ("metadata_replicas", "object_regions", "client_egress_regions"):
        regions = body.get(name)
        placement[name] = None if regions is None else list(
            _strings(regions, REGION_RE, f"placement.{name}", "region names (a-z, 0-9, -)")
        )
    return placement


def _redactions(value: Any) -> tuple[Redaction, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_RULES:
        raise errors.InvalidInput(f"redaction is a list of at most {MAX_RULES} rules", field="redaction")
    rules = []
    for rule in value:
        rule = _object(rule, "redaction", ("path", "lifted_by"))
        path = rule.get("path")
        steps = _parse_path(path)
        lifted = _strings(rule.get("lifted_by", []), SCOPE_RE, "redaction.lifted_by", "token scopes")
        rules.append(Redaction(path, lifted, steps))
    return tuple(rules)


def _parse_path(path: Any) -> tuple[str | int | None, ...]:
    """``$.payload.a[*].b`` -> ("payload", "a", None, "b")."""
    if not isinstance(path, str) or not path.startswith("$") or len(path) > 512:
        raise errors.InvalidInput("a redaction path is a JSON path: $.payload.a.b, $.payload.items[*].c",
                                  field="redaction.path")
    steps: list[str | int | None] = []
    position = 1
    while position < len(path):
        match = PATH_STEP.match(path, position)
        if match is None:
            raise errors.InvalidInput(
                f"redaction path {path[:80]!r}: expected .name, [*] or [n] at character {position}",
                field="redaction.path",
            )
        if match.group(1) is not None:
            steps.append(match.group(1))
        elif match.group(2) is not None:
            steps.append(int(match.group(2)))
        else:
            steps.append(None)
        position = match.end()
    if not steps or steps[0] not in ("payload", "metadata"):
        raise errors.InvalidInput("a redaction path starts at $.payload or $.metadata", field="redaction.path")
    return tuple(steps)


def _access(value: Any, action: str) -> Access | None:
    body = _object(value, "authorization", ("read", "append"))
    rule = body.get(action)
    if rule is None:
        return None
    rule = _object(rule, f"authorization.{action}", ("scopes", "subjects"))
    return Access(
        scopes=_strings(rule.get("scopes", []), SCOPE_RE, f"authorization.{action}.scopes", "token scopes"),
        subjects=_strings(rule.get("subjects", []), SUBJECT_RE, f"authorization.{action}.subjects", "token ids"),
    )


def _direction(value: Any) -> str:
    if value is None:
        return "output"
    if value not in DIRECTIONS:
        raise errors.InvalidInput("direction is 'output' or 'input'", field="direction")
    return value


def _classes(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    classes = _strings(value, CLASS_RE, "content_classes", "content class names (a-z, 0-9, _ . -)")
    for declared in classes:
        check_not_forbidden(declared)
    return classes
