"""Ending a session (a clean Run shutdown), hosts' online state on servers, strict queries.

In process (tests/support/http_harness.py): the real ASGI app and a Run that signs its requests.
"""

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


def online_of(cast: Cast) -> tuple[bool, bool]:
    """(host-a's `online` as endpoints say, web-1's `endpoint_online` as its owner sees it)."""
    endpoints = cast.world.api("GET", "/api/v1/endpoints").json()["endpoints"]
    endpoint = next(e for e in endpoints if e["id"] == cast.run.endpoint_id)
    server = cast.world.api("GET", f"/api/v1/servers/{cast.server_id}", cast.owner[1]).json()
    return endpoint["online"], server["endpoint_online"]


def error_of(response: Any) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


def test_ending_the_session_shows_the_endpoint_and_its_servers_offline_at_once(
    cast: Cast,
) -> None:
    """After POST /run/v1/sessions/end, endpoint and server both say offline, without waiting
    for the session to expire."""
    cast.run.start()
    before = online_of(cast)
    ended = cast.run.post("/run/v1/sessions/end", {})
    after = online_of(cast)

    assert before == (True, True)
    assert (200, cast.run.generation) == (ended.status_code, ended.json()["generation"])
    assert after == (False, False)


def test_an_ended_session_is_refused_like_a_rotated_one(cast: Cast) -> None:
    """Requests signed with an ended session are answered as for a rotated one."""
    cast.run.start()
    assert cast.run.post("/run/v1/sessions/end", {}).status_code == 200

    heartbeat = cast.run.heartbeat()

    assert error_of(heartbeat)[:2] == (401, "session_rotated")


def test_registering_after_ending_the_session_shows_the_endpoint_online_again(
    cast: Cast,
) -> None:
    """A Run that starts again after a clean stop is online again, at the next generation."""
    cast.run.start()
    assert cast.run.post("/run/v1/sessions/end", {}).status_code == 200

    cast.run.start()

    assert online_of(cast) == (True, True)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs?colour=blue",
        "/api/v1/servers?colour=blue",
        "/api/v1/jobs?state=queued&colour=",
    ],
)
def test_an_unknown_query_parameter_is_refused_by_name(cast: Cast, path: str) -> None:
    """An unknown query parameter or filter is 422 invalid_request naming it, never ignored."""
    response = cast.world.api("GET", path)

    status, code, message = error_of(response)
    assert (status, code) == (422, "invalid_request")
    assert "query.colour" in message
