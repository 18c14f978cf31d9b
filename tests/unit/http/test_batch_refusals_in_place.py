"""A batch of acks or results answers every entry in its place, a refused one first or in the
middle as well as last: a batch that stopped at its first refusal, or put refusals at the end,
would still pass a test whose refused entry is the last one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.scheduling.jobs import ErrorInfo
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

WRONG_LEASE = "mrl_" + "x" * 43
REFUSED = (0, 2)
"""The refused entries of a batch of four: the first and one in the middle."""


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def claimed(cast: Cast, count: int) -> list[dict[str, Any]]:
    for _ in range(count):
        cast.world.submit(cast.server_id, cast.owner[1])
    granted = cast.run.claim(count)
    assert len(granted) == count
    return granted


def outcomes(answers: list[dict[str, Any]]) -> list[tuple[str, int, str | None]]:
    return [(a["job_id"], a["status"], a.get("error", {}).get("code")) for a in answers]


def expected(
    entries: list[dict[str, Any]], refusal: tuple[int, str] = (409, "lease_mismatch")
) -> list[tuple[str, int, str | None]]:
    return [
        (e["job_id"], *refusal) if i in REFUSED else (e["job_id"], 200, None)
        for i, e in enumerate(entries)
    ]


def test_acks_refused_first_and_in_the_middle_are_answered_in_place(cast: Cast) -> None:
    run = cast.run.start(capacity=8)
    entries = [run.entry(g["job_id"], g["attempt"]) for g in claimed(cast, 4)]
    for i in REFUSED:
        entries[i] = {**entries[i], "lease": WRONG_LEASE}
    answers = run.post("/run/v1/jobs/acks", {"acks": entries}).json()["answers"]
    states = [cast.world.stored(e["job_id"]).state.value for e in entries]
    assert outcomes(answers) == expected(entries)
    assert states == ["accepted", "running", "accepted", "running"]


SPOILED = {
    "lease": ({"lease": WRONG_LEASE}, (409, "lease_mismatch")),
    "outcome": ({"outcome": "exploded"}, (422, "invalid_request")),
}
"""How a result entry is spoiled: refused when its job is decided on (a lease that does not
match), or before (an outcome that is not one)."""


@pytest.mark.parametrize("spoiled", sorted(SPOILED))
def test_results_refused_first_and_in_the_middle_are_answered_in_place(
    cast: Cast, spoiled: str
) -> None:
    run = cast.run.start(capacity=8)
    granted = claimed(cast, 4)
    for g in granted:
        assert run.ack(g["job_id"], g["attempt"]).status_code == 200
    entries = [
        {**run.entry(g["job_id"], g["attempt"]), "outcome": "succeeded", "retryable": False}
        for g in granted
    ]
    spoil, refusal = SPOILED[spoiled]
    for i in REFUSED:
        entries[i] = {**entries[i], **spoil}
    answers = run.post("/run/v1/jobs/results", {"results": entries}).json()["answers"]
    states = [cast.world.stored(e["job_id"]).state.value for e in entries]
    assert outcomes(answers) == expected(entries, refusal)
    assert [a["answer"]["state"] for a in answers if a["status"] == 200] == ["succeeded"] * 2
    assert states == ["running", "succeeded", "running", "succeeded"]


def test_a_batched_result_keeps_its_error_and_output(cast: Cast) -> None:
    """Every field of a batched result is recorded as a single result's would be."""
    run = cast.run.start(capacity=8)
    (granted,) = claimed(cast, 1)
    assert run.ack(granted["job_id"], granted["attempt"]).status_code == 200
    entry = {
        **run.entry(granted["job_id"], granted["attempt"]),
        "outcome": "failed",
        "retryable": False,
        "error": {"code": "exit_status", "message": "exited 3"},
        "output": {"lines": 2},
    }
    (answer,) = run.post("/run/v1/jobs/results", {"results": [entry]}).json()["answers"]
    recorded = cast.world.stored(granted["job_id"]).result
    assert (answer["status"], answer["answer"]["state"]) == (200, "failed")
    assert recorded is not None
    assert (recorded.result.error, recorded.result.output_json) == (
        ErrorInfo("exit_status", "exited 3"),
        '{"lines":2}',
    )


def test_a_batched_retryable_failure_is_retried_later(cast: Cast) -> None:
    run = cast.run.start(capacity=8)
    (granted,) = claimed(cast, 1)
    assert run.ack(granted["job_id"], granted["attempt"]).status_code == 200
    entry = {
        **run.entry(granted["job_id"], granted["attempt"]),
        "outcome": "failed",
        "retryable": True,
    }
    (answer,) = run.post("/run/v1/jobs/results", {"results": [entry]}).json()["answers"]
    stored = cast.world.stored(granted["job_id"])
    assert (answer["status"], answer["answer"]["state"], stored.state.value) == (
        200,
        "retrying",
        "retrying",
    )
    assert answer["answer"]["next_eligible_at"] is not None


def test_a_batch_naming_a_job_twice_is_refused_saying_so(cast: Cast) -> None:
    run = cast.run.start(capacity=8)
    (granted,) = claimed(cast, 1)
    entry = run.entry(granted["job_id"], granted["attempt"])
    answer = run.post("/run/v1/jobs/acks", {"acks": [entry, entry]})
    assert (answer.status_code, answer.json()["error"]["message"]) == (
        422,
        "each job may appear only once in a batch",
    )
