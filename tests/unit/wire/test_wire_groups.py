"""The groups' answers are their documented shapes exactly (moonrun/wire): a fan-out, a group's
read, blocking read and cancel, and a held job's view fit the served document's schema, parse
as declared, and send every key GroupView, its counts, FanoutAnswer and JobGroupView declare."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.http import group_api, user_api
from moonrun.http.api import Route
from moonrun.wire import user
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory
from tests.unit.wire.test_wire import check_answers

ROUTES = {(route.method, route.path): route for route in (*user_api.ROUTES, *group_api.ROUTES)}


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def test_every_group_answer_is_its_documented_shape_exactly(cast: Cast) -> None:
    world = cast.world
    web2 = world.create_server("web-2", cast.other_run.endpoint_id, cast.owner[0])
    for server_id in (cast.server_id, web2):
        answer = world.api(
            "PUT", f"/api/v1/servers/{server_id}/labels", json={"labels": {"r": "w"}}
        )
        assert answer.status_code == 200
    answers: list[tuple[Route, int, Any]] = []

    def note(method: str, template: str, response: Any) -> Any:
        assert response.status_code < 300, response.text
        answers.append((ROUTES[(method, template)], response.status_code, response.json()))
        return response.json()

    body = {"selector": "r=w", "kind": "noop", "max_parallel": 1, "stop_on_failure": True}
    made = note("POST", "/api/v1/jobs/fanout", world.api("POST", "/api/v1/jobs/fanout", json=body))
    group = made["group"]["id"]
    note("GET", "/api/v1/groups/{group_id}", world.api("GET", f"/api/v1/groups/{group}"))
    note("GET", "/api/v1/jobs", world.api("GET", "/api/v1/jobs", params={"group": group}))
    note(
        "POST",
        "/api/v1/groups/{group_id}/cancel",
        world.api("POST", f"/api/v1/groups/{group}/cancel"),
    )
    waited = world.api("GET", f"/api/v1/groups/{group}?wait_s=1&until=terminal")
    assert note("GET", "/api/v1/groups/{group_id}", waited)["done"] is True

    seen = check_answers(cast, answers)

    declared = {
        shape.__name__: set(typing.get_type_hints(shape))
        for shape in (user.FanoutAnswer, user.GroupView, user.GroupCountsView, user.JobGroupView)
    }
    assert declared == {name: seen.get(name, set()) for name in declared}
