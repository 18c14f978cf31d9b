"""Log batches together (docs/protocol.md, "Log batches together"): `POST
/run/v1/logs/batches` takes several attempts' batches in one request, each checked, stored and
answered as its own `POST /run/v1/logs` would be, one refused alone. Registration says the
platform takes them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, SignedRun, http_world
from tests.support.stores import StoreFactory

TS = "2026-11-30T00:00:00.000Z"


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


def running(cast: Cast, run: SignedRun, count: int) -> list[str]:
    job_ids = [cast.world.submit(cast.server_id, cast.owner[1])["id"] for _ in range(count)]
    for job_id in job_ids:
        run.run_to_running(job_id)
    return job_ids


def batch(run: SignedRun, job_id: str, seq: int, *texts: str, **fields: Any) -> dict[str, Any]:
    lines = [{"ts": TS, "stream": "stdout", "text": text} for text in texts]
    return {"job_id": job_id, **run.evidence(job_id, 1), "seq": seq, "lines": lines, **fields}


def send(run: SignedRun, *batches: dict[str, Any]) -> Any:
    return run.post("/run/v1/logs/batches", {"batches": list(batches)})


def logs_answer(cast: Cast, job_id: str) -> Any:
    response = cast.world.api("GET", f"/api/v1/jobs/{job_id}/logs", token=cast.owner[1])
    assert response.status_code == 200, response.text
    return response.json()


def test_registration_says_the_platform_takes_log_batches_together(cast: Cast) -> None:
    assert cast.run.register().json()["log_batches"] is True


def test_each_attempts_batch_is_stored_and_answered_in_order(cast: Cast) -> None:
    run = cast.run.start(capacity=2)
    first, second = running(cast, run, 2)
    response = send(run, batch(run, first, 7, "a", "b"), batch(run, second, 9, "c", final=True))
    assert response.status_code == 200, response.text
    assert response.json()["answers"] == [
        {"job_id": first, "attempt": 1, "status": 200, "answer": {"accepted_through_seq": 7}},
        {"job_id": second, "attempt": 1, "status": 200, "answer": {"accepted_through_seq": 9}},
    ]
    assert [line["text"] for line in logs_answer(cast, first)["lines"]] == ["a", "b"]
    assert [line["text"] for line in logs_answer(cast, second)["lines"]] == ["c"]
    assert run.result(second, 1).status_code == 200
    assert logs_answer(cast, second)["logs_complete"] is True  # its batch was the last


def test_a_batch_refused_is_refused_alone(cast: Cast) -> None:
    run = cast.run.start(capacity=2)
    first, second = running(cast, run, 2)
    wrong = {**batch(run, first, 7, "lost"), "lease": "lease_not_this_one"}
    response = send(run, wrong, batch(run, second, 9, "kept"))
    assert response.status_code == 200, response.text
    refused, stored = response.json()["answers"]
    assert (refused["status"], refused["error"]["code"], stored["status"]) == (
        409,
        "lease_mismatch",
        200,
    )
    assert (logs_answer(cast, first)["lines"], len(logs_answer(cast, second)["lines"])) == ([], 1)


@pytest.mark.parametrize("bad", ["the same attempt twice", "no batch", "a batch without seq"])
def test_a_request_that_does_not_hold_together_is_refused_whole(cast: Cast, bad: str) -> None:
    run = cast.run.start()
    (job_id,) = running(cast, run, 1)
    batches = {
        "the same attempt twice": [batch(run, job_id, 1, "x"), batch(run, job_id, 2, "y")],
        "no batch": [],
        "a batch without seq": [{k: v for k, v in batch(run, job_id, 1).items() if k != "seq"}],
    }[bad]
    response = send(run, *batches)
    assert (response.status_code, response.json()["error"]["code"]) == (422, "invalid_request")
    assert logs_answer(cast, job_id)["lines"] == []
