"""The stores' statements on psycopg's `RawCursor`, their placeholders numbered once each.

The SQL stores write placeholders as `%(name)s` (and the wake-ups as `%s`). psycopg's own
cursor turns those into PostgreSQL's `$1` on every `execute`, caching the result only for
statements under 50 parameters and 4 KB: a job's insert has 70, so every user's create ran
psycopg's Python query splitter again (`_query2pg_nocache`: 8% of the platform's samples
holding the GIL in `bench/peer_bench.py` over PostgreSQL). The stores' statements are a
small, fixed set (the variable ones are bounded by their arity), so each is numbered once
here and run on a `RawCursor`, which takes `$n` as it is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")


@functools.lru_cache(maxsize=1024)
def numbered(statement: str) -> tuple[bytes, tuple[str, ...] | None]:
    """`statement` with `%(name)s` or `%s` placeholders as `$1`, `$2`, ... and `%%` as `%`,
    and the names in the order of their numbers (None when the placeholders are `%s`). A
    name used twice keeps its first number."""
    names: dict[str, int] = {}
    positional = 0

    def number(found: re.Match[str]) -> str:
        nonlocal positional
        text = found.group(0)
        if text == "%%":
            return "%"
        if text == "%s":
            if names:
                raise ValueError(f"named and positional placeholders mixed: {statement!r}")
            positional += 1
            return f"${positional}"
        if positional:
            raise ValueError(f"named and positional placeholders mixed: {statement!r}")
        return f"${names.setdefault(found.group(1), len(names) + 1)}"

    text = _PLACEHOLDER.sub(number, statement)
    return text.encode(), (tuple(names) if names else None)


def _values(names: tuple[str, ...] | None, parameters: Any) -> Sequence[Any]:
    if names is None:
        return tuple(parameters)
    if not isinstance(parameters, Mapping):
        raise TypeError("named placeholders take a mapping of parameters")
    return [parameters[name] for name in names]


class NumberedCursor:
    """A psycopg `RawCursor` taking the stores' placeholders (`store/sql.py`'s `Cursor`)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __enter__(self) -> NumberedCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        """Left open: it lives as long as its connection and serves its next statement."""

    @property
    def rowcount(self) -> int:
        count: int = self._raw.rowcount
        return count

    def execute(self, statement: str, parameters: Any = None, /) -> NumberedCursor:
        if parameters is None:
            # Without parameters psycopg sends the text as it is (several statements may
            # travel in one simple query): nothing to number, and `%%` is left alone.
            self._raw.execute(statement)
        else:
            query, names = numbered(statement)
            self._raw.execute(query, _values(names, parameters))
        return self

    def executemany(self, statement: str, parameters: Iterable[Any], /) -> None:
        query, names = numbered(statement)
        self._raw.executemany(query, [_values(names, each) for each in parameters])

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._raw.fetchall()
        return rows

    def fetchone(self) -> Any:
        return self._raw.fetchone()
