"""A user API body's unknown field is refused with a 422 naming it; a Run protocol body's is
ignored, for a newer Run talking to an older platform (docs/protocol.md, "Conventions")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def test_a_typo_in_a_job_is_refused_naming_the_field_and_creates_nothing(cast: Cast) -> None:
    world, owner = cast.world, cast.owner
    path = f"/api/v1/servers/{cast.server_id}/jobs"
    response = world.api("POST", path, token=owner[1], json={"kind": "noop", "max_attempt": 5})
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "invalid_request",
        "message": "max_attempt: unknown field",
    }
    listed = world.api("GET", "/api/v1/jobs", token=owner[1]).json()
    assert listed["jobs"] == []


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/v1/users", {"name": "eve", "admin": True}, "admin"),
        ("POST", "/api/v1/endpoints", {"name": "host-c", "labels": ["x"]}, "labels"),
        ("POST", "/api/v1/jobs/cancel", {"job_ids": ["job_x"], "force": True}, "force"),
        (
            "POST",
            "/api/v1/servers/{server}/jobs",
            {"kind": "noop", "backoff": {"initial_s": 1, "max": 9}},
            "backoff.max",
        ),
        (
            "POST",
            "/api/v1/servers/{server}/jobs/batch",
            {"jobs": [{"kind": "noop", "priorty": 1}]},
            "jobs.0.priorty",
        ),
    ],
)
def test_every_user_body_refuses_a_field_it_does_not_know(
    cast: Cast, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    path = path.format(server=cast.server_id)
    response = cast.world.api(method, path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"] == f"{field}: unknown field"


def test_a_long_unknown_field_name_is_said_back_cut_short(cast: Cast) -> None:
    path = f"/api/v1/servers/{cast.server_id}/jobs"
    response = cast.world.api("POST", path, json={"kind": "noop", "x" * 10_000: 1})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "x" * 100 + ": unknown field"


def test_a_run_body_with_a_field_this_platform_does_not_know_is_still_served(cast: Cast) -> None:
    run = cast.run.start()
    response = run.post("/run/v1/reconcile", {"entries": [], "newer_run_field": {"x": 1}})
    assert response.status_code == 200, response.text
