"""The small part of RFC 8941 structured fields that request signatures need.

Dictionaries whose members are items or inner lists, with parameters; items are integers,
strings, tokens, byte sequences or booleans. Parsing is strict: anything else is `SfvError`.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field

BareItem = int | str | bytes | bool


class Token(str):
    """An sf-token (unquoted), as opposed to an sf-string."""

    __slots__ = ()


class SfvError(ValueError):
    """The header is not a structured field of the expected shape."""


@dataclass(frozen=True)
class Member:
    """A dictionary member: an item or an inner list, each with parameters."""

    value: BareItem | tuple[BareItem, ...]
    params: dict[str, BareItem] = field(default_factory=dict)

    @property
    def is_inner_list(self) -> bool:
        return isinstance(self.value, tuple)


_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*")
_INTEGER = re.compile(r"-?[0-9]{1,15}")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip(self, chars: str) -> None:
        while self.peek() and self.peek() in chars:
            self.pos += 1

    def match(self, pattern: re.Pattern[str]) -> str:
        found = pattern.match(self.text, self.pos)
        if not found:
            raise SfvError(f"unexpected input at {self.pos}")
        self.pos = found.end()
        return found.group()

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise SfvError(f"expected {char!r} at {self.pos}")
        self.pos += 1

    def dictionary(self) -> dict[str, Member]:
        members: dict[str, Member] = {}
        self.skip(" ")
        while self.peek():
            key = self.match(_KEY)
            if self.peek() == "=":
                self.pos += 1
                members[key] = self.item_or_inner_list()
            else:
                members[key] = Member(True, self.params())
            self.skip(" \t")
            if not self.peek():
                break
            self.expect(",")
            self.skip(" \t")
            if not self.peek():
                raise SfvError("trailing comma")
        return members

    def item_or_inner_list(self) -> Member:
        if self.peek() == "(":
            self.pos += 1
            items: list[BareItem] = []
            while True:
                self.skip(" ")
                if self.peek() == ")":
                    self.pos += 1
                    return Member(tuple(items), self.params())
                items.append(self.bare_item())
                self.params()  # parameters on inner-list items are allowed and ignored
                if self.peek() not in " )":
                    raise SfvError(f"bad inner list at {self.pos}")
        return Member(self.bare_item(), self.params())

    def params(self) -> dict[str, BareItem]:
        params: dict[str, BareItem] = {}
        while self.peek() == ";":
            self.pos += 1
            self.skip(" ")
            key = self.match(_KEY)
            if self.peek() == "=":
                self.pos += 1
                params[key] = self.bare_item()
            else:
                params[key] = True
        return params

    def bare_item(self) -> BareItem:
        char = self.peek()
        if char == '"':
            return self.string()
        if char == ":":
            return self.byte_sequence()
        if char == "?":
            self.pos += 1
            flag = self.peek()
            if flag not in ("0", "1"):
                raise SfvError("bad boolean")
            self.pos += 1
            return flag == "1"
        if char == "-" or char.isdigit():
            return int(self.match(_INTEGER))
        if char.isalpha() or char == "*":
            return Token(self.match(_TOKEN))
        raise SfvError(f"unexpected {char!r} at {self.pos}")

    def string(self) -> str:
        self.expect('"')
        out: list[str] = []
        while True:
            char = self.peek()
            if not char:
                raise SfvError("unterminated string")
            self.pos += 1
            if char == '"':
                return "".join(out)
            if char == "\\":
                escaped = self.peek()
                if escaped not in ('"', "\\"):
                    raise SfvError("bad escape")
                self.pos += 1
                out.append(escaped)
            elif " " <= char <= "~":
                out.append(char)
            else:
                raise SfvError("non-ASCII in string")

    def byte_sequence(self) -> bytes:
        self.expect(":")
        end = self.text.find(":", self.pos)
        if end < 0:
            raise SfvError("unterminated byte sequence")
        chunk = self.text[self.pos : end]
        self.pos = end + 1
        try:
            return base64.b64decode(chunk, validate=True)
        except binascii.Error:
            raise SfvError("bad base64 in byte sequence") from None


def parse_dictionary(text: str) -> dict[str, Member]:
    """Parse a structured-field dictionary header value."""
    return _Parser(text.strip()).dictionary()


def serialize_item(value: BareItem) -> str:
    if isinstance(value, bool):
        return "?1" if value else "?0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return ":" + base64.b64encode(value).decode("ascii") + ":"
    if isinstance(value, Token):
        return str(value)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def serialize_inner_list(items: tuple[BareItem, ...], params: dict[str, BareItem]) -> str:
    """`("a" "b");k=v` — the form the `@signature-params` line uses."""
    inner = " ".join(serialize_item(item) for item in items)
    return f"({inner})" + "".join(
        f";{key}" if value is True else f";{key}={serialize_item(value)}"
        for key, value in params.items()
    )
