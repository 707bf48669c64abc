"""The four receivers a subscription delivers to, as plain configuration.

``copy_to_stream(path)``, ``call(function_name)``, ``processor(name)`` and
``webhook(url, secret=None)`` are exported from ``yoke``. Each turns into the
flat ``config`` dict stored in the ``yoke.subscription.configured`` event
(``kind`` plus its own fields) and back.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .. import errors
from ..events import validate_path

# A batch for copy and call: at most this many events and bytes (webhook
# and processor receive one event at a time).
MAX_BATCH_EVENTS = 1000
MAX_BATCH_BYTES = 1024 * 1024
MAX_REGISTERED_CHARS = 200  # function and processor names (as App registers them)
SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class CopyToStream:
    """Append a copy of each event to the stream ``path`` (same tenant)."""

    path: str
    kind = "copy"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.path}


@dataclass(frozen=True)
class Call:
    """Await the application function registered with ``@app.receiver(name)``."""

    function: str
    kind = "call"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "function": self.function}


@dataclass(frozen=True)
class Processor:
    """Fold the source stream into the state of the processor registered
    with ``@app.processor(name)``."""

    name: str
    kind = "processor"

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "processor": self.name}


@dataclass(frozen=True)
class SecretRef:
    """Where a declared webhook's secret is found when the application
    starts (``secret_from_env``, ``secret_from_setting``), so that no secret
    is written in code."""

    source: str  # "env": an environment variable; "setting": an entry of the webhook_secrets setting
    name: str

    def __str__(self) -> str:
        return f"environment variable {self.name}" if self.source == "env" else f"webhook_secrets[{self.name!r}]"


def secret_from_env(name: str) -> SecretRef:
    """A webhook secret read from the environment variable ``name`` at start-up."""
    return SecretRef("env", _reference_name(name))


def secret_from_setting(name: str) -> SecretRef:
    """A webhook secret read from the ``webhook_secrets`` setting (a JSON
    object of name to secret; ``YOKE_WEBHOOK_SECRETS``) at start-up."""
    return SecretRef("setting", _reference_name(name))


def _reference_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 200 or "\x00" in name:
        raise errors.InvalidInput("a secret reference names 1-200 characters", field="secret")
    return name


def resolve_secret(ref: SecretRef, environ: Mapping[str, str], setting: Mapping[str, str]) -> str:
    """The secret ``ref`` names, checked; ``InvalidInput`` naming the
    reference when it is missing or not a webhook secret."""
    found = (environ if ref.source == "env" else setting).get(ref.name)
    if not found:
        raise errors.InvalidInput(f"the webhook secret is missing: {ref} is not set", field="secret")
    try:
        signing_key(found)
    except errors.InvalidInput as exc:
        raise errors.InvalidInput(f"{ref}: {exc.message}", field="secret") from None
    return found


@dataclass(frozen=True)
class Webhook:
    """POST each event, signed per Standard Webhooks, to ``url``."""

    url: str
    secret: str
    generated: bool = False  # the secret was made by ``webhook()``, not given
    # A declared webhook's secret, found when the application starts
    # (``secret`` is "" until then).
    secret_ref: SecretRef | None = None
    kind = "webhook"

    def config(self) -> dict[str, Any]:
        # The secret stays out of the log: the event carries its fingerprint.
        return {"kind": self.kind, "url": self.url, "secret_id": secret_id(self.secret)}


Receiver = CopyToStream | Call | Processor | Webhook


def copy_to_stream(path: str) -> CopyToStream:
    return CopyToStream(validate_path(path))


def call(function_name: str) -> Call:
    return Call(_registered_name(function_name, "function_name"))


def processor(name: str) -> Processor:
    return Processor(_registered_name(name, "name"))


def webhook(url: str, secret: str | SecretRef | None = None) -> Webhook:
    """``secret`` is ``whsec_<base64>`` (24-64 random bytes); omitted, one is
    generated and returned once by ``subscribe``. A subscription declared
    on the App (``app.subscription``) takes a reference instead:
    ``secret_from_env(name)`` or ``secret_from_setting(name)``."""
    refused = errors.InvalidInput("a webhook url is http:// or https:// with a host", field="url")
    if not isinstance(url, str) or len(url) > 2048 or any(c in url for c in "\x00\r\n\t "):
        raise refused
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise refused from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refused
    if secret is None:
        return Webhook(url, new_secret(), generated=True)
    if isinstance(secret, SecretRef):
        return Webhook(url, "", secret_ref=secret)
    signing_key(secret)  # validates
    return Webhook(url, secret)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


def signing_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise errors.InvalidInput("a webhook secret is 'whsec_' followed by base64", field="secret")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except ValueError:
        raise errors.InvalidInput("a webhook secret is 'whsec_' followed by base64", field="secret") from None
    if not 24 <= len(key) <= 64:
        raise errors.InvalidInput("a webhook secret holds 24-64 bytes", field="secret")
    return key


def secret_id(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:16]


def _registered_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_REGISTERED_CHARS or "\x00" in name:
        raise errors.InvalidInput(f"{field} is 1-{MAX_REGISTERED_CHARS} characters", field=field)
    return name


def validated(receiver: Any) -> Receiver:
    """``receiver`` checked as its constructor function checks it (a receiver
    dataclass built directly gets no other check)."""
    if isinstance(receiver, CopyToStream):
        return copy_to_stream(receiver.path)
    if isinstance(receiver, Call):
        return call(receiver.function)
    if isinstance(receiver, Processor):
        return processor(receiver.name)
    if isinstance(receiver, Webhook):
        if receiver.secret_ref is not None and not receiver.secret:
            raise errors.InvalidInput(
                f"a webhook secret by reference ({receiver.secret_ref}) is for subscriptions declared on"
                " the App; subscribe takes the secret itself", field="secret",
            )
        checked = webhook(receiver.url, receiver.secret)
        return Webhook(checked.url, checked.secret, receiver.generated)
    raise errors.InvalidInput(
        "receiver is copy_to_stream(), call(), processor() or webhook()", field="receiver"
    )


def from_dict(raw: Any) -> Receiver:
    """A receiver from its JSON form (HTTP, CLI): ``{"kind": "copy", "target": "/b"}``,
    ``{"kind": "call", "function": f}``, ``{"kind": "processor", "processor": p}``,
    ``{"kind": "webhook", "url": u, "secret": s?}``."""
    if not isinstance(raw, Mapping):
        raise errors.InvalidInput("a receiver is an object with a kind", field="receiver")
    fields = {
        "copy": ("target",), "call": ("function",), "processor": ("processor",),
        "webhook": ("url", "secret"),
    }
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in fields:
        raise errors.InvalidInput(
            "receiver.kind is copy, call, processor or webhook", field="receiver.kind"
        )
    unknown = set(raw) - {"kind", *fields[kind]}
    if unknown:
        raise errors.InvalidInput(
            f"unknown receiver field(s): {', '.join(sorted(map(str, unknown)))}", field="receiver"
        )
    try:
        if kind == "copy":
            return copy_to_stream(raw["target"])
        if kind == "call":
            return call(raw["function"])
        if kind == "processor":
            return processor(raw["processor"])
        return webhook(raw["url"], raw.get("secret"))
    except KeyError as missing:
        raise errors.InvalidInput(f"receiver.{missing.args[0]} is required", field="receiver") from None
