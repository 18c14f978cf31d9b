"""Labels: the small `key: value` maps endpoints and servers carry (docs/protocol.md, "Labels")."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Final

from moonrun.errors import InvalidLabels

Labels = tuple[tuple[str, str], ...]
"""A checked label map as its (key, value) pairs in key order: immutable and comparable, so
records holding one stay frozen values."""

NO_LABELS: Final[Labels] = ()
MAX_LABELS: Final = 32
MAX_VALUE_LENGTH: Final = 128
KEY_PATTERN: Final = re.compile(r"[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?")
"""A key: 1 to 63 lower-case letters, digits and `._/-`, starting and ending with a letter or a
digit (`fullmatch`)."""

_FIELD_ECHO: Final = 100
"""At most this much of a key is said back in an error (like other field names)."""


def check_labels(raw: object, field: str = "labels") -> Labels:
    """The checked labels of a JSON object of strings, or `InvalidLabels` naming each bad
    entry (`labels.KEY`, or `labels[N]` for the Nth key when the key itself is bad)."""
    if not isinstance(raw, Mapping):
        raise InvalidLabels(f"{field} must be an object", fields=((field, "must be an object"),))
    problems: list[tuple[str, str]] = []
    if len(raw) > MAX_LABELS:
        problems.append((field, f"at most {MAX_LABELS} labels, not {len(raw)}"))
    for index, (key, value) in enumerate(raw.items()):
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            # The key is not one we can safely say back (it may hold anything): its place is.
            problems.append((f"{field}[{index}]", f"a key must match {KEY_PATTERN.pattern}"))
            continue
        where = f"{field}.{key}"[:_FIELD_ECHO]
        problem = value_problem(value)
        if problem is not None:
            problems.append((where, problem))
    if problems:
        message = "; ".join(f"{where}: {problem}" for where, problem in problems[:5])
        raise InvalidLabels(message, fields=tuple(problems))
    return tuple(sorted((str(key), str(value)) for key, value in raw.items()))


def value_problem(value: object) -> str | None:
    """What is wrong with a label value, or None."""
    if not isinstance(value, str):
        return "a value must be a string"
    if len(value) > MAX_VALUE_LENGTH:
        return f"a value is at most {MAX_VALUE_LENGTH} characters, not {len(value)}"
    if any(unicodedata.category(char) == "Cc" for char in value):
        return "a value must not hold control characters"
    return None


def as_dict(labels: Labels) -> dict[str, str]:
    return dict(labels)


def effective_labels(endpoint: Labels, server: Labels) -> dict[str, str]:
    """What a server's selectors match: its endpoint's labels, with the server's own value
    winning wherever both set a key (the host says what it is; the server may say more)."""
    return {**dict(endpoint), **dict(server)}


def merge_proposed(current: Labels, proposed: Labels) -> Labels:
    """An endpoint's labels once its Run's join proposes some: what an admin already set wins
    key by key, since the join only proposes."""
    return check_labels({**dict(proposed), **dict(current)})
