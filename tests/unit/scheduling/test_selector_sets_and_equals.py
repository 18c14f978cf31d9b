"""What a new user typed into a selector (docs/protocol.md, "Selectors"): an empty set is a
clear refusal with its position, and a set is a set."""

from __future__ import annotations

import pytest

from moonrun.errors import InvalidSelector
from moonrun.scheduling.selectors import Op, Requirement, Selector, parse_selector


@pytest.mark.parametrize(
    ("text", "position"),
    [("role in ()", 9), ("role notin ( )", 13), ("env=prod, role in ()", 19)],
)
def test_an_empty_set_is_refused_with_the_position_of_its_closing_parenthesis(
    text: str, position: int
) -> None:
    with pytest.raises(InvalidSelector) as refused:
        parse_selector(text)
    assert (refused.value.status, refused.value.code, refused.value.position) == (
        422,
        "invalid_selector",
        position,
    )
    assert refused.value.message == (
        f"selector does not parse at position {position}: "
        "expected a value: the set of 'in' or 'notin' is empty"
    )


def test_a_value_named_twice_in_a_set_is_named_once() -> None:
    assert parse_selector("role in (web, db, web)") == Selector(
        (Requirement("role", Op.IN, ("web", "db")),)
    )


def test_a_set_of_the_empty_value_is_written_so_that_it_parses_back() -> None:
    empty_value = parse_selector("role in (,)")
    assert empty_value == Selector((Requirement("role", Op.IN, ("",)),))
    assert parse_selector(str(empty_value)) == empty_value
    assert empty_value.matches({"role": ""})
    assert not empty_value.matches({"role": "web"})
