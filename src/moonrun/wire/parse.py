"""Run's checked parse of an answer: a decoded JSON value against its declared shape.

`parse(RegisterAnswer, value, where)` returns `value` typed as the shape once every key the
shape requires is there with a value of its type, and raises `ForeignAnswer` (a kind of
`Unreachable`: as good as no answer) naming the first field that is not. Keys the shape does not
name are left alone (a newer platform may send more); a `NotRequired` key may be absent.

Hand-written, not pydantic: Run must not load pydantic (its start-up time,
tests/project/test_layers.py), and the shapes keep to a small grammar that a check compiled
once per shape covers: `str`, `int`, `float` (an integer too), `bool`, `None`, `X | None`,
`list[X]`, `dict[str, X]` (a map such as labels), `Any`, and TypedDicts of these. A
declaration outside it fails when its check is compiled (`TypeError`), which the tests do for
every shape.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, NotRequired, TypeVar, cast

from typing_extensions import is_typeddict

from moonrun.errors import ForeignAnswer

T = TypeVar("T")

Problem = tuple[str, str]
"""Where in the value (`.jobs[0].lease`; "" is the value itself) and what is wrong there."""
Check = Callable[[object], Problem | None]
"""A compiled check: None when the value fits its annotation."""

_compiled: dict[object, Check] = {}


def parse(shape: type[T], value: object, where: str) -> T:
    """`value` as `shape`, checked; `where` names the answer in the error (a route, say)."""
    problem = check_of(shape)(value)
    if problem is not None:
        place, wrong = problem
        field = f" at {place.removeprefix('.')}" if place else ""
        raise ForeignAnswer(f"the platform answered {where} in a foreign shape{field}: {wrong}")
    return cast(T, value)


def check_of(annotation: object) -> Check:
    """The check of one annotation, compiled once."""
    check = _compiled.get(annotation)
    if check is None:
        check = _compile(annotation)
        _compiled[annotation] = check
    return check


def _compile(annotation: object) -> Check:
    if annotation is Any:
        return lambda value: None
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return _list_check(check_of(args[0]))
    if origin is dict and len(args) == 2 and args[0] is str:
        return _map_check(check_of(args[1]))
    if origin in (types.UnionType, typing.Union) and type(None) in args and len(args) == 2:
        (inner,) = (arg for arg in args if arg is not type(None))
        return _optional_check(check_of(inner))
    if is_typeddict(annotation):
        return _typed_dict_check(cast(type, annotation))
    raise TypeError(f"{annotation!r} is outside the wire shapes' grammar")


def _scalar(name: str, fits: Callable[[object], bool]) -> Check:
    def check(value: object) -> Problem | None:
        return None if fits(value) else ("", f"expected {name}, got {_kind(value)}")

    return check


_SCALARS: dict[object, Check] = {
    str: _scalar("a string", lambda value: type(value) is str),
    int: _scalar("an integer", lambda value: type(value) is int),
    float: _scalar("a number", lambda value: type(value) is float or type(value) is int),
    bool: _scalar("a boolean", lambda value: value is True or value is False),
    type(None): _scalar("null", lambda value: value is None),
}

_KINDS = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _kind(value: object) -> str:
    """A JSON value's type, as JSON names it (never the value: it may be a secret)."""
    return _KINDS.get(type(value), type(value).__name__)


def _list_check(item: Check) -> Check:
    def check(value: object) -> Problem | None:
        if type(value) is not list:
            return "", f"expected an array, got {_kind(value)}"
        for index, element in enumerate(value):
            problem = item(element)
            if problem is not None:
                return f"[{index}]{problem[0]}", problem[1]
        return None

    return check


def _map_check(item: Check) -> Check:
    # JSON object keys are always strings: only the values need checking.
    def check(value: object) -> Problem | None:
        if type(value) is not dict:
            return "", f"expected an object, got {_kind(value)}"
        for key, element in value.items():
            problem = item(element)
            if problem is not None:
                return f".{key}{problem[0]}", problem[1]
        return None

    return check


def _optional_check(inner: Check) -> Check:
    def check(value: object) -> Problem | None:
        if value is None:
            return None
        problem = inner(value)
        if problem is None or problem[0]:
            return problem
        return "", problem[1].replace(", got", " or null, got", 1)

    return check


def _typed_dict_check(shape: type) -> Check:
    hints = typing.get_type_hints(shape, include_extras=True)
    required: list[tuple[str, Check]] = []
    optional: list[tuple[str, Check]] = []
    for name, hint in hints.items():
        if typing.get_origin(hint) is NotRequired:
            optional.append((name, check_of(typing.get_args(hint)[0])))
        else:
            required.append((name, check_of(hint)))

    def check(value: object) -> Problem | None:
        if type(value) is not dict:
            return "", f"expected an object, got {_kind(value)}"
        for name, field in required:
            if name not in value:
                return f".{name}", "missing"
            problem = field(value[name])
            if problem is not None:
                return f".{name}{problem[0]}", problem[1]
        for name, field in optional:
            if name in value:
                problem = field(value[name])
                if problem is not None:
                    return f".{name}{problem[0]}", problem[1]
        return None

    return check
