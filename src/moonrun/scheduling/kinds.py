"""The job kinds a Run advertises, and the JSON Schema subset their payloads are checked by.

Run declares, per handler, a JSON Schema for its payload; it checks each payload against that
schema before running it, and advertises the schemas when it registers. The platform then
checks a job at submit against what its server's endpoint advertised, so a misspelt kind or a
bad field is a 422 naming the field instead of a failure on the host.

Both sides use this one checker. It knows a subset of JSON Schema (draft 2020-12 meanings):
`type`, `enum`, `const`, `properties`, `required`, `additionalProperties`, `items`,
`minItems`, `maxItems`, `minLength`, `maxLength`, `minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum`, `anyOf`, `oneOf`, `allOf`, `not`, and `$ref` into the schema's own
`$defs` (or `definitions`). Every other keyword is ignored, as JSON Schema ignores unknown
keywords: in particular `pattern` and `format`, because a hostile Run could send a regular
expression that takes the platform minutes to match. A check that would take more than
`STEP_BUDGET` steps, or nest deeper than `MAX_DEPTH`, gives up and accepts (Run checks the
payload again before running it).
"""

from __future__ import annotations

import difflib
import json
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from moonrun.errors import InvalidPayload, InvalidRequest, UnknownKind
from moonrun.scheduling.fingerprint import JsonValue, Shape, compact_json, load_json
from moonrun.scheduling.jobs import KIND_PATTERN

MAX_KINDS: Final = 64
"""The most kinds one registration may advertise."""
SCHEMA_LIMIT: Final = 16 * 1024
"""The most bytes one kind's schema may take as compact JSON."""
ADVERTISEMENT_LIMIT: Final = 128 * 1024
"""The most bytes a whole advertisement may take as compact JSON."""
SCHEMA_SHAPE: Final = Shape(max_depth=32, max_members=4_000)
STEP_BUDGET: Final = 20_000
"""The most schema evaluations one payload check may make before it gives up and accepts."""
MAX_DEPTH: Final = 128
"""The deepest a payload check may nest (payload levels, `anyOf` branches and `$ref` hops)."""
MAX_PROBLEMS: Final = 20
"""The most problems one refusal names."""

TYPES: Final = ("object", "array", "string", "number", "integer", "boolean", "null")

Schema = Any
"""A JSON Schema: an object, or `true` (anything) / `false` (nothing)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One way a payload does not fit its kind's schema."""

    field: str
    """Where, from the payload's top: `argv`, `argv[0]`, `artifacts[1].name`; "" is the whole
    payload."""
    message: str

    def describe(self) -> str:
        where = f"payload.{self.field}" if self.field else "payload"
        if self.field.startswith("["):
            where = f"payload{self.field}"
        return f"{where} {self.message}"


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


def schema_problems(schema: Schema) -> list[str]:
    """What makes a schema unusable: a keyword this checker knows with a value of the wrong
    type, or a `$ref` that does not resolve. Empty when the schema is fine."""
    found: list[str] = []
    _schema_problems(schema, schema, "", found)
    return found[:MAX_PROBLEMS]


def _schema_problems(schema: Schema, root: Schema, at: str, found: list[str]) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        found.append(f"{at or 'the schema'} must be an object or a boolean")
        return
    kind = schema.get("type")
    if kind is not None:
        names = kind if isinstance(kind, list) else [kind]
        if not names or any(name not in TYPES for name in names):
            found.append(f"{at}type must be one of {', '.join(TYPES)} (or a list of them)")
    for word in ("enum",):
        if word in schema and not isinstance(schema[word], list):
            found.append(f"{at}{word} must be an array")
    for word in ("required",):
        value = schema.get(word)
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(v, str) for v in value)
        ):
            found.append(f"{at}{word} must be an array of strings")
    for word in ("minItems", "maxItems", "minLength", "maxLength"):
        value = schema.get(word)
        if value is not None and (not _is_integer(value) or value < 0):
            found.append(f"{at}{word} must be a non-negative integer")
    for word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = schema.get(word)
        if value is not None and not _is_number(value):
            found.append(f"{at}{word} must be a number")
    properties = schema.get("properties")
    if properties is not None:
        if not isinstance(properties, dict):
            found.append(f"{at}properties must be an object")
        else:
            for name, sub in properties.items():
                _schema_problems(sub, root, f"{at}properties.{name}.", found)
    for word in ("additionalProperties", "items", "not"):
        if word in schema:
            _schema_problems(schema[word], root, f"{at}{word}.", found)
    for word in ("anyOf", "oneOf", "allOf"):
        if word in schema:
            branches = schema[word]
            if not isinstance(branches, list) or not branches:
                found.append(f"{at}{word} must be a non-empty array")
                continue
            for index, sub in enumerate(branches):
                _schema_problems(sub, root, f"{at}{word}[{index}].", found)
    for word in ("$defs", "definitions"):
        defs = schema.get(word)
        if defs is not None:
            if not isinstance(defs, dict):
                found.append(f"{at}{word} must be an object")
            else:
                for name, sub in defs.items():
                    _schema_problems(sub, root, f"{at}{word}.{name}.", found)
    if "$ref" in schema and _resolve(root, schema["$ref"]) is None:
        found.append(f"{at}$ref must point into the schema's own $defs")


def _resolve(root: Schema, ref: object) -> Schema | None:
    """The schema a local `$ref` (`#/$defs/name`, `#/definitions/name` or `#`) points at."""
    if not isinstance(ref, str) or not isinstance(root, dict):
        return None
    if ref == "#":
        return root
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            defs = root.get(prefix[2:-1])
            name = ref[len(prefix) :].replace("~1", "/").replace("~0", "~")
            if isinstance(defs, dict) and name in defs:
                return defs[name]
    return None


# -- checking a job ----------------------------------------------------------------------------


def check_job(kinds: Mapping[str, Schema] | None, kind: str, payload: JsonValue) -> None:
    """Refuse a job that the advertised kinds say its Run cannot run: `UnknownKind`, or
    `InvalidPayload` naming each field that does not fit. `None` (nothing advertised, an older
    Run) accepts every job."""
    if kinds is None:
        return
    schema = kinds.get(kind)
    if schema is None:
        raise UnknownKind(unknown_kind_message(kind, kinds))
    problems = payload_problems(schema, payload)
    if problems:
        raise InvalidPayload(
            "; ".join(problem.describe() for problem in problems),
            fields=tuple((problem.field, problem.message) for problem in problems),
        )


def unknown_kind_message(kind: str, kinds: Mapping[str, Schema]) -> str:
    known = sorted(kinds)
    message = f"this server's Run does not run {kind!r} jobs"
    close = difflib.get_close_matches(kind, known, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    if known:
        message += f"; it runs {', '.join(known)}"
    return message


def payload_problems(schema: Schema, payload: JsonValue) -> list[Problem]:
    """How `payload` does not fit `schema` (empty: it fits, or checking it gave up)."""
    checker = _Checker(schema)
    try:
        checker.check(schema, payload, "", 0)
    except _GaveUp:
        return []
    return checker.problems[:MAX_PROBLEMS]


class _GaveUp(Exception):
    """The check took too many steps or nested too deep; the payload is accepted."""


class _Checker:
    def __init__(self, root: Schema) -> None:
        self.root = root
        self.steps = 0
        self.problems: list[Problem] = []

    def fits(self, schema: Schema, value: JsonValue, depth: int) -> bool:
        """Whether `value` fits, without keeping its problems."""
        probe = _Checker(self.root)
        probe.steps = self.steps
        probe.check(schema, value, "", depth)
        self.steps = probe.steps
        return not probe.problems

    def check(self, schema: Schema, value: JsonValue, at: str, depth: int) -> None:
        self.steps += 1
        if self.steps > STEP_BUDGET or depth > MAX_DEPTH:
            raise _GaveUp()
        if not isinstance(schema, dict):
            if schema is False:
                self._problem(at, "is not allowed")
            return
        if "$ref" in schema:
            target = _resolve(self.root, schema["$ref"])
            if target is not None:
                self.check(target, value, at, depth + 1)
        kind = schema.get("type")
        if kind is not None:
            names = kind if isinstance(kind, list) else [kind]
            if not any(_is_type(value, name) for name in names):
                self._problem(at, f"must be {_a(names)}, not {_a([_type_of(value)])}")
                return
        if "const" in schema and not _json_equal(value, schema["const"]):
            self._problem(at, f"must be {_show(schema['const'])}")
        enum = schema.get("enum")
        if isinstance(enum, list) and not any(_json_equal(value, item) for item in enum):
            self._problem(at, f"must be one of {', '.join(_show(item) for item in enum)}")
        if isinstance(value, dict):
            self._object(schema, value, at, depth)
        elif isinstance(value, list):
            self._array(schema, value, at, depth)
        elif isinstance(value, str):
            self._string(schema, value, at)
        elif _is_number(value):
            self._number(schema, value, at)
        self._combinations(schema, value, at, depth)

    def _object(self, schema: dict[str, Any], value: dict[str, Any], at: str, depth: int) -> None:
        required = schema.get("required")
        if isinstance(required, list):
            for name in required:
                if isinstance(name, str) and name not in value:
                    self._problem(_join(at, name), "is required")
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                self.check(properties[name], item, _join(at, name), depth + 1)
            elif extra is False:
                allowed = ", ".join(sorted(properties)) or "none"
                self._problem(_join(at, name), f"is not a field of this kind (fields: {allowed})")
            elif extra is not True:
                self.check(extra, item, _join(at, name), depth + 1)

    def _array(self, schema: dict[str, Any], value: list[Any], at: str, depth: int) -> None:
        low, high = schema.get("minItems"), schema.get("maxItems")
        if _is_number(low) and len(value) < low:
            self._problem(at, f"must hold at least {low} item{'' if low == 1 else 's'}")
        if _is_number(high) and len(value) > high:
            self._problem(at, f"must hold at most {high} item{'' if high == 1 else 's'}")
        items = schema.get("items", True)
        if items is not True:
            for index, item in enumerate(value):
                self.check(items, item, f"{at}[{index}]", depth + 1)

    def _string(self, schema: dict[str, Any], value: str, at: str) -> None:
        low, high = schema.get("minLength"), schema.get("maxLength")
        if _is_number(low) and len(value) < low:
            self._problem(at, f"must be at least {low} character{'' if low == 1 else 's'} long")
        if _is_number(high) and len(value) > high:
            self._problem(at, f"must be at most {high} character{'' if high == 1 else 's'} long")

    def _number(self, schema: dict[str, Any], value: float, at: str) -> None:
        for word, holds, words in _BOUNDS:
            bound = schema.get(word)
            if _is_number(bound) and not holds(value, bound):
                self._problem(at, f"must be {words} {_show(bound)}")

    def _combinations(self, schema: dict[str, Any], value: JsonValue, at: str, depth: int) -> None:
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            for branch in all_of:
                self.check(branch, value, at, depth + 1)
        any_of = schema.get("anyOf")
        if isinstance(any_of, list) and not any(self.fits(b, value, depth + 1) for b in any_of):
            self._problem(at, "matches none of the forms this kind allows")
        one_of = schema.get("oneOf")
        if isinstance(one_of, list):
            matching = sum(1 for branch in one_of if self.fits(branch, value, depth + 1))
            if matching != 1:
                how = "none" if matching == 0 else "more than one"
                self._problem(at, f"matches {how} of the forms this kind allows")
        if "not" in schema and self.fits(schema["not"], value, depth + 1):
            self._problem(at, "has a form this kind does not allow")

    def _problem(self, at: str, message: str) -> None:
        self.problems.append(Problem(at, message))


# -- JSON values -------------------------------------------------------------------------------


_BOUNDS: Final[tuple[tuple[str, Callable[[Any, Any], bool], str], ...]] = (
    ("minimum", operator.ge, "at least"),
    ("exclusiveMinimum", operator.gt, "more than"),
    ("maximum", operator.le, "at most"),
    ("exclusiveMaximum", operator.lt, "less than"),
)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: object) -> bool:
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _is_type(value: JsonValue, name: str) -> bool:
    checks: dict[str, Callable[[Any], bool]] = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "number": _is_number,
        "integer": _is_integer,
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    check = checks.get(name)
    return check is not None and bool(check(value))


def _type_of(value: JsonValue) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is_type(value, name):
            return name
    return "unknown"


def _json_equal(a: JsonValue, b: JsonValue) -> bool:
    """Equality as JSON means it: `true` is not `1`, `1` is `1.0`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


_ARTICLES: Final = {"array": "an array", "object": "an object", "integer": "an integer"}


def _a(names: list[str]) -> str:
    """`a string or null`: type names as a sentence says them."""
    words = [_ARTICLES.get(n) or (n if n == "null" else f"a {n}") for n in names]
    return " or ".join(words)


def _show(value: JsonValue) -> str:
    text = compact_json(value, field="value", limit=1 << 20)
    return text if len(text) <= 40 else text[:37] + "..."


_PLAIN_KEY: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def _join(at: str, name: str) -> str:
    """The path of member `name` of `at`: `.name`, or `["name"]` as escaped JSON (at most 64
    characters of it) for a key a user could have made misleading or huge."""
    if _PLAIN_KEY.match(name):
        return f"{at}.{name}" if at else name
    shown = json.dumps(name[:64] + ("..." if len(name) > 64 else ""))
    return f"{at}[{shown}]"
