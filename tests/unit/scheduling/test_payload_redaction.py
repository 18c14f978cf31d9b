"""A payload shown to its readers hides every credential-looking part (scheduling/redaction.py;
docs/protocol.md, "Payload"): no value under a credential-looking key survives at any depth,
everything else is unchanged, and the work is one pass however deep the payload."""

from __future__ import annotations

import copy
import json
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moonrun.scheduling import redaction
from moonrun.scheduling.redaction import REDACTED, looks_like_credential, normalised, redacted

SECRET = "s3cr3t-value-that-must-not-survive"

CREDENTIAL_KEYS = [
    "secret",
    "token",
    "password",
    "passwd",
    "credential",
    "api_key",
    "apikey",
    "api-key",
    "private_key",
    "authorization",
    "cookie",
    "API_KEY",
    "Api-Key",
    "db_password",
    "GITHUB_TOKEN",
    "X-Auth-Token",
    "aws_secret_access_key",
    "Set-Cookie",
    "credentials",
    "client.secret",
    "auth",
    "PWD",
    "\uff53\uff45\uff43\uff52\uff45\uff54",  # a full-width "secret"
    "\u017fecret",  # a long s: case-folds to "secret"
    "pass\u200bword",  # a zero-width space inside
]
PLAIN_KEYS = ["argv", "timeout_s", "path", "name", "author", "socket", "note", "keyboard", ""]


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_each_documented_credential_name_is_recognised_in_any_spelling(key: str) -> None:
    assert looks_like_credential(key)


@given(name=st.text(alphabet=st.characters(max_codepoint=127), max_size=20))
def test_an_ascii_name_is_normalised_as_any_other(name: str) -> None:
    """The ASCII fast path (lower case, letters and digits) agrees with NFKC and case-folding."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    assert normalised(name) == "".join(char for char in folded if char.isalnum())


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_other_names_are_not_credentials(key: str) -> None:
    assert not looks_like_credential(key)


def test_a_credential_members_value_is_redacted_whatever_it_holds() -> None:
    payload = {
        "db_password": {"nested": [SECRET]},
        "list": [{"API-Key": SECRET}, {"keep": 1}],
        "token": 7,
        "argv": ["echo", "hello"],
    }
    assert redacted(payload) == {
        "db_password": REDACTED,
        "list": [{"API-Key": REDACTED}, {"keep": 1}],
        "token": REDACTED,
        "argv": ["echo", "hello"],
    }


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["env", "GITHUB_TOKEN=abc", "make"], ["env", "GITHUB_TOKEN=[redacted]", "make"]),
        (["deploy", "--password=abc"], ["deploy", "--password=[redacted]"]),
        (["deploy", "--api-key", "abc", "x"], ["deploy", "--api-key", "[redacted]", "x"]),
        (
            ["curl", "-H", "Authorization: Bearer abc", "https://example.com/"],
            ["curl", "-H", "Authorization: [redacted]", "https://example.com/"],
        ),
        (["env", "HOME=/tmp", "--name", "x"], ["env", "HOME=/tmp", "--name", "x"]),
        (["echo", "token"], ["echo", "token"]),
    ],
    ids=["env assignment", "flag=value", "flag then value", "header", "others kept", "a word"],
)
def test_a_commands_environment_flags_and_headers_in_argv_are_redacted(
    argv: list[str], shown: list[str]
) -> None:
    """The command kind has no environment member: `["env", "NAME=value", ...]` is how its
    payload sets one (docs/kinds.md), so an assignment, flag or header naming a credential
    hides its value."""
    assert redacted({"argv": argv, "timeout_s": 60}) == {"argv": shown, "timeout_s": 60}


# -- properties --------------------------------------------------------------------------------

plain_keys = st.text(alphabet="abcdefghijlmnqruvxyz_", max_size=8).filter(
    lambda key: not looks_like_credential(key)
)
"""Keys that look like no credential (no `k`, `o`, `p`, `s`, `t`, `w`: no word of the list)."""
credential_keys = st.sampled_from(CREDENTIAL_KEYS)
plain_strings = st.text(max_size=12).filter(
    lambda text: redaction.redacted_string(text) == text and not redaction.is_credential_flag(text)
)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | plain_strings


def json_trees(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=30,
    )


def secret_subtree() -> st.SearchStrategy[Any]:
    """A value holding SECRET somewhere (or being it)."""
    return st.recursive(
        st.just(SECRET),
        lambda children: (
            st.lists(children, min_size=1, max_size=3)
            | st.dictionaries(plain_keys, children, min_size=1, max_size=3)
        ),
        max_leaves=6,
    )


mixed_trees = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(plain_keys, children, max_size=4)
        | st.dictionaries(credential_keys, secret_subtree(), min_size=1, max_size=2)
    ),
    max_leaves=40,
)


def paths_under_credentials(value: Any, under: bool = False) -> list[Any]:
    """The values found directly under a credential-looking key, at every depth."""
    found: list[Any] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if looks_like_credential(key):
                found.append(item)
            found += paths_under_credentials(item)
    elif isinstance(value, list):
        for item in value:
            found += paths_under_credentials(item)
    return found


@given(payload=mixed_trees)
@settings(max_examples=300)
def test_no_value_under_a_credential_key_survives_at_any_depth(payload: Any) -> None:
    shown = redacted(payload)
    assert SECRET not in json.dumps(shown, ensure_ascii=False)
    assert all(value == REDACTED for value in paths_under_credentials(shown))


@given(payload=json_trees(plain_keys))
@settings(max_examples=300)
def test_a_payload_without_credentials_is_shown_unchanged(payload: Any) -> None:
    before = copy.deepcopy(payload)
    assert redacted(payload) == payload
    assert payload == before


@given(payload=mixed_trees)
@settings(max_examples=200)
def test_redaction_changes_only_what_it_hides_and_never_its_input(payload: Any) -> None:
    """Same keys in the same order, same list lengths; a changed value is REDACTED (under a
    credential key) or a redacted string; the input is left as it was; twice is once."""
    before = copy.deepcopy(payload)
    shown = redacted(payload)
    assert payload == before
    assert redacted(shown) == shown

    def same_shape(given: Any, got: Any) -> None:
        if isinstance(given, dict):
            assert list(given) == list(got)
            for key in given:
                if looks_like_credential(key):
                    assert got[key] == REDACTED
                else:
                    same_shape(given[key], got[key])
        elif isinstance(given, list):
            assert len(given) == len(got)
            for item, shown_item in zip(given, got, strict=True):
                same_shape(item, shown_item)
        else:
            assert given == got

    same_shape(payload, shown)


def test_a_payload_nested_far_deeper_than_the_limit_is_redacted_without_recursion() -> None:
    """Stored payloads nest at most 32 deep; the redaction walks any depth without recursion
    (a nest 50,000 deep would overflow Python's stack)."""
    depth = 50_000
    payload: Any = {"token": SECRET}
    for _ in range(depth):
        payload = {"next": [payload]}
    shown = redacted(payload)
    for _ in range(depth):
        shown = shown["next"][0]
    assert shown == {"token": REDACTED}


def test_the_work_is_one_look_per_key_and_string(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 KiB payload costs one check per member and one per string: bounded by its size."""
    looks = []
    real = redaction.looks_like_credential

    def counted(name: str) -> bool:
        looks.append(name)
        return real(name)

    monkeypatch.setattr(redaction, "looks_like_credential", counted)
    payload = {f"k{i}": [f"v{i}", {"n": i}] for i in range(1_500)}
    assert len(json.dumps(payload)) < 64 * 1024
    assert redacted(payload) == payload
    members, strings = 2 * 1_500, 1_500
    assert len(looks) <= members + strings
