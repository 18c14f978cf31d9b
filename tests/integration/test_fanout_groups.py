"""Fan-out groups over HTTP, on every store (docs/protocol.md, "Groups"): one request makes a job
on each matching server the caller may submit to, as one group; the group's read counts its
jobs, blocks until they end, and cancels them; bad input is a 422 naming the field.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`, administered by
`helper`; db-1 on host-b, owned by `stranger`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.http_harness import Cast, HttpWorld, http_world
from tests.support.stores import StoreFactory, memory_factory

LONG_S = 30.0


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        label_fleet(cast)
        yield cast


def label_fleet(cast: Cast) -> None:
    """web-1 and two more web servers of the owner; the stranger's db-1 is labelled role=web
    too (their servers must never match the owner's selector)."""
    world = cast.world
    for server_id in (
        cast.server_id,
        world.create_server("web-2", cast.other_run.endpoint_id, cast.owner[0]),
        world.create_server("web-3", cast.run.endpoint_id, cast.owner[0]),
        cast.other_server_id,
    ):
        answer = world.api("PUT", f"/api/v1/servers/{server_id}/labels", json={"labels": WEB})
        assert answer.status_code == 200, answer.text


WEB = {"role": "web", "env": "prod"}


def fanout(cast: Cast, token: str | None = None, **body: Any) -> Any:
    body.setdefault("selector", "role=web,env=prod")
    body.setdefault("kind", "noop")
    headers = body.pop("headers", {})
    return cast.world.api(
        "POST", "/api/v1/jobs/fanout", token=token or cast.owner[1], json=body, headers=headers
    )


def test_a_fanout_answers_the_group_and_a_job_per_matching_server_of_the_caller(
    cast: Cast,
) -> None:
    answer = fanout(cast, payload={"x": 1}, max_attempts=2)
    assert answer.status_code == 201, answer.text
    group, jobs = answer.json()["group"], answer.json()["jobs"]
    assert group["id"].startswith("grp_")
    assert (group["job_count"], group["selector"], group["kind"]) == (
        3,
        "role=web,env=prod",
        "noop",
    )
    assert group["counts"]["queued"] == 3
    assert group["done"] is False
    assert cast.other_server_id not in {job["server_id"] for job in jobs}
    assert {job["group"]["id"] for job in jobs} == {group["id"]}
    assert {job["max_attempts"] for job in jobs} == {2}
    listed = cast.world.api(
        "GET", "/api/v1/jobs", params={"group": group["id"]}, token=cast.owner[1]
    )
    assert sorted(job["id"] for job in listed.json()["jobs"]) == sorted(job["id"] for job in jobs)


def test_a_fanout_matching_nothing_of_the_callers_is_422_no_match(cast: Cast) -> None:
    answer = fanout(cast, selector="role=db")
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "no_match")
    # The helper (an administrator of web-1 only) reaches web-1; the stranger only db-1, and
    # nothing of the owner's shows in what they are answered.
    helped = fanout(cast, token=cast.helper[1])
    assert [job["server_id"] for job in helped.json()["jobs"]] == [cast.server_id]
    theirs = fanout(cast, token=cast.stranger[1]).json()
    assert theirs["group"]["job_count"] == 1
    assert sum(theirs["group"]["counts"].values()) == 1
    assert [job["server_id"] for job in theirs["jobs"]] == [cast.other_server_id]


def test_bad_fanout_input_is_a_422_naming_the_field(cast: Cast) -> None:
    cases = {
        "selector": {"selector": "role=web,,"},
        "max_parallel": {"max_parallel": 0},
        "stop_on_failure": {"stop_on_failure": "yes"},
        "kind": {"kind": "Bad Kind"},
    }
    for field, body in cases.items():
        answer = fanout(cast, **body)
        assert answer.status_code == 422, (field, answer.text)
        assert answer.json()["error"]["code"] != "no_match"
        assert field in answer.text
    empty = fanout(cast, selector="")
    assert (empty.status_code, empty.json()["error"]["code"]) == (422, "invalid_request")


def test_the_same_idempotency_key_gives_the_same_group_and_another_body_conflicts(
    cast: Cast,
) -> None:
    key = {"Idempotency-Key": "roll-out-7"}
    first = fanout(cast, headers=key)
    again = fanout(cast, headers=key)
    assert again.status_code == 201
    assert again.json()["group"]["id"] == first.json()["group"]["id"]
    assert [j["id"] for j in again.json()["jobs"]] == [j["id"] for j in first.json()["jobs"]]
    conflict = fanout(cast, headers=key, max_parallel=1)
    assert (conflict.status_code, conflict.json()["error"]["code"]) == (
        409,
        "idempotency_conflict",
    )


def test_a_group_is_read_and_cancelled_by_its_creator_only(cast: Cast) -> None:
    group = fanout(cast, max_parallel=1).json()["group"]
    path = f"/api/v1/groups/{group['id']}"
    for token, status in ((cast.stranger[1], 403), (cast.helper[1], 403), (None, 401)):
        assert cast.world.api("GET", path, token=token).status_code == status
        assert cast.world.api("POST", path + "/cancel", token=token).status_code == status
    listed = cast.world.api(
        "GET", "/api/v1/jobs", params={"group": group["id"]}, token=cast.stranger[1]
    )
    assert listed.status_code == 403
    assert cast.world.api("GET", "/api/v1/groups/grp_missing00000").status_code == 404
    read = cast.world.api("GET", path, token=cast.owner[1]).json()
    assert read["counts"]["queued"] == 3
    assert read["max_parallel"] == 1
    cancelled = cast.world.api("POST", path + "/cancel", token=cast.owner[1]).json()
    assert (cancelled["counts"]["cancelled"], cancelled["done"]) == (3, True)
    # The platform admin reads any group.
    assert cast.world.api("GET", path).json()["done"] is True


def test_held_jobs_say_so_and_are_granted_only_as_others_end(cast: Cast) -> None:
    answer = fanout(cast, max_parallel=1).json()
    held = [job for job in answer["jobs"] if job["group"]["held"]]
    assert len(held) == 2
    runs = [cast.run.start(), cast.other_run.start()]
    granted = [grant for run in runs for grant in run.claim(4)]
    assert len(granted) == 1
    owner_run = next(run for run in runs if (granted[0]["job_id"], 1) in run.leases)
    owner_run.ack(granted[0]["job_id"], 1)
    owner_run.result(granted[0]["job_id"], 1, "succeeded")
    assert len([grant for run in runs for grant in run.claim(4)]) == 1


def test_wait_needs_until_terminal(cast: Cast) -> None:
    group = fanout(cast).json()["group"]
    path = f"/api/v1/groups/{group['id']}?wait_s=1"
    answer = cast.world.api("GET", path, token=cast.owner[1])
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")


# -- blocking reads (one event loop for the waiting request and the waking ones) ------------------


@pytest.fixture
def woken(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        cast.world.platform.watch.recheck_s = LONG_S  # only a wake-up can end a wait early
        label_fleet(cast)
        with TestClient(cast.world.app) as client:
            cast.world.client = client
            yield cast


def in_background(work: Callable[[], Any]) -> Future[Any]:
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(work)
    pool.shutdown(wait=False)
    return future


def until_waiting(world: HttpWorld) -> None:
    for _ in range(10_000):
        if world.platform.watch.waiting >= 1:
            return
        time.sleep(0.001)
    raise AssertionError("the request never started waiting")


def test_a_blocking_group_read_answers_once_every_job_has_ended(woken: Cast) -> None:
    cast, world = woken, woken.world
    group = fanout(cast).json()["group"]
    path = f"/api/v1/groups/{group['id']}?wait_s=30&until=terminal"
    waiting = in_background(lambda: world.api("GET", path, token=cast.owner[1]))
    until_waiting(world)
    runs = [cast.run.start(), cast.other_run.start()]
    for run in runs:
        for grant in run.claim(4):
            run.ack(grant["job_id"], grant["attempt"])
            assert not waiting.done()
            run.result(grant["job_id"], grant["attempt"], "succeeded")
    answer = waiting.result(timeout=LONG_S)
    assert answer.status_code == 200
    assert (answer.json()["done"], answer.json()["counts"]["succeeded"]) == (True, 3)
