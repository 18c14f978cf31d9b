"""JSON drawn on a terminal safely: no raw control, bidi or line-separator character, so that
what a job's submitter (or a handler) wrote cannot move the cursor, recolour the terminal or
make one line read as another."""

from __future__ import annotations

import json
import re
from typing import Any

_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
"""What `json.dumps(..., ensure_ascii=False)` leaves raw and a terminal must not be given: DEL
and the C1 controls (0x9b is an 8-bit CSI), bidi marks, embeddings, overrides and isolates,
line and paragraph separators, lone surrogates. (JSON escapes the C0 controls itself.)"""


def _escaped(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def safe_json(document: Any, *, compact: bool = False) -> str:
    """`document` as JSON text, indented (or `compact`: no spaces), other non-ASCII characters
    as they are and every unsafe one as its `\\uXXXX` escape: still valid JSON, read back as
    the same value (such characters only ever stand inside JSON strings)."""
    text = (
        json.dumps(document, separators=(",", ":"), ensure_ascii=False)
        if compact
        else json.dumps(document, indent=2, ensure_ascii=False)
    )
    return _UNSAFE.sub(_escaped, text)
