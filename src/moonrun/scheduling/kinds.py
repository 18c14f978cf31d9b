"""The job kinds a Run advertises, and the check of a job against them at submit.

Run declares, per handler, a JSON Schema for its payload; it checks each payload against that
schema before running it, and advertises the schemas when it registers. The platform then
checks a job at submit against what its server's endpoint advertised, so a misspelt kind or a
bad field is a 422 naming the field instead of a failure on the host. Both sides use one
checker, `moonrun.scheduling.jsonschema_subset`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Final

from moonrun.errors import InvalidPayload, InvalidRequest, UnknownKind
from moonrun.scheduling.fingerprint import JsonValue, Shape, compact_json, load_json
from moonrun.scheduling.jobs import KIND_PATTERN
from moonrun.scheduling.jsonschema_subset import Checker, Schema, compile_schema, schema_problems

MAX_KINDS: Final = 64
"""The most kinds one registration may advertise."""
SCHEMA_LIMIT: Final = 16 * 1024
"""The most bytes one kind's schema may take as compact JSON."""
ADVERTISEMENT_LIMIT: Final = 128 * 1024
"""The most bytes a whole advertisement may take as compact JSON."""
SCHEMA_SHAPE: Final = Shape(max_depth=32, max_members=4_000)


# -- the advertisement -------------------------------------------------------------------------


def check_advertisement(kinds: object) -> dict[str, Schema]:
    """The kinds a Run advertised, checked (InvalidRequest naming what is wrong)."""
    if not isinstance(kinds, dict):
        raise InvalidRequest("kinds must be an object of kind name to payload schema")
    if len(kinds) > MAX_KINDS:
        raise InvalidRequest(f"kinds names more than {MAX_KINDS} kinds")
    for kind, schema in kinds.items():
        if not isinstance(kind, str) or not KIND_PATTERN.match(kind):
            raise InvalidRequest("every kind must match ^[a-z][a-z0-9_.-]{0,63}$")
        compact_json(schema, field=f"kinds.{kind}", limit=SCHEMA_LIMIT, shape=SCHEMA_SHAPE)
        problems = schema_problems(schema)
        if problems:
            raise InvalidRequest(f"the schema of kind {kind} is not usable: {problems[0]}")
    compact_json(kinds, field="kinds", limit=ADVERTISEMENT_LIMIT)
    return kinds


def advertisement_json(kinds: Mapping[str, Schema]) -> str:
    """The stored form of an advertisement (compact, sorted keys)."""
    return compact_json(dict(kinds), field="kinds", limit=ADVERTISEMENT_LIMIT)


def load_advertisement(text: str) -> dict[str, Schema]:
    kinds: dict[str, Schema] = load_json(text)
    return kinds


# -- checking a job ----------------------------------------------------------------------------


class Kinds:
    """An advertisement's kinds, each schema compiled on its first use and kept (the platform
    keeps one of these per advertisement in use)."""

    def __init__(self, schemas: Mapping[str, Schema]) -> None:
        self.schemas = schemas
        self._checkers: dict[str, Checker] = {}

    def check(self, kind: str, payload: JsonValue) -> None:
        """Refuse a job its Run cannot run: `UnknownKind`, or `InvalidPayload` naming each
        field that does not fit."""
        checker = self._checkers.get(kind)
        if checker is None:
            if kind not in self.schemas:
                raise UnknownKind(unknown_kind_message(kind, self.schemas))
            checker = self._checkers[kind] = compile_schema(self.schemas[kind])
        problems = checker(payload)
        if problems:
            raise InvalidPayload(
                "; ".join(problem.describe() for problem in problems),
                fields=tuple((problem.field, problem.message) for problem in problems),
            )


def check_job(kinds: Mapping[str, Schema] | None, kind: str, payload: JsonValue) -> None:
    """`Kinds(kinds).check(kind, payload)`; `None` (nothing advertised, an older Run)
    accepts every job."""
    if kinds is not None:
        Kinds(kinds).check(kind, payload)


def unknown_kind_message(kind: str, kinds: Mapping[str, Schema]) -> str:
    known = sorted(kinds)
    message = f"this server's Run does not run {kind!r} jobs"
    close = difflib.get_close_matches(kind, known, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    if known:
        message += f"; it runs {', '.join(known)}"
    return message
