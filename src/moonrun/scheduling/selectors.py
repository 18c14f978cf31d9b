"""Label selectors in Kubernetes' syntax: `k=v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.

A comma joins requirements (all must hold); the empty selector matches everything; `k==v` is
`k=v`, and the set of `in`/`notin` may not be empty. A value is
written bare: any characters but white space, `,`, `(`, `)`, `=` and `!`, so a label whose value
holds one of those cannot be selected by it (docs/protocol.md, "Selectors").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from moonrun.errors import InvalidSelector
from moonrun.scheduling.labels import KEY_PATTERN, MAX_VALUE_LENGTH

MAX_SELECTOR_LENGTH: Final = 4096
"""Longer selectors are refused before parsing: enough for any real one, and it bounds work."""

_SPECIAL: Final = frozenset(",()=!")


class Op(Enum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One condition on one key."""

    key: str
    op: Op
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.op:
            case Op.EXISTS:
                return value is not None
            case Op.DOES_NOT_EXIST:
                return value is None
            case Op.EQUALS | Op.IN:
                return value is not None and value in self.values
            case Op.NOT_EQUALS | Op.NOT_IN:
                # As in Kubernetes: a label that is absent is not equal to anything.
                return value is None or value not in self.values

    def __str__(self) -> str:
        match self.op:
            case Op.EXISTS:
                return self.key
            case Op.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Op.EQUALS | Op.NOT_EQUALS:
                return f"{self.key}{self.op.value}{self.values[0]}"
            case Op.IN | Op.NOT_IN:
                # A set of the empty value alone is `(,)`: `()` is refused as an empty set.
                written = "," if self.values == ("",) else ",".join(self.values)
                return f"{self.key} {self.op.value} ({written})"


@dataclass(frozen=True, slots=True)
class Selector:
    """Requirements that must all hold."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


EVERYTHING: Final = Selector()


def parse_selector(text: str) -> Selector:
    """The selector `text` says, or `InvalidSelector` saying where (counting from 0) it stops
    making sense. The message names the position, never the text (it is echoed to logs)."""
    if not isinstance(text, str):
        raise _refusal(0, "a selector must be a string")
    if len(text) > MAX_SELECTOR_LENGTH:
        limit = MAX_SELECTOR_LENGTH
        raise _refusal(limit, f"a selector is at most {limit} characters")
    return _Parser(text).selector()


def _refusal(position: int, problem: str) -> InvalidSelector:
    message = f"selector does not parse at position {position}: {problem}"
    return InvalidSelector(message, fields=(("selector", message),), position=position)


class _Parser:
    """A recursive-descent parser over the text; `at` is the next character's index."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def selector(self) -> Selector:
        self.blank()
        if self.at == len(self.text):
            return EVERYTHING
        requirements = [self.requirement()]
        while self.peek() == ",":
            self.at += 1
            requirements.append(self.requirement())
        if self.at != len(self.text):
            raise _refusal(self.at, "expected ',' or the end")
        return Selector(tuple(requirements))

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.at += 1
            return Requirement(self.key(), Op.DOES_NOT_EXIST)
        key = self.key()
        after_key = self.at
        following = self.peek()
        if following == "=":
            self.at += 2 if self.text.startswith("==", self.at) else 1
            return Requirement(key, Op.EQUALS, (self.value(),))
        if following == "!":
            if not self.text.startswith("!=", self.at):
                raise _refusal(self.at, "expected '!='")
            self.at += 2
            return Requirement(key, Op.NOT_EQUALS, (self.value(),))
        word = self.word()
        if word in ("in", "notin") and self.at > after_key:
            op = Op.IN if word == "in" else Op.NOT_IN
            return Requirement(key, op, self.values())
        if word:
            raise _refusal(self.at - len(word), "expected an operator: =, !=, in or notin")
        return Requirement(key, Op.EXISTS)

    def key(self) -> str:
        self.blank()
        start = self.at
        word = self.word()
        if not word:
            raise _refusal(start, "expected a label key")
        if not KEY_PATTERN.fullmatch(word):
            raise _refusal(start, f"a label key must match {KEY_PATTERN.pattern}")
        return word

    def value(self) -> str:
        self.blank()
        start = self.at
        word = self.word()
        if len(word) > MAX_VALUE_LENGTH:
            raise _refusal(start, f"a value is at most {MAX_VALUE_LENGTH} characters")
        return word

    def values(self) -> tuple[str, ...]:
        if self.peek() != "(":
            raise _refusal(self.at, "expected '('")
        self.at += 1
        if self.peek() == ")":
            # As Kubernetes: `in ()` would match nothing and `notin ()` everything, surely not
            # what was meant. `(a,)` stays a set holding "" (Kubernetes reads it so too).
            raise _refusal(self.at, "expected a value: the set of 'in' or 'notin' is empty")
        values = [self.value()]
        while self.peek() == ",":
            self.at += 1
            values.append(self.value())
        if self.peek() != ")":
            raise _refusal(self.at, "expected ',' or ')'")
        self.at += 1
        return tuple(dict.fromkeys(values))  # a set, as in Kubernetes: `(a,a)` is `(a)`

    def word(self) -> str:
        """The bare word at `at` (maybe empty), and `at` moved past it."""
        start = self.at
        text = self.text
        while self.at < len(text) and not text[self.at].isspace() and text[self.at] not in _SPECIAL:
            self.at += 1
        return text[start : self.at]

    def peek(self) -> str:
        """The next character that is not white space ("" at the end), `at` moved onto it."""
        self.blank()
        return self.text[self.at] if self.at < len(self.text) else ""

    def blank(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1
