"""Dependencies over HTTP, on every store (docs/protocol.md, "Dependencies"): `after` and
`after_group` on a create and in a batch; the JobView says what a job waits on; a dependency
that fails ends it `cancelled` with `dependency_failed`; bad input is a 422 naming the field,
another owner's job answered exactly as a missing one.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`; db-1 on host-b,
owned by `stranger`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import StoreFactory


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


def create(cast: Cast, server_id: str | None = None, token: str | None = None, **body: Any) -> Any:
    body.setdefault("kind", "noop")
    return cast.world.api(
        "POST",
        f"/api/v1/servers/{server_id or cast.server_id}/jobs",
        token=token or cast.owner[1],
        json=body,
    )


def read(cast: Cast, job_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = cast.world.api(
        "GET", f"/api/v1/jobs/{job_id}", token=cast.owner[1]
    ).json()
    return answer


def test_a_job_after_another_waits_visibly_and_runs_once_it_succeeded(cast: Cast) -> None:
    first = cast.world.submit(cast.server_id, cast.owner[1])
    answer = create(cast, after=[first["id"]])
    assert answer.status_code == 201, answer.text
    waiting = answer.json()
    assert waiting["state"] == "queued"
    assert waiting["waiting_for"] == {"jobs": [first["id"]], "group": None}
    cast.run.start()
    attempt = cast.run.run_to_running(first["id"])
    cast.run.result(first["id"], attempt)
    assert read(cast, waiting["id"])["waiting_for"] is None
    assert [job["job_id"] for job in cast.run.claim(4)] == [waiting["id"]]


def test_a_failed_dependency_cancels_the_job_with_dependency_failed(cast: Cast) -> None:
    first = cast.world.submit(cast.server_id, cast.owner[1])
    waiting = create(cast, after=[first["id"]]).json()
    cast.run.start()
    attempt = cast.run.run_to_running(first["id"])
    cast.run.result(first["id"], attempt, outcome="failed")
    ended = read(cast, waiting["id"])
    assert ended["state"] == "cancelled"
    assert ended["terminal"]["error"]["code"] == "dependency_failed"
    assert first["id"] in ended["terminal"]["error"]["message"]


def test_after_naming_another_owners_job_or_a_missing_one_is_the_same_422(cast: Cast) -> None:
    theirs = cast.world.submit(cast.other_server_id, cast.stranger[1])
    answers = [create(cast, after=[named]) for named in (theirs["id"], "job_nosuchjob")]
    errors = []
    for answer in answers:
        assert answer.status_code == 422, answer.text
        errors.append(answer.json()["error"])
    assert errors[0] == errors[1]
    assert errors[0]["fields"] == [{"field": "after[0]", "message": "no such job"}]


def test_after_naming_101_jobs_is_a_422_naming_the_field(cast: Cast) -> None:
    answer = create(cast, after=[f"job_{n:04d}abc" for n in range(101)])
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["fields"][0]["field"] == "after"


def test_a_batch_carries_dependencies_per_job(cast: Cast) -> None:
    first = cast.world.submit(cast.server_id, cast.owner[1])
    answer = cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/jobs/batch",
        token=cast.owner[1],
        json={"jobs": [{"kind": "noop"}, {"kind": "noop", "after": [first["id"]]}]},
    )
    assert answer.status_code == 201, answer.text
    jobs = answer.json()["jobs"]
    assert jobs[0]["waiting_for"] is None
    assert jobs[1]["waiting_for"] == {"jobs": [first["id"]], "group": None}
    refused = cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/jobs/batch",
        token=cast.owner[1],
        json={"jobs": [{"kind": "noop", "after": ["job_nosuchjob"]}]},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["fields"] == [
        {"field": "jobs[0].after[0]", "message": "no such job"}
    ]


def test_after_group_naming_a_group_the_caller_may_not_see_is_a_422(cast: Cast) -> None:
    answer = create(cast, after_group="grp_nosuchgroup")
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["fields"] == [
        {"field": "after_group", "message": "no such group"}
    ]


def test_a_fanout_takes_no_dependencies(cast: Cast) -> None:
    answer = cast.world.api(
        "POST",
        "/api/v1/jobs/fanout",
        token=cast.owner[1],
        json={"selector": "role=web", "kind": "noop", "after": ["job_nosuchjob"]},
    )
    assert answer.status_code == 422, answer.text
    assert "after" in answer.json()["error"]["message"]
