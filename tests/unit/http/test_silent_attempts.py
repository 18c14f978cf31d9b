"""Silent attempts (docs/protocol.md, "Silent attempts"): a result may say `silent: true`, the
attempt printed no log line; its logs are then complete with that result, without a log batch
of their own, on every store (the word is kept in the attempt's history). Registration says
the platform takes the word; a result that does not say it waits for its last batch, or the
transfer grace, as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, SignedRun, http_world
from tests.support.stores import StoreFactory


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


def running(cast: Cast, run: SignedRun, **body: Any) -> tuple[str, int]:
    job_id = cast.world.submit(cast.server_id, cast.owner[1], **body)["id"]
    return job_id, run.run_to_running(job_id)


def logs_answer(cast: Cast, job_id: str, **params: Any) -> Any:
    path = f"/api/v1/jobs/{job_id}/logs"
    response = cast.world.api("GET", path, token=cast.owner[1], params=params)
    assert response.status_code == 200, response.text
    return response.json()


def view(cast: Cast, job_id: str) -> Any:
    response = cast.world.api("GET", f"/api/v1/jobs/{job_id}", token=cast.owner[1])
    assert response.status_code == 200, response.text
    return response.json()


def batch(run: SignedRun, job_ids: list[str], silent: list[bool]) -> Any:
    results = [
        {**run.entry(job_id, 1), "outcome": "succeeded", "retryable": False, "silent": said}
        for job_id, said in zip(job_ids, silent, strict=True)
    ]
    response = run.post("/run/v1/jobs/results", {"results": results})
    assert response.status_code == 200, response.text
    return response.json()


def test_registration_says_the_platform_takes_a_silent_result(cast: Cast) -> None:
    assert cast.run.register().json()["silent_results"] is True


def test_a_silent_result_completes_the_attempts_logs_with_it(cast: Cast) -> None:
    run = cast.run.start()
    job_id, attempt = running(cast, run)
    assert run.result(job_id, attempt, silent=True).status_code == 200
    answer = logs_answer(cast, job_id)
    assert (view(cast, job_id)["logs_complete"], answer["logs_complete"], answer["lines"]) == (
        True,
        True,
        [],
    )


def test_a_result_that_does_not_say_so_still_waits_for_its_last_batch(cast: Cast) -> None:
    run = cast.run.start()
    job_id, attempt = running(cast, run)
    assert run.result(job_id, attempt).status_code == 200
    assert (view(cast, job_id)["logs_complete"], logs_answer(cast, job_id)["logs_complete"]) == (
        False,
        False,
    )


def test_in_a_batch_only_the_results_that_say_so_complete_their_logs(cast: Cast) -> None:
    run = cast.run.start(capacity=2)
    quiet, _ = running(cast, run)
    loud, _ = running(cast, run)
    answer = batch(run, [quiet, loud], [True, False])
    assert [entry["status"] for entry in answer["answers"]] == [200, 200]
    assert (view(cast, quiet)["logs_complete"], view(cast, loud)["logs_complete"]) == (True, False)


def test_a_silent_attempt_that_failed_and_is_retried_keeps_its_logs_complete(cast: Cast) -> None:
    """The word lives in the attempt's history, which every store keeps."""
    run = cast.run.start()
    job_id, first = running(cast, run, max_attempts=2)
    failed = run.result(
        job_id, first, "failed", retryable=True, silent=True, error={"code": "x", "message": "y"}
    )
    assert failed.status_code == 200, failed.text
    assert logs_answer(cast, job_id, attempt=first)["logs_complete"] is True


@pytest.mark.parametrize("said", ["yes", 1, None])
def test_a_silent_that_is_not_a_boolean_is_refused_and_nothing_is_recorded(
    cast: Cast, said: Any
) -> None:
    run = cast.run.start()
    job_id, attempt = running(cast, run)
    refused = run.result(job_id, attempt, silent=said)
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_request")
    assert view(cast, job_id)["state"] == "running"
