"""Run's parse knows maps (`dict[str, X]`, the views' labels): each value is checked and a
misfit is named by its key (src/moonrun/wire/parse.py)."""

from __future__ import annotations

import pytest
from typing_extensions import TypedDict

from moonrun.errors import ForeignAnswer
from moonrun.wire.parse import parse


class Labelled(TypedDict):
    labels: dict[str, str]


def test_a_map_of_strings_parses() -> None:
    value = {"labels": {"role": "web", "": ""}}
    assert parse(Labelled, value, "GET /x") == value


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        ({"role": 1}, "at labels.role: expected a string, got an integer"),
        ([], "expected an object"),
    ],
)
def test_a_map_value_of_another_type_is_a_foreign_answer_naming_its_key(
    labels: object, said: str
) -> None:
    with pytest.raises(ForeignAnswer) as refused:
        parse(Labelled, {"labels": labels}, "GET /x")
    assert said in refused.value.message
