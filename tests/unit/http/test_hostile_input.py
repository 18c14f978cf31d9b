"""Hostile input at the edge: every bad byte is a typed 4xx, and one owner's job never stalls
another's (issue findings: poison payloads, lone surrogates, cursor overflow, bounds)."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import StoreFactory, memory_factory


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


@pytest.fixture
def memory_cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def raw_json(cast: Cast, method: str, path: str, body: str, token: str | None = None) -> Any:
    """Send `body` as is: the client's JSON encoder could not send a lone surrogate."""
    return cast.world.api(
        method,
        path,
        token=token if token is not None else cast.owner[1],
        content=body.encode(),
        headers={"Content-Type": "application/json"},
    )


def error_of(response: Any) -> tuple[int, str]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    return response.status_code, response.json()["error"]["code"]


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_a_deeply_nested_payload_is_refused_at_creation_with_its_limit_named(
    memory_cast: Cast,
) -> None:
    """A payload nested deeper than the limit is 422 naming depth; the job is never stored."""
    world = memory_cast.world
    response = world.api(
        "POST",
        f"/api/v1/servers/{memory_cast.server_id}/jobs",
        token=memory_cast.owner[1],
        json={"kind": "noop", "payload": {"deep": nested(300)}},
    )
    assert error_of(response) == (422, "invalid_request")
    assert "depth" in response.json()["error"]["message"]
    listed = world.api("GET", "/api/v1/jobs", token=memory_cast.owner[1]).json()
    assert listed["jobs"] == []


def test_a_lone_surrogate_anywhere_in_a_user_body_is_invalid_request(memory_cast: Cast) -> None:
    """`\\ud800` in an id, a user id, a payload key or value is 422 JSON, never a 500."""
    cast, server = memory_cast, memory_cast.server_id
    admin = "mra_http-harness-admin-token-000000000000000"
    bodies = [
        ("/api/v1/servers", '{"name": "x", "endpoint_id": "\\ud800", "owner_id": "u"}', admin),
        ("/api/v1/servers", '{"name": "x", "endpoint_id": "e", "owner_id": "\\udc00"}', admin),
        (f"/api/v1/servers/{server}/admins", '{"user_id": "\\ud800"}', cast.owner[1]),
        (f"/api/v1/servers/{server}/jobs", '{"kind": "noop", "payload": {"\\ud800": 1}}', None),
        (f"/api/v1/servers/{server}/jobs", '{"kind": "noop", "payload": {"a": "x\\udfff"}}', None),
    ]
    for path, body, token in bodies:
        response = raw_json(cast, "POST", path, body, token)
        assert error_of(response) == (422, "invalid_request"), (path, body)


def test_a_lone_surrogate_from_a_run_is_invalid_request(memory_cast: Cast) -> None:
    """Reconcile entries, progress messages and log batches with `\\ud800` are 422 JSON."""
    cast = memory_cast
    run = cast.run.start()
    job = cast.world.submit(cast.server_id, cast.owner[1])
    attempt = run.run_to_running(job["id"])
    evidence = run.evidence(job["id"], attempt)
    line = {"ts": "2026-11-30T00:00:00.000Z", "stream": "stdout", "text": "x"}
    sent = [
        ("/run/v1/reconcile", {"entries": [{**evidence, "job_id": "job_\ud800"}]}),
        (f"/run/v1/jobs/{job['id']}/progress", {**evidence, "seq": 1, "message": "\ud800"}),
        ("/run/v1/logs", {"job_id": "\ud800", **evidence, "seq": 1, "lines": [line]}),
        (
            "/run/v1/logs",
            {"job_id": job["id"], **evidence, "seq": 1, "lines": [{**line, "text": "a\udc00b"}]},
        ),
    ]
    for path, body in sent:
        response = run.post(path, body)  # json.dumps writes the lone surrogate as an escape
        assert error_of(response) == (422, "invalid_request"), (path, body)
    assert cast.world.stored(job["id"]).state.value == "running"


def test_a_payload_at_the_depth_limit_is_claimed_and_answered_whole(memory_cast: Cast) -> None:
    """The deepest payload creation accepts reaches Run exactly as it was sent."""
    cast = memory_cast
    payload = {"deep": nested(31)}
    job = cast.world.submit(cast.server_id, cast.owner[1], payload=payload)
    (granted,) = cast.run.start().claim(1)
    assert (job["id"], payload) == (granted["job_id"], granted["payload"])


def test_payload_bounds_are_named_when_exceeded(memory_cast: Cast) -> None:
    """Depth beyond 32 and more than 10,000 keys and items are each a 422 naming the bound."""
    cast = memory_cast
    path = f"/api/v1/servers/{cast.server_id}/jobs"
    too_deep = {"kind": "noop", "payload": {"deep": nested(32)}}
    too_many = {"kind": "noop", "payload": {"items": [0] * 10_001}}
    answers = [
        cast.world.api("POST", path, token=cast.owner[1], json=b) for b in (too_deep, too_many)
    ]
    assert [error_of(a) for a in answers] == [(422, "invalid_request")] * 2
    assert ["depth limit" in answers[0].text, "member limit" in answers[1].text] == [True, True]


def test_a_cursor_beyond_64_bits_is_invalid_request(cast: Cast) -> None:
    """A cursor whose number overflows is 422 like every other bad cursor, on every store."""
    for number in ("9223372036854775808", "99999999999999999999999", "-9223372036854775809"):
        response = cast.world.api(
            "GET", "/api/v1/jobs", params={"cursor": cursor_of(f"{number}:job_x")}
        )
        assert error_of(response) == (422, "invalid_request"), number


@pytest.mark.parametrize(
    "not_before", ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "1969-12-31T23:59:59Z"]
)
def test_not_before_outside_1970_to_a_year_ahead_is_invalid(
    memory_cast: Cast, not_before: str
) -> None:
    """A job cannot be scheduled before 1970 or more than a year ahead."""
    response = memory_cast.world.api(
        "POST",
        f"/api/v1/servers/{memory_cast.server_id}/jobs",
        token=memory_cast.owner[1],
        json={"kind": "noop", "not_before": not_before},
    )
    assert error_of(response) == (422, "invalid_request")
    assert "not_before" in response.json()["error"]["message"]


def test_a_backoff_whose_cap_is_below_its_start_is_invalid(memory_cast: Cast) -> None:
    """`max_s` below `initial_s` (given or defaulted) is 422 naming both."""
    path = f"/api/v1/servers/{memory_cast.server_id}/jobs"
    bodies = [
        {"kind": "noop", "backoff": {"initial_s": 10, "max_s": 5}},
        {"kind": "noop", "backoff": {"initial_s": 3600}},
    ]
    for body in bodies:
        response = memory_cast.world.api("POST", path, token=memory_cast.owner[1], json=body)
        assert error_of(response) == (422, "invalid_request"), body
        assert "max_s" in response.json()["error"]["message"]


def test_a_stored_payload_too_deep_to_decode_is_still_answered_with_its_neighbours(
    memory_cast: Cast,
) -> None:
    """A payload stored before its bounds existed (2,000 levels deep) is handed on verbatim:
    the claim that granted it answers 200, and another owner's job in the same claim runs."""
    cast, world = memory_cast, memory_cast.world
    deep_json = '{"deep":' + "[" * 2000 + "]" * 2000 + "}"
    poison = world.submit(cast.server_id, cast.owner[1])
    world.store.replace_job(
        dataclasses.replace(world.stored(poison["id"]), payload_json=deep_json),
        world.stored(poison["id"]),
    )
    other_server = world.create_server("web-2", cast.run.endpoint_id, cast.stranger[0])
    neighbour = world.submit(other_server, cast.stranger[1])
    run = cast.run.start()
    response = run.post("/run/v1/jobs/claim", {"max_jobs": 2})
    assert response.status_code == 200
    assert deep_json.encode() in response.content
    # The payload verbatim, then the rest read with it set aside (too deep for Python's json).
    answer = json.loads(response.content.replace(deep_json.encode(), b"{}"))
    (granted,) = [job for job in answer["jobs"] if job["job_id"] == neighbour["id"]]
    run.leases[(neighbour["id"], granted["attempt"])] = granted["lease"]
    assert run.ack(neighbour["id"], granted["attempt"]).status_code == 200
    assert run.result(neighbour["id"], granted["attempt"]).json()["state"] == "succeeded"
