"""The JSON Schema subset job payloads are checked by, compiled into a checker with a step budget.

It knows a subset of JSON Schema (draft 2020-12 meanings): `type`, `enum`, `const`,
`properties`, `required`, `additionalProperties`, `items`, `minItems`, `maxItems`, `minLength`,
`maxLength`, `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `anyOf`, `oneOf`,
`allOf`, `not`, `$ref` into the schema's own `$defs` (or `definitions`), and `pattern` of one
form only (`class_pattern`): a run of character classes, each but the last matching a fixed
number of characters, like `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`. Such a pattern matches in one
pass, without backtracking, whatever a hostile Run sends; any other regular expression could
take the platform minutes, so any other `pattern` is ignored, as is `format` and every other
keyword (JSON Schema ignores unknown keywords). A check that would take more than
`STEP_BUDGET` steps, or nest deeper than `MAX_DEPTH`, gives up and accepts (Run checks the
payload again before running it).

Hand-written rather than the `jsonschema` library, for two constraints: the schemas come from
Runs, which the platform does not trust, and the library runs any `pattern` as a regular
expression and has no bound on the work one check may take; and the messages are API (a 422
names each field in words a user reads).
tests/unit/scheduling/test_kinds_checker_agrees_with_jsonschema.py holds it to the library's
verdicts over generated schemas and payloads inside the subset.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from moonrun.scheduling.fingerprint import JsonValue, compact_json

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
        found.append(f"{at.rstrip('.') or 'the schema'} must be an object or a boolean")
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
    if "pattern" in schema and not isinstance(schema["pattern"], str):
        found.append(f"{at}pattern must be a string")
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
    """The schema a local `$ref` (`#/$defs/name`, `#/definitions/name` or `#`) points at.

    The fragment is a JSON Pointer in a URI (RFC 6901, section 6): percent-decoded first, then
    split at `/`, then `~1` and `~0` in each part. A pointer anywhere else (deeper into a
    definition, or into `properties`) is not followed."""
    if not isinstance(ref, str) or not isinstance(root, dict) or not ref.startswith("#"):
        return None
    pointer = _percent_decoded(ref[1:])
    if not pointer:
        return root
    parts = pointer.split("/")
    if len(parts) != 3 or parts[0] or parts[1] not in ("$defs", "definitions"):
        return None
    defs = root.get(parts[1])
    name = parts[2].replace("~1", "/").replace("~0", "~")
    if isinstance(defs, dict) and name in defs:
        return defs[name]
    return None


_PERCENT: Final = re.compile(r"(?:%[0-9A-Fa-f]{2})+")


def _percent_decoded(text: str) -> str:
    """`text` with each run of `%XX` read as UTF-8 (as `urllib.parse.unquote` does; `urllib` is
    kept out of `scheduling/`, which imports no network or I/O module)."""
    return _PERCENT.sub(
        lambda run: bytes.fromhex(run[0].replace("%", "")).decode(errors="replace"), text
    )


# -- checking a payload -----------------------------------------------------------------------


def payload_problems(schema: Schema, payload: JsonValue) -> list[Problem]:
    """How `payload` does not fit `schema` (empty: it fits, or checking it gave up)."""
    return compile_schema(schema)(payload)


Checker = Callable[[JsonValue], list[Problem]]
"""A schema compiled once (`compile_schema`): a payload in, its problems out."""


def compile_schema(schema: Schema) -> Checker:
    """`schema` turned into one function per schema node, each testing only the keywords its
    node has: checking a payload then costs a few calls per value instead of a look-up of
    every keyword at every value (the platform checks every job it is given)."""
    compiler = _Compiler(schema)
    node = compiler.node(schema)

    def check(payload: JsonValue) -> list[Problem]:
        state = _State()
        try:
            node(payload, "", 0, state)
        except _GaveUp:
            return []
        return state.problems[:MAX_PROBLEMS]

    return check


class _GaveUp(Exception):
    """The check took too many steps or nested too deep; the payload is accepted."""


class _State:
    """One check's running count of steps, and the problems found so far."""

    __slots__ = ("problems", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.problems: list[Problem] = []


_Node = Callable[[JsonValue, str, int, _State], None]
"""A compiled schema node: (value, where, depth, state); problems go into the state."""


def _fits(node: _Node, value: JsonValue, depth: int, state: _State) -> bool:
    """Whether `value` fits `node`, keeping none of its problems (its steps count)."""
    probe = _State()
    probe.steps = state.steps
    node(value, "", depth, probe)
    state.steps = probe.steps
    return not probe.problems


def _anything(value: JsonValue, at: str, depth: int, state: _State) -> None:
    _step(depth, state)


def _nothing(value: JsonValue, at: str, depth: int, state: _State) -> None:
    _step(depth, state)
    state.problems.append(Problem(at, "is not allowed"))


def _step(depth: int, state: _State) -> None:
    state.steps += 1
    if state.steps > STEP_BUDGET or depth > MAX_DEPTH:
        raise _GaveUp()


_Part = Callable[[JsonValue, str, int, _State], bool]
"""One keyword's test within a node: False stops the node (a type that does not match)."""


class _Compiler:
    def __init__(self, root: Schema) -> None:
        self.root = root
        self.done: dict[int, _Node] = {}

    def node(self, schema: Schema) -> _Node:
        if not isinstance(schema, dict):
            return _nothing if schema is False else _anything
        known = self.done.get(id(schema))
        if known is not None:
            return known
        parts: list[_Part] = []

        def node(value: JsonValue, at: str, depth: int, state: _State) -> None:
            state.steps += 1  # `_step`, inline: this runs for every value checked
            if state.steps > STEP_BUDGET or depth > MAX_DEPTH:
                raise _GaveUp()
            for part in parts:
                if not part(value, at, depth, state):
                    return

        # Registered before its parts are built, so that a `$ref` cycle ends here.
        self.done[id(schema)] = node
        parts.extend(self.parts(schema))
        return node

    def parts(self, schema: dict[str, Any]) -> list[_Part]:
        parts: list[_Part] = []
        if "$ref" in schema:
            target = _resolve(self.root, schema["$ref"])
            if target is not None:
                referred = self.node(target)
                parts.append(lambda v, at, d, s: referred(v, at, d + 1, s) or True)
        if "type" in schema:
            parts.append(_type_part(schema["type"]))
        # Each lambda below has a message variable of its own: a closure reads its variables
        # when it runs, so two lambdas sharing one would both say the last message.
        if "const" in schema:
            const = schema["const"]
            not_const = f"must be {_show(const)}"
            parts.append(lambda v, at, d, s: _json_equal(v, const) or _add(s, at, not_const))
        enum = schema.get("enum")
        if isinstance(enum, list):
            not_in = f"must be one of {', '.join(_show(item) for item in enum)}"
            parts.append(
                lambda v, at, d, s: any(_json_equal(v, i) for i in enum) or _add(s, at, not_in)
            )
        parts.extend(self.object_parts(schema))
        parts.extend(self.array_parts(schema))
        parts.extend(_string_parts(schema))
        parts.extend(_number_parts(schema))
        parts.extend(self.combination_parts(schema))
        return parts

    def object_parts(self, schema: dict[str, Any]) -> list[_Part]:
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        found = schema.get("properties")
        properties = {
            name: self.node(sub) for name, sub in (found if isinstance(found, dict) else {}).items()
        }
        extra = schema.get("additionalProperties", True)
        if not names and not properties and extra is True:
            return []
        other = None if extra is True or extra is False else self.node(extra)
        allowed = ", ".join(sorted(properties)) or "none"
        plain = frozenset(name for name in properties if _PLAIN_KEY.match(name))

        def members(value: JsonValue, at: str, depth: int, state: _State) -> bool:
            if not isinstance(value, dict):
                return True
            for name in names:
                if name not in value:
                    state.problems.append(Problem(_join(at, name), "is required"))
            for name, item in value.items():
                sub = properties.get(name)
                if sub is not None:
                    path = (f"{at}.{name}" if at else name) if name in plain else _join(at, name)
                    sub(item, path, depth + 1, state)
                elif extra is False:
                    message = f"is not a field of this kind (fields: {allowed})"
                    state.problems.append(Problem(_join(at, name), message))
                elif other is not None:
                    other(item, _join(at, name), depth + 1, state)
            return True

        return [members]

    def array_parts(self, schema: dict[str, Any]) -> list[_Part]:
        parts = _length_parts(schema, list, ("minItems", "maxItems"), _items)
        items = schema.get("items", True)
        if items is not True:
            item = self.node(items)

            def each(value: JsonValue, at: str, depth: int, state: _State) -> bool:
                if isinstance(value, list):
                    for index, member in enumerate(value):
                        item(member, f"{at}[{index}]", depth + 1, state)
                return True

            parts.append(each)
        return parts

    def combination_parts(self, schema: dict[str, Any]) -> list[_Part]:
        parts: list[_Part] = []
        all_of, any_of, one_of = schema.get("allOf"), schema.get("anyOf"), schema.get("oneOf")
        if isinstance(all_of, list):
            every = [self.node(branch) for branch in all_of]

            def all_part(value: JsonValue, at: str, depth: int, state: _State) -> bool:
                for branch in every:
                    branch(value, at, depth + 1, state)
                return True

            parts.append(all_part)
        if isinstance(any_of, list):
            some = [self.node(branch) for branch in any_of]
            no_form = "matches none of the forms this kind allows"
            parts.append(
                lambda v, at, d, s: any(_fits(b, v, d + 1, s) for b in some) or _add(s, at, no_form)
            )
        if isinstance(one_of, list):
            one = [self.node(branch) for branch in one_of]

            def one_part(value: JsonValue, at: str, depth: int, state: _State) -> bool:
                matching = sum(1 for branch in one if _fits(branch, value, depth + 1, state))
                if matching != 1:
                    how = "none" if matching == 0 else "more than one"
                    _add(state, at, f"matches {how} of the forms this kind allows")
                return True

            parts.append(one_part)
        if "not" in schema:
            never = self.node(schema["not"])
            refused = "has a form this kind does not allow"
            parts.append(lambda v, at, d, s: not _fits(never, v, d + 1, s) or _add(s, at, refused))
        return parts


def _add(state: _State, at: str, message: str) -> bool:
    """Note a problem; True, so that the node goes on with its other keywords."""
    state.problems.append(Problem(at, message))
    return True


_EXACT_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "number": (int, float),
    "integer": (int,),
}
"""The Python types a parsed JSON value of each type has: exactly these (JSON parsers make
no subclasses), so `bool` is never a number and one set look-up answers most tests."""


def _type_part(kind: object) -> _Part:
    names = [n for n in (kind if isinstance(kind, list) else [kind]) if isinstance(n, str)]
    exact = frozenset(t for name in names for t in _EXACT_TYPES.get(name, ()))
    whole_floats = "integer" in names and "number" not in names
    wanted = _a(names)

    def typed(value: JsonValue, at: str, depth: int, state: _State) -> bool:
        kind = type(value)
        if kind in exact or (whole_floats and kind is float and value.is_integer()):
            return True
        if kind not in _JSON_TYPES and any(_is_type(value, name) for name in names):
            return True  # not a parsed value (a caller's own subclass): the slow way
        state.problems.append(Problem(at, f"must be {wanted}, not {_a([_type_of(value)])}"))
        return False  # nothing else about a value of the wrong type is worth saying

    return typed


def _string_parts(schema: dict[str, Any]) -> list[_Part]:
    parts = _length_parts(schema, str, ("minLength", "maxLength"), _characters)
    pattern = schema.get("pattern")
    compiled = class_pattern(pattern) if isinstance(pattern, str) else None
    if compiled is not None:
        mismatch = f"must match {pattern}"
        parts.append(
            lambda v, at, d, s: (
                not isinstance(v, str) or compiled.fullmatch(v) is not None or _add(s, at, mismatch)
            )
        )
    return parts


MAX_CLASSES: Final = 8
"""The most character classes a `pattern` this checker matches may have."""
_COUNT: Final = re.compile(r"\{(\d{1,6})(?:(,)(\d{1,6})?)?\}")


def class_pattern(pattern: str) -> re.Pattern[str] | None:
    """`pattern` as a regular expression that matches in one pass, when it is `^`, then up to
    MAX_CLASSES character classes (`[a-z._-]`: characters and ranges; `\\` before a character
    that is not a letter or digit makes it literal; no negation), each but the last with no
    count or an exact `{n}`, the last with `?`, `*`, `+`, `{n}`, `{m,}` or `{m,n}`, then `$`;
    None for any other pattern (then ignored).

    One pass: every class before the last takes a fixed number of characters, so the only
    choice is how many the last one takes, and a class test per character decides it. The
    expression is rebuilt from the classes read, never compiled from `pattern` itself.
    """
    if len(pattern) > 1024 or not pattern.startswith("^") or not pattern.endswith("$"):
        return None
    body, at = pattern[1:-1], 0
    built: list[tuple[str, int, int, str]] = []
    while at < len(body):
        read = _read_class(body, at)
        if read is None or len(built) == MAX_CLASSES:
            return None
        members, at = read
        count, low, high = "", 1, 1
        if at < len(body) and body[at] in "?*+":
            count, at = body[at], at + 1
            low, high = (0 if count != "+" else 1), (1 if count == "?" else -1)
        elif (found := _COUNT.match(body, at)) is not None:
            low = int(found.group(1))
            high = low if not found.group(2) else int(found.group(3) or -1)
            if high != -1 and high < low:
                return None
            count, at = found.group(0), found.end()
        if built and built[-1][1] != built[-1][2]:
            return None  # a class of variable count before another: not one pass
        built.append((members, low, high, count))
    if not built:
        return None
    return re.compile("".join(f"[{members}]{count}" for members, _, _, count in built))


def _read_class(body: str, at: int) -> tuple[str, int] | None:
    """The members of the class starting at `body[at]`, escaped for `re`, and where it ends."""
    if not body.startswith("[", at) or body.startswith("[^", at):
        return None
    at += 1
    members: list[str] = []
    while at < len(body) and (body[at] != "]" or not members):
        low, at = _class_character(body, at)
        if low is None:
            return None
        if body.startswith("-", at) and at + 1 < len(body) and body[at + 1] != "]":
            high, at = _class_character(body, at + 1)
            if high is None or high < low:
                return None
            members.append(f"{re.escape(low)}-{re.escape(high)}")
        else:
            members.append(re.escape(low))
    if at >= len(body):
        return None
    return "".join(members), at + 1


def _class_character(body: str, at: int) -> tuple[str | None, int]:
    """One character of a class (a `\\` escape of a non-alphanumeric one included)."""
    character = body[at]
    if character == "\\":
        if at + 1 >= len(body) or body[at + 1].isalnum():
            return None, at
        return body[at + 1], at + 2
    if character in "[]":
        return None, at
    return character, at + 1


def _items(how: str, n: float) -> str:
    return f"must hold {how} {n} item{'' if n == 1 else 's'}"


def _characters(how: str, n: float) -> str:
    return f"must be {how} {n} character{'' if n == 1 else 's'} long"


def _length_parts(
    schema: dict[str, Any],
    kind: type[Sized],
    words: tuple[str, str],
    say: Callable[[str, float], str],
) -> list[_Part]:
    """The tests of `minItems`/`maxItems` (arrays) or `minLength`/`maxLength` (strings)."""
    parts: list[_Part] = []
    low, high = schema.get(words[0]), schema.get(words[1])
    if _is_number(low):
        short = say("at least", low)
        parts.append(lambda v, at, d, s: not _shorter(v, kind, low) or _add(s, at, short))
    if _is_number(high):
        long = say("at most", high)
        parts.append(lambda v, at, d, s: not _longer(v, kind, high) or _add(s, at, long))
    return parts


def _number_parts(schema: dict[str, Any]) -> list[_Part]:
    parts: list[_Part] = []
    for word, holds, words in _BOUNDS:
        bound = schema.get(word)
        if _is_number(bound):
            parts.append(_bound_part(holds, bound, f"must be {words} {_show(bound)}"))
    return parts


def _bound_part(holds: Callable[[Any, Any], bool], bound: float, message: str) -> _Part:
    return lambda v, at, d, s: not _is_number(v) or holds(v, bound) or _add(s, at, message)


def _shorter(value: Any, kind: type[Sized], length: float) -> bool:
    return isinstance(value, kind) and len(value) < length


def _longer(value: Any, kind: type[Sized], length: float) -> bool:
    return isinstance(value, kind) and len(value) > length


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


_JSON_TYPES: Final = frozenset({dict, list, str, bool, type(None), int, float})

_TYPE_TESTS: Final[dict[str, Callable[[Any], bool]]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": _is_number,
    "integer": _is_integer,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _is_type(value: JsonValue, name: str) -> bool:
    test = _TYPE_TESTS.get(name)
    return test is not None and test(value)


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
