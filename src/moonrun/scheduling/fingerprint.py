"""Terminal fingerprints (RFC 8785 canonical JSON, SHA-256 hex) and token hashes."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import rfc8785

from moonrun.errors import InvalidRequest, TooLarge

JsonValue = Any
"""A value that `json` can encode: dict, list, str, int, float, bool or None."""


def canonical_json(value: JsonValue, *, field: str, limit: int) -> bytes:
    """RFC 8785 (JCS) bytes of `value`; bad or oversized values are typed errors."""
    try:
        data = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{field} is not representable as canonical JSON: {exc}") from None
    if len(data) > limit:
        raise TooLarge(f"{field} is {len(data)} bytes canonical; the limit is {limit}")
    return data


def compact_json(value: JsonValue, *, field: str, limit: int, shape: Shape | None = None) -> str:
    """Deterministic compact JSON (sorted keys) for storage; bad or oversized values are typed
    errors. Cheaper than RFC 8785, which only fingerprints need."""
    if shape is not None:
        shape.check(value, field)
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRequest(f"{field} holds a lone surrogate, which is not Unicode") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{field} is not representable as JSON: {exc}") from None
    if size > limit:
        raise TooLarge(f"{field} is {size} bytes as JSON; the limit is {limit}")
    return text


@dataclass(frozen=True, slots=True)
class Shape:
    """Bounds on a JSON value's shape, beside its size: how deep containers nest, and how many
    members (object keys and array items) it holds in all."""

    max_depth: int
    max_members: int

    def check(self, value: JsonValue, field: str) -> None:
        """Raise InvalidRequest naming the bound a value exceeds (walked without recursion, so
        a value too deep for Python's stack is refused like any other)."""
        members = 0
        pending: list[tuple[JsonValue, int]] = [(value, 1)]
        while pending:
            item, depth = pending.pop()
            if isinstance(item, dict):
                children: Any = item.values()
            elif isinstance(item, list):
                children = item
            else:
                continue
            if depth > self.max_depth:
                raise InvalidRequest(
                    f"{field} nests deeper than {self.max_depth} levels (depth limit)"
                )
            members += len(children)
            if members > self.max_members:
                raise InvalidRequest(
                    f"{field} holds more than {self.max_members} keys and items (member limit)"
                )
            pending.extend((child, depth + 1) for child in children)


def load_json(text: str) -> JsonValue:
    """Parse JSON that moonrun itself wrote."""
    return json.loads(text)


def result_fingerprint(
    outcome: str,
    retryable: bool,
    error: dict[str, str] | None,
    output: JsonValue | None,
) -> str:
    """SHA-256 hex of the JCS form of `{"outcome", "retryable", "error", "output"}`."""
    body = {"outcome": outcome, "retryable": retryable, "error": error, "output": output}
    return hashlib.sha256(canonical_json(body, field="result", limit=1 << 30)).hexdigest()


def token_hash(token: str) -> str:
    """SHA-256 hex of a token's whole ASCII text, prefix too (docs/protocol.md, "Credentials")."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def token_matches(token: str, stored_hash: str | None) -> bool:
    """Constant-time check of a presented token against a stored hash."""
    if stored_hash is None:
        return False
    return hmac.compare_digest(token_hash(token), stored_hash)
