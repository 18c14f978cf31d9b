"""Labels on a command line: `KEY=VALUE` sets a label, `KEY-` removes one (as `kubectl label`)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from moonrun.errors import InvalidLabels, InvalidRequest

_BY_PLACE = re.compile(r"labels\[(\d+)\]")


def parse_pairs(pairs: Sequence[str], option: str = "a label") -> dict[str, str]:
    """`KEY=VALUE` arguments as a map (the value may be empty or hold `=`); the platform checks
    keys and values, this only refuses what is not a pair or names a key twice."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise InvalidRequest(f"{option} is KEY=VALUE, not {pair!r}")
        if key in labels:
            raise InvalidRequest(f"label {key!r} is given twice")
        labels[key] = value
    return labels


def apply_changes(
    current: Mapping[str, str], changes: Sequence[str], *, replace: bool = False
) -> dict[str, str]:
    """The labels after `changes` (`KEY=VALUE` sets, `KEY-` removes): on top of `current`, or
    in place of it when `replace`."""
    removals = [change for change in changes if change.endswith("-") and "=" not in change]
    if replace and removals:
        raise InvalidRequest("--replace sets exactly the labels given: there is nothing to remove")
    updated = {} if replace else dict(current)
    updated.update(parse_pairs([change for change in changes if change not in removals]))
    for removal in removals:
        if removal == "-":
            raise InvalidRequest("a label to remove is KEY-, not '-'")
        updated.pop(removal[:-1], None)
    return updated


@contextmanager
def naming_labels(sent: Mapping[str, str]) -> Iterator[None]:
    """Refused labels said by the key typed, not by the API's field: the platform names a bad
    key by its place (`labels[1]`: it never echoes an unchecked key), which on a command line
    is the Nth label given; echoing it back to the one who typed it is safe (quoted, so a
    control character cannot break the line)."""
    try:
        yield
    except InvalidLabels as error:
        keys = list(sent)
        fields = tuple((_named(field, keys), problem) for field, problem in error.fields)
        if not fields:
            raise
        message = "; ".join(f"{field}: {problem}" for field, problem in fields[:5])
        raise InvalidLabels(message, fields=fields) from None


def _named(field: str, keys: Sequence[str]) -> str:
    if (place := _BY_PLACE.fullmatch(field)) and int(place[1]) < len(keys):
        return f"label {keys[int(place[1])]!r}"
    if field.startswith("labels."):
        return f"label {field.removeprefix('labels.')!r}"
    return field


def labels_text(labels: Mapping[str, str]) -> str:
    """Labels on one line, in key order: `env=prod, role=web` ("-" for none)."""
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items())) or "-"
