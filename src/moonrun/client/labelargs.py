"""Labels on a command line: `KEY=VALUE` sets a label, `KEY-` removes one (as `kubectl label`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from moonrun.errors import InvalidRequest


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


def labels_text(labels: Mapping[str, str]) -> str:
    """Labels on one line, in key order: `env=prod, role=web` ("-" for none)."""
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items())) or "-"
