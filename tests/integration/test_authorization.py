"""The user API's authorization matrix (docs/protocol.md, "User API"): every route x every caller.

Each cell is one request with the exact status and error code docs/protocol.md gives: no (valid)
credentials -> 401 `unauthenticated`; authenticated but not allowed on a resource that exists ->
403 `forbidden`, reads included; no such resource -> 404 `not_found`. The scene is the usual
cast (tests/support/http_harness.py): server web-1 on host-a, owned by `owner`, administered by
`helper`;
`stranger` owns db-1 on host-b and is the "other user" for web-1.

Rows that write run every cell in a fresh world, so that no cell sees another cell's writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import ADMIN_TOKEN, Cast, http_world, user_routes
from tests.support.stores import memory_factory

ACTORS = ("admin", "owner", "srv-admin", "other", "no token", "bad token")
"""Platform admin; web-1's owner; web-1's server administrator; a user with no right on web-1
(who owns another server); no Authorization header; a well-formed token that nobody holds."""

BOGUS_TOKEN = "mra_no-user-holds-this-token-00000000000000000"
MISSING_SERVER = "srv_doesnotexist0000"
MISSING_JOB = "job_doesnotexist0000"
MISSING_USER = "usr_doesnotexist0000"
MISSING_ENDPOINT = "ep_doesnotexist0000"

OK, CREATED, ACCEPTED = "200", "201", "202"
FORBIDDEN = "403 forbidden"
UNAUTH = "401 unauthenticated"
NOT_FOUND = "404 not_found"
SERVER_BUSY = "409 server_busy"
NOT_FINISHED = "409 job_not_finished"
NO_MATCH = "422 no_match"
MISSING_GROUP = "grp_doesnotexist0000"

_unique = itertools.count(1)


@dataclass
class Scene:
    """One world: the cast plus a queued job on web-1 (which Run runs on demand) and one on db-1."""

    cast: Cast
    job_id: str
    other_job_id: str
    """A queued job on db-1, the other user's server."""
    running: str | None = None

    def token(self, actor: str) -> str | None:
        return {
            "admin": ADMIN_TOKEN,
            "owner": self.cast.owner[1],
            "srv-admin": self.cast.helper[1],
            "other": self.cast.stranger[1],
            "no token": None,
            "bad token": BOGUS_TOKEN,
        }[actor]

    def running_job_id(self) -> str:
        """The scene's job, now claimed and acked by Run (so that a cancel waits on Run)."""
        if self.running is None:
            self.cast.run.start().run_to_running(self.job_id)
            self.running = self.job_id
        return self.running

    def finished_job_id(self) -> str:
        """The scene's job, now cancelled while it waited (so it has ended)."""
        response = self.cast.world.api("POST", f"/api/v1/jobs/{self.job_id}/cancel")
        assert response.status_code == 200, response.text
        return self.job_id

    def finished_other_job_id(self) -> str:
        """The job on db-1, now cancelled while it waited."""
        response = self.cast.world.api("POST", f"/api/v1/jobs/{self.other_job_id}/cancel")
        assert response.status_code == 200, response.text
        return self.other_job_id

    def label(self, server_id: str, labels: dict[str, str]) -> None:
        path = f"/api/v1/servers/{server_id}/labels"
        response = self.cast.world.api("PUT", path, json={"labels": labels})
        assert response.status_code == 200, response.text

    def group_id(self) -> str:
        """A fan-out group the owner made over web-1 (labelled role=web)."""
        self.label(self.cast.server_id, {"role": "web"})
        body = {"selector": "role=web", "kind": "noop"}
        response = self.cast.world.api(
            "POST", "/api/v1/jobs/fanout", token=self.cast.owner[1], json=body
        )
        assert response.status_code == 201, response.text
        group_id: str = response.json()["group"]["id"]
        return group_id

    def schedule_of(self, server_id: str, token: str) -> str:
        """A new schedule of that server, made by `token`'s user."""
        body = {"name": unique_name("nightly"), "cron": "@daily", "job": {"kind": "noop"}}
        path = f"/api/v1/servers/{server_id}/schedules"
        response = self.cast.world.api("POST", path, token=token, json=body)
        assert response.status_code == 201, response.text
        schedule_id: str = response.json()["id"]
        return schedule_id

    def selector_schedule(self) -> str:
        """A new selector schedule the owner made (over role=web)."""
        body = {
            "name": unique_name("fleet"),
            "cron": "@daily",
            "selector": "role=web",
            "job": {"kind": "noop"},
        }
        response = self.cast.world.api(
            "POST", "/api/v1/schedules", token=self.cast.owner[1], json=body
        )
        assert response.status_code == 201, response.text
        schedule_id: str = response.json()["id"]
        return schedule_id

    def web1_schedule(self) -> str:
        return self.schedule_of(self.cast.server_id, self.cast.owner[1])

    def db1_schedule(self) -> str:
        return self.schedule_of(self.cast.other_server_id, self.cast.stranger[1])

    def job_with_artifact(self) -> str:
        """The scene's job, now running with a complete artifact `result.txt`."""
        job_id = self.running_job_id()
        attempt = self.cast.world.stored(job_id).attempt
        response = self.cast.run.put_chunk(job_id, attempt, "result.txt", 0, b"result", True)
        assert response.status_code == 202, response.text
        return job_id


@contextmanager
def scene(tmp_path: Path) -> Iterator[Scene]:
    with http_world(memory_factory(), tmp_path / f"world-{next(_unique)}") as cast:
        job = cast.world.submit(cast.server_id, cast.owner[1])
        other_job = cast.world.submit(cast.other_server_id, cast.stranger[1])
        yield Scene(cast, job["id"], other_job["id"])


PathOf = Callable[[Scene], str]
BodyOf = Callable[[Scene], Any]


@dataclass(frozen=True)
class Row:
    """One request, and the outcome each actor must get (in the order of ACTORS)."""

    label: str
    method: str
    route: str
    """The route template, as the app declares it."""
    path: PathOf
    expected: tuple[str, ...]
    body: BodyOf | None = None
    writes: bool = False
    """Run each cell in a fresh world."""


def unique_name(prefix: str) -> str:
    return f"{prefix}-{next(_unique)}"


def web1(s: Scene) -> str:
    return s.cast.server_id


def db1(s: Scene) -> str:
    return s.cast.other_server_id


def idle_server(s: Scene) -> str:
    """A new server of web-1's owner, on host-a, with no jobs."""
    return s.cast.world.create_server(unique_name("idle"), s.cast.run.endpoint_id, s.cast.owner[0])


def unused_endpoint(s: Scene) -> str:
    """A new endpoint no server points at."""
    return s.cast.world.create_endpoint(unique_name("spare")).endpoint_id


ROWS: tuple[Row, ...] = (
    # -- who am I: any user ----------------------------------------------------------------------
    Row(
        "who am I",
        "GET",
        "/api/v1/me",
        lambda s: "/api/v1/me",
        (OK, OK, OK, OK, UNAUTH, UNAUTH),
    ),
    # -- users: platform admins only ---------------------------------------------------------
    Row(
        "list users",
        "GET",
        "/api/v1/users",
        lambda s: "/api/v1/users",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "create user",
        "POST",
        "/api/v1/users",
        lambda s: "/api/v1/users",
        (CREATED, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"name": unique_name("user"), "platform_admin": False},
        writes=True,
    ),
    Row(
        "disable owner",
        "POST",
        "/api/v1/users/{user_id}/disable",
        lambda s: f"/api/v1/users/{s.cast.owner[0]}/disable",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "disable missing user",
        "POST",
        "/api/v1/users/{user_id}/disable",
        lambda s: f"/api/v1/users/{MISSING_USER}/disable",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "enable owner",
        "POST",
        "/api/v1/users/{user_id}/enable",
        lambda s: f"/api/v1/users/{s.cast.owner[0]}/enable",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "rotate owner's token",
        "POST",
        "/api/v1/users/{user_id}/token",
        lambda s: f"/api/v1/users/{s.cast.owner[0]}/token",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "rotate missing user's token",
        "POST",
        "/api/v1/users/{user_id}/token",
        lambda s: f"/api/v1/users/{MISSING_USER}/token",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "set owner's password",
        "PUT",
        "/api/v1/users/{user_id}/password",
        lambda s: f"/api/v1/users/{s.cast.owner[0]}/password",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"password": "correct horse"},
        writes=True,
    ),
    Row(
        "set missing user's password",
        "PUT",
        "/api/v1/users/{user_id}/password",
        lambda s: f"/api/v1/users/{MISSING_USER}/password",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"password": "correct horse"},
        writes=True,
    ),
    # -- servers -------------------------------------------------------------------------------
    Row(
        "list servers (each sees its own)",
        "GET",
        "/api/v1/servers",
        lambda s: "/api/v1/servers",
        (OK, OK, OK, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "create server",
        "POST",
        "/api/v1/servers",
        lambda s: "/api/v1/servers",
        (CREATED, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {
            "name": unique_name("srv"),
            "endpoint_id": s.cast.run.endpoint_id,
            "owner_id": s.cast.owner[0],
        },
        writes=True,
    ),
    Row(
        "create server on a missing endpoint",
        "POST",
        "/api/v1/servers",
        lambda s: "/api/v1/servers",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {
            "name": unique_name("srv"),
            "endpoint_id": "ep_doesnotexist0000",
            "owner_id": s.cast.owner[0],
        },
        writes=True,
    ),
    Row(
        "get server web-1",
        "GET",
        "/api/v1/servers/{server_id}",
        lambda s: f"/api/v1/servers/{web1(s)}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "get missing server",
        "GET",
        "/api/v1/servers/{server_id}",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "get server db-1 (the other user's)",
        "GET",
        "/api/v1/servers/{server_id}",
        lambda s: f"/api/v1/servers/{db1(s)}",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "add other user as web-1 admin",
        "POST",
        "/api/v1/servers/{server_id}/admins",
        lambda s: f"/api/v1/servers/{web1(s)}/admins",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"user_id": s.cast.stranger[0]},
        writes=True,
    ),
    Row(
        "add missing user as web-1 admin",
        "POST",
        "/api/v1/servers/{server_id}/admins",
        lambda s: f"/api/v1/servers/{web1(s)}/admins",
        (NOT_FOUND, NOT_FOUND, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"user_id": MISSING_USER},
        writes=True,
    ),
    Row(
        "add web-1's owner as db-1 admin",
        "POST",
        "/api/v1/servers/{server_id}/admins",
        lambda s: f"/api/v1/servers/{db1(s)}/admins",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        body=lambda s: {"user_id": s.cast.owner[0]},
        writes=True,
    ),
    Row(
        "add admin to missing server",
        "POST",
        "/api/v1/servers/{server_id}/admins",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/admins",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        body=lambda s: {"user_id": s.cast.stranger[0]},
        writes=True,
    ),
    Row(
        "remove web-1's admin",
        "DELETE",
        "/api/v1/servers/{server_id}/admins/{user_id}",
        lambda s: f"/api/v1/servers/{web1(s)}/admins/{s.cast.helper[0]}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "remove a user who is no admin of web-1",
        "DELETE",
        "/api/v1/servers/{server_id}/admins/{user_id}",
        lambda s: f"/api/v1/servers/{web1(s)}/admins/{s.cast.stranger[0]}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "remove admin of missing server",
        "DELETE",
        "/api/v1/servers/{server_id}/admins/{user_id}",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/admins/{s.cast.helper[0]}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "set web-1's labels",
        "PUT",
        "/api/v1/servers/{server_id}/labels",
        lambda s: f"/api/v1/servers/{web1(s)}/labels",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"labels": {"role": "web"}},
        writes=True,
    ),
    Row(
        "set missing server's labels",
        "PUT",
        "/api/v1/servers/{server_id}/labels",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/labels",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        body=lambda s: {"labels": {"role": "web"}},
        writes=True,
    ),
    Row(
        "remove web-1 (a job not ended)",
        "DELETE",
        "/api/v1/servers/{server_id}",
        lambda s: f"/api/v1/servers/{web1(s)}",
        (SERVER_BUSY, SERVER_BUSY, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "remove an idle server of web-1's owner",
        "DELETE",
        "/api/v1/servers/{server_id}",
        lambda s: f"/api/v1/servers/{idle_server(s)}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "remove missing server",
        "DELETE",
        "/api/v1/servers/{server_id}",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    # -- endpoints: platform admins only -------------------------------------------------------
    Row(
        "list endpoints",
        "GET",
        "/api/v1/endpoints",
        lambda s: "/api/v1/endpoints",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "create endpoint",
        "POST",
        "/api/v1/endpoints",
        lambda s: "/api/v1/endpoints",
        (CREATED, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"name": unique_name("host")},
        writes=True,
    ),
    Row(
        "drain host-a",
        "POST",
        "/api/v1/endpoints/{endpoint_id}/drain",
        lambda s: f"/api/v1/endpoints/{s.cast.run.endpoint_id}/drain",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "drain missing endpoint",
        "POST",
        "/api/v1/endpoints/{endpoint_id}/drain",
        lambda s: f"/api/v1/endpoints/{MISSING_ENDPOINT}/drain",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "undrain host-a",
        "POST",
        "/api/v1/endpoints/{endpoint_id}/undrain",
        lambda s: f"/api/v1/endpoints/{s.cast.run.endpoint_id}/undrain",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "remove host-a (web-1 points at it)",
        "DELETE",
        "/api/v1/endpoints/{endpoint_id}",
        lambda s: f"/api/v1/endpoints/{s.cast.run.endpoint_id}",
        ("409 endpoint_in_use", FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "remove an unused endpoint",
        "DELETE",
        "/api/v1/endpoints/{endpoint_id}",
        lambda s: f"/api/v1/endpoints/{unused_endpoint(s)}",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "set host-a's labels",
        "PUT",
        "/api/v1/endpoints/{endpoint_id}/labels",
        lambda s: f"/api/v1/endpoints/{s.cast.run.endpoint_id}/labels",
        (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"labels": {"zone": "eu"}},
        writes=True,
    ),
    Row(
        "set missing endpoint's labels",
        "PUT",
        "/api/v1/endpoints/{endpoint_id}/labels",
        lambda s: f"/api/v1/endpoints/{MISSING_ENDPOINT}/labels",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"labels": {"zone": "eu"}},
        writes=True,
    ),
    Row(
        "remove missing endpoint",
        "DELETE",
        "/api/v1/endpoints/{endpoint_id}",
        lambda s: f"/api/v1/endpoints/{MISSING_ENDPOINT}",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    # -- jobs ----------------------------------------------------------------------------------
    Row(
        "create job on web-1",
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        lambda s: f"/api/v1/servers/{web1(s)}/jobs",
        (CREATED, CREATED, CREATED, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"kind": "noop"},
        writes=True,
    ),
    Row(
        "create job on db-1",
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        lambda s: f"/api/v1/servers/{db1(s)}/jobs",
        (CREATED, FORBIDDEN, FORBIDDEN, CREATED, UNAUTH, UNAUTH),
        body=lambda s: {"kind": "noop"},
        writes=True,
    ),
    Row(
        "create job on missing server",
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/jobs",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        body=lambda s: {"kind": "noop"},
        writes=True,
    ),
    Row(
        "create a batch of jobs on web-1",
        "POST",
        "/api/v1/servers/{server_id}/jobs/batch",
        lambda s: f"/api/v1/servers/{web1(s)}/jobs/batch",
        (CREATED, CREATED, CREATED, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"jobs": [{"kind": "noop"}, {"kind": "noop"}]},
        writes=True,
    ),
    Row(
        "create a batch of jobs on missing server",
        "POST",
        "/api/v1/servers/{server_id}/jobs/batch",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/jobs/batch",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        body=lambda s: {"jobs": [{"kind": "noop"}]},
        writes=True,
    ),
    Row(
        "list jobs (each sees its own)",
        "GET",
        "/api/v1/jobs",
        lambda s: "/api/v1/jobs",
        (OK, OK, OK, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "list jobs of web-1",
        "GET",
        "/api/v1/jobs",
        lambda s: f"/api/v1/jobs?server_id={web1(s)}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "list jobs of db-1",
        "GET",
        "/api/v1/jobs",
        lambda s: f"/api/v1/jobs?server_id={db1(s)}",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "list jobs of db-1 with their payloads",
        "GET",
        "/api/v1/jobs",
        lambda s: f"/api/v1/jobs?server_id={db1(s)}&include=payload",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "list jobs of missing server",
        "GET",
        "/api/v1/jobs",
        lambda s: f"/api/v1/jobs?server_id={MISSING_SERVER}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "get job on web-1",
        "GET",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.job_id}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "get job on db-1",
        "GET",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.other_job_id}",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    # Its payload: whoever may read the job (docs/protocol.md, "Payload"); others as above.
    Row(
        "get job on web-1 with its payload",
        "GET",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.job_id}?include=payload",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "get job on db-1 with its payload",
        "GET",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.other_job_id}?include=payload",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "get missing job with its payload",
        "GET",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}?include=payload",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "get missing job",
        "GET",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "rerun finished job on web-1",
        "POST",
        "/api/v1/jobs/{job_id}/rerun",
        lambda s: f"/api/v1/jobs/{s.finished_job_id()}/rerun",
        (CREATED, CREATED, CREATED, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "rerun queued job on web-1",
        "POST",
        "/api/v1/jobs/{job_id}/rerun",
        lambda s: f"/api/v1/jobs/{s.job_id}/rerun",
        (NOT_FINISHED, NOT_FINISHED, NOT_FINISHED, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "rerun finished job on db-1",
        "POST",
        "/api/v1/jobs/{job_id}/rerun",
        lambda s: f"/api/v1/jobs/{s.finished_other_job_id()}/rerun",
        (CREATED, FORBIDDEN, FORBIDDEN, CREATED, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "rerun missing job",
        "POST",
        "/api/v1/jobs/{job_id}/rerun",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}/rerun",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    # A job the caller may not manage is 404, as if it did not exist (docs/protocol.md, "Jobs").
    Row(
        "delete finished job on web-1",
        "DELETE",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.finished_job_id()}",
        (OK, OK, OK, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "delete queued job on web-1",
        "DELETE",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.job_id}",
        (NOT_FINISHED, NOT_FINISHED, NOT_FINISHED, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "delete finished job on db-1",
        "DELETE",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{s.finished_other_job_id()}",
        (OK, NOT_FOUND, NOT_FOUND, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "delete missing job",
        "DELETE",
        "/api/v1/jobs/{job_id}",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "kinds of web-1",
        "GET",
        "/api/v1/servers/{server_id}/kinds",
        lambda s: f"/api/v1/servers/{web1(s)}/kinds",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "kinds of db-1",
        "GET",
        "/api/v1/servers/{server_id}/kinds",
        lambda s: f"/api/v1/servers/{db1(s)}/kinds",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "kinds of missing server",
        "GET",
        "/api/v1/servers/{server_id}/kinds",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/kinds",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "cancel queued job on web-1",
        "POST",
        "/api/v1/jobs/{job_id}/cancel",
        lambda s: f"/api/v1/jobs/{s.job_id}/cancel",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "cancel running job on web-1",
        "POST",
        "/api/v1/jobs/{job_id}/cancel",
        lambda s: f"/api/v1/jobs/{s.running_job_id()}/cancel",
        (ACCEPTED, ACCEPTED, ACCEPTED, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "cancel queued job on db-1",
        "POST",
        "/api/v1/jobs/{job_id}/cancel",
        lambda s: f"/api/v1/jobs/{s.other_job_id}/cancel",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "cancel missing job",
        "POST",
        "/api/v1/jobs/{job_id}/cancel",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}/cancel",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "cancel jobs of web-1 and db-1 at once (each refused in its own entry)",
        "POST",
        "/api/v1/jobs/cancel",
        lambda s: "/api/v1/jobs/cancel",
        (OK, OK, OK, OK, UNAUTH, UNAUTH),
        body=lambda s: {"job_ids": [s.job_id, s.other_job_id, MISSING_JOB]},
        writes=True,
    ),
    Row(
        "logs of job on web-1",
        "GET",
        "/api/v1/jobs/{job_id}/logs",
        lambda s: f"/api/v1/jobs/{s.job_id}/logs",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "logs of job on db-1",
        "GET",
        "/api/v1/jobs/{job_id}/logs",
        lambda s: f"/api/v1/jobs/{s.other_job_id}/logs",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "logs of missing job",
        "GET",
        "/api/v1/jobs/{job_id}/logs",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}/logs",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    # -- artifacts: as the job read -------------------------------------------------------------
    Row(
        "artifacts of job on web-1",
        "GET",
        "/api/v1/jobs/{job_id}/artifacts",
        lambda s: f"/api/v1/jobs/{s.job_id}/artifacts",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "artifacts of job on db-1",
        "GET",
        "/api/v1/jobs/{job_id}/artifacts",
        lambda s: f"/api/v1/jobs/{s.other_job_id}/artifacts",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "artifacts of missing job",
        "GET",
        "/api/v1/jobs/{job_id}/artifacts",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}/artifacts",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "download artifact of job on web-1",
        "GET",
        "/api/v1/jobs/{job_id}/artifacts/{name}",
        lambda s: f"/api/v1/jobs/{s.job_with_artifact()}/artifacts/result.txt",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    # -- fan-out groups: a fan-out reaches the caller's servers; its group, its creator --------
    Row(
        "fan out to role=web (each reaches the servers they may submit to)",
        "POST",
        "/api/v1/jobs/fanout",
        lambda s: "/api/v1/jobs/fanout",
        (CREATED, CREATED, CREATED, CREATED, UNAUTH, UNAUTH),
        body=lambda s: (
            s.label(web1(s), {"role": "web"}),
            s.label(db1(s), {"role": "web"}),
            {"selector": "role=web", "kind": "noop"},
        )[-1],
        writes=True,
    ),
    Row(
        "fan out to db-1's label (the other user's)",
        "POST",
        "/api/v1/jobs/fanout",
        lambda s: "/api/v1/jobs/fanout",
        (CREATED, NO_MATCH, NO_MATCH, CREATED, UNAUTH, UNAUTH),
        body=lambda s: (s.label(db1(s), {"tier": "db"}), {"selector": "tier=db", "kind": "noop"})[
            -1
        ],
        writes=True,
    ),
    Row(
        "get the owner's group",
        "GET",
        "/api/v1/groups/{group_id}",
        lambda s: f"/api/v1/groups/{s.group_id()}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "get missing group",
        "GET",
        "/api/v1/groups/{group_id}",
        lambda s: f"/api/v1/groups/{MISSING_GROUP}",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "list one's own groups (every caller sees only theirs)",
        "GET",
        "/api/v1/groups",
        lambda s: "/api/v1/groups",
        (OK, OK, OK, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "list jobs of the owner's group",
        "GET",
        "/api/v1/jobs",
        lambda s: f"/api/v1/jobs?group={s.group_id()}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "cancel the owner's group",
        "POST",
        "/api/v1/groups/{group_id}/cancel",
        lambda s: f"/api/v1/groups/{s.group_id()}/cancel",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "cancel missing group",
        "POST",
        "/api/v1/groups/{group_id}/cancel",
        lambda s: f"/api/v1/groups/{MISSING_GROUP}/cancel",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "download missing artifact of job on db-1",
        "GET",
        "/api/v1/jobs/{job_id}/artifacts/{name}",
        lambda s: f"/api/v1/jobs/{s.other_job_id}/artifacts/result.txt",
        (NOT_FOUND, FORBIDDEN, FORBIDDEN, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    Row(
        "download artifact of missing job",
        "GET",
        "/api/v1/jobs/{job_id}/artifacts/{name}",
        lambda s: f"/api/v1/jobs/{MISSING_JOB}/artifacts/result.txt",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
    ),
    # -- schedules: the server's owner and administrators, platform admins -------------------
    Row(
        "create schedule on web-1",
        "POST",
        "/api/v1/servers/{server_id}/schedules",
        lambda s: f"/api/v1/servers/{web1(s)}/schedules",
        (CREATED, CREATED, CREATED, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"name": unique_name("s"), "cron": "@hourly", "job": {"kind": "noop"}},
        writes=True,
    ),
    Row(
        "create schedule on missing server",
        "POST",
        "/api/v1/servers/{server_id}/schedules",
        lambda s: f"/api/v1/servers/{MISSING_SERVER}/schedules",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        body=lambda s: {"name": unique_name("s"), "cron": "@hourly", "job": {"kind": "noop"}},
        writes=True,
    ),
    # -- selector schedules: anyone may make one (its firings reach only the servers its creator
    # may submit to, as a fan-out's); it is its creator's, as a group is
    Row(
        "create selector schedule over role=web",
        "POST",
        "/api/v1/schedules",
        lambda s: "/api/v1/schedules",
        (CREATED, CREATED, CREATED, CREATED, UNAUTH, UNAUTH),
        body=lambda s: {
            "name": unique_name("s"),
            "cron": "@hourly",
            "selector": "role=web",
            "job": {"kind": "noop"},
        },
        writes=True,
    ),
    Row(
        "create schedule on web-1 by server_id",
        "POST",
        "/api/v1/schedules",
        lambda s: "/api/v1/schedules",
        (CREATED, CREATED, CREATED, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {
            "name": unique_name("s"),
            "cron": "@hourly",
            "server_id": web1(s),
            "job": {"kind": "noop"},
        },
        writes=True,
    ),
    Row(
        "read the owner's selector schedule",
        "GET",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.selector_schedule()}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "change the owner's selector schedule",
        "PATCH",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.selector_schedule()}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"selector": "role=web,env=prod"},
        writes=True,
    ),
    Row(
        "trigger the owner's selector schedule",
        "POST",
        "/api/v1/schedules/{schedule_id}/trigger",
        lambda s: f"/api/v1/schedules/{s.selector_schedule()}/trigger",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "delete the owner's selector schedule",
        "DELETE",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.selector_schedule()}",
        (OK, OK, FORBIDDEN, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "list schedules",
        "GET",
        "/api/v1/schedules",
        lambda s: "/api/v1/schedules",
        (OK, OK, OK, OK, UNAUTH, UNAUTH),
    ),
    Row(
        "list schedules of web-1",
        "GET",
        "/api/v1/schedules",
        lambda s: f"/api/v1/schedules?server={web1(s)}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
    ),
    Row(
        "read schedule of web-1",
        "GET",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.web1_schedule()}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "read schedule of db-1",
        "GET",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.db1_schedule()}",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "read missing schedule",
        "GET",
        "/api/v1/schedules/{schedule_id}",
        lambda s: "/api/v1/schedules/sch_doesnotexist0000",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "change schedule of web-1",
        "PATCH",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.web1_schedule()}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        body=lambda s: {"name": "renamed"},
        writes=True,
    ),
    Row(
        "change schedule of db-1",
        "PATCH",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.db1_schedule()}",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        body=lambda s: {"name": "renamed"},
        writes=True,
    ),
    Row(
        "change missing schedule",
        "PATCH",
        "/api/v1/schedules/{schedule_id}",
        lambda s: "/api/v1/schedules/sch_doesnotexist0000",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        body=lambda s: {"name": "renamed"},
        writes=True,
    ),
    Row(
        "delete schedule of web-1",
        "DELETE",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.web1_schedule()}",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "delete schedule of db-1",
        "DELETE",
        "/api/v1/schedules/{schedule_id}",
        lambda s: f"/api/v1/schedules/{s.db1_schedule()}",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "delete missing schedule",
        "DELETE",
        "/api/v1/schedules/{schedule_id}",
        lambda s: "/api/v1/schedules/sch_doesnotexist0000",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "pause schedule of web-1",
        "POST",
        "/api/v1/schedules/{schedule_id}/pause",
        lambda s: f"/api/v1/schedules/{s.web1_schedule()}/pause",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "pause schedule of db-1",
        "POST",
        "/api/v1/schedules/{schedule_id}/pause",
        lambda s: f"/api/v1/schedules/{s.db1_schedule()}/pause",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "pause missing schedule",
        "POST",
        "/api/v1/schedules/{schedule_id}/pause",
        lambda s: "/api/v1/schedules/sch_doesnotexist0000/pause",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "resume schedule of web-1",
        "POST",
        "/api/v1/schedules/{schedule_id}/resume",
        lambda s: f"/api/v1/schedules/{s.web1_schedule()}/resume",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "resume schedule of db-1",
        "POST",
        "/api/v1/schedules/{schedule_id}/resume",
        lambda s: f"/api/v1/schedules/{s.db1_schedule()}/resume",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "resume missing schedule",
        "POST",
        "/api/v1/schedules/{schedule_id}/resume",
        lambda s: "/api/v1/schedules/sch_doesnotexist0000/resume",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "trigger schedule of web-1",
        "POST",
        "/api/v1/schedules/{schedule_id}/trigger",
        lambda s: f"/api/v1/schedules/{s.web1_schedule()}/trigger",
        (OK, OK, OK, FORBIDDEN, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "trigger schedule of db-1",
        "POST",
        "/api/v1/schedules/{schedule_id}/trigger",
        lambda s: f"/api/v1/schedules/{s.db1_schedule()}/trigger",
        (OK, FORBIDDEN, FORBIDDEN, OK, UNAUTH, UNAUTH),
        writes=True,
    ),
    Row(
        "trigger missing schedule",
        "POST",
        "/api/v1/schedules/{schedule_id}/trigger",
        lambda s: "/api/v1/schedules/sch_doesnotexist0000/trigger",
        (NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, UNAUTH, UNAUTH),
        writes=True,
    ),
)


# -- running and reading the matrix -----------------------------------------------------------


def outcome(response: Any) -> str:
    """`201`, or `403 forbidden` for an error with the protocol's exact error shape."""
    status = response.status_code
    if status < 400:
        return str(status)
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    shaped = (
        isinstance(error, dict)
        and set(body) == {"error"}
        and set(error) == {"code", "message"}
        and isinstance(error["message"], str)
    )
    return f"{status} {error['code']}" if shaped else f"{status} <malformed error body>"


def perform(row: Row, actor: str, at: Scene) -> str:
    kwargs: dict[str, Any] = {} if row.body is None else {"json": row.body(at)}
    response = at.cast.world.api(row.method, row.path(at), token=at.token(actor), **kwargs)
    return outcome(response)


def render(expected: dict[str, tuple[str, ...]], actual: dict[str, tuple[str, ...]]) -> str:
    """The matrix as a table; a wrong cell reads `!<actual> (want <expected>)`."""

    def cell(label: str, column: int) -> str:
        want, got = expected[label][column], actual[label][column]
        return got if want == got else f"!{got} (want {want})"

    headers = ("route", *ACTORS)
    rows = [
        (
            f"{row.method} {row.route} [{row.label}]",
            *(cell(row.label, i) for i in range(len(ACTORS))),
        )
        for row in ROWS
    ]
    widths = [max(len(line[i]) for line in (headers, *rows)) for i in range(len(headers))]
    lines = [
        " | ".join(text.ljust(width) for text, width in zip(line, widths, strict=True))
        for line in (headers, *rows)
    ]
    wrong = sum(
        1
        for row in ROWS
        for i in range(len(ACTORS))
        if expected[row.label][i] != actual[row.label][i]
    )
    return f"{wrong} of {len(ACTORS) * len(ROWS)} cells differ\n" + "\n".join(lines)


# -- tests --------------------------------------------------------------------------------------


def test_the_matrix_has_a_row_for_every_user_route(tmp_path: Path) -> None:
    """A user route without a row in the matrix (or a row for a route that is gone) fails."""
    with scene(tmp_path) as at:
        app = at.cast.world.app
        served = at.cast.world.client.get("/openapi.json").json()["paths"]
    declared = user_routes(app)
    documented = {
        (method.upper(), path)
        for path, operations in served.items()
        if path.startswith("/api/v1/")
        for method in operations
    }
    assert declared == documented
    assert sorted(declared) == sorted({(row.method, row.route) for row in ROWS})


MATRIX_PARTS = 4
"""The matrix's rows run as this many tests (every fourth row each), so that pytest-xdist
spreads its few hundred fresh worlds over its workers."""


def test_the_authorization_matrix_names_each_row_once() -> None:
    labels = [row.label for row in ROWS]
    assert len(labels) == len(set(labels)), "row labels must be unique"
    assert all(len(row.expected) == len(ACTORS) for row in ROWS)


@pytest.mark.parametrize("part", range(MATRIX_PARTS))
def test_every_cell_of_the_authorization_matrix(tmp_path: Path, part: int) -> None:
    """Every route x caller answers the exact status and code of docs/protocol.md, "User API"
    (this part's rows)."""
    rows = ROWS[part::MATRIX_PARTS]
    expected = {row.label: row.expected for row in rows}
    actual: dict[str, tuple[str, ...]] = {}
    with scene(tmp_path) as shared:
        for row in rows:
            cells = []
            for actor in ACTORS:
                if row.writes:
                    with scene(tmp_path) as fresh:
                        cells.append(perform(row, actor, fresh))
                else:
                    cells.append(perform(row, actor, shared))
            actual[row.label] = tuple(cells)
    assert expected == actual, "\n" + render(expected, actual)


def test_lists_show_each_caller_only_what_they_may_see(tmp_path: Path) -> None:
    """GET /servers and GET /jobs list exactly the servers and jobs the caller may manage."""
    with scene(tmp_path) as at:
        cast, other_job = at.cast, at.other_job_id
        web1_view = ([cast.server_id], [at.job_id])
        expected = {
            "admin": (sorted([cast.server_id, cast.other_server_id]), [other_job, at.job_id]),
            "owner": web1_view,
            "srv-admin": web1_view,
            "other": ([cast.other_server_id], [other_job]),
        }
        actual = {}
        for actor in expected:
            token = at.token(actor)
            servers = cast.world.api("GET", "/api/v1/servers", token=token).json()["servers"]
            jobs = cast.world.api("GET", "/api/v1/jobs", token=token).json()["jobs"]
            actual[actor] = (sorted(s["id"] for s in servers), [j["id"] for j in jobs])
    assert expected == actual


@pytest.fixture(scope="module")
def quiet_scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """One scene for requests that must not change anything."""
    with scene(tmp_path_factory.mktemp("quiet")) as at:
        yield at


@pytest.mark.parametrize(
    "route",
    [
        "/api/v1/users",
        "/api/v1/servers",
        "/api/v1/endpoints",
        f"/api/v1/servers/{MISSING_SERVER}/jobs",
        f"/api/v1/servers/{MISSING_SERVER}/admins",
    ],
)
@pytest.mark.parametrize("body", [b"{not json", b'{"name": "\xff"}'], ids=["not JSON", "not UTF-8"])
@pytest.mark.parametrize("token", [None, BOGUS_TOKEN], ids=["no token", "bad token"])
def test_no_valid_credentials_is_401_whatever_the_body(
    quiet_scene: Scene, route: str, body: bytes, token: str | None
) -> None:
    """Without valid credentials a POST is 401, even when its body cannot be parsed."""
    response = quiet_scene.cast.world.api(
        "POST", route, token=token, content=body, headers={"Content-Type": "application/json"}
    )
    expected = UNAUTH
    assert expected == outcome(response)


def test_who_am_i_answers_each_caller_their_own_user(quiet_scene: Scene) -> None:
    """GET /api/v1/me answers the user the token belongs to, as GET /api/v1/users shows it."""
    world = quiet_scene.cast.world
    users = {
        u["id"]: u for u in world.api("GET", "/api/v1/users", token=ADMIN_TOKEN).json()["users"]
    }
    actors = ("owner", "srv-admin", "other")
    answered = [world.api("GET", "/api/v1/me", token=quiet_scene.token(a)).json() for a in actors]
    expected_ids = [
        quiet_scene.cast.owner[0],
        quiet_scene.cast.helper[0],
        quiet_scene.cast.stranger[0],
    ]
    assert [me["id"] for me in answered] == expected_ids
    assert answered == [users[i] for i in expected_ids]
