"""The console's submit form: what a person typed, read as the API would take it, and the
advertised kinds shown as fields to fill in."""

from __future__ import annotations

import json
from typing import Any

from moonrun.errors import InvalidRequest
from moonrun.scheduling.kinds import load_advertisement
from moonrun.scheduling.records import Advertisement

PLACEHOLDERS: dict[str, Any] = {
    "string": "",
    "array": [],
    "object": {},
    "boolean": False,
    "number": 0,
    "integer": 0,
}
"""What a required field of each type starts as in the payload editor."""


def parse_payload(text: str) -> Any:
    """The payload a person typed (empty: none), or InvalidRequest saying where the JSON
    breaks (the service checks that it is an object, and its limits)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidRequest(
            f"the payload is not JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except RecursionError:
        raise InvalidRequest("the payload nests too deep to read") from None


def parse_attempts(text: str) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest("attempts must be a whole number") from None


def parse_priority(text: str) -> int | None:
    """The priority chosen (empty: the default); the service checks its range."""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(
            "priority must be a whole number from 0 to 9",
            fields=(("priority", "must be a whole number from 0 to 9"),),
        ) from None


def parse_concurrency(key: str, limit: str) -> dict[str, Any] | None:
    """The concurrency key and limit typed (no key: none); the service checks both."""
    if not key:
        if limit:
            problem = "needs a concurrency key"
            raise InvalidRequest(
                f"concurrency.limit {problem}", fields=(("concurrency.limit", problem),)
            )
        return None
    if not limit:
        return {"key": key}
    try:
        return {"key": key, "limit": int(limit)}
    except ValueError:
        problem = "must be a whole number from 1 to 1000"
        raise InvalidRequest(
            f"concurrency.limit {problem}", fields=(("concurrency.limit", problem),)
        ) from None


def kinds_of(advertisement: Advertisement | None) -> list[dict[str, Any]]:
    """Each advertised kind with its top-level fields and a payload to start from."""
    if advertisement is None:
        return []
    kinds = load_advertisement(advertisement.kinds_json)
    return [_kind(kind, kinds[kind]) for kind in sorted(kinds)]


def _kind(kind: str, schema: Any) -> dict[str, Any]:
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = (
        [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    )
    fields = [
        {
            "name": name,
            "type": _type_of(sub),
            "required": name in required,
            "description": sub.get("description", "") if isinstance(sub, dict) else "",
        }
        for name, sub in properties.items()
    ]
    skeleton = {name: _placeholder(properties.get(name)) for name in required}
    return {"kind": kind, "fields": fields, "skeleton": json.dumps(skeleton)}


def _type_of(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    kind = schema.get("type")
    if isinstance(kind, str):
        items = schema.get("items")
        if kind == "array" and isinstance(items, dict) and isinstance(items.get("type"), str):
            return f"array of {items['type']}s"
        return kind
    if isinstance(kind, list):
        return " or ".join(str(name) for name in kind)
    if isinstance(schema.get("enum"), list):
        return "one of " + ", ".join(json.dumps(value) for value in schema["enum"])
    return "any"


def _placeholder(schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return PLACEHOLDERS.get(kind) if isinstance(kind, str) else None
