"""Terminal fingerprints (RFC 8785 canonical JSON, SHA-256 hex) and token hashes."""

from __future__ import annotations

import hashlib
import hmac
import json
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


def compact_json(value: JsonValue, *, field: str, limit: int) -> str:
    """Deterministic compact JSON (sorted keys) for storage; bad or oversized values are typed
    errors. Cheaper than RFC 8785, which only fingerprints need."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{field} is not representable as JSON: {exc}") from None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise TooLarge(f"{field} is {size} bytes as JSON; the limit is {limit}")
    return text


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
    """SHA-256 hex of a token's whole ASCII string, prefix included (PROTOCOL.md section 1)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def token_matches(token: str, stored_hash: str | None) -> bool:
    """Constant-time check of a presented token against a stored hash."""
    if stored_hash is None:
        return False
    return hmac.compare_digest(token_hash(token), stored_hash)
