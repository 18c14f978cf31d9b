"""Labels and selectors (docs/protocol.md, "Labels" and "Selectors"): the checks, the grammar
and what matches, in the pure domain."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.errors import InvalidLabels, InvalidSelector
from moonrun.scheduling.labels import (
    KEY_PATTERN,
    check_labels,
    effective_labels,
    merge_proposed,
)
from moonrun.scheduling.selectors import Op, Requirement, Selector, parse_selector

# -- labels --------------------------------------------------------------------------------------


def test_labels_are_kept_in_key_order() -> None:
    assert check_labels({"role": "web", "env": "prod"}) == (("env", "prod"), ("role", "web"))


def test_thirty_three_labels_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidLabels) as refused:
        check_labels({f"k{n}": "v" for n in range(33)})
    assert refused.value.status == 422
    assert refused.value.code == "invalid_labels"
    assert refused.value.fields == (("labels", "at most 32 labels, not 33"),)
    assert len(check_labels({f"k{n}": "v" for n in range(32)})) == 32


def test_a_200_character_value_is_refused_naming_its_key() -> None:
    with pytest.raises(InvalidLabels) as refused:
        check_labels({"role": "x" * 200})
    assert refused.value.fields == (("labels.role", "a value is at most 128 characters, not 200"),)
    assert "x" * 10 not in refused.value.message  # values are never said back


@pytest.mark.parametrize(
    "key", ["", "Role", "-role", "role-", "a b", "k" * 64, "é", "role\n", "a:b"]
)
def test_a_bad_key_is_refused_by_its_place_not_its_text(key: str) -> None:
    with pytest.raises(InvalidLabels) as refused:
        check_labels({"ok": "1", key: "v"})
    assert [field for field, _ in refused.value.fields] == ["labels[1]"]


@pytest.mark.parametrize("value", ["a\nb", "\x00", "tab\there", "\x7f", "\u0085"])
def test_a_value_with_a_control_character_is_refused(value: str) -> None:
    with pytest.raises(InvalidLabels):
        check_labels({"k": value})


def test_keys_of_the_longest_and_shortest_kinds_are_taken() -> None:
    keys = ["a", "0", "k" * 63, "example.com/role", "a_b-c.d/e"]
    assert [key for key, _ in check_labels(dict.fromkeys(keys, ""))] == sorted(keys)


def test_a_servers_labels_override_its_endpoints() -> None:
    endpoint = check_labels({"env": "staging", "zone": "eu"})
    server = check_labels({"env": "prod", "role": "web"})
    labels = effective_labels(endpoint, server)
    assert labels == {"env": "prod", "zone": "eu", "role": "web"}
    assert parse_selector("env=prod,zone=eu").matches(labels)
    assert not parse_selector("env=staging").matches(labels)


def test_a_join_only_proposes_labels_an_admin_already_set_win() -> None:
    current = check_labels({"env": "prod"})
    assert merge_proposed(current, check_labels({"env": "dev", "gpu": "yes"})) == (
        ("env", "prod"),
        ("gpu", "yes"),
    )


# -- selectors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Selector()),
        ("  ", Selector()),
        ("role=web", Selector((Requirement("role", Op.EQUALS, ("web",)),))),
        ("role==web", Selector((Requirement("role", Op.EQUALS, ("web",)),))),
        ("role != web", Selector((Requirement("role", Op.NOT_EQUALS, ("web",)),))),
        ("env in (prod, staging)", Selector((Requirement("env", Op.IN, ("prod", "staging")),))),
        ("env notin (dev)", Selector((Requirement("env", Op.NOT_IN, ("dev",)),))),
        ("gpu", Selector((Requirement("gpu", Op.EXISTS),))),
        ("!gpu", Selector((Requirement("gpu", Op.DOES_NOT_EXIST),))),
        ("in", Selector((Requirement("in", Op.EXISTS),))),
        ("empty=", Selector((Requirement("empty", Op.EQUALS, ("",)),))),
        (
            "role=web, !gpu ,env in (prod)",
            Selector(
                (
                    Requirement("role", Op.EQUALS, ("web",)),
                    Requirement("gpu", Op.DOES_NOT_EXIST),
                    Requirement("env", Op.IN, ("prod",)),
                )
            ),
        ),
    ],
)
def test_every_form_of_the_kubernetes_syntax_parses(text: str, expected: Selector) -> None:
    assert parse_selector(text) == expected


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("role=web,", 9),
        ("role=web env=prod", 9),
        ("Role=web", 0),
        ("role in prod", 8),
        ("role in (a,b", 12),
        ("role ~ web", 5),
        ("role!web", 4),
        ("=web", 0),
        ("!", 1),
        ("role=web,,env", 9),
        ("role is web", 5),
        ("role=(", 5),
    ],
)
def test_a_selector_that_does_not_parse_is_refused_with_its_position(
    text: str, position: int
) -> None:
    with pytest.raises(InvalidSelector) as refused:
        parse_selector(text)
    assert (refused.value.status, refused.value.code) == (422, "invalid_selector")
    assert refused.value.position == position
    assert f"at position {position}" in refused.value.message
    assert [field for field, _ in refused.value.fields] == ["selector"]


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("role=web", [True, False, False]),
        ("role!=web", [False, True, True]),
        ("role in (web,db)", [True, True, False]),
        ("role notin (web)", [False, True, True]),
        ("role", [True, True, False]),
        ("!role", [False, False, True]),
        ("role,env=prod", [True, False, False]),
        ("", [True, True, True]),
    ],
)
def test_each_operator_matches_as_in_kubernetes(text: str, matches: list[bool]) -> None:
    labelled = [{"role": "web", "env": "prod"}, {"role": "db"}, {}]
    assert [parse_selector(text).matches(labels) for labels in labelled] == matches


# -- properties ----------------------------------------------------------------------------------

keys = st.from_regex(KEY_PATTERN, fullmatch=True)
values = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), blacklist_characters=",()=!"
    ),
    max_size=20,
).filter(lambda value: not any(char.isspace() for char in value))
requirements = st.one_of(
    st.builds(lambda k: Requirement(k, Op.EXISTS), keys),
    st.builds(lambda k: Requirement(k, Op.DOES_NOT_EXIST), keys),
    st.builds(lambda k, v: Requirement(k, Op.EQUALS, (v,)), keys, values),
    st.builds(lambda k, v: Requirement(k, Op.NOT_EQUALS, (v,)), keys, values),
    st.builds(
        lambda k, vs: Requirement(k, Op.IN, tuple(vs)),
        keys,
        st.lists(values, min_size=1, unique=True),
    ),
    st.builds(
        lambda k, vs: Requirement(k, Op.NOT_IN, tuple(vs)),
        keys,
        st.lists(values, min_size=1, unique=True),
    ),
)


@given(st.lists(requirements, max_size=6).map(lambda found: Selector(tuple(found))))
def test_a_written_selector_parses_back_to_itself(selector: Selector) -> None:
    assert parse_selector(str(selector)) == selector


@given(st.text(max_size=60) | st.text(alphabet="ab=!,() inotx\t", max_size=40))
def test_any_text_parses_or_is_refused_with_a_position_inside_it(text: str) -> None:
    position: int | None = 0
    try:
        parse_selector(text)
    except InvalidSelector as refused:
        position = refused.position
    assert position is not None
    assert 0 <= position <= len(text)


@given(st.dictionaries(keys, values, max_size=5), st.lists(requirements, max_size=4))
def test_a_selector_matches_exactly_when_each_requirement_does(
    labels: dict[str, str], found: list[Requirement]
) -> None:
    selector = Selector(tuple(found))
    assert selector.matches(labels) == all(r.matches(labels) for r in found)
    assert parse_selector(str(selector)).matches(labels) == selector.matches(labels)
