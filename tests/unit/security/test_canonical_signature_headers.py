"""The signature headers Run writes are read by three regular expressions instead of the
structured-field parser (60 us a request); any other form goes to the parser. Both readings
agree wherever the quick one answers: every verdict and every value is the parser's."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.security import signing

KEY = b"k" * 32
PATH = "/run/v1/heartbeat"


def headers(key_id: str, nonce: str, created: int, body: bytes = b"{}") -> dict[str, str]:
    written = signing.sign(
        "POST", PATH, "", body, key_id=key_id, key=KEY, created=created, nonce=nonce
    )
    return {name.lower(): value for name, value in written.items()}


def outcome(given_headers: dict[str, str]) -> Any:
    """What `parse_head` answers: the Signed, or the error's type and words."""
    try:
        return signing.parse_head("POST", PATH, "", given_headers)
    except Exception as error:  # the verdict is what is compared
        return (type(error), str(error))


ascii_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)


@given(
    key_id=st.one_of(ascii_text, st.just("session:ses_1"), st.just("endpoint:end_1")),
    nonce=st.one_of(ascii_text, st.just(signing.b64url(b"n" * 16))),
    created=st.one_of(st.integers(-10, 10**16), st.just(1_795_000_000)),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["signature-input", "signature", "content-digest"]),
            st.integers(0, 200),
            st.sampled_from(['"', "\\", " ", ";", ",", "=", ":", "0", "a", "\t", "é", ""]),
            st.booleans(),
        ),
        max_size=3,
    ),
)
def test_the_quick_reading_agrees_with_the_parser_on_any_headers(
    key_id: str,
    nonce: str,
    created: int,
    edits: list[tuple[str, int, str, bool]],
) -> None:
    given_headers = headers(key_id, nonce, created)
    for name, at, text, replace in edits:  # damage the headers here and there
        value = given_headers[name]
        at = min(at, len(value))
        given_headers[name] = value[:at] + text + value[at + (1 if replace else 0) :]
    quick = outcome(given_headers)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(signing, "canonical_headers", lambda *_: None)
        parsed = outcome(given_headers)
    assert quick == parsed


@given(
    session=st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\'),
        min_size=1,
        max_size=40,
    ),
    nonce=st.binary(min_size=16, max_size=32),
    created=st.integers(0, 10**15 - 1),
)
def test_every_request_run_signs_is_read_the_quick_way(
    session: str, nonce: bytes, created: int
) -> None:
    written = headers(f"session:{session}", signing.b64url(nonce), created)
    assert (
        signing.canonical_headers(
            written["signature-input"], written["signature"], written["content-digest"]
        )
        is not None
    )
