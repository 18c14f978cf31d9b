"""Access lifecycle over HTTP (docs/protocol.md, "Users and access", "Endpoints"): disabling
users, rotating tokens, setting passwords, draining endpoints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.support.console_kit import cheap_passwords, console
from tests.support.http_harness import ADMIN_TOKEN, Cast, http_world
from tests.support.stores import memory_factory


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def status_and_code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert status == response.status_code, response.text
    return response.json()


# -- disable and enable ------------------------------------------------------------------------


def test_a_disabled_users_api_token_is_refused_at_once(cast: Cast) -> None:
    """After disable, the user's token is 401; after enable it works again."""
    world, (owner_id, owner_token) = cast.world, cast.owner
    disabled = ok(world.api("POST", f"/api/v1/users/{owner_id}/disable"))
    refused = world.api("GET", "/api/v1/me", token=owner_token)
    enabled = ok(world.api("POST", f"/api/v1/users/{owner_id}/enable"))
    again = world.api("GET", "/api/v1/me", token=owner_token)
    assert (disabled["disabled"], enabled["disabled"]) == (True, False)
    assert status_and_code(refused) == (401, "unauthenticated")
    assert again.status_code == 200


def test_users_list_shows_who_is_disabled(cast: Cast) -> None:
    """UserView carries `disabled`."""
    world, owner_id = cast.world, cast.owner[0]
    ok(world.api("POST", f"/api/v1/users/{owner_id}/disable"))
    users = ok(world.api("GET", "/api/v1/users"))["users"]
    flags = {user["name"]: user["disabled"] for user in users}
    assert flags == {"admin": False, "owner": True, "helper": False, "stranger": False}


def test_a_platform_admin_cannot_disable_themself(cast: Cast) -> None:
    """Disabling oneself is 422: the platform keeps a way in."""
    world = cast.world
    me = ok(world.api("GET", "/api/v1/me"))
    response = world.api("POST", f"/api/v1/users/{me['id']}/disable")
    assert status_and_code(response) == (422, "invalid_request")


def test_a_disabled_users_console_session_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signed-in console user who is disabled is signed out on their next page."""
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as c:
        browser = c.client("olive")
        before = browser.get("/jobs")
        ok(c.world.api("POST", f"/api/v1/users/{c.users['olive'][0]}/disable"))
        after = browser.get("/jobs")
    assert before.status_code == 200
    assert after.status_code in (303, 401)


# -- token rotation ----------------------------------------------------------------------------


def test_rotating_a_token_revokes_the_old_one_and_is_not_cached(cast: Cast) -> None:
    """The new token works, the old one is 401, and the answer says no-store."""
    world, (owner_id, old_token) = cast.world, cast.owner
    response = world.api("POST", f"/api/v1/users/{owner_id}/token", token=old_token)
    answer = ok(response)
    assert response.headers["cache-control"] == "no-store"
    assert answer["user"]["id"] == owner_id
    assert world.api("GET", "/api/v1/me", token=answer["api_token"]).status_code == 200
    assert status_and_code(world.api("GET", "/api/v1/me", token=old_token)) == (
        401,
        "unauthenticated",
    )


def test_a_user_cannot_rotate_someone_elses_token(cast: Cast) -> None:
    """Rotating another user's token is 403 unless you are a platform admin."""
    world = cast.world
    refused = world.api("POST", f"/api/v1/users/{cast.helper[0]}/token", token=cast.owner[1])
    by_admin = world.api("POST", f"/api/v1/users/{cast.helper[0]}/token", token=ADMIN_TOKEN)
    assert status_and_code(refused) == (403, "forbidden")
    assert by_admin.status_code == 200


# -- passwords ---------------------------------------------------------------------------------


def test_a_user_sets_their_password_and_signs_in_with_it(cast: Cast) -> None:
    """PUT password, then the console sign-in accepts it."""
    world, (owner_id, owner_token) = cast.world, cast.owner
    path = f"/api/v1/users/{owner_id}/password"
    ok(world.api("PUT", path, token=owner_token, json={"password": "correct horse"}))
    assert world.platform.directory.sign_in("owner", "correct horse") is not None


def test_a_short_password_is_refused(cast: Cast) -> None:
    """The length rules of user creation hold: 422 invalid_request."""
    world, (owner_id, owner_token) = cast.world, cast.owner
    path = f"/api/v1/users/{owner_id}/password"
    response = world.api("PUT", path, token=owner_token, json={"password": "short"})
    assert status_and_code(response) == (422, "invalid_request")


def test_a_disabled_user_cannot_sign_in(cast: Cast) -> None:
    """Sign-in with the right password of a disabled user fails."""
    world, owner_id = cast.world, cast.owner[0]
    ok(world.api("PUT", f"/api/v1/users/{owner_id}/password", json={"password": "correct horse"}))
    ok(world.api("POST", f"/api/v1/users/{owner_id}/disable"))
    assert world.platform.directory.sign_in("owner", "correct horse") is None


# -- draining ----------------------------------------------------------------------------------


def test_a_draining_endpoint_is_granted_no_claims_until_undrained(cast: Cast) -> None:
    """Claims answer empty while draining; EndpointView shows it; undrain grants again."""
    world, run = cast.world, cast.run.start()
    job = world.submit(cast.server_id, cast.owner[1])
    drained = ok(world.api("POST", f"/api/v1/endpoints/{run.endpoint_id}/drain"))
    while_draining = run.claim()
    listed = ok(world.api("GET", "/api/v1/endpoints"))["endpoints"]
    undrained = ok(world.api("POST", f"/api/v1/endpoints/{run.endpoint_id}/undrain"))
    after = run.claim()
    assert (drained["draining"], undrained["draining"]) == (True, False)
    assert while_draining == []
    assert {e["id"]: e["draining"] for e in listed}[run.endpoint_id] is True
    assert [claimed["job_id"] for claimed in after] == [job["id"]]


def test_a_draining_endpoint_lets_running_attempts_finish(cast: Cast) -> None:
    """A job acked before the drain still records its result."""
    world, run = cast.world, cast.run.start()
    job = world.submit(cast.server_id, cast.owner[1])
    attempt = run.run_to_running(job["id"])
    ok(world.api("POST", f"/api/v1/endpoints/{run.endpoint_id}/drain"))
    response = run.result(job["id"], attempt)
    assert response.status_code == 200, response.text
    assert world.stored(job["id"]).state.value == "succeeded"


def test_draining_a_missing_endpoint_is_not_found(cast: Cast) -> None:
    """404 not_found for an endpoint that does not exist."""
    response = cast.world.api("POST", "/api/v1/endpoints/ep_doesnotexist0000/drain")
    assert status_and_code(response) == (404, "not_found")


# -- removing servers and endpoints ------------------------------------------------------------


def test_a_server_with_jobs_not_ended_cannot_be_removed(cast: Cast) -> None:
    """409 server_busy naming how many jobs; the server stays."""
    world, owner_token = cast.world, cast.owner[1]
    world.submit(cast.server_id, owner_token)
    world.submit(cast.server_id, owner_token)
    response = world.api("DELETE", f"/api/v1/servers/{cast.server_id}", token=owner_token)
    assert status_and_code(response) == (409, "server_busy")
    assert "2 jobs" in response.json()["error"]["message"]
    assert ok(world.api("GET", f"/api/v1/servers/{cast.server_id}"))["id"] == cast.server_id


def test_the_owner_removes_a_server_once_its_jobs_are_cancelled(cast: Cast) -> None:
    """After cancelling, DELETE answers the server; it is gone from the list and 404."""
    world, owner_token = cast.world, cast.owner[1]
    job = world.submit(cast.server_id, owner_token)
    ok(world.api("POST", f"/api/v1/jobs/{job['id']}/cancel", token=owner_token))
    removed = ok(world.api("DELETE", f"/api/v1/servers/{cast.server_id}", token=owner_token))
    listed = ok(world.api("GET", "/api/v1/servers"))["servers"]
    again = world.api("GET", f"/api/v1/servers/{cast.server_id}")
    assert removed["id"] == cast.server_id
    assert cast.server_id not in {server["id"] for server in listed}
    assert status_and_code(again) == (404, "not_found")


def test_a_removed_servers_ended_jobs_stay_readable_by_platform_admins_only(cast: Cast) -> None:
    """The job record stays: a platform admin reads it, the former owner is refused."""
    world, owner_token = cast.world, cast.owner[1]
    job = world.submit(cast.server_id, owner_token)
    ok(world.api("POST", f"/api/v1/jobs/{job['id']}/cancel", token=owner_token))
    ok(world.api("DELETE", f"/api/v1/servers/{cast.server_id}", token=owner_token))
    by_admin = ok(world.api("GET", f"/api/v1/jobs/{job['id']}"))
    by_owner = world.api("GET", f"/api/v1/jobs/{job['id']}", token=owner_token)
    assert by_admin["state"] == "cancelled"
    assert by_owner.status_code == 403


def test_a_server_administrator_cannot_remove_the_server(cast: Cast) -> None:
    """Only the owner or a platform admin removes a server: 403 for its administrators."""
    response = cast.world.api("DELETE", f"/api/v1/servers/{cast.server_id}", token=cast.helper[1])
    assert status_and_code(response) == (403, "forbidden")


def test_an_endpoint_servers_point_at_cannot_be_removed(cast: Cast) -> None:
    """409 endpoint_in_use while a server points at the endpoint."""
    response = cast.world.api("DELETE", f"/api/v1/endpoints/{cast.run.endpoint_id}")
    assert status_and_code(response) == (409, "endpoint_in_use")
    assert "1 server" in response.json()["error"]["message"]


def test_a_removed_endpoints_run_is_refused(cast: Cast) -> None:
    """Once its servers are gone, the endpoint is removed and its Run's requests are 401."""
    world, run, owner_token = cast.world, cast.run.start(), cast.owner[1]
    ok(world.api("DELETE", f"/api/v1/servers/{cast.server_id}", token=owner_token))
    removed = ok(world.api("DELETE", f"/api/v1/endpoints/{run.endpoint_id}"))
    listed = ok(world.api("GET", "/api/v1/endpoints"))["endpoints"]
    heartbeat = run.heartbeat()
    registration = run.register()
    assert removed["id"] == run.endpoint_id
    assert run.endpoint_id not in {endpoint["id"] for endpoint in listed}
    assert heartbeat.status_code == 401
    assert registration.status_code == 401


def test_removing_a_missing_server_or_endpoint_is_not_found(cast: Cast) -> None:
    """404 not_found for a server or endpoint that does not exist."""
    server = cast.world.api("DELETE", "/api/v1/servers/srv_doesnotexist0000")
    endpoint = cast.world.api("DELETE", "/api/v1/endpoints/ep_doesnotexist0000")
    assert status_and_code(server) == (404, "not_found")
    assert status_and_code(endpoint) == (404, "not_found")
