"""The JSON Schema subset payloads are checked by (`moonrun.scheduling.jsonschema_subset`),
keyword by keyword, to the word of each problem and to the step of each bound: what a user
reads in a 422 is its API (docs/protocol.md, "Kinds"), and the bounds are what keeps a hostile
schema cheap.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from moonrun.artifacts.protocol import NAME_PATTERN as PLATFORMS_ARTIFACT_NAME
from moonrun.errors import InvalidPayload, InvalidRequest, TooLarge, UnknownKind
from moonrun.run.handlers.command import ARTIFACT_NAME_PATTERN
from moonrun.run.handlers.command import PAYLOAD_SCHEMA as COMMAND
from moonrun.scheduling.jsonschema_subset import (
    MAX_DEPTH,
    MAX_PROBLEMS,
    STEP_BUDGET,
    Problem,
    class_pattern,
    payload_problems,
    schema_problems,
)
from moonrun.scheduling.kinds import (
    MAX_KINDS,
    Kinds,
    advertisement_json,
    check_advertisement,
    load_advertisement,
    unknown_kind_message,
)

Found = list[tuple[str, str]]


def problems(schema: Any, payload: Any) -> Found:
    return [(p.field, p.message) for p in payload_problems(schema, payload)]


# -- each keyword's problems -------------------------------------------------------------------


TYPES = [
    ({"type": ["string", "null"]}, 1, [("", "must be a string or null, not an integer")]),
    ({"type": ["integer"]}, 2.0, []),
    ({"type": ["integer"]}, 2.5, [("", "must be an integer, not a number")]),
    ({"type": "integer"}, True, [("", "must be an integer, not a boolean")]),
    ({"type": ["integer", "number"]}, 2.5, []),
    ({"type": "number"}, 7, []),
    ({"type": "object"}, [], [("", "must be an object, not an array")]),
    ({"type": "array"}, {}, [("", "must be an array, not an object")]),
    ({"type": "boolean"}, 0, [("", "must be a boolean, not an integer")]),
    ({"type": "null"}, "x", [("", "must be null, not a string")]),
    ({"type": "string"}, None, [("", "must be a string, not null")]),
    # a wrong type says nothing more about the value
    (
        {"type": "string", "minLength": 5, "enum": ["x"]},
        3,
        [("", "must be a string, not an integer")],
    ),
]

SIZES = [
    ({"minItems": 1}, [], [("", "must hold at least 1 item")]),
    ({"minItems": 2}, [1], [("", "must hold at least 2 items")]),
    ({"minItems": 2}, [1, 2], []),
    ({"maxItems": 1}, [1, 2], [("", "must hold at most 1 item")]),
    ({"maxItems": 2}, [1, 2, 3], [("", "must hold at most 2 items")]),
    ({"maxItems": 2}, [1, 2], []),
    ({"minItems": 5, "maxItems": 0}, "not an array", []),
    ({"minLength": 1}, "", [("", "must be at least 1 character long")]),
    ({"minLength": 2}, "a", [("", "must be at least 2 characters long")]),
    ({"minLength": 2}, "ab", []),
    ({"maxLength": 1}, "ab", [("", "must be at most 1 character long")]),
    ({"maxLength": 2}, "abc", [("", "must be at most 2 characters long")]),
    ({"maxLength": 2}, "ab", []),
    ({"minLength": 5, "maxLength": 0}, ["not", "a", "string"], []),
    ({"minLength": 2, "maxLength": 1}, "ab", [("", "must be at most 1 character long")]),
]

BOUNDS = [
    ({"minimum": 1}, 0, [("", "must be at least 1")]),
    ({"minimum": 1}, 1, []),
    ({"exclusiveMinimum": 1}, 1, [("", "must be more than 1")]),
    ({"exclusiveMinimum": 1}, 1.5, []),
    ({"maximum": 1}, 2, [("", "must be at most 1")]),
    ({"maximum": 1}, 1, []),
    ({"exclusiveMaximum": 1}, 1, [("", "must be less than 1")]),
    ({"exclusiveMaximum": 1.5}, 1, []),
    ({"minimum": 1, "maximum": 0}, "zero", []),
    ({"minimum": 2, "maximum": 0}, 1, [("", "must be at least 2"), ("", "must be at most 0")]),
    ({"maximum": 0}, True, []),
]

VALUES = [
    ({"const": "x" * 50}, "y", [("", 'must be "' + "x" * 36 + "...")]),
    ({"const": {"a": [1, True, None]}}, {"a": [1, True]}, [("", 'must be {"a":[1,true,null]}')]),
    ({"const": {"a": [1, True, None]}}, {"a": [1.0, True, None]}, []),
    ({"const": [1, 2]}, [2, 1], [("", "must be [1,2]")]),
    ({"const": {"a": 1}}, {"b": 1}, [("", 'must be {"a":1}')]),
    ({"const": {"a": 1}}, {"a": 2}, [("", 'must be {"a":1}')]),
    ({"const": "1"}, 1, [("", 'must be "1"')]),
    ({"const": None}, False, [("", "must be null")]),
    ({"const": 0}, False, [("", "must be 0")]),
    ({"const": False}, 0, [("", "must be false")]),
    ({"const": True}, True, []),
    ({"enum": ["a", 1, None]}, "b", [("", 'must be one of "a", 1, null')]),
    ({"enum": ["a", 1, None]}, 1.0, []),
]

OBJECTS = [
    ({"required": ["a", "b c"]}, {}, [("a", "is required"), ('["b c"]', "is required")]),
    ({"required": ["a"]}, "not an object", []),
    ({"required": ["a", 3]}, {"a": 1}, []),
    (
        {"properties": {"a": {"type": "string"}, "b c": {"type": "string"}}},
        {"a": 1, "b c": 2},
        [
            ("a", "must be a string, not an integer"),
            ('["b c"]', "must be a string, not an integer"),
        ],
    ),
    (
        {"additionalProperties": False},
        {"x": 1},
        [("x", "is not a field of this kind (fields: none)")],
    ),
    (
        {"properties": {"b": {}, "a": {}}, "additionalProperties": False},
        {"a": 1, "c": 2},
        [("c", "is not a field of this kind (fields: a, b)")],
    ),
    (
        {"additionalProperties": {"type": "string"}, "properties": {"a": {}}},
        {"a": 1, "b": 2},
        [("b", "must be a string, not an integer")],
    ),
    ({"additionalProperties": True, "properties": {}}, {"x": 1}, []),
    (
        {"properties": {"o": {"properties": {"i": {"type": "null"}}}}},
        {"o": {"i": 1}},
        [("o.i", "must be null, not an integer")],
    ),
    (
        {"properties": {"o": {"required": ["r"], "additionalProperties": False}}},
        {"o": {"x y": 1}},
        [("o.r", "is required"), ('o["x y"]', "is not a field of this kind (fields: none)")],
    ),
    ({"properties": {"a": False}}, {"a": 1}, [("a", "is not allowed")]),
    ({"properties": {"a": {"type": "null"}}}, {"b": 1}, []),
    ({"properties": {"a": {"type": "null"}}}, ["a"], []),
]

ARRAYS = [
    (
        {"items": {"properties": {"n": {"type": "null"}}}},
        [{"n": None}, {"n": 1}],
        [("[1].n", "must be null, not an integer")],
    ),
    (
        {"properties": {"l": {"items": {"type": "null"}}}},
        {"l": [None, 0]},
        [("l[1]", "must be null, not an integer")],
    ),
    ({"items": {"type": "null"}}, {"0": 1}, []),
    ({"items": False}, [], []),
    ({"items": False}, [1], [("[0]", "is not allowed")]),
]

COMBINATIONS = [
    ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, 1, [("", "must be at least 5")]),
    (
        {"allOf": [{"type": "integer"}, {"minimum": 5}]},
        "x",
        [("", "must be an integer, not a string")],
    ),
    (
        {"allOf": [{"minimum": 5}, {"maximum": 0}]},
        1,
        [("", "must be at least 5"), ("", "must be at most 0")],
    ),
    (
        {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "x",
        [("", "matches none of the forms this kind allows")],
    ),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, None, []),
    (
        {"oneOf": [{"type": "integer"}, {"type": "null"}]},
        "x",
        [("", "matches none of the forms this kind allows")],
    ),
    (
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        1,
        [("", "matches more than one of the forms this kind allows")],
    ),
    ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, 3, []),
    ({"not": {"type": "integer"}}, 1, [("", "has a form this kind does not allow")]),
    ({"not": {"type": "integer"}}, "x", []),
    (
        {"type": "integer", "not": {"const": 3}, "anyOf": [{"minimum": 5}]},
        3,
        [
            ("", "matches none of the forms this kind allows"),
            ("", "has a form this kind does not allow"),
        ],
    ),
]

REFERENCES = [
    (
        {
            "$defs": {"a/b": {"type": "null"}, "c~d": {"type": "null"}},
            "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c~0d"}},
        },
        {"x": 1, "y": 2},
        [("x", "must be null, not an integer"), ("y", "must be null, not an integer")],
    ),
    (
        {"definitions": {"n": {"type": "null"}}, "$ref": "#/definitions/n"},
        1,
        [("", "must be null, not an integer")],
    ),
    (
        {"properties": {"self": {"$ref": "#"}}, "type": "object"},
        {"self": {"self": 1}},
        [("self.self", "must be an object, not an integer")],
    ),
    ({"$ref": "#/$defs/missing", "type": "null"}, 1, [("", "must be null, not an integer")]),
    ({"$ref": 3, "type": "null"}, 1, [("", "must be null, not an integer")]),
    ({"$defs": {"n": {"type": "null"}}, "$ref": "#/definitions/n"}, 1, []),
    (
        {"$ref": "#/$defs/n", "$defs": {"n": {"minimum": 3}}, "maximum": 0},
        1,
        [("", "must be at least 3"), ("", "must be at most 0")],
    ),
    (False, 1, [("", "is not allowed")]),
    (True, 1, []),
]


@pytest.mark.parametrize(
    ("schema", "payload", "expected"),
    TYPES + SIZES + BOUNDS + VALUES + OBJECTS + ARRAYS + COMBINATIONS + REFERENCES,
    ids=repr,
)
def test_each_keyword_names_exactly_what_does_not_fit(
    schema: Any, payload: Any, expected: Found
) -> None:
    """Every keyword the checker knows: the field and the words of each problem, in order."""
    assert problems(schema, payload) == expected


POINTERS = [
    ({"$defs": {"a b": {"type": "null"}}, "$ref": "#/$defs/a%20b"}, True),
    ({"$defs": {"%": {"type": "null"}}, "$ref": "#/$defs/%25"}, True),
    ({"$defs": {"a/b": {"type": "null"}}, "$ref": "#/$defs/a~1b"}, True),
    ({"$defs": {"a/b": {"type": "null"}}, "$ref": "#/$defs/a%2Fb"}, False),
    ({"$defs": {"a/b": {"type": "null"}}, "$ref": "#/$defs/a/b"}, False),
    ({"$defs": {"a": {"$defs": {"b": {}}}}, "$ref": "#/$defs/a/$defs/b"}, False),
]


@pytest.mark.parametrize(("schema", "followed"), POINTERS, ids=repr)
def test_a_ref_is_a_json_pointer_in_a_uri_fragment_percent_decoded_then_split(
    schema: Any, followed: bool
) -> None:
    """`$ref`'s fragment is read as JSON Schema reads it (RFC 6901, section 6): `%20` is a
    space and `%2F` a `/` that separates, like an unescaped one; a pointer deeper than one
    definition is not followed, and the schema is unusable rather than read another way
    (the `jsonschema` library found these:
    tests/unit/scheduling/test_kinds_checker_agrees_with_jsonschema.py).
    """
    if followed:
        assert (schema_problems(schema), problems(schema, 1)) == (
            [],
            [("", "must be null, not an integer")],
        )
    else:
        assert schema_problems(schema) == ["$ref must point into the schema's own $defs"]


PAIRS = [
    ({"minItems": 2, "maxItems": 5}, [1], [("", "must hold at least 2 items")]),
    ({"minItems": 2, "maxItems": 5}, [1] * 6, [("", "must hold at most 5 items")]),
    ({"minLength": 2, "maxLength": 5}, "a", [("", "must be at least 2 characters long")]),
    ({"minLength": 2, "maxLength": 5}, "abcdef", [("", "must be at most 5 characters long")]),
    ({"const": 1, "enum": [2]}, 3, [("", "must be 1"), ("", "must be one of 2")]),
    (
        {"anyOf": [{"type": "null"}], "not": {"type": "string"}},
        "x",
        [
            ("", "matches none of the forms this kind allows"),
            ("", "has a form this kind does not allow"),
        ],
    ),
]


@pytest.mark.parametrize(("schema", "payload", "expected"), PAIRS, ids=repr)
def test_two_keywords_of_one_schema_each_say_their_own_words(
    schema: Any, payload: Any, expected: Found
) -> None:
    """A lower and an upper bound together (or const and enum, anyOf and not): each problem
    is its own keyword's, never the other's (each message was once the last one built)."""
    assert problems(schema, payload) == expected


def test_an_empty_artifact_name_is_too_short_not_too_long() -> None:
    """The command kind's artifact name (1 to 128 characters): "" says at least 1 (and that
    it does not match the name's pattern, which wants a first character)."""
    payload = {"argv": ["true"], "artifacts": [{"path": "out.txt", "name": ""}]}
    expected = [
        ("artifacts[0].name", "must be at least 1 character long"),
        ("artifacts[0].name", f"must match {ARTIFACT_NAME_PATTERN}"),
    ]
    assert problems(COMMAND, payload) == expected


NAMES = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"}


def node_id(value: object) -> str:
    """A test id that can be named again on pytest's command line (mutmut does): brackets,
    backslashes and non-ASCII in `repr` ids are not, so each such character is spelled by its
    code point."""
    text = value if isinstance(value, str) else repr(value)
    spelled = re.sub(r"[^A-Za-z0-9._-]", lambda m: f"_{ord(m.group()):x}_", text)
    return spelled[:40] or "empty"


@pytest.mark.parametrize(
    ("value", "fits"),
    [
        ("report.txt", True),
        ("a", True),
        ("A" * 128, True),
        ("A" * 129, False),
        ("../evil", False),
        ("a/b", False),
        (".hidden", False),
        ("-x", False),
        ("", False),
        ("caf\u00e9", False),
        ("a\n", False),
        (7, True),  # not a string: `type` speaks, `pattern` does not
    ],
    ids=node_id,
)
def test_a_pattern_of_character_classes_refuses_a_string_that_does_not_match(
    value: Any, fits: bool
) -> None:
    """`pattern` in the one form the checker matches: names like paths are refused with the
    pattern in the message (`$` does not let a trailing newline through)."""
    found = problems({"pattern": NAMES["pattern"]}, value)
    assert found == ([] if fits else [("", f"must match {NAMES['pattern']}")])


@pytest.mark.parametrize(
    ("pattern", "rebuilt"),
    [
        ("^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", r"[A-Za-z0-9][A-Za-z0-9\._\-]{0,127}"),
        ("^[a-z]+$", "[a-z]+"),
        ("^[ab]{2}[c]?$", "[ab]{2}[c]?"),
        (r"^[\-\]x]{3,}$", r"[\-\]x]{3,}"),
        ("^[a]*[b]$", None),  # a class of variable count before another: backtracking
        ("^(a+)+$", None),
        ("^[^a]$", None),
        (r"^[\d]$", None),
        ("^[z-a]$", None),
        ("^[]$", None),
        ("^[a]{3,1}$", None),
        ("[a]", None),
        ("^" + "[a]" * 9 + "$", None),
    ],
    ids=node_id,
)
def test_only_a_run_of_character_classes_is_a_pattern_the_checker_matches(
    pattern: str, rebuilt: str | None
) -> None:
    """A pattern is matched only when it is `^`, character classes each but the last of a
    fixed count, `$`; the expression is rebuilt from the classes read (None: ignored)."""
    compiled = class_pattern(pattern)
    assert (compiled.pattern if compiled is not None else None) == rebuilt


def test_the_command_kinds_artifact_name_pattern_is_the_platforms() -> None:
    """What is refused at submit is exactly what the platform would not store."""
    assert PLATFORMS_ARTIFACT_NAME.pattern == ARTIFACT_NAME_PATTERN


def test_a_refusal_names_at_most_twenty_problems() -> None:
    """Twenty-five misfits: the first twenty, in payload order."""
    found = problems({"items": {"type": "string"}}, list(range(25)))
    assert found == [(f"[{n}]", "must be a string, not an integer") for n in range(MAX_PROBLEMS)]


def test_a_problem_describes_itself_from_the_payload_top() -> None:
    """Under `payload`: a member with a dot, an index or an escaped key without one."""
    described = [
        Problem("a.b", "is required").describe(),
        Problem("[2]", "is not allowed").describe(),
        Problem('["x y"]', "is required").describe(),
        Problem("", "must be an object").describe(),
    ]
    assert described == [
        "payload.a.b is required",
        "payload[2] is not allowed",
        'payload["x y"] is required',
        "payload must be an object",
    ]


def test_a_key_of_exactly_sixty_four_characters_is_shown_whole() -> None:
    """64 characters of a key that is not plain are shown whole; 65 are cut to 64 and `...`."""
    closed = {"additionalProperties": False}
    names = [p.field for p in payload_problems(closed, {" " + "k" * 63: 1, " " + "k" * 64: 2})]
    assert names == ['[" ' + "k" * 63 + '"]', '[" ' + "k" * 63 + '..."]']


# -- bounds: depth and steps -------------------------------------------------------------------


def nested(
    levels: int, wrap: Any, leaf_schema: Any, leaf: Any, payload_wrap: Any
) -> tuple[Any, Any]:
    schema, payload = leaf_schema, leaf
    for _ in range(levels):
        schema, payload = wrap(schema), payload_wrap(payload)
    return schema, payload


def same(value: Any) -> Any:
    return value


def refs(levels: int) -> tuple[Any, Any]:
    """A chain of `levels` `$ref`s ending in a schema that refuses 1."""
    defs: dict[str, Any] = {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(levels - 1)}
    defs[f"d{levels - 1}"] = {"type": "null"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}, 1


CHAINS = {
    "properties": lambda n: nested(
        n, lambda s: {"properties": {"a": s}}, {"type": "null"}, 1, lambda p: {"a": p}
    ),
    "items": lambda n: nested(n, lambda s: {"items": s}, {"type": "null"}, 1, lambda p: [p]),
    "items, false": lambda n: nested(n, lambda s: {"items": s}, False, 1, lambda p: [p]),
    "additionalProperties": lambda n: nested(
        n, lambda s: {"additionalProperties": s}, {"type": "null"}, 1, lambda p: {"a": p}
    ),
    "allOf": lambda n: nested(n, lambda s: {"allOf": [s]}, {"type": "null"}, 1, same),
    "anyOf": lambda n: nested(n, lambda s: {"anyOf": [s]}, {"type": "null"}, 1, same),
    "oneOf": lambda n: nested(n, lambda s: {"oneOf": [s]}, {"type": "null"}, 1, same),
    "not": lambda n: nested(
        n, lambda s: {"allOf": [{"not": {"not": s}}]}, {"type": "null"}, 1, same
    ),
    "$ref": refs,
}


@pytest.fixture
def deep_stack() -> Iterator[None]:
    """Room for schemas compiled 129 levels deep under a tracer (mutmut's trampolines take
    several frames per call); nothing else changes."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.usefixtures("deep_stack")
@pytest.mark.parametrize("construct", sorted(CHAINS))
def test_a_check_nested_to_the_depth_bound_still_answers_and_one_deeper_gives_up(
    construct: str,
) -> None:
    """Nested to MAX_DEPTH (128) levels the misfit is found; one level more, the check gives
    up and accepts (each keyword counts one level per schema it enters)."""
    build = CHAINS[construct]
    levels = MAX_DEPTH // 3 if construct == "not" else MAX_DEPTH
    at_bound, past = build(levels), build(levels + 1)
    assert (problems(*at_bound) != [], problems(*past)) == (True, [])


@pytest.mark.parametrize(
    ("item", "per_item"),
    [({"type": "integer"}, 1), (False, 1), ({"anyOf": [{"type": "integer"}]}, 2)],
    ids=["typed", "false", "anyOf"],
)
def test_a_check_of_exactly_its_step_budget_answers_and_one_step_more_gives_up(
    item: Any, per_item: int
) -> None:
    """The root counts one step and each item `per_item`: at STEP_BUDGET steps a misfit is
    still found; at one step more the check gives up and accepts."""
    schema = {"items": item}
    fits = (STEP_BUDGET - 1) // per_item
    within = [0] * (fits - 1) + ["x"]
    beyond = [0] * fits + ["x"]
    assert (problems(schema, within) != [], problems(schema, beyond)) == (True, [])


# -- schemas --------------------------------------------------------------------------------------


TYPE_WORDS = (
    "type must be one of object, array, string, number, integer, boolean, null (or a list of them)"
)
SCHEMAS = [
    (True, []),
    (False, []),
    ({}, []),
    ("string", ["the schema must be an object or a boolean"]),
    ([], ["the schema must be an object or a boolean"]),
    ({"type": []}, [TYPE_WORDS]),
    ({"type": ["string", "nope"]}, [TYPE_WORDS]),
    ({"type": 3}, [TYPE_WORDS]),
    ({"type": ["null", "object"]}, []),
    ({"enum": "a"}, ["enum must be an array"]),
    ({"enum": []}, []),
    ({"required": "a"}, ["required must be an array of strings"]),
    ({"required": ["a", 1]}, ["required must be an array of strings"]),
    ({"required": []}, []),
    ({"minItems": -1}, ["minItems must be a non-negative integer"]),
    ({"maxItems": 1.5}, ["maxItems must be a non-negative integer"]),
    ({"minLength": True}, ["minLength must be a non-negative integer"]),
    ({"maxLength": 2.0}, []),
    ({"minLength": 0}, []),
    ({"minimum": "1"}, ["minimum must be a number"]),
    ({"maximum": True}, ["maximum must be a number"]),
    ({"exclusiveMinimum": -0.5, "exclusiveMaximum": 1.5}, []),
    ({"properties": []}, ["properties must be an object"]),
    ({"properties": {"a": 3}}, ["properties.a must be an object or a boolean"]),
    ({"additionalProperties": 3}, ["additionalProperties must be an object or a boolean"]),
    ({"items": 3}, ["items must be an object or a boolean"]),
    ({"not": 3}, ["not must be an object or a boolean"]),
    ({"anyOf": []}, ["anyOf must be a non-empty array"]),
    ({"oneOf": {}}, ["oneOf must be a non-empty array"]),
    ({"allOf": [{}, 3]}, ["allOf[1] must be an object or a boolean"]),
    ({"$defs": []}, ["$defs must be an object"]),
    ({"definitions": 3}, ["definitions must be an object"]),
    ({"$defs": {"a": 3}}, ["$defs.a must be an object or a boolean"]),
    ({"definitions": {"b": "x"}}, ["definitions.b must be an object or a boolean"]),
    ({"$ref": "#/$defs/none"}, ["$ref must point into the schema's own $defs"]),
    ({"$ref": 3}, ["$ref must point into the schema's own $defs"]),
    ({"$ref": "#"}, []),
    ({"$defs": {"a": {}}, "$ref": "#/$defs/a"}, []),
    ({"definitions": {"a": {}}, "$ref": "#/definitions/a"}, []),
    (
        {"$defs": {"a": {}}, "$ref": "#/definitions/a"},
        ["$ref must point into the schema's own $defs"],
    ),
    (
        {"properties": {"a": {"items": {"anyOf": [{"type": "x"}]}}}},
        [f"properties.a.items.anyOf[0].{TYPE_WORDS}"],
    ),
    ({"$defs": {"d": {"not": {"minimum": "x"}}}}, ["$defs.d.not.minimum must be a number"]),
    (
        {"definitions": {"d": {"additionalProperties": {"enum": 1}}}},
        ["definitions.d.additionalProperties.enum must be an array"],
    ),
    ({"oneOf": [{"required": [1]}]}, ["oneOf[0].required must be an array of strings"]),
    ({"pattern": 3}, ["pattern must be a string"]),
    ({"pattern": "^(a+)+$"}, []),
]


@pytest.mark.parametrize(("schema", "expected"), SCHEMAS, ids=repr)
def test_a_schema_is_unusable_for_exactly_these_reasons(schema: Any, expected: list[str]) -> None:
    """Each known keyword of the wrong type, each dangling `$ref`, named by its path."""
    assert schema_problems(schema) == expected


def test_a_schema_with_every_keyword_wrong_names_twenty_of_them() -> None:
    """One problem per keyword, in the checker's order, at most twenty."""
    words = ["minItems", "maxItems", "minLength", "maxLength"]
    bounds = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]
    schema: dict[str, Any] = dict.fromkeys(words, -1) | dict.fromkeys(bounds, "a")
    schema |= dict.fromkeys(("enum", "required", "properties", "anyOf", "oneOf", "allOf"), 1)
    schema |= {"type": "x", "$defs": 1, "definitions": 1, "$ref": "x", "items": 1, "not": 1}
    schema |= {"additionalProperties": 1}
    expected = [
        TYPE_WORDS,
        "enum must be an array",
        "required must be an array of strings",
        *(f"{word} must be a non-negative integer" for word in words),
        *(f"{word} must be a number" for word in bounds),
        "properties must be an object",
        "additionalProperties must be an object or a boolean",
        "items must be an object or a boolean",
        "not must be an object or a boolean",
        "anyOf must be a non-empty array",
        "oneOf must be a non-empty array",
        "allOf must be a non-empty array",
        "$defs must be an object",
        "definitions must be an object",
    ]
    assert schema_problems(schema) == expected


# -- advertisements and kinds --------------------------------------------------------------------


def refusal(kinds: Any) -> tuple[type[Exception], str]:
    try:
        check_advertisement(kinds)
    except (InvalidRequest, TooLarge) as error:
        return type(error), error.message
    raise AssertionError("accepted")


def test_an_advertisement_is_refused_saying_why() -> None:
    """Not an object, too many kinds, a bad name, an unusable schema: each says what."""
    found = [
        refusal(["noop"]),
        refusal({f"k{n}": {} for n in range(MAX_KINDS + 1)}),
        refusal({"Noop": {}}),
        refusal({"noop": {"type": "str"}}),
    ]
    assert found == [
        (InvalidRequest, "kinds must be an object of kind name to payload schema"),
        (InvalidRequest, "kinds names more than 64 kinds"),
        (InvalidRequest, "every kind must match ^[a-z][a-z0-9_.-]{0,63}$"),
        (InvalidRequest, f"the schema of kind noop is not usable: {TYPE_WORDS}"),
    ]


def test_an_advertisement_of_exactly_sixty_four_kinds_is_accepted() -> None:
    """MAX_KINDS kinds are fine; the refusal starts at one more."""
    kinds = {f"k{n}": {} for n in range(MAX_KINDS)}
    assert check_advertisement(kinds) == kinds


def test_a_whole_advertisement_past_its_size_limit_is_too_large() -> None:
    """Each schema under 16 KiB, together over 128 KiB: 413 too_large for `kinds`."""
    schema = {"description": "x" * 15_000}
    with pytest.raises(TooLarge) as refused:
        check_advertisement({f"k{n}": schema for n in range(10)})
    assert "kinds" in refused.value.message


def test_an_advertisement_is_stored_compact_with_sorted_keys_and_read_back() -> None:
    """advertisement_json is the stored text; load_advertisement gives the same kinds back."""
    kinds = {"sleep": {"type": "object"}, "noop": {}}
    stored = advertisement_json(kinds)
    assert (stored, load_advertisement(stored)) == ('{"noop":{},"sleep":{"type":"object"}}', kinds)


def test_an_unknown_kind_names_the_closest_only_when_one_is_close() -> None:
    """A near miss suggests its kind; a far one only lists them; nothing advertised, neither."""
    kinds = {"command": {}, "sleep": {}}
    messages = [
        unknown_kind_message("sleeep", kinds),
        unknown_kind_message("zzz", kinds),
        unknown_kind_message("zzz", {}),
    ]
    assert messages == [
        "this server's Run does not run 'sleeep' jobs (did you mean 'sleep'?); "
        "it runs command, sleep",
        "this server's Run does not run 'zzz' jobs; it runs command, sleep",
        "this server's Run does not run 'zzz' jobs",
    ]


def test_kinds_check_each_job_against_its_own_kind() -> None:
    """A payload fit for one kind is refused by another; an unknown kind is UnknownKind."""
    kinds = Kinds({"wait": {"required": ["seconds"]}, "any": {}})
    kinds.check("any", {})
    kinds.check("wait", {"seconds": 1})
    kinds.check("wait", {"seconds": 2})  # the compiled checker, kept
    with pytest.raises(InvalidPayload) as refused:
        kinds.check("wait", {"second": 1})
    with pytest.raises(UnknownKind):
        kinds.check("sleep", {})
    assert (refused.value.message, refused.value.fields) == (
        "payload.seconds is required",
        (("seconds", "is required"),),
    )


def test_an_invalid_payload_joins_every_problem_in_its_message() -> None:
    """Several problems: one message, `; `-separated, each described from the payload top."""
    kinds = Kinds({"k": {"required": ["a", "b"]}})
    with pytest.raises(InvalidPayload) as refused:
        kinds.check("k", {})
    assert refused.value.message == "payload.a is required; payload.b is required"


# -- what the compiled checker must not lose ----------------------------------------------------


class Ordered(dict):  # type: ignore[type-arg]
    """A dict subclass, as a caller's own payload may be (not a parsed JSON value)."""


class Text(str):
    """A str subclass."""


def test_values_that_are_not_parsed_json_are_typed_the_slow_way() -> None:
    """A dict or str subclass has its JSON type; an unknown type name matches nothing."""
    found = [
        problems({"type": "object"}, Ordered(a=1)),
        problems({"type": "object", "required": ["b"]}, Ordered(a=1)),
        problems({"type": "integer"}, Text("1")),
        problems({"type": ["nope", "string"]}, "x"),
        problems({"type": "string"}, 2.0),
    ]
    assert found == [
        [],
        [("b", "is required")],
        [("", "must be an integer, not a string")],
        [],
        [("", "must be a string, not an integer")],
    ]


def test_json_equality_tells_empty_containers_from_empty_strings() -> None:
    """`[]` and `{}` are neither `""` nor each other."""
    found = [
        problems({"const": []}, ""),
        problems({"const": {}}, ""),
        problems({"const": {}}, []),
        problems({"const": ""}, []),
    ]
    assert found == [
        [("", "must be []")],
        [("", "must be {}")],
        [("", "must be {}")],
        [("", 'must be ""')],
    ]


def test_a_value_of_forty_characters_is_shown_whole_and_one_more_is_cut() -> None:
    """A const's JSON of 40 characters is named whole; at 41, its first 37 and `...`."""
    forty, forty_one = "x" * 38, "x" * 39
    found = [problems({"const": forty}, 1), problems({"const": forty_one}, 1)]
    assert found == [
        [("", f'must be "{forty}"')],
        [("", 'must be "' + "x" * 36 + "...")],
    ]


def test_members_without_a_schema_of_their_own_cost_no_steps() -> None:
    """With no additionalProperties schema, 20,000 unnamed members are not walked: the named
    one's misfit is still found (walking them would pass the step budget and accept)."""
    schema = {"properties": {"zzz": {"type": "null"}}}
    payload = {f"k{n}": 0 for n in range(STEP_BUDGET)} | {"zzz": 1}
    assert problems(schema, payload) == [("zzz", "must be null, not an integer")]


def test_items_without_a_schema_of_their_own_cost_no_steps() -> None:
    """With no items schema, 20,000 items are not walked: maxItems still answers."""
    assert problems({"maxItems": 1}, [0] * STEP_BUDGET) == [("", "must hold at most 1 item")]


def test_additional_members_are_named_from_the_payload_top() -> None:
    """An additionalProperties misfit inside a member is named `o.b`, not `b`."""
    schema = {"properties": {"o": {"additionalProperties": {"type": "string"}}}}
    assert problems(schema, {"o": {"b": 1}}) == [("o.b", "must be a string, not an integer")]


@pytest.mark.parametrize(
    ("schema", "payload", "expected"),
    [
        (
            {"items": {}, "anyOf": [{"type": "null"}]},
            [],
            "matches none of the forms this kind allows",
        ),
        ({"allOf": [{}], "not": {}}, 1, "has a form this kind does not allow"),
        ({"oneOf": [{}], "not": {}}, 1, "has a form this kind does not allow"),
        ({"required": ["a"], "minimum": 5}, 1, "must be at least 5"),
        (
            {"properties": {"a": {}}, "anyOf": [{"type": "null"}]},
            {"a": 1},
            "matches none of the forms this kind allows",
        ),
    ],
    ids=["items", "allOf", "oneOf", "members of a non-object", "members"],
)
def test_a_keyword_that_fits_lets_the_next_keywords_speak(
    schema: Any, payload: Any, expected: str
) -> None:
    """items, allOf, oneOf and properties go on to the keywords after them (only a wrong type
    stops a node)."""
    assert problems(schema, payload) == [("", expected)]


def test_refs_anywhere_in_a_schema_resolve_against_its_root() -> None:
    """A `$ref` in properties, items, not, anyOf or $defs points into the root's $defs."""
    ref = {"$ref": "#/$defs/a"}
    schema = {
        "$defs": {"a": {}, "b": ref},
        "definitions": {"c": ref},
        "properties": {"p": ref},
        "items": ref,
        "not": ref,
        "additionalProperties": ref,
        "anyOf": [ref],
    }
    assert schema_problems(schema) == []


def test_a_member_name_ending_in_x_is_named_whole() -> None:
    """Only the trailing dot of a path is dropped: `properties.boX`, not `properties.bo`."""
    assert schema_problems({"properties": {"boX": 3}}) == [
        "properties.boX must be an object or a boolean"
    ]


def test_one_kinds_schema_past_its_bounds_is_refused_naming_the_kind() -> None:
    """Over 16 KiB: 413 naming `kinds.noop`; deeper than 32 levels: 422 naming it too."""
    deep: Any = {}
    for _ in range(33):
        deep = {"not": deep}
    found = [
        refusal({"noop": {"description": "x" * 17_000}}),
        refusal({"noop": deep}),
        refusal({f"k{n}": {"description": "x" * 15_000} for n in range(10)}),
    ]
    assert [(kind, message.split(" is ")[0].split(" nests ")[0]) for kind, message in found] == [
        (TooLarge, "kinds.noop"),
        (InvalidRequest, "kinds.noop"),
        (TooLarge, "kinds"),
    ]
    assert found[1][1] == "kinds.noop nests deeper than 32 levels (depth limit)"
