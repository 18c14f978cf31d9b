"""The payload checker (`moonrun.scheduling.jsonschema_subset`) gives the verdict of the
`jsonschema` library (draft 2020-12) on every schema of the subset it supports and every value.

Hypothesis generates schemas from the keywords the checker knows (docs/protocol.md, "Kinds")
and, for each, values drawn to fit it (following its types, bounds,
enums, properties, branches and `$ref`s) or anything at all, so that both verdicts come up;
the checker must say "fits" exactly when the library says valid. Where the checker differs
from the library on purpose, the generator stays out of it, and says why where it does so:

- `pattern`: only the one-pass form (`class_pattern`); any other pattern is ignored on
  purpose (a Run's regular expression never runs on the platform), so only that form is made.
- A `$` in a pattern ends the string, as in ECMA-262, whose regular expressions JSON Schema
  names; the library runs Python's `re`, whose `$` also matches before a final newline, so
  the strings generated hold no newline (`tests/unit/scheduling/test_kinds_checker.py` pins the
  checker's
  side: `a\\n` does not match `^[a]$`).
- The step budget and depth bound: past them the checker accepts. Generated schemas and
  values are small, and every `$ref` cycle passes through `properties`, `items` or
  `additionalProperties` (a cycle that consumes nothing of the value would never end in the
  library: it recurses until Python's stack runs out).
- Keywords the checker ignores (`format`, `prefixItems`, `uniqueItems`, ...) and schemas it
  refuses (`schema_problems`) are not generated; every generated schema is also checked
  against the draft 2020-12 meta-schema, so the generator cannot drift outside JSON Schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import hypothesis
import pytest
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from moonrun.run.handlers.command import PAYLOAD_SCHEMA as COMMAND
from moonrun.run.handlers.sleep import PAYLOAD_SCHEMA as SLEEP
from moonrun.scheduling.jsonschema_subset import (
    TYPES,
    class_pattern,
    payload_problems,
    schema_problems,
)

# -- values ------------------------------------------------------------------------------------

# No newline: see the module docstring (a pattern's `$`).
TEXT = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=5)
NUMBERS = st.one_of(
    st.integers(-3, 3),
    st.integers(),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, -1.5, 2.5, 1e20, 10**20, 2**63]),
    st.floats(-10, 10, allow_nan=False, allow_infinity=False),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
KEYS = st.one_of(st.sampled_from(["a", "b", "c", "a b", "~", ""]), TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=8,
)


# -- schemas -----------------------------------------------------------------------------------

PROPERTY_NAMES = st.sampled_from(["a", "b", "c", "a b", "~", "$ref", ""])
DEF_NAMES = st.text(alphabet="ab~/ %\u00e9", max_size=3)
"""`~` and `/` are escaped in a `$ref` (`~0`, `~1`); a space, `%` and `\u00e9` are
percent-encoded (UTF-8)."""


def ref_to(where: str, name: str, quote_all: bool) -> str:
    """A `$ref` to `name` in `where` (`$defs` or `definitions`): a JSON Pointer in a URI
    fragment (RFC 6901, sections 3 and 6), with only what must be percent-encoded encoded, or
    every character that may be."""
    escaped = name.replace("~", "~0").replace("/", "~1")
    if quote_all:
        return f"#/{where}/" + "".join(f"%{byte:02X}" for byte in escaped.encode())
    return f"#/{where}/{quote(escaped)}"


# Character classes of the one-pattern form: members are characters (each but letters and
# digits escaped, which the form allows and which keeps `-`, `]`, `^` and `\` literal) and
# ranges. `&`, `~` and `|` are left out: Python's `re` warns about `&&`, `~~` and `||` in a
# class (future set operations) where ECMA-262 reads them as characters.
CLASS_CHARACTERS = st.sampled_from(list("abxyz019 .-_]^\\[$"))
RANGES = st.sampled_from(["a-c", "x-z", "0-9", "A-Z", "a-a"])


@st.composite
def character_classes(draw: st.DrawFn) -> str:
    members = draw(
        st.lists(
            st.one_of(RANGES, CLASS_CHARACTERS.map(lambda c: c if c.isalnum() else "\\" + c)),
            min_size=1,
            max_size=3,
        )
    )
    return "[" + "".join(members) + "]"


@st.composite
def patterns(draw: st.DrawFn) -> str:
    """`^`, classes of a fixed count, a last class of any count, `$` (`class_pattern`)."""
    fixed = draw(
        st.lists(
            st.tuples(character_classes(), st.sampled_from(["", "{0}", "{1}", "{2}"])),
            max_size=2,
        )
    )
    last = draw(character_classes())
    count = draw(st.sampled_from(["", "?", "*", "+", "{2}", "{1,}", "{0,3}", "{1,2}", "{0}"]))
    pattern = "^" + "".join(c + n for c, n in fixed) + last + count + "$"
    assert class_pattern(pattern) is not None, pattern
    return pattern


SMALL = st.integers(0, 4)
BOUNDS = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -1.5, 2.0]))
WORDS = st.sampled_from(
    [
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "pattern",
        "$ref",
    ]
)


@st.composite
def schemas(draw: st.DrawFn, depth: int, free: tuple[str, ...], guarded: tuple[str, ...]) -> Any:
    """A schema of the subset. `free`: the `$ref`s it may make where it stands; `guarded`: the
    ones it may make below `properties`, `items` or `additionalProperties`, which take one
    level of the value each (so every `$ref` cycle ends with the value)."""
    if depth == 0 or draw(st.integers(0, 5)) == 0:
        leaf = [st.booleans(), st.just({}), st.sampled_from(TYPES).map(lambda t: {"type": t})]
        if free:
            leaf.append(st.sampled_from(free).map(lambda ref: {"$ref": ref}))
        return draw(st.one_of(leaf))
    below = schemas(depth - 1, free, guarded)
    consuming = schemas(depth - 1, guarded, guarded)
    schema: dict[str, Any] = {}
    for word in draw(st.sets(WORDS, min_size=1, max_size=4)):
        if word == "type":
            schema[word] = draw(
                st.one_of(
                    st.sampled_from(TYPES),
                    st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True),
                )
            )
        elif word == "enum":
            schema[word] = draw(st.lists(JSON, max_size=3))
        elif word == "const":
            schema[word] = draw(JSON)
        elif word == "properties":
            schema[word] = draw(st.dictionaries(PROPERTY_NAMES, consuming, max_size=3))
        elif word == "required":
            schema[word] = draw(st.lists(PROPERTY_NAMES, max_size=3, unique=True))
        elif word in ("additionalProperties", "items"):
            schema[word] = draw(consuming)
        elif word in ("minItems", "maxItems", "minLength", "maxLength"):
            schema[word] = draw(SMALL)
        elif word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            schema[word] = draw(BOUNDS)
        elif word in ("anyOf", "oneOf", "allOf"):
            schema[word] = draw(st.lists(below, min_size=1, max_size=3))
        elif word == "not":
            schema[word] = draw(below)
        elif word == "pattern":
            schema[word] = draw(patterns())
        elif word == "$ref" and free:
            schema[word] = draw(st.sampled_from(free))
    return schema


@dataclass(frozen=True)
class Case:
    """A root schema, and what each `$ref` in it points at (for drawing values)."""

    schema: Any
    targets: dict[str, Any]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A root schema with `$defs` (or `definitions`): a definition may refer to the root or to
    any definition below a consuming keyword; the root refers to definitions anywhere."""
    where = draw(st.sampled_from(["$defs", "definitions"]))
    names = draw(st.lists(DEF_NAMES, max_size=3, unique=True))
    refs = tuple(ref_to(where, name, draw(st.booleans())) for name in names)
    definitions = {name: draw(schemas(2, (), ("#", *refs))) for name in names}
    root = draw(schemas(3, refs, ("#", *refs)))
    if isinstance(root, bool):
        return Case(root, {})
    schema = {**root, where: definitions} if definitions else root
    targets = dict(zip(refs, definitions.values(), strict=True))
    targets["#"] = schema
    return Case(schema, targets)


# -- values drawn to fit -----------------------------------------------------------------------


@st.composite
def values_for(draw: st.DrawFn, schema: Any, targets: dict[str, Any], depth: int = 0) -> Any:
    """A value that often fits `schema` (it follows one of its forms), else anything."""
    if depth > 5 or not isinstance(schema, dict) or draw(st.integers(0, 9)) == 0:
        return draw(JSON if depth <= 5 else SCALARS)

    def fit(sub: Any) -> Any:
        return draw(values_for(sub, targets, depth + 1))

    ref = schema.get("$ref")
    if ref in targets and draw(st.booleans()):
        return fit(targets[ref])
    for word in ("anyOf", "oneOf", "allOf"):
        if word in schema and draw(st.booleans()):
            return fit(draw(st.sampled_from(schema[word])))
    if "const" in schema and draw(st.integers(0, 3)) > 0:
        return schema["const"]
    if schema.get("enum") and draw(st.integers(0, 3)) > 0:
        return draw(st.sampled_from(schema["enum"]))
    kind = schema.get("type", list(TYPES))
    kind = draw(st.sampled_from(kind if isinstance(kind, list) else [kind]))
    if kind == "object":
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        keys = set(schema.get("required", [])) | draw(
            st.sets(st.sampled_from(sorted(properties) or [""]), max_size=3)
        )
        if draw(st.integers(0, 3)) == 0:
            keys.add(draw(KEYS))
        return {key: fit(properties.get(key, extra)) for key in keys}
    if kind == "array":
        low = schema.get("minItems", 0)
        high = schema.get("maxItems", low + 3)
        count = draw(st.integers(max(0, low - 1), max(low, high) + 1))
        return [fit(schema.get("items", True)) for _ in range(count)]
    if kind == "string":
        pattern = schema.get("pattern")
        if pattern is not None and draw(st.integers(0, 3)) > 0:
            compiled = class_pattern(pattern)
            assert compiled is not None
            return draw(st.from_regex(compiled, fullmatch=True))
        low = schema.get("minLength", 0)
        high = schema.get("maxLength", low + 3)
        return draw(
            st.text(
                st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)),
                min_size=max(0, low - 1),
                max_size=max(low, high) + 1,
            )
        )
    if kind in ("number", "integer"):
        bounds = [schema[w] for w in ("minimum", "maximum", "exclusiveMinimum") if w in schema]
        bounds += [schema[w] for w in ("exclusiveMaximum",) if w in schema]
        near = [b + d for b in bounds for d in (-1, -0.5, 0, 0.5, 1)]
        value = draw(st.one_of(NUMBERS, st.sampled_from(near or [0])))
        return int(value) if kind == "integer" and draw(st.booleans()) else value
    return draw(st.sampled_from({"boolean": [True, False], "null": [None]}[kind]))


# -- the verdicts ------------------------------------------------------------------------------


def verdicts(schema: Any, values: list[Any]) -> tuple[list[bool], list[bool]]:
    """(the checker's, the library's): True where a value fits."""
    library = Draft202012Validator(schema)
    ours = [not payload_problems(schema, value) for value in values]
    theirs = [library.is_valid(value) for value in values]
    return ours, theirs


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(case=cases(), data=st.data())
def test_the_checker_fits_exactly_the_values_jsonschema_finds_valid(
    case: Case, data: st.DataObject
) -> None:
    """On every generated schema of the subset and values for it, the checker and the
    `jsonschema` library (draft 2020-12) agree whether each value fits."""
    assert schema_problems(case.schema) == []  # inside the subset the checker supports
    Draft202012Validator.check_schema(case.schema)  # and a schema of draft 2020-12
    values = data.draw(st.lists(values_for(case.schema, case.targets), min_size=1, max_size=6))
    ours, theirs = verdicts(case.schema, values)
    for fits in theirs:
        hypothesis.event("fits" if fits else "does not fit")
    assert ours == theirs


@pytest.mark.parametrize("schema", [COMMAND, SLEEP], ids=["command", "sleep"])
@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(data=st.data())
def test_the_built_in_kinds_payloads_fit_exactly_when_jsonschema_finds_them_valid(
    schema: Any, data: st.DataObject
) -> None:
    """The schemas Run's own handlers advertise, on values drawn to fit them or not."""
    values = data.draw(st.lists(values_for(schema, {}), min_size=1, max_size=6))
    ours, theirs = verdicts(schema, values)
    assert ours == theirs
