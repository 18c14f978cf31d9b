"""Concurrency keys over HTTP, on every store (docs/protocol.md, "Concurrency keys"): at most
`limit` jobs of one owner with one key are claimed or running at once, on all endpoints
together; the others wait in FIFO order and are granted as ones under way end; one owner's key
never holds back another owner's jobs; bad input is a 422 naming the field.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`; db-1 on host-b,
owned by `stranger`; here also web-2 on host-b, owned by `owner`.
"""

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


def second_server(cast: Cast) -> str:
    """The owner's web-2, on the other endpoint (host-b)."""
    return cast.world.create_server("web-2", cast.other_run.endpoint_id, cast.owner[0])


def submit(cast: Cast, server_id: str, key: str = "backup", limit: int = 1, **body: Any) -> Any:
    return cast.world.submit(
        server_id, cast.owner[1], concurrency={"key": key, "limit": limit}, **body
    )


def claim_all(runs: list[SignedRun]) -> list[tuple[SignedRun, dict[str, Any]]]:
    return [(run, grant) for run in runs for grant in run.claim(8)]


def finish(run: SignedRun, grant: dict[str, Any]) -> None:
    run.ack(grant["job_id"], grant["attempt"])
    run.result(grant["job_id"], grant["attempt"], "succeeded")


def read(cast: Cast, job_id: str) -> Any:
    return cast.world.api("GET", f"/api/v1/jobs/{job_id}", token=cast.owner[1]).json()


def test_at_most_limit_jobs_of_a_key_are_granted_across_two_endpoints(cast: Cast) -> None:
    servers = [cast.server_id, second_server(cast)]
    jobs = [submit(cast, servers[n % 2], limit=2) for n in range(6)]
    assert [job["concurrency"] for job in jobs[:2]] == [
        {"key": "backup", "limit": 2, "held": False}
    ] * 2
    assert {job["concurrency"]["held"] for job in jobs[2:]} == {True}
    runs = [cast.run.start(), cast.other_run.start()]
    granted = claim_all(runs)
    assert sorted(grant["job_id"] for _, grant in granted) == sorted(j["id"] for j in jobs[:2])
    # Running (acked) keeps their places: still nothing more.
    for run, grant in granted:
        run.ack(grant["job_id"], grant["attempt"])
    assert claim_all(runs) == []


def test_held_jobs_of_a_key_are_granted_oldest_first_the_moment_one_ends(cast: Cast) -> None:
    servers = [cast.server_id, second_server(cast)]
    jobs = [submit(cast, servers[n % 2]) for n in range(4)]
    runs = [cast.run.start(), cast.other_run.start()]
    order = []
    for _ in jobs:
        granted = claim_all(runs)
        assert len(granted) == 1
        run, grant = granted[0]
        order.append(grant["job_id"])
        if len(order) < len(jobs):
            assert read(cast, jobs[len(order)]["id"])["concurrency"]["held"] is True
        finish(run, grant)
    assert order == [job["id"] for job in jobs]
    assert claim_all(runs) == []


def test_one_owners_key_never_holds_back_another_owners_jobs(cast: Cast) -> None:
    mine = [submit(cast, cast.server_id) for _ in range(2)]
    theirs = cast.world.submit(
        cast.other_server_id, cast.stranger[1], concurrency={"key": "backup", "limit": 1}
    )
    assert theirs["concurrency"]["held"] is False
    assert read(cast, mine[1]["id"])["concurrency"]["held"] is True
    granted = claim_all([cast.run.start(), cast.other_run.start()])
    assert sorted(grant["job_id"] for _, grant in granted) == sorted([mine[0]["id"], theirs["id"]])


def test_a_cancelled_job_frees_its_keys_place(cast: Cast) -> None:
    first, second = (submit(cast, cast.server_id) for _ in range(2))
    answer = cast.world.api("POST", f"/api/v1/jobs/{first['id']}/cancel", token=cast.owner[1])
    assert answer.status_code == 200, answer.text
    assert read(cast, second["id"])["concurrency"]["held"] is False


def test_batches_and_fanouts_carry_keys_too(cast: Cast) -> None:
    web_2 = second_server(cast)
    for server_id in (cast.server_id, web_2):
        labelled = cast.world.api(
            "PUT",
            f"/api/v1/servers/{server_id}/labels",
            json={"labels": {"role": "web"}},
        )
        assert labelled.status_code == 200, labelled.text
    key = {"key": "deploy", "limit": 1}
    batch = cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/jobs/batch",
        token=cast.owner[1],
        json={"jobs": [{"kind": "noop", "concurrency": key}] * 2},
    )
    assert batch.status_code == 201, batch.text
    assert [job["concurrency"]["held"] for job in batch.json()["jobs"]] == [False, True]
    fanout = cast.world.api(
        "POST",
        "/api/v1/jobs/fanout",
        token=cast.owner[1],
        json={"selector": "role=web", "kind": "noop", "concurrency": key, "max_parallel": 2},
    )
    assert fanout.status_code == 201, fanout.text
    assert {job["concurrency"]["held"] for job in fanout.json()["jobs"]} == {True}
    runs = [cast.run.start(), cast.other_run.start()]
    assert len(claim_all(runs)) == 1


def test_bad_concurrency_is_a_422_naming_the_field(cast: Cast) -> None:
    cases = {
        "concurrency.limit": [{"key": "k", "limit": 0}, {"key": "k", "limit": 1001}],
        "concurrency.key": [{"key": ""}, {"key": "k" * 129}, {"key": "a\nb"}, {"limit": 2}],
    }
    for field, bodies in cases.items():
        for concurrency in bodies:
            for path, body in (
                (
                    f"/api/v1/servers/{cast.server_id}/jobs",
                    {"kind": "noop", "concurrency": concurrency},
                ),
                (
                    "/api/v1/jobs/fanout",
                    {"selector": "a=b", "kind": "noop", "concurrency": concurrency},
                ),
            ):
                answer = cast.world.api("POST", path, token=cast.owner[1], json=body)
                assert answer.status_code == 422, (concurrency, answer.text)
                assert field in answer.text, (concurrency, answer.text)
    fine = cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/jobs",
        token=cast.owner[1],
        json={"kind": "noop", "concurrency": {"key": "k", "limit": 1000}},
    )
    assert fine.status_code == 201, fine.text
