"""How the console draws log lines: controls as visible escapes, and only the newest lines that
fit a budget of HTML, so that no log can make a page huge or pose as another line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from markupsafe import Markup, escape

from moonrun.logs.protocol import LogPage

TAIL_LINES = 200
TAIL_HTML_BYTES = 128 * 1024
"""Beyond this much log HTML, older lines of the tail are left to the logs API."""

# C0 and C1 controls but tab, DEL, bidi marks, embeddings, overrides and isolates, line and
# paragraph separators, and lone surrogates (which nothing should have stored).
_CONTROLS = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]+"
)


@dataclass(frozen=True, slots=True)
class ShownLine:
    stream: str
    html: Markup


_NAMED = {"\r": "\\r", "\n": "\\n"}


def _escape_char(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def line_html(text: str) -> Markup:
    """`text` escaped for HTML, each run of controls as `\\x1b`-style escapes in a `ctl` span."""
    parts: list[str] = []
    start = 0
    for found in _CONTROLS.finditer(text):
        parts.append(escape(text[start : found.start()]))
        escapes = "".join(_escape_char(char) for char in found.group())
        parts.append(f'<span class="ctl">{escapes}</span>')
        start = found.end()
    parts.append(escape(text[start:]))
    return Markup("".join(parts))


def shown_tail(page: LogPage, budget: int = TAIL_HTML_BYTES) -> list[ShownLine]:
    """The newest lines of `page` whose HTML fits `budget` (always the newest one)."""
    shown: list[ShownLine] = []
    size = 0
    for line in reversed(page.lines):
        html = line_html(line.text)
        if shown and size + len(html) > budget:
            break
        shown.append(ShownLine(line.stream, html))
        size += len(html)
    shown.reverse()
    return shown
