"""Finding a secret in a response, in any encoding: the canary tests' scanner.

Shared by the user API canary (tests/integration/test_canary.py) and the console's page canary
(tests/unit/web/test_console.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, quote_plus

Secret = str | bytes


def encodings(secret: Secret) -> dict[str, str]:
    """Every form in which `secret` could leak: raw, hex, base64 and base64url (padded or not,
    and the part that is the same wherever the secret sits inside a longer encoded value), and
    URL-encoded."""
    raw = secret.encode() if isinstance(secret, str) else secret
    forms: dict[str, str] = {
        "raw": secret if isinstance(secret, str) else raw.decode("latin-1"),
        "hex": raw.hex(),
        "url-encoded": quote(raw, safe=""),
        "form-encoded": quote_plus(raw),
    }
    for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
        padded = encode(raw).decode("ascii")
        forms[name] = padded
        forms[f"{name} unpadded"] = padded.rstrip("=")
        for shift in (0, 1, 2):
            # With `shift` bytes before it, the first group mixes in those bytes and the last
            # group the bytes after it: what lies between depends on the secret alone.
            text = encode(b"\0" * shift + raw).decode("ascii")
            forms[f"{name} at byte offset {shift}"] = text[
                4 if shift else 0 : (shift + len(raw)) // 3 * 4
            ]
    return forms


def found_forms(secret: Secret, haystack: str) -> list[str]:
    """The forms of `secret` that occur in `haystack` (hex in any letter case)."""
    lowered = haystack.lower()
    return [
        name
        for name, form in encodings(secret).items()
        if (form.lower() in lowered if name == "hex" else form in haystack)
    ]


def string_leaves(value: Any) -> Iterator[str]:
    """Every string in a JSON document, keys included, as its decoded text."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from string_leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from string_leaves(item)


def haystack_of(response: Any) -> str:
    """Everything a response shows: status line, headers, raw body, decoded JSON strings."""
    parts = [str(response.status_code)]
    parts += [f"{name}: {value}" for name, value in response.headers.multi_items()]
    parts.append(response.content.decode("latin-1"))
    with contextlib.suppress(ValueError):  # not JSON
        parts += list(string_leaves(json.loads(response.content)))
    return "\n".join(parts)
