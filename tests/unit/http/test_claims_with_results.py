"""Claims with results (docs/protocol.md, "Claims with results"): a results batch may ask for
up to `max_jobs` more; once its results are applied, the places they freed are granted in
the same answer and commit, as a claim would grant them. Registration says the platform does
this; a batch that asks nothing is answered as before."""

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


def running(cast: Cast, run: SignedRun, jobs: int, claimed: int) -> list[dict[str, Any]]:
    """`jobs` jobs made, `claimed` of them claimed and acked."""
    for _ in range(jobs):
        cast.world.submit(cast.server_id, cast.owner[1])
    granted = run.claim(claimed)
    for job in granted:
        assert run.ack(job["job_id"], job["attempt"]).status_code == 200
    return granted


def results(run: SignedRun, granted: list[dict[str, Any]], **claim: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "results": [
            {**run.entry(g["job_id"], g["attempt"]), "outcome": "succeeded", "retryable": False}
            for g in granted
        ]
    }
    if claim:
        body["claim"] = claim
    response = run.post("/run/v1/jobs/results", body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    for job in answer.get("jobs", []):
        run.leases[(job["job_id"], job["attempt"])] = job["lease"]
    return answer


def test_registration_says_the_platform_grants_with_results(cast: Cast) -> None:
    response = cast.run.register()
    assert response.json()["claims_with_results"] is True


def test_the_places_a_batch_frees_are_granted_in_its_answer(cast: Cast) -> None:
    run = cast.run.start(capacity=2)
    granted = running(cast, run, jobs=4, claimed=2)
    answer = results(run, granted, max_jobs=2)
    assert [a["answer"]["state"] for a in answer["answers"]] == ["succeeded", "succeeded"]
    fresh = answer["jobs"]
    assert len(fresh) == 2
    assert {g["job_id"] for g in fresh}.isdisjoint({g["job_id"] for g in granted})
    # Granted as a claim grants: an attempt under a lease, acked like any other.
    assert [run.ack(g["job_id"], g["attempt"]).status_code for g in fresh] == [200, 200]


def test_a_batch_is_granted_no_more_than_the_sessions_capacity(cast: Cast) -> None:
    """Capacity 2, both places busy, one result: one place frees, one job is granted."""
    run = cast.run.start(capacity=2)
    granted = running(cast, run, jobs=4, claimed=2)
    answer = results(run, granted[:1], max_jobs=2)
    assert len(answer["jobs"]) == 1


def test_a_batch_that_asks_nothing_is_granted_nothing(cast: Cast) -> None:
    run = cast.run.start(capacity=2)
    granted = running(cast, run, jobs=3, claimed=2)
    assert "jobs" not in results(run, granted)
    assert len(run.claim(2)) == 1, "the job is still there for a claim"


def test_a_batch_with_nothing_claimable_grants_nothing(cast: Cast) -> None:
    run = cast.run.start(capacity=2)
    granted = running(cast, run, jobs=1, claimed=1)
    assert results(run, granted, max_jobs=1)["jobs"] == []


@pytest.mark.parametrize("max_jobs", [0, -1, "2"])
def test_a_claim_asking_for_no_job_is_refused_whole(cast: Cast, max_jobs: Any) -> None:
    run = cast.run.start(capacity=2)
    granted = running(cast, run, jobs=1, claimed=1)
    body = {
        "results": [
            {
                **run.entry(granted[0]["job_id"], granted[0]["attempt"]),
                "outcome": "succeeded",
                "retryable": False,
            }
        ],
        "claim": {"max_jobs": max_jobs},
    }
    response = run.post("/run/v1/jobs/results", body)
    assert (response.status_code, response.json()["error"]["code"]) == (422, "invalid_request")


def test_a_session_that_must_reconcile_first_still_hears_its_results_and_is_granted_nothing(
    cast: Cast,
) -> None:
    """Run registered again (a new session, not reconciled yet) and sends a result with a
    claim: the result is answered as without one, and nothing is granted."""
    run = cast.run.start(capacity=2)
    granted = running(cast, run, jobs=3, claimed=1)
    assert run.register(capacity=2, boot_id="boot-2").status_code == 201
    answer = results(run, granted, max_jobs=1)
    assert (len(answer["answers"]), answer["jobs"]) == (1, [])
