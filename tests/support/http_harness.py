"""The real ASGI app over a store, driven through HTTP with a signing Run client.

`HttpWorld` builds the platform exactly as `moonrun platform serve` does, but with a manual
clock and repeatable tokens, and serves it in-process (Starlette's TestClient). `SignedRun`
speaks docs/protocol.md, "Joining and sessions" to "Artifacts", as any Run would: Ed25519 for
registration, HMAC for the rest.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from moonrun.artifacts.file import FileArtifactStore
from moonrun.artifacts.protocol import ArtifactStore
from moonrun.clock import ManualClock
from moonrun.http.channels import Channels
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogStore
from moonrun.scheduling.jobs import Job
from moonrun.security import signing
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.websessions import WebSessions
from moonrun.store import codec
from moonrun.wiring.app import create_app
from moonrun.wiring.platform import Platform
from tests.support.stores import StoreFactory

ADMIN_TOKEN = "mra_http-harness-admin-token-000000000000000"
SECRET = bytes(range(32))
SETTINGS = SchedulingSettings(
    ack_timeout_s=30,
    lease_ttl_s=40,
    session_ttl_s=50,
    max_attempts=3,
    backoff_initial_s=1,
    backoff_multiplier=2,
    backoff_max_s=60,
)


def user_routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path template) of every route under /api/v1/, read from the app's route tables
    (the APIs' own, and FastAPI's in case a user route were ever added there)."""
    found: set[tuple[str, str]] = {(route.method, route.path) for route in app.api.routes}  # type: ignore[attr-defined]

    def walk(routes: list[Any], prefix: str) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)
            if included is not None:  # newer FastAPI keeps an included router as one route
                walk(included.routes, prefix + route.include_context.prefix)
            elif isinstance(route, APIRoute):
                found.update((method, prefix + route.path) for method in route.methods)

    walk(list(app.routes), "")
    return {(method, path) for method, path in found if path.startswith("/api/v1/")}


def public_key_of(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return signing.b64url(raw)


@dataclass
class SignedRun:
    """A Run on one endpoint: its identity key, its current session, the leases it holds."""

    world: HttpWorld
    endpoint_id: str
    identity: Ed25519PrivateKey
    session_id: str = ""
    session_key: bytes = b""
    generation: int = 0
    leases: dict[tuple[str, int], str] = field(default_factory=dict)

    # -- signing -------------------------------------------------------------------------------

    def signed_headers(
        self,
        method: str,
        path: str,
        body: bytes,
        *,
        query: str = "",
        key_id: str | None = None,
        key: bytes | Ed25519PrivateKey | None = None,
        created: int | None = None,
        nonce: str | None = None,
    ) -> dict[str, str]:
        headers = signing.sign(
            method,
            path,
            query,
            body,
            key_id=key_id or f"session:{self.session_id}",
            key=key if key is not None else self.session_key,
            created=created if created is not None else self.world.clock.now() // 1000,
            nonce=nonce or signing.b64url(secrets.token_bytes(16)),
        )
        headers["Content-Type"] = "application/json"
        return headers

    def post(self, path: str, body: Any, **signing_options: Any) -> httpx.Response:
        """POST `body` as JSON, signed with the session key (or the given key)."""
        data = json.dumps(body).encode()
        headers = self.signed_headers("POST", path, data, **signing_options)
        return self.world.client.post(path, content=data, headers=headers)

    # -- control channel -----------------------------------------------------------------------

    def register(
        self, capacity: int = 4, boot_id: str = "boot-1", kinds: dict[str, Any] | None = None
    ) -> httpx.Response:
        """Register a session; `kinds` is what this Run advertises (none: an older Run)."""
        body: dict[str, Any] = {"boot_id": boot_id, "run_version": "0.1.0", "capacity": capacity}
        if kinds is not None:
            body["kinds"] = kinds
        response = self.post(
            "/run/v1/sessions",
            body,
            key_id=f"endpoint:{self.endpoint_id}",
            key=self.identity,
        )
        if response.status_code == 201:
            answer = response.json()
            self.session_id = answer["session_id"]
            self.session_key = signing.b64url_decode(answer["session_key"])
            self.generation = answer["generation"]
        return response

    def start(self, capacity: int = 4, kinds: dict[str, Any] | None = None) -> SignedRun:
        """Register and reconcile an empty journal: ready to claim."""
        assert self.register(capacity, kinds=kinds).status_code == 201
        assert self.reconcile([]).status_code == 200
        return self

    def heartbeat(self) -> httpx.Response:
        return self.post("/run/v1/heartbeat", {})

    # -- jobs channel --------------------------------------------------------------------------

    def reconcile(self, entries: list[dict[str, Any]]) -> httpx.Response:
        return self.post("/run/v1/reconcile", {"entries": entries})

    def entry(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"job_id": job_id, "attempt": attempt, "lease": self.leases[(job_id, attempt)]}

    def claim(self, max_jobs: int = 1) -> list[dict[str, Any]]:
        response = self.post("/run/v1/jobs/claim", {"max_jobs": max_jobs})
        assert response.status_code == 200, response.text
        jobs: list[dict[str, Any]] = response.json()["jobs"]
        for job in jobs:
            self.leases[(job["job_id"], job["attempt"])] = job["lease"]
        return jobs

    def evidence(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {"attempt": attempt, "lease": self.leases[(job_id, attempt)]}

    def ack(self, job_id: str, attempt: int) -> httpx.Response:
        return self.post(f"/run/v1/jobs/{job_id}/ack", self.evidence(job_id, attempt))

    def progress(self, job_id: str, attempt: int, seq: int, **fields: Any) -> httpx.Response:
        body = {**self.evidence(job_id, attempt), "seq": seq, **fields}
        return self.post(f"/run/v1/jobs/{job_id}/progress", body)

    def cancel_poll(self, job_id: str, attempt: int) -> httpx.Response:
        return self.post(f"/run/v1/jobs/{job_id}/cancel-poll", self.evidence(job_id, attempt))

    def result(
        self, job_id: str, attempt: int, outcome: str = "succeeded", **fields: Any
    ) -> httpx.Response:
        fields.setdefault("retryable", False)
        body = {**self.evidence(job_id, attempt), "outcome": outcome, **fields}
        return self.post(f"/run/v1/jobs/{job_id}/result", body)

    def run_to_running(self, job_id: str) -> int:
        (granted,) = self.claim(1)
        assert granted["job_id"] == job_id
        assert self.ack(job_id, granted["attempt"]).status_code == 200
        return int(granted["attempt"])

    # -- logs and artifacts --------------------------------------------------------------------

    def send_logs(
        self, job_id: str, attempt: int, seq: int, *texts: str, final: bool = False
    ) -> httpx.Response:
        """A batch of `texts`; `final`: the attempt's last (its logs are then complete)."""
        lines = [{"ts": "2026-11-30T00:00:00.000Z", "stream": "stdout", "text": t} for t in texts]
        body: dict[str, Any] = {
            "job_id": job_id,
            **self.evidence(job_id, attempt),
            "seq": seq,
            "lines": lines,
        }
        if final:
            body["final"] = True
        return self.post("/run/v1/logs", body)

    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool = False
    ) -> httpx.Response:
        path = f"/run/v1/artifacts/{job_id}/{attempt}/{name}/{index}"
        headers = self.signed_headers("PUT", path, data)
        headers["Content-Type"] = "application/octet-stream"
        headers["Run-Lease"] = self.leases[(job_id, attempt)]
        if final:
            headers["Run-Final"] = "true"
        return self.world.client.put(path, content=data, headers=headers)


class HttpWorld:
    """A served platform with an admin, an owner, a server administrator, a stranger, and two
    joined endpoints (host-a with server web-1 of the owner; host-b with db-1 of the stranger)."""

    def __init__(
        self,
        factory: StoreFactory,
        artifacts_dir: Path,
        *,
        logs: LogStore | None = None,
        artifacts: ArtifactStore | None = None,
        channels: Channels | None = None,
        settings: SchedulingSettings = SETTINGS,
    ) -> None:
        self.clock = ManualClock()
        self.tokens = SeededTokenSource(11)
        self.store = factory.open()
        self.factory = factory
        service = SchedulingService(self.store, self.clock, self.tokens, settings)
        directory = Directory(self.store, self.clock, self.tokens)
        directory.ensure_bootstrap_admin(ADMIN_TOKEN)
        self.settings = settings
        self.platform = Platform(
            service=service,
            directory=directory,
            web=WebSessions(self.store, self.clock, SECRET),
            clock=self.clock,
            secret=SECRET,
            logs=logs or MemoryLogStore(),
            artifacts=artifacts or FileArtifactStore(artifacts_dir),
            channels=channels or Channels.with_limits(),
        )
        self.app = create_app(self.platform, sweep=False)
        self.client = TestClient(self.app, raise_server_exceptions=True)

    # -- users ---------------------------------------------------------------------------------

    def api(self, method: str, path: str, token: str | None = ADMIN_TOKEN, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(method, path, headers=headers, **kwargs)

    def create_user(self, name: str, **fields: Any) -> tuple[str, str]:
        """(user id, API token)."""
        response = self.api("POST", "/api/v1/users", json={"name": name, **fields})
        assert response.status_code == 201, response.text
        answer = response.json()
        return answer["user"]["id"], answer["api_token"]

    def create_endpoint(self, name: str) -> SignedRun:
        """Create and join an endpoint; the returned Run has not registered yet."""
        response = self.api("POST", "/api/v1/endpoints", json={"name": name})
        assert response.status_code == 201, response.text
        identity = Ed25519PrivateKey.generate()
        joined = self.client.post(
            "/run/v1/join",
            json={
                "join_token": response.json()["join_token"],
                "identity_public_key": public_key_of(identity),
            },
        )
        assert joined.status_code == 200, joined.text
        return SignedRun(self, joined.json()["endpoint_id"], identity)

    def create_server(self, name: str, endpoint_id: str, owner_id: str) -> str:
        response = self.api(
            "POST",
            "/api/v1/servers",
            json={"name": name, "endpoint_id": endpoint_id, "owner_id": owner_id},
        )
        assert response.status_code == 201, response.text
        server_id: str = response.json()["id"]
        return server_id

    def submit(self, server_id: str, token: str, **body: Any) -> dict[str, Any]:
        body.setdefault("kind", "noop")
        response = self.api("POST", f"/api/v1/servers/{server_id}/jobs", token=token, json=body)
        assert response.status_code == 201, response.text
        self.clock.advance(1)  # a total order of creation, as in the service-level harness
        job: dict[str, Any] = response.json()
        return job

    def stored(self, job_id: str) -> Job:
        job = self.store.get_job(job_id)
        assert job is not None
        return job

    def stored_row(self, job_id: str) -> dict[str, Any]:
        """The job exactly as the store keeps it, column by column."""
        return codec.job_to_row(self.stored(job_id))

    def restart(self) -> None:
        """A new platform instance over the reopened store (same secret), served afresh."""
        self.client.close()
        self.platform.close()
        self.store = self.factory.reopen(self.store)
        service = SchedulingService(self.store, self.clock, self.tokens, self.settings)
        directory = Directory(self.store, self.clock, self.tokens)
        self.platform = Platform(
            service=service,
            directory=directory,
            web=WebSessions(self.store, self.clock, SECRET),
            clock=self.clock,
            secret=SECRET,
            logs=self.platform.logs,
            artifacts=self.platform.artifacts,
        )
        self.app = create_app(self.platform, sweep=False)
        self.client = TestClient(self.app, raise_server_exceptions=True)

    def close(self) -> None:
        self.client.close()
        self.platform.close()
        self.store.close()


@dataclass
class Cast:
    """The usual people and places of an HTTP test."""

    world: HttpWorld
    owner: tuple[str, str]
    helper: tuple[str, str]
    stranger: tuple[str, str]
    run: SignedRun
    other_run: SignedRun
    server_id: str
    other_server_id: str


@contextmanager
def http_world(factory: StoreFactory, tmp_path: Path, **options: Any) -> Iterator[Cast]:
    world = HttpWorld(factory, tmp_path / "artifacts", **options)
    try:
        owner = world.create_user("owner")
        helper = world.create_user("helper")
        stranger = world.create_user("stranger")
        run = world.create_endpoint("host-a")
        other_run = world.create_endpoint("host-b")
        server_id = world.create_server("web-1", run.endpoint_id, owner[0])
        response = world.api(
            "POST",
            f"/api/v1/servers/{server_id}/admins",
            token=owner[1],
            json={"user_id": helper[0]},
        )
        assert response.status_code == 200, response.text
        other_server_id = world.create_server("db-1", other_run.endpoint_id, stranger[0])
        yield Cast(world, owner, helper, stranger, run, other_run, server_id, other_server_id)
    finally:
        world.close()
