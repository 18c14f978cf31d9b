"""The HTTP service's own behaviour: lifecycle, errors, limits, health, metrics, idempotency."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.http.channels import Channels
from tests.support.http_harness import Cast, HttpWorld, http_world
from tests.support.stores import StoreFactory, memory_factory


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


@pytest.fixture
def memory_cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def test_a_job_runs_from_creation_to_success_over_http(cast: Cast) -> None:
    """create -> claim -> ack -> progress -> logs -> result, and the owner reads the outcome."""
    world, run = cast.world, cast.run.start()
    job = world.submit(cast.server_id, cast.owner[1])
    attempt = run.run_to_running(job["id"])
    assert run.progress(job["id"], attempt, 1, percent=50, message="half").status_code == 200
    assert run.send_logs(job["id"], attempt, 1, "hello", "world").status_code == 202
    answer = run.result(job["id"], attempt, output={"ok": True})
    assert (
        answer.status_code,
        answer.json()["state"],
        answer.json()["replayed"],
    ) == (200, "succeeded", False)
    view = world.api("GET", f"/api/v1/jobs/{job['id']}", token=cast.owner[1]).json()
    assert (view["state"], view["attempt"], view["progress"]["percent"]) == ("succeeded", 1, 50.0)
    logs = world.api("GET", f"/api/v1/jobs/{job['id']}/logs", token=cast.helper[1]).json()
    assert [line["text"] for line in logs["lines"]] == ["hello", "world"]


def test_errors_have_the_protocol_shape(memory_cast: Cast) -> None:
    """Unknown routes, bad bodies and missing credentials answer {"error": {code, message}}."""
    world = memory_cast.world
    cases = [
        (world.client.get("/api/v1/nowhere"), 404, "not_found"),
        (world.api("GET", "/api/v1/jobs", token=None), 401, "unauthenticated"),
        (world.api("GET", "/api/v1/jobs/job_missing"), 404, "not_found"),
        (world.client.post("/run/v1/jobs/claim", json={"max_jobs": 1}), 401, "signature_missing"),
        (
            world.api("POST", f"/api/v1/servers/{memory_cast.server_id}/jobs", json={"kind": 5}),
            422,
            "invalid_request",
        ),
    ]
    for response, status, code in cases:
        assert (status, code) == (response.status_code, response.json()["error"]["code"])
        assert isinstance(response.json()["error"]["message"], str)


def test_a_validation_error_never_echoes_the_input(memory_cast: Cast) -> None:
    """422 names the field, not the value (which could be a secret)."""
    run = memory_cast.run.start()
    response = run.post("/run/v1/jobs/job_x/ack", {"attempt": "mrl_secret-lease-value", "lease": 1})
    assert response.status_code == 422
    assert "mrl_secret-lease-value" not in response.text


def test_oversized_bodies_are_too_large(memory_cast: Cast) -> None:
    """A body over its channel's limit is 413 too_large before anything reads it."""
    world = memory_cast.world
    response = world.api(
        "POST",
        f"/api/v1/servers/{memory_cast.server_id}/jobs",
        content=b"x" * (2 * 1024 * 1024),
        headers={"Content-Type": "application/json"},
    )
    assert (response.status_code, response.json()["error"]["code"]) == (413, "too_large")


def test_a_full_channel_answers_channel_busy_at_once(tmp_path: Path) -> None:
    """With no room left on a channel, requests are refused with 429 and Retry-After."""
    world = HttpWorld(memory_factory(), tmp_path, channels=Channels.with_limits(user=0))
    try:
        response = world.api("GET", "/api/v1/jobs")
    finally:
        world.close()
    assert (
        response.status_code,
        response.json()["error"]["code"],
        response.headers["Retry-After"],
    ) == (429, "channel_busy", "1")


def test_idempotency_key_returns_the_same_job_or_a_conflict(cast: Cast) -> None:
    """Same key and body: the same job; same key, other body: 409 idempotency_conflict."""
    world = cast.world
    path = f"/api/v1/servers/{cast.server_id}/jobs"
    headers = {"Idempotency-Key": "deploy-42"}
    first = world.api("POST", path, token=cast.owner[1], json={"kind": "noop"}, headers=headers)
    again = world.api("POST", path, token=cast.owner[1], json={"kind": "noop"}, headers=headers)
    other = world.api("POST", path, token=cast.owner[1], json={"kind": "sleep"}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] == again.json()["id"]
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_conflict")
    listed = world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    assert [first.json()["id"]] == [job["id"] for job in listed]


def test_healthz_and_metrics(memory_cast: Cast) -> None:
    """Health answers ok; metrics count jobs by state, claims and rejections by code."""
    world, run = memory_cast.world, memory_cast.run.start()
    job = world.submit(memory_cast.server_id, memory_cast.owner[1])
    (granted,) = run.claim(1)
    run.leases[(job["id"], 9)] = "mrl_wrong"
    assert run.ack(job["id"], 9).status_code == 409
    assert world.client.get("/healthz").json() == {"status": "ok"}
    text = world.client.get("/metrics").text
    assert 'moonrun_jobs{state="accepted"} 1.0' in text
    assert "moonrun_claims_total 1.0" in text
    assert 'moonrun_rejected_messages_total{code="stale_attempt"} 1.0' in text
    assert "fenced_writes_rejected_total 1.0" in text
    assert 'moonrun_request_seconds_count{channel="jobs"}' in text
    assert granted["lease"] not in text
    assert job["id"] not in text


def test_openapi_describes_every_route(memory_cast: Cast) -> None:
    """The served OpenAPI document lists every Run and user route."""
    paths = memory_cast.world.client.get("/openapi.json").json()["paths"]
    expected = {
        "/run/v1/join",
        "/run/v1/sessions",
        "/run/v1/heartbeat",
        "/run/v1/reconcile",
        "/run/v1/jobs/claim",
        "/run/v1/jobs/{job_id}/ack",
        "/run/v1/jobs/{job_id}/progress",
        "/run/v1/jobs/{job_id}/cancel-poll",
        "/run/v1/jobs/{job_id}/result",
        "/run/v1/logs",
        "/run/v1/artifacts/{job_id}/{attempt}/{name}/{chunk_index}",
        "/api/v1/users",
        "/api/v1/servers",
        "/api/v1/servers/{server_id}",
        "/api/v1/servers/{server_id}/admins",
        "/api/v1/endpoints",
        "/api/v1/servers/{server_id}/jobs",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/cancel",
        "/api/v1/jobs/{job_id}/cancel",
        "/api/v1/jobs/{job_id}/logs",
        "/healthz",
        "/metrics",
    }
    assert set() == expected - set(paths)


def test_a_query_integer_beyond_its_range_is_invalid_not_a_crash(memory_cast: Cast) -> None:
    """An attempt number past 64 bits in a query is 422 invalid_request (it once reached the
    answer's serialiser and failed there)."""
    world = memory_cast.world
    job = world.submit(memory_cast.server_id, memory_cast.owner[1])
    path = f"/api/v1/jobs/{job['id']}/logs?attempt={2**64}"
    answer = world.api("GET", path, token=memory_cast.owner[1])
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")
