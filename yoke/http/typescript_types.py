"""TypeScript types of the HTTP API's answers, generated from its OpenAPI
document: ``yoke/hosts/node/api.d.ts``, what the Node package's client
(``yoke-sdk/client``) answers with. Regenerate after a change to the
schemas (tests/actors/test_node_client.py fails until then):

    .venv/bin/python -m yoke.http.typescript_types > yoke/hosts/node/api.d.ts
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson

# The answers the client returns, and what they refer to.
ROOTS = ("EventPage", "AppendAnswer", "InstanceList", "InstanceDetail", "SubscriptionList", "FailureList", "Idle",
         "ErrorBody")


def typescript(schema: dict[str, Any]) -> str:
    """One JSON schema (pydantic's subset) as a TypeScript type."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if "const" in schema:
        return orjson.dumps(schema["const"]).decode()
    if "enum" in schema:
        return " | ".join(orjson.dumps(v).decode() for v in schema["enum"])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " | ".join(dict.fromkeys(typescript(s) for s in schema[union]))
    kind = schema.get("type")
    if kind == "array":
        item = typescript(schema.get("items", {}))
        return f"({item})[]" if " " in item else f"{item}[]"
    if kind == "object" or "properties" in schema:
        if not schema.get("properties"):
            extra = schema.get("additionalProperties")
            return f"Record<string, {typescript(extra)}>" if isinstance(extra, dict) else "Record<string, Json>"
        return "{ " + " ".join(field(n, s, n in schema.get("required", ())) for n, s in schema["properties"].items()) + " }"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}.get(
        kind, "Json"
    )


def field(name: str, schema: dict[str, Any], required: bool) -> str:
    return f"{name}{'' if required else '?'}: {typescript(schema)};"


def referenced(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        found = {schema["$ref"].rsplit("/", 1)[1]} if "$ref" in schema else set()
        return found.union(*(referenced(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(referenced(v) for v in schema))
    return set()


def generate(document: dict[str, Any]) -> str:
    schemas = document["components"]["schemas"]
    wanted: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(referenced(schemas[name]))
    lines = [
        "// Generated from Yoke's OpenAPI document by yoke/http/typescript_types.py: do not edit.",
        "// The answers of the HTTP API, as yoke-sdk/client returns them.",
        "",
        "export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };",
    ]
    for name in sorted(wanted):
        schema = schemas[name]
        description = (schema.get("description") or "").strip().replace("*/", "* /")
        lines.append("")
        if description:
            lines.append("/** " + " ".join(description.split()) + " */")
        if schema.get("properties"):
            lines.append(f"export interface {name} {{")
            required = set(schema.get("required", ()))
            for prop, sub in schema["properties"].items():
                note = (sub.get("description") or "").strip().replace("*/", "* /")
                if note:
                    lines.append("  /** " + " ".join(note.split()) + " */")
                lines.append("  " + field(prop, sub, prop in required))
            lines.append("}")
        else:
            lines.append(f"export type {name} = {typescript(schema)};")
    return "\n".join(lines) + "\n"


def main() -> None:
    from .app import create_app

    print(generate(create_app(lambda: contextlib.nullcontext()).openapi()), end="")


if __name__ == "__main__":
    main()
