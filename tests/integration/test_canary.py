"""Canary markers: no secret ever leaves through the user API (docs/protocol.md, "Credentials").

One scenario plants unique markers in every sensitive field: leases (made by the platform, taken
from claims), session ids and keys (from registrations), join tokens, API tokens, passwords and
their argon2 hashes, the platform secret, and a job payload's secret reference, host path and
socket path. It then drives every user route (each GET and POST under /api/v1) while those
secrets are live: a job claimed, acked and progressed with a cancel intent and logs, jobs that
timed out, expired, were lost in a reconciliation, failed and succeeded, and a queued one; in
successful, 401, 403, 404, 409 and 422 answers. No marker may appear in any response body or
header: raw, hex, base64 (standard and urlsafe, padded or not, at any byte offset) or
URL-encoded. Neither may the SHA-256 hashes the store keeps of leases, join and API tokens.

What a user typed in a payload is theirs: a read that asks for it (`include=payload`) shows the
payload's host and socket paths to whoever may read the job, in its `payload` member only, and
its secret reference (under `secret_ref`) redacted (docs/protocol.md, "Payload").

Three answers return a secret once, by design, and only their own freshly created one is excused:
POST /api/v1/users returns the new user's `api_token`; POST /api/v1/users/{user_id}/token the
user's rotated `api_token`; POST /api/v1/endpoints returns the new endpoint's `join_token`.
Every other marker is still checked in those answers.

An Idempotency-Key is not a secret (a client-chosen request name); it is used but not a marker.

Last, a 422 names the field and the problem but never echoes the rejected value, which may be
a secret put in the wrong field (the rule http.py states for validation errors).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.canary_scan import Secret, found_forms, haystack_of
from tests.support.http_harness import (
    ADMIN_TOKEN,
    SECRET,
    HttpWorld,
    SignedRun,
    http_world,
    public_key_of,
    user_routes,
)
from tests.support.stores import memory_factory

SECRET_REF = "vault:kv/canary-secret-ref-5d1c8e2f9a47"
HOST_DIR = "canary-host-path-7b3e0c4d1f62"
SOCKET_NAME = "canary-socket-path-2a9f6b8e3c15"
HOST_PATH = f"/srv/{HOST_DIR}/data"
SOCKET_PATH = f"/run/{SOCKET_NAME}.sock"
PAYLOAD = {"secret_ref": SECRET_REF, "path": HOST_PATH, "socket": SOCKET_PATH}
KINDS = {"noop": {"type": "object", "properties": {"secret_ref": {"type": "string"}}}}
"""What the canary's Run advertises from its second registration on (PAYLOAD fits it)."""
TYPED_BY_THE_USER = (
    "payload host path",
    "payload host directory",
    "payload socket path",
    "payload socket name",
)
"""The markers a payload holds under keys that name no credential: what its submitter typed,
shown back (only) in the `payload` member of a view that asked for it, to whoever may read the
job (docs/protocol.md, "Payload"). The secret reference, under `secret_ref`, is redacted there
too. The platform's own paths and sockets never enter a payload."""
PAYLOAD_ASKED = "include=payload"
IDEMPOTENCY_KEY = "deploy-canary-1"
"""Not a secret: a client's name for a request (it may show up anywhere)."""

# -- the scenario -------------------------------------------------------------------------------


@dataclass
class Seen:
    """A response to the user API, and the one secret it was created to return (if any)."""

    label: str
    response: Any
    fresh: str | None = None
    shows_payload: bool = False
    """A job read or listing that asked for payloads (`include=payload`) and got them."""


@dataclass
class Canary:
    """A world with marked secrets, and every user-facing response it gave."""

    world: HttpWorld
    markers: dict[str, Secret] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    routes: set[tuple[str, str]] = field(default_factory=set)
    who: dict[str | None, str] = field(default_factory=dict)
    leases: dict[tuple[str, int], str] = field(default_factory=dict)
    """The marker name of each (job id, attempt)'s lease."""
    stored: dict[str, str | None] = field(default_factory=dict)
    """The lease hash the store kept right after each claim, by the lease's marker name."""

    def secret(self, name: str, value: Secret, *, hashed: bool = False) -> None:
        """Plant a marker; `hashed` also marks the SHA-256 hex that the store keeps of it."""
        assert name not in self.markers
        self.markers[name] = value
        if hashed:
            assert isinstance(value, str)
            self.markers[f"SHA-256 of {name}"] = hashlib.sha256(value.encode()).hexdigest()

    def call(
        self,
        method: str,
        route: str,
        *,
        token: str | None = ADMIN_TOKEN,
        fresh: str | None = None,
        query: str = "",
        **kwargs: Any,
    ) -> Any:
        """Send a user API request; `route` is the template, with ids given in `kwargs`."""
        ids = {
            key: kwargs.pop(key)
            for key in list(kwargs)
            if key
            in ("server_id", "job_id", "user_id", "endpoint_id", "name", "schedule_id", "group_id")
        }
        path = route.format(**ids) + (f"?{query}" if query else "")
        response = self.world.api(method, path, token=token, **kwargs)
        self.routes.add((method, route))
        caller = self.who.get(token, "an unknown token")
        label = f"{method} {path} as {caller} -> {response.status_code}"
        shows_payload = "include=payload" in query and response.status_code == 200
        self.seen.append(Seen(label, response, fresh, shows_payload))
        return response

    def create_user(
        self, name: str, password: str | None = None, *, platform_admin: bool = False
    ) -> tuple[str, str]:
        body: dict[str, Any] = {"name": name}
        if platform_admin:
            body["platform_admin"] = True
        if password is not None:
            self.secret(f"password of {name}", password)
            body["password"] = password
        response = self.call("POST", "/api/v1/users", json=body, fresh=f"API token of {name}")
        assert response.status_code == 201, response.text
        user_id, token = response.json()["user"]["id"], response.json()["api_token"]
        self.secret(f"API token of {name}", token, hashed=True)
        self.who[token] = name
        if password is not None:
            stored = self.world.store.user_by_name(name)
            assert stored is not None
            assert stored.password_hash is not None
            *_, salt, digest = stored.password_hash.split("$")
            self.secret(f"argon2 hash of {name}'s password", stored.password_hash)
            self.secret(f"argon2 salt of {name}'s password", salt)
            self.secret(f"argon2 digest of {name}'s password", digest)
        return user_id, token

    def create_endpoint(self, name: str) -> tuple[str, str]:
        """(endpoint id, join token), not joined yet."""
        response = self.call(
            "POST", "/api/v1/endpoints", json={"name": name}, fresh=f"join token of {name}"
        )
        assert response.status_code == 201, response.text
        join_token = response.json()["join_token"]
        self.secret(f"join token of {name}", join_token, hashed=True)
        return response.json()["endpoint"]["id"], join_token

    def join(self, join_token: str) -> SignedRun:
        identity = Ed25519PrivateKey.generate()
        body = {"join_token": join_token, "identity_public_key": public_key_of(identity)}
        joined = self.world.client.post("/run/v1/join", json=body)
        assert joined.status_code == 200, joined.text
        return SignedRun(self.world, joined.json()["endpoint_id"], identity)

    def register(self, run: SignedRun, boot_id: str, kinds: dict[str, Any] | None = None) -> None:
        assert run.register(boot_id=boot_id, kinds=kinds).status_code == 201
        self.secret(f"session id of {boot_id}", run.session_id)
        self.secret(f"session key of {boot_id}", run.session_key)
        self.secret(
            f"session key of {boot_id} (wire form)",
            base64.urlsafe_b64encode(run.session_key).decode().rstrip("="),
        )

    def claim(self, run: SignedRun, count: int, labels: dict[str, str]) -> dict[str, int]:
        """Claim `count` jobs; mark each lease; answer the attempt of each job id."""
        granted = run.claim(count)
        assert len(granted) == count
        for job in granted:
            name = f"lease of {labels[job['job_id']]} attempt {job['attempt']}"
            self.leases[(job["job_id"], job["attempt"])] = name
            self.secret(name, job["lease"], hashed=True)
            self.stored[name] = self.world.stored(job["job_id"]).lease_hash
        return {job["job_id"]: job["attempt"] for job in granted}

    def submit(self, server_id: str, token: str, **body: Any) -> str:
        headers = body.pop("headers", {})
        body.setdefault("kind", "noop")
        body.setdefault("payload", PAYLOAD)
        response = self.call(
            "POST",
            "/api/v1/servers/{server_id}/jobs",
            token=token,
            server_id=server_id,
            json=body,
            headers=headers,
        )
        assert response.status_code == 201, response.text
        self.world.clock.advance(1)
        job_id: str = response.json()["id"]
        return job_id


def planted(world: HttpWorld) -> Canary:
    """A canary holding the markers every scenario starts with: the admin token, the platform
    secret and the payload's secret reference, host paths and socket paths."""
    c = Canary(world)
    c.who = {ADMIN_TOKEN: "admin", None: "nobody"}
    c.secret("admin API token", ADMIN_TOKEN, hashed=True)
    c.secret("platform secret", SECRET)
    for name, value in (
        ("payload secret reference", SECRET_REF),
        ("payload host path", HOST_PATH),
        ("payload host directory", HOST_DIR),
        ("payload socket path", SOCKET_PATH),
        ("payload socket name", SOCKET_NAME),
    ):
        c.secret(name, value)
    return c


def build_canary(world: HttpWorld) -> Canary:
    """Plant the markers, bring jobs into every kind of state, and read everything."""
    c = planted(world)

    owner_id, owner = c.create_user("owner", "pw-canary-owner-3b1d9a7c5e80")
    helper_id, helper = c.create_user("helper", "pw-canary-helper-6e2f0a9d4b71")
    _, stranger = c.create_user("stranger")
    _, host_a_token = c.create_endpoint("host-a")
    c.create_endpoint("host-b")  # its join token stays unused, and valid, all along
    run = c.join(host_a_token)
    host_a = run.endpoint_id
    created = c.call(
        "POST",
        "/api/v1/servers",
        json={"name": "web-1", "endpoint_id": host_a, "owner_id": owner_id},
    )
    assert created.status_code == 201, created.text
    web1 = created.json()["id"]
    assert (
        c.call(
            "POST",
            "/api/v1/servers/{server_id}/admins",
            token=owner,
            server_id=web1,
            json={"user_id": helper_id},
        ).status_code
        == 200
    )

    c.register(run, "boot-1")
    assert run.reconcile([]).status_code == 200

    # Two jobs whose first attempts end by the sweeper: one never acked, one whose lease lapses.
    labels: dict[str, str] = {}
    timeout = c.submit(web1, owner)
    expiring = c.submit(web1, owner)
    labels |= {timeout: "timeout job", expiring: "expiring job"}
    first = c.claim(run, 2, labels)
    assert run.ack(expiring, first[expiring]).status_code == 200
    world.clock.advance(31_000)
    assert world.platform.service.sweep() == 1
    world.clock.advance(10_000)
    assert run.heartbeat().status_code == 200
    assert world.platform.service.sweep() == 1
    world.clock.advance(5_000)
    second = c.claim(run, 2, labels)
    for job_id in (timeout, expiring):
        assert run.ack(job_id, second[job_id]).status_code == 200
    failed = run.result(
        timeout, second[timeout], "failed", error={"code": "boom", "message": "it broke"}
    )
    assert failed.status_code == 200, failed.text
    assert run.result(expiring, second[expiring], output={"ok": True}).status_code == 200

    # A running job with progress, logs and a cancel intent; a job lost by a reconciliation.
    running = c.submit(web1, owner, headers={"Idempotency-Key": IDEMPOTENCY_KEY})
    lost = c.submit(web1, helper)
    labels |= {running: "running job", lost: "lost job"}
    third = c.claim(run, 2, labels)
    for job_id in (running, lost):
        assert run.ack(job_id, third[job_id]).status_code == 200
    assert (
        run.progress(running, third[running], 1, percent=40, message="warming up").status_code
        == 200
    )
    assert run.send_logs(running, third[running], 1, "line one", "line two").status_code == 202
    assert run.send_logs(lost, third[lost], 1, "about to be lost").status_code == 202
    uploaded = run.put_chunk(running, third[running], "result.txt", 0, b"artifact bytes", True)
    assert uploaded.status_code == 202, uploaded.text
    cancel = c.call("POST", "/api/v1/jobs/{job_id}/cancel", token=helper, job_id=running)
    assert cancel.status_code == 202, cancel.text
    c.register(run, "boot-2", kinds=KINDS)
    assert run.reconcile([run.entry(running, third[running])]).status_code == 200
    progressed = run.progress(running, third[running], 2, percent=60, message="still going")
    assert (progressed.status_code, progressed.json()["cancel_requested"]) == (200, True)
    assert run.cancel_poll(running, third[running]).status_code == 200
    assert run.send_logs(running, third[running], 2, "line three").status_code == 202
    queued = c.submit(web1, owner)
    labels[queued] = "queued job"
    jobs = [timeout, expiring, running, lost, queued]
    states = ["failed", "succeeded", "running", "retrying", "queued"]
    assert states == [world.stored(job_id).state.value for job_id in jobs]

    read_everything(c, jobs, web1, (ADMIN_TOKEN, owner, helper))
    refused_and_invalid(c, web1, running, owner, stranger)

    # Writes through every remaining POST, then cancels, then everything read again.
    assert c.submit(web1, owner, headers={"Idempotency-Key": IDEMPOTENCY_KEY}) == running
    batch = c.call(
        "POST",
        "/api/v1/servers/{server_id}/jobs/batch",
        token=owner,
        server_id=web1,
        json={"jobs": [{"kind": "noop", "payload": PAYLOAD}] * 2},
    )
    assert batch.status_code == 201, batch.text
    web2 = c.call(
        "POST",
        "/api/v1/servers",
        json={"name": "web-2", "endpoint_id": host_a, "owner_id": helper_id},
    )
    assert web2.status_code == 201, web2.text
    c.create_user("late-user", "pw-canary-late-8c4e2b7f1d93")
    host_c, _ = c.create_endpoint("host-c")
    refused = c.call("POST", "/api/v1/jobs/cancel", token=stranger, json={"job_ids": jobs})
    assert {403} == {entry["status"] for entry in refused.json()["answers"]}, refused.text
    c.call("POST", "/api/v1/jobs/{job_id}/cancel", token=owner, job_id=jobs[0])
    cancelled = c.call("POST", "/api/v1/jobs/cancel", token=owner, json={"job_ids": jobs[1:]})
    assert cancelled.status_code == 200, cancelled.text
    read_everything(c, jobs, web1, (ADMIN_TOKEN, helper))
    assert run.result(running, third[running], "cancelled").status_code == 200
    rerun = c.call("POST", "/api/v1/jobs/{job_id}/rerun", token=owner, job_id=timeout)
    assert rerun.status_code == 201, rerun.text
    read_everything(c, jobs, web1, (owner,))
    schedules(c, web1, owner)
    access_lifecycle(c, host_a, owner)
    removals(c, (web1, web2.json()["id"]), (host_a, host_c), helper)

    for path in ("/healthz", "/metrics", "/openapi.json", "/docs"):
        response = world.client.get(path)
        c.seen.append(Seen(f"GET {path} (no token) -> {response.status_code}", response))
    return c


def schedules(c: Canary, server_id: str, owner: str) -> None:
    """A schedule whose job carries the marked payload, through every schedule route: its view
    shows the job's kind and options, never the payload."""
    body = {"name": "canary nightly", "cron": "@daily", "job": {"kind": "noop", "payload": PAYLOAD}}
    made = c.call(
        "POST", "/api/v1/servers/{server_id}/schedules", token=owner, server_id=server_id, json=body
    )
    assert made.status_code == 201, made.text
    schedule_id = made.json()["id"]
    c.call("GET", "/api/v1/schedules", token=owner)
    c.call("GET", "/api/v1/schedules/{schedule_id}", token=owner, schedule_id=schedule_id)
    c.call(
        "PATCH",
        "/api/v1/schedules/{schedule_id}",
        token=owner,
        schedule_id=schedule_id,
        json={"job": {"kind": "noop", "payload": PAYLOAD}},
    )
    for action in ("pause", "resume", "trigger"):
        answer = c.call(
            "POST", f"/api/v1/schedules/{{schedule_id}}/{action}", token=owner,
            schedule_id=schedule_id,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
    c.call("DELETE", "/api/v1/schedules/{schedule_id}", token=owner, schedule_id=schedule_id)


def access_lifecycle(c: Canary, endpoint_id: str, other: str) -> None:
    """Drain and undrain; for a new user, a new password, a rotated token, disable and enable;
    and the refusals of each."""
    user_id, token = c.create_user("leaver", "pw-canary-leaver-0d7e3a5c1b94")
    for verb in ("drain", "undrain"):
        c.call("POST", f"/api/v1/endpoints/{{endpoint_id}}/{verb}", endpoint_id=endpoint_id)
        c.call(
            "POST",
            f"/api/v1/endpoints/{{endpoint_id}}/{verb}",
            token=other,
            endpoint_id=endpoint_id,
        )
    for caller in (ADMIN_TOKEN, other):
        c.call(
            "PUT",
            "/api/v1/endpoints/{endpoint_id}/labels",
            token=caller,
            endpoint_id=endpoint_id,
            json={"labels": {"zone": "eu"}},
        )
    password = "pw-canary-leaver-new-4f8a1c2e9b60"
    c.secret("new password of leaver", password)
    for caller in (token, other):
        c.call(
            "PUT",
            "/api/v1/users/{user_id}/password",
            token=caller,
            user_id=user_id,
            json={"password": password},
        )
    c.call("PUT", "/api/v1/users/{user_id}/password", user_id=user_id, json={"password": "x"})
    c.call("POST", "/api/v1/users/{user_id}/token", token=other, user_id=user_id)
    rotated = c.call(
        "POST",
        "/api/v1/users/{user_id}/token",
        token=token,
        user_id=user_id,
        fresh="API token of leaver (rotated)",
    )
    assert rotated.status_code == 200, rotated.text
    c.secret("API token of leaver (rotated)", rotated.json()["api_token"], hashed=True)
    for verb in ("disable", "enable"):
        c.call("POST", f"/api/v1/users/{{user_id}}/{verb}", token=other, user_id=user_id)
        c.call("POST", f"/api/v1/users/{{user_id}}/{verb}", user_id=user_id)


def removals(c: Canary, servers: tuple[str, str], endpoints: tuple[str, str], owner: str) -> None:
    """Remove a busy server and an idle one (as its owner), an endpoint in use and an unused
    one."""
    for server_id in servers:
        c.call("DELETE", "/api/v1/servers/{server_id}", token=owner, server_id=server_id)
    for endpoint_id in endpoints:
        c.call("DELETE", "/api/v1/endpoints/{endpoint_id}", endpoint_id=endpoint_id)
    assert [e.id for e in c.world.store.list_endpoints()].count(endpoints[1]) == 0


def read_everything(c: Canary, jobs: list[str], server_id: str, tokens: tuple[str, ...]) -> None:
    """Every GET of the user API, as each of `tokens`."""
    for token in tokens:
        c.call("GET", "/api/v1/me", token=token)
        c.call("GET", "/api/v1/users", token=token)
        c.call("GET", "/api/v1/servers", token=token)
        c.call("GET", "/api/v1/servers/{server_id}", token=token, server_id=server_id)
        c.call("GET", "/api/v1/endpoints", token=token)
        c.call("GET", "/api/v1/jobs", token=token)
        c.call("GET", "/api/v1/jobs", token=token, query=f"server_id={server_id}")
        for state in ("queued", "running", "retrying", "succeeded", "failed", "cancelled"):
            c.call("GET", "/api/v1/jobs", token=token, query=f"state={state}")
        cursor: str | None = ""
        while cursor is not None:
            page = c.call(
                "GET",
                "/api/v1/jobs",
                token=token,
                query=f"limit=1&cursor={cursor}" if cursor else "limit=1",
            )
            cursor = page.json()["next_cursor"]
        c.call("GET", "/api/v1/jobs", token=token, query="include=payload")
        for job_id in jobs:
            c.call("GET", "/api/v1/jobs/{job_id}", token=token, job_id=job_id)
            c.call("GET", "/api/v1/jobs/{job_id}", token=token, job_id=job_id, query=PAYLOAD_ASKED)
            c.call("GET", "/api/v1/jobs/{job_id}/logs", token=token, job_id=job_id)
            for query in ("attempt=1", "attempt=2", "attempt=3", "after_seq=0"):
                c.call("GET", "/api/v1/jobs/{job_id}/logs", token=token, job_id=job_id, query=query)
            c.call("GET", "/api/v1/jobs/{job_id}/artifacts", token=token, job_id=job_id)
            c.call(
                "GET",
                "/api/v1/jobs/{job_id}/artifacts/{name}",
                token=token,
                job_id=job_id,
                name="result.txt",
            )


def refused_and_invalid(c: Canary, server_id: str, job_id: str, owner: str, stranger: str) -> None:
    """401, 403, 404, 409 and 422 answers, many of them to requests that carry secrets."""
    lease = str(c.markers[next(iter(c.leases.values()))])
    for token in (None, lease, c.markers["join token of host-b"]):
        assert isinstance(token, str | None)
        c.call("GET", "/api/v1/jobs/{job_id}", token=token, job_id=job_id)
        c.call("GET", "/api/v1/jobs/{job_id}", token=token, job_id=job_id, query=PAYLOAD_ASKED)
        c.call(
            "POST",
            "/api/v1/servers/{server_id}/jobs",
            token=token,
            server_id=server_id,
            json={"kind": "noop", "payload": PAYLOAD},
        )
    c.call("GET", "/api/v1/jobs/{job_id}", token=stranger, job_id=job_id)
    for asked in (PAYLOAD_ASKED, "include=payloads", "include=payload&wait_s=1"):
        c.call("GET", "/api/v1/jobs/{job_id}", token=stranger, job_id=job_id, query=asked)
    c.call("GET", "/api/v1/jobs", token=stranger, query=PAYLOAD_ASKED)
    c.call("GET", "/api/v1/jobs/{job_id}", job_id=lease, query=PAYLOAD_ASKED)
    c.call("GET", "/api/v1/jobs/{job_id}/logs", token=stranger, job_id=job_id)
    c.call("GET", "/api/v1/jobs/{job_id}/artifacts", token=stranger, job_id=job_id)
    c.call(
        "GET",
        "/api/v1/jobs/{job_id}/artifacts/{name}",
        token=stranger,
        job_id=job_id,
        name="result.txt",
    )
    c.call("POST", "/api/v1/jobs/{job_id}/cancel", token=stranger, job_id=job_id)
    c.call("GET", "/api/v1/servers/{server_id}", token=stranger, server_id=server_id)
    c.call("GET", "/api/v1/servers/{server_id}/kinds", token=stranger, server_id=server_id)
    c.call("GET", "/api/v1/servers/{server_id}/kinds", token=owner, server_id=server_id)
    for caller, labels in ((owner, {"role": "web"}), (stranger, {}), (owner, {"role": lease * 9})):
        c.call(
            "PUT",
            "/api/v1/servers/{server_id}/labels",
            token=caller,
            server_id=server_id,
            json={"labels": labels},
        )
    for selector in ("role%3Dweb", "role%20in%20web"):
        c.call("GET", "/api/v1/servers", token=owner, query=f"selector={selector}")
    # A fan-out of the secret payload, its group read, waited on, listed and cancelled; refused
    # fan-outs (no match, a lease as the selector, an idempotency conflict) and group reads.
    fanned = c.call(
        "POST",
        "/api/v1/jobs/fanout",
        token=owner,
        json={"selector": "role=web", "kind": "noop", "payload": PAYLOAD, "max_parallel": 1},
        headers={"Idempotency-Key": "fan-canary-1"},
    )
    assert fanned.status_code == 201, fanned.text
    group_id = fanned.json()["group"]["id"]
    for body, key, status in (
        ({"selector": "role=web", "kind": "noop", "payload": {"other": 1}}, "fan-canary-1", 409),
        ({"selector": "role=db", "kind": "noop", "payload": PAYLOAD}, "fan-canary-2", 422),
        ({"selector": f"role={lease} x", "kind": "noop", "payload": PAYLOAD}, "fan-3", 422),
    ):
        refused = c.call(
            "POST", "/api/v1/jobs/fanout", token=owner, json=body, headers={"Idempotency-Key": key}
        )
        assert refused.status_code == status, refused.text
    c.call("GET", "/api/v1/groups/{group_id}", token=owner, group_id=group_id)
    c.call("GET", "/api/v1/groups/{group_id}", token=stranger, group_id=group_id)
    c.call("GET", "/api/v1/groups", token=owner)
    c.call("GET", "/api/v1/groups", token=stranger)
    c.call("GET", "/api/v1/groups/{group_id}", group_id=lease)
    c.call("GET", "/api/v1/jobs", token=owner, query=f"group={group_id}")
    c.call("POST", "/api/v1/groups/{group_id}/cancel", token=stranger, group_id=group_id)
    c.call("POST", "/api/v1/groups/{group_id}/cancel", token=owner, group_id=group_id)
    waited = c.call(
        "GET",
        "/api/v1/groups/{group_id}",
        token=owner,
        group_id=group_id,
        query="wait_s=5&until=terminal",
    )
    assert waited.json()["done"] is True, waited.text
    # A selector schedule of the secret payload: made, triggered (a group), read and refused to
    # another user, and refused with a lease as its selector; its views never show the payload.
    fleet = {"name": "canary fleet", "cron": "@daily", "selector": "role=web", "max_parallel": 1}
    scheduled = c.call(
        "POST",
        "/api/v1/schedules",
        token=owner,
        json={**fleet, "job": {"kind": "noop", "payload": PAYLOAD}},
    )
    assert scheduled.status_code == 201, scheduled.text
    fleet_id = scheduled.json()["id"]
    fired = c.call(
        "POST", "/api/v1/schedules/{schedule_id}/trigger", token=owner, schedule_id=fleet_id
    )
    assert fired.json()["group_id"] is not None, fired.text
    c.call("GET", "/api/v1/schedules/{schedule_id}", token=stranger, schedule_id=fleet_id)
    c.call("POST", "/api/v1/schedules/{schedule_id}/trigger", token=stranger, schedule_id=fleet_id)
    refused = c.call(
        "POST",
        "/api/v1/schedules",
        token=owner,
        json={**fleet, "selector": f"role={lease} x", "job": {"kind": "noop", "payload": PAYLOAD}},
    )
    assert refused.status_code == 422, refused.text
    c.call("GET", "/api/v1/schedules", token=owner)
    c.call("DELETE", "/api/v1/schedules/{schedule_id}", token=owner, schedule_id=fleet_id)
    for misfit in (
        {"kind": "noop", "payload": {"secret_ref": [SECRET_REF]}},  # 422 invalid_payload
        {"kind": "nope", "payload": PAYLOAD},  # 422 unknown_kind
    ):
        refused = c.call(
            "POST",
            "/api/v1/servers/{server_id}/jobs",
            token=owner,
            server_id=server_id,
            json=misfit,
        )
        assert refused.status_code == 422, refused.text
    c.call("POST", "/api/v1/jobs/{job_id}/rerun", token=owner, job_id=job_id)  # 409 not finished
    c.call("POST", "/api/v1/jobs/{job_id}/rerun", token=stranger, job_id=job_id)
    c.call("DELETE", "/api/v1/jobs/{job_id}", token=owner, job_id=job_id)  # 409 not finished
    c.call("DELETE", "/api/v1/jobs/{job_id}", token=stranger, job_id=job_id)  # 404
    c.call(
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        token=stranger,
        server_id=server_id,
        json={"kind": "noop", "payload": PAYLOAD},
    )
    c.call("GET", "/api/v1/users", token=owner)
    c.call("GET", "/api/v1/endpoints", token=owner)
    c.call(
        "POST",
        "/api/v1/users",
        token=owner,
        json={"name": "sneaky", "password": "pw-canary-owner-3b1d9a7c5e80"},
    )
    c.call("GET", "/api/v1/jobs/{job_id}", job_id=lease)
    c.call("GET", "/api/v1/jobs/{job_id}/logs", job_id=lease)
    c.call("GET", "/api/v1/jobs/{job_id}/artifacts", job_id=lease)
    c.call("GET", "/api/v1/servers/{server_id}", server_id=c.markers["join token of host-b"])
    c.call("GET", "/api/v1/jobs", query=f"cursor={quote(lease)}")
    c.call(
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        token=owner,
        server_id=server_id,
        json={"kind": "noop", "payload": {"other": 1}},
        headers={"Idempotency-Key": IDEMPOTENCY_KEY},
    )
    c.call(
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        token=owner,
        server_id=server_id,
        json={"kind": "noop", "payload": PAYLOAD, "max_attempts": "three"},
    )
    c.call(
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        token=owner,
        server_id=server_id,
        json={"kind": 7, "payload": PAYLOAD},
    )
    c.call(
        "POST",
        "/api/v1/servers/{server_id}/jobs",
        token=owner,
        server_id=server_id,
        json={"kind": "noop", "payload": [SECRET_REF, HOST_PATH, SOCKET_PATH]},
    )
    c.call(
        "POST",
        "/api/v1/users",
        json={"name": "bad name!", "password": "pw-canary-owner-3b1d9a7c5e80"},
    )
    c.call("POST", "/api/v1/users", json={"name": "x", "password": 12345678901})
    c.call(
        "POST",
        "/api/v1/servers/{server_id}/admins",
        token=owner,
        server_id=server_id,
        json={"user_id": lease},
    )
    c.call(
        "DELETE",
        "/api/v1/servers/{server_id}/admins/{user_id}",
        token=owner,
        server_id=server_id,
        user_id=lease,
    )
    c.call(
        "POST",
        "/api/v1/servers",
        json={"name": "web-3", "endpoint_id": lease, "owner_id": "nobody"},
    )


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Canary]:
    world = HttpWorld(memory_factory(), tmp_path_factory.mktemp("canary") / "artifacts")
    try:
        yield build_canary(world)
    finally:
        world.close()


# -- tests --------------------------------------------------------------------------------------


def test_the_scenario_drives_every_user_route(canary: Canary) -> None:
    """Every GET and POST under /api/v1 is among the responses the canary scans."""
    assert user_routes(canary.world.app) == canary.routes


def test_the_scenario_answers_every_kind_of_status(canary: Canary) -> None:
    """Successes and every user-facing refusal are among the scanned responses."""
    statuses = {seen.response.status_code for seen in canary.seen}
    assert {200, 201, 202, 401, 403, 404, 409, 422} == statuses


def test_the_markers_were_live_secrets_while_the_responses_were_taken(canary: Canary) -> None:
    """Passwords sign in, the store keeps exactly the marked hashes, the unused join token joins."""
    world, markers = canary.world, canary.markers
    directory = world.platform.directory
    signed_in = {
        name: directory.sign_in(name, str(markers[f"password of {name}"])) is not None
        for name in ("owner", "helper", "late-user")
    }
    expected = {"owner": True, "helper": True, "late-user": True}
    assert expected == signed_in
    hashes = {f"SHA-256 of {name}": markers[f"SHA-256 of {name}"] for name in canary.stored}
    assert hashes == {f"SHA-256 of {name}": stored for name, stored in canary.stored.items()}
    assert len(canary.leases) == 6
    joined = world.client.post(
        "/run/v1/join",
        json={
            "join_token": markers["join token of host-b"],
            "identity_public_key": public_key_of(Ed25519PrivateKey.generate()),
        },
    )
    assert joined.status_code == 200


@dataclass
class WithoutPayloads:
    """A response as `haystack_of` reads it, every view's `payload` member taken out."""

    status_code: int
    headers: Any
    content: bytes

    @classmethod
    def of(cls, response: Any) -> WithoutPayloads:
        body = response.json()
        for view in body.get("jobs", [body]):
            view.pop("payload")
        return cls(response.status_code, response.headers, json.dumps(body).encode())


def test_no_secret_appears_in_any_user_facing_response(canary: Canary) -> None:
    """No marker, in any encoding, in any user-facing body or header (see the module doc);
    what the user typed in a payload only in the `payload` member of an answer that asked for
    it (TYPED_BY_THE_USER), and its secret reference nowhere."""
    leaks = []
    for seen in canary.seen:
        haystack = haystack_of(seen.response)
        outside_payloads = (
            haystack_of(WithoutPayloads.of(seen.response)) if seen.shows_payload else haystack
        )
        for name, secret in canary.markers.items():
            if name == seen.fresh:
                continue  # POST /users and POST /endpoints return this one secret, by design
            scanned = outside_payloads if name in TYPED_BY_THE_USER else haystack
            leaks += [f"{seen.label}: {name} ({form})" for form in found_forms(secret, scanned)]
    assert leaks == []
    assert len(canary.seen) > 300


def test_payloads_are_shown_only_to_readers_who_asked_with_the_secret_reference_redacted(
    canary: Canary,
) -> None:
    """Every answer that asked for payloads and got them shows the marked payload with its
    `secret_ref` redacted; a refused one shows none."""
    asked = [seen for seen in canary.seen if PAYLOAD_ASKED in seen.label.split()[1]]
    shown = [seen for seen in asked if seen.shows_payload]
    payloads = [
        view["payload"]
        for seen in shown
        for view in seen.response.json().get("jobs", [seen.response.json()])
    ]
    assert len(shown) > 10
    assert {json.dumps(p, sort_keys=True) for p in payloads} >= {
        json.dumps({**PAYLOAD, "secret_ref": "[redacted]"}, sort_keys=True)
    }
    assert all(p.get("secret_ref", "[redacted]") == "[redacted]" for p in payloads)
    refused = {seen.response.status_code for seen in asked if not seen.shows_payload}
    assert refused == {401, 403, 404, 422}


def test_lease_hashes_never_appear(canary: Canary) -> None:
    """The SHA-256 hex of every lease (what the store keeps) is in no response, in any case."""
    hashes = {
        name: value for name, value in canary.markers.items() if name.startswith("SHA-256 of lease")
    }
    assert len(hashes) == 6
    leaks = [
        f"{seen.label}: {name}"
        for seen in canary.seen
        for name, value in hashes.items()
        if str(value).lower() in haystack_of(seen.response).lower()
    ]
    assert leaks == []


def test_creation_answers_return_their_own_new_secret_once(canary: Canary) -> None:
    """The only excused answers carry exactly their new token, in its documented field."""
    excused = [seen for seen in canary.seen if seen.fresh is not None]
    assert {"POST"} == {seen.label.split()[0] for seen in excused}
    fields = {"api_token": "API token of", "join_token": "join token of"}
    for seen in excused:
        body = seen.response.json()
        (field_name,) = [name for name in fields if name in body]
        assert seen.fresh.startswith(fields[field_name])
        assert canary.markers[seen.fresh] == body[field_name]
    assert len(excused) == 9  # 5 users, 3 endpoints, 1 rotated token


@pytest.mark.parametrize("secret", ["mrl_" + "x" * 43, b"\x00\x01binary-key-material\xff\xfe"])
def test_the_scanner_finds_every_encoding(secret: Secret) -> None:
    """Each encoding of a marker, embedded in other text at any offset, is found."""
    raw = secret.encode() if isinstance(secret, str) else secret
    blobs = {
        "hex": "prefix " + raw.hex().upper() + " suffix",
        "base64 at offset 1": base64.b64encode(b"a" + raw + b"zz").decode(),
        "base64url at offset 2": base64.urlsafe_b64encode(b"ab" + raw + b"z").decode(),
        "base64url unpadded": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "url-encoded": "q=" + quote(raw, safe=""),
    }
    if isinstance(secret, str):
        blobs["raw"] = f'{{"x": "..{secret}.."}}'
    found = {name: bool(found_forms(secret, blob)) for name, blob in blobs.items()}
    assert dict.fromkeys(blobs, True) == found
    assert found_forms(secret, "nothing to see " + base64.b64encode(b"other").decode()) == []


JOBS_ROUTE = "/api/v1/servers/{server_id}/jobs"


@pytest.mark.parametrize(
    ("method", "route", "request_options"),
    [
        pytest.param("POST", JOBS_ROUTE, {"json": {"kind": SECRET_REF}}, id="kind"),
        pytest.param(
            "POST",
            JOBS_ROUTE,
            {"json": {"kind": "noop", "max_attempts": SECRET_REF}},
            id="max_attempts",
        ),
        pytest.param(
            "POST",
            JOBS_ROUTE,
            {"json": {"kind": "noop", "not_before": SECRET_REF}},
            id="not_before",
        ),
        pytest.param(
            "POST",
            JOBS_ROUTE,
            {"json": {"kind": "noop"}, "headers": {"Idempotency-Key": f"{SECRET_REF} x"}},
            id="Idempotency-Key",
        ),
        pytest.param("GET", "/api/v1/jobs", {"params": {"state": SECRET_REF}}, id="state"),
        pytest.param("GET", "/api/v1/jobs", {"params": {"cursor": SECRET_REF}}, id="cursor"),
        pytest.param("GET", "/api/v1/jobs", {"params": {"limit": SECRET_REF}}, id="limit"),
        pytest.param("POST", "/api/v1/users", {"json": {"name": SECRET_REF}}, id="user name"),
        pytest.param(
            "POST",
            "/api/v1/users",
            {"json": {"name": "someone", "platform_admin": SECRET_REF}},
            id="platform_admin",
        ),
        pytest.param(
            "POST", "/api/v1/endpoints", {"json": {"name": SECRET_REF}}, id="endpoint name"
        ),
    ],
)
def test_a_rejected_value_is_never_echoed(
    tmp_path: Path, method: str, route: str, request_options: dict[str, Any]
) -> None:
    """A 422 names the field and the problem, never the value (it may be a misplaced secret)."""
    with http_world(memory_factory(), tmp_path) as cast:
        path = route.format(server_id=cast.server_id)
        response = cast.world.api(method, path, **request_options)
    expected = (422, [])
    assert expected == (response.status_code, found_forms(SECRET_REF, haystack_of(response)))
