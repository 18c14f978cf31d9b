"""Terminal fingerprints (SHA-256 of RFC 8785 JSON), result validation and token hashes."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.errors import InvalidRequest, TooLarge
from moonrun.scheduling.fingerprint import result_fingerprint, token_hash, token_matches
from moonrun.scheduling.jobs import OUTPUT_LIMIT, ErrorInfo, Outcome, RunResult


def independent_fingerprint(
    outcome: str, retryable: bool, error: dict[str, str] | None, output: Any
) -> str:
    """The contract's fingerprint, computed without moonrun (exact for ASCII text and ints)."""
    body = {"outcome": outcome, "retryable": retryable, "error": error, "output": output}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Printable ASCII without control characters: the JSON both encoders write is identical.
ascii_text = st.text(alphabet=[chr(c) for c in range(0x20, 0x7F)], max_size=20)
safe_ints = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | safe_ints | ascii_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(ascii_text, children, max_size=4)
    ),
    max_leaves=12,
)
outcomes = st.sampled_from([outcome.value for outcome in Outcome])
codes = st.from_regex(r"\A[a-z][a-z0-9_.-]{0,20}\Z")
errors = st.none() | st.fixed_dictionaries({"code": codes, "message": ascii_text})

ERROR = {"code": "disk_full", "message": "no space left on /var"}
OUTPUT = {"written": 3, "paths": ["/a", "/b"], "ok": False, "note": None}


# -- known answers ---------------------------------------------------------------------------


def test_fingerprint_known_answer() -> None:
    """A concrete result hashes to SHA-256 of its sorted, compact JSON."""
    expected = independent_fingerprint("failed", True, ERROR, OUTPUT)
    assert expected == result_fingerprint("failed", True, ERROR, OUTPUT)
    assert expected == RunResult.of("failed", True, ERROR, OUTPUT).fingerprint


def test_absent_error_and_output_are_hashed_as_null() -> None:
    """A bare success fingerprints {"error":null,"outcome":"succeeded","output":null,...}."""
    body = b'{"error":null,"outcome":"succeeded","output":null,"retryable":false}'
    expected = hashlib.sha256(body).hexdigest()
    assert expected == RunResult.of("succeeded", False).fingerprint


@given(outcome=outcomes, retryable=st.booleans(), error=errors, output=json_values)
def test_fingerprint_matches_independent_hash_for_ascii_and_ints(
    outcome: str, retryable: bool, error: dict[str, str] | None, output: Any
) -> None:
    """For ASCII strings and safe integers the fingerprint equals a json+hashlib digest."""
    expected = independent_fingerprint(outcome, retryable, error, output)
    assert expected == RunResult.of(outcome, retryable, error, output).fingerprint


def test_fingerprint_is_lowercase_sha256_hex() -> None:
    """Fingerprints are 64 lowercase hex digits."""
    fingerprint = RunResult.of("succeeded", False).fingerprint
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint), fingerprint


# -- what matters and what does not ----------------------------------------------------------


@given(output=st.dictionaries(ascii_text, json_values, min_size=2, max_size=6))
def test_key_order_does_not_matter(output: dict[str, Any]) -> None:
    """Reordering the keys of output and error leaves the fingerprint unchanged."""
    reversed_output = dict(reversed(list(output.items())))
    reversed_error = {"message": ERROR["message"], "code": ERROR["code"]}
    expected = RunResult.of("failed", False, ERROR, output).fingerprint
    assert expected == RunResult.of("failed", False, reversed_error, reversed_output).fingerprint


def test_equal_numbers_fingerprint_the_same() -> None:
    """RFC 8785 writes 1.0 as 1, so an integral float and the integer agree."""
    expected = RunResult.of("succeeded", False, output={"n": 1}).fingerprint
    assert expected == RunResult.of("succeeded", False, output={"n": 1.0}).fingerprint


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("outcome", "cancelled"),
        ("retryable", False),
        ("error", None),
        ("error", {"code": "disk_full", "message": "no space left on /tmp"}),
        ("error", {"code": "disk_fill", "message": "no space left on /var"}),
        ("output", None),
        ("output", {}),
        ("output", {**OUTPUT, "written": 4}),
        ("output", {**OUTPUT, "paths": ["/b", "/a"]}),
        ("output", "3"),
    ],
    ids=repr,
)
def test_any_different_field_changes_the_fingerprint(field: str, other: Any) -> None:
    """Changing outcome, retryable, error or output gives a different fingerprint."""
    base: dict[str, Any] = {"outcome": "failed", "retryable": True, "error": ERROR}
    base["output"] = OUTPUT
    changed = {**base, field: other}
    assert RunResult.of(**base).fingerprint != RunResult.of(**changed).fingerprint


def test_error_and_output_are_kept_canonical() -> None:
    """The recorded output is its canonical JSON and the error a typed ErrorInfo."""
    result = RunResult.of("failed", False, {"message": "m", "code": "c"}, {"b": 1, "a": [2]})
    expected = '{"a":[2],"b":1}'
    assert expected == result.output_json
    assert ErrorInfo("c", "m") == result.error
    assert Outcome.FAILED is result.outcome


# -- validation ------------------------------------------------------------------------------


class NotJson:
    """A value JSON cannot hold, with a repr that is the same in every process (a test id)."""

    def __repr__(self) -> str:
        return "NotJson()"


@pytest.mark.parametrize(
    "fields",
    [
        {"outcome": "success"},
        {"outcome": "SUCCEEDED"},
        {"outcome": ""},
        {"outcome": None},
        {"outcome": "retrying"},
        {"retryable": 1},
        {"retryable": 0},
        {"retryable": "true"},
        {"retryable": None},
        {"error": "disk_full"},
        {"error": ["disk_full", "no space"]},
        {"error": {"code": "disk_full"}},
        {"error": {"message": "no space"}},
        {"error": {"code": "Disk_Full", "message": "no space"}},
        {"error": {"code": "9lives", "message": "no space"}},
        {"error": {"code": "x" * 65, "message": "no space"}},
        {"error": {"code": "disk_full", "message": 5}},
        {"error": {"code": "disk_full", "message": None}},
        {"error": {"code": "disk_full", "message": "m" * 4097}},
        {"output": math.nan},
        {"output": {"ratio": math.nan}},
        {"output": [math.inf]},
        {"output": {1: "non-string key"}},
        {"output": {"value": NotJson()}},
    ],
    ids=repr,
)
def test_malformed_results_are_invalid(fields: dict[str, Any]) -> None:
    """Bad outcome, non-bool retryable, malformed error or non-JSON output: InvalidRequest."""
    arguments: dict[str, Any] = {"outcome": "failed", "retryable": False, **fields}
    with pytest.raises(InvalidRequest):
        RunResult.of(**arguments)


def test_error_limits_are_inclusive() -> None:
    """A 64-character code and a 4096-character message are accepted."""
    error = {"code": "e" * 64, "message": "m" * 4096}
    assert ErrorInfo("e" * 64, "m" * 4096) == RunResult.of("failed", False, error).error


def test_oversized_output_is_too_large() -> None:
    """Output whose canonical JSON exceeds the limit by one byte raises TooLarge."""
    at_limit = "x" * (OUTPUT_LIMIT - 2)  # two quotes make it exactly OUTPUT_LIMIT bytes
    expected = OUTPUT_LIMIT
    assert expected == len(RunResult.of("succeeded", False, output=at_limit).output_json or "")
    with pytest.raises(TooLarge):
        RunResult.of("succeeded", False, output=at_limit + "x")


# -- tokens ----------------------------------------------------------------------------------


@given(token=st.text(max_size=80))
def test_token_hash_is_sha256_hex_of_the_whole_token(token: str) -> None:
    """token_hash is the SHA-256 hex digest of the token's UTF-8 bytes."""
    expected = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
    assert expected == token_hash(token)


def test_token_hash_includes_the_prefix() -> None:
    """The prefix is part of what is hashed."""
    expected = hashlib.sha256(b"mrl_abc123").hexdigest()
    assert expected == token_hash("mrl_abc123")
    assert token_hash("abc123") != token_hash("mrl_abc123")


def test_token_matches_its_own_hash_only() -> None:
    """A token matches its hash; another token, or no stored hash, does not."""
    stored = token_hash("mrl_abc123")
    assert token_matches("mrl_abc123", stored)
    assert not token_matches("mrl_abc124", stored)
    assert not token_matches("abc123", stored)


def test_token_never_matches_a_missing_hash() -> None:
    """token_matches is False when nothing is stored, even for the empty token."""
    assert False is token_matches("mrl_abc123", None)
    assert False is token_matches("", None)
