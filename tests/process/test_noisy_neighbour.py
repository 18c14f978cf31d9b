"""Noisy neighbours: one owner's floods on a shared endpoint never reach another owner's jobs.

A real platform and a real Run (tests/support/e2e.py). Owner A and owner B each have a server on the
same endpoint. A floods it: commands that print a 30 MB line, a million short lines, control
characters and bytes that are not UTF-8; artifacts that are large, sparse and huge, named like
paths, or pointing at Run's own key; payloads nested past the limit, too wide, holding lone
surrogates, too big, of kinds no handler runs. Meanwhile B's 100 jobs must all succeed on their
first attempt, each with exactly its own log line, and A's floods must have been refused with
typed errors or bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.run.client import PlatformClient, join
from moonrun.security import signing
from tests.process.test_platform_edge import Stalled, stalled_post
from tests.support.e2e import Cluster, JobView, cluster
from tests.support.launcher import wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = [pytest.mark.processes, pytest.mark.alone]

B_JOBS = 100
FLOOD_LINE_BYTES = 30_000_000
CONTROLS = r"printf '\033[2J\342\200\256evil\r\nB: ok\n\377\376\355\240\200\n'"
"""Clear-screen, a bidi override, CR/LF posing as another line, bytes that are not UTF-8."""


class Owner:
    """A user holding one server on the shared endpoint, speaking the user API with its token."""

    def __init__(self, cl: Cluster, name: str, endpoint_id: str) -> None:
        created = cl.created("/api/v1/users", {"name": name, "platform_admin": False})
        self.id = created["user"]["id"]
        body = {"name": f"{name}-server", "endpoint_id": endpoint_id, "owner_id": self.id}
        self.server_id = cl.created("/api/v1/servers", body)["id"]
        self.client = httpx.Client(
            base_url=cl.platform.url,
            headers={"Authorization": f"Bearer {created['api_token']}"},
            timeout=30,
        )

    def post_job(self, body: bytes | dict[str, Any]) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.client.post(
            f"/api/v1/servers/{self.server_id}/jobs",
            content=content,
            headers={"Content-Type": "application/json"},
        )

    def submit(self, kind: str, payload: Any) -> str:
        response = self.post_job({"kind": kind, "payload": payload, "max_attempts": 1})
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    def job(self, job_id: str) -> JobView:
        response = self.client.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        view: JobView = response.json()
        return view

    def logs(self, job_id: str) -> tuple[list[dict[str, Any]], int]:
        """Every log line the platform kept of the job's latest attempt, page after page, and
        how many bytes it dropped."""
        lines: list[dict[str, Any]] = []
        after_seq = -1
        while True:
            params = {"after_seq": after_seq}
            response = self.client.get(f"/api/v1/jobs/{job_id}/logs", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            lines += page["lines"]
            if not page["more"]:
                return lines, page["dropped_bytes"]
            after_seq = page["next_after_seq"]


def nested(depth: int) -> dict[str, Any]:
    """A payload `depth` levels deep: an object holding lists."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"deep": value}


def sh(script: str, *artifacts: tuple[str, str]) -> dict[str, Any]:
    payload: dict[str, Any] = {"argv": ["sh", "-c", script], "timeout_s": 120}
    if artifacts:
        payload["artifacts"] = [{"path": path, "name": name} for path, name in artifacts]
    return payload


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Cluster, Owner, Owner]]:
    with cluster(tmp_path) as cl:
        # Run as root confines commands to an unprivileged user, as docs/operations.md advises.
        options = ("--run-as", "nobody") if os.geteuid() == 0 else ()
        run = cl.add_run("shared", capacity=8, start=False)
        run.start(options=options)
        a = Owner(cl, "owner-a", run.endpoint_id)
        b = Owner(cl, "owner-b", run.endpoint_id)
        yield cl, a, b
        a.client.close()
        b.client.close()


def flood(a: Owner, key_path: Path) -> tuple[list[str], list[int]]:
    """Owner A's floods: the jobs it got created and the statuses of what was refused."""
    jobs = [
        a.submit("command", sh(f'head -c {FLOOD_LINE_BYTES} /dev/zero | tr "\\0" A')),
        a.submit("command", sh("yes spam | head -n 1000000")),
        a.submit(
            "command", sh(r"printf '\033[2J\342\200\256evil\r\nB: ok\n\377\376\355\240\200\n'")
        ),
        a.submit(
            "command",
            sh(
                "head -c 20000000 /dev/urandom > big.bin && truncate -s 3G sparse.bin",
                ("big.bin", "big.bin"),
                ("sparse.bin", "sparse.bin"),
                (str(key_path), "identity.key"),
                ("/etc/shadow", "shadow"),
            ),
        ),
        a.submit("noop", nested(32)),
        a.submit("noop", {"wide": [0] * 9_000}),
    ]
    refused = [
        a.post_job({"kind": "no-such-kind", "payload": {}}).status_code,
        a.post_job({"kind": "command", "payload": {"argv": "echo hi"}}).status_code,
        a.post_job({"kind": "noop", "payload": nested(40)}).status_code,
        a.post_job({"kind": "noop", "payload": {"wide": [0] * 10_001}}).status_code,
        a.post_job(b'{"kind": "noop", "payload": {"\\ud800": "\\udfff"}}').status_code,
        a.post_job({"kind": "noop", "payload": {"x": "y" * 400_000}}).status_code,
        a.post_job(
            b'{"kind": "noop", "payload": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"
        ).status_code,
        a.post_job(b"\xff\xfe{").status_code,
        a.post_job({"kind": "command", "payload": sh("true", ("x", "../../escape"))}).status_code,
    ]
    return jobs, refused


def test_one_owners_floods_never_touch_another_owners_jobs_on_a_shared_endpoint(
    shared: tuple[Cluster, Owner, Owner],
) -> None:
    """A floods logs, artifacts and poison payloads; B's 100 jobs all succeed on their first
    attempt, each with its own log line; A's floods are refused with typed errors or bounded."""
    cl, a, b = shared
    run = cl.runs[0]
    with cl.explained():
        a_jobs, refused = flood(a, run.data_dir / "identity.key")
        b_jobs = [b.submit("command", {"argv": ["echo", f"b-{n}"]}) for n in range(B_JOBS)]
        a_jobs += flood(a, run.data_dir / "identity.key")[0]

        def ended(owner: Owner, job_id: str) -> JobView | None:
            view = owner.job(job_id)
            return view if view["state"] in ("succeeded", "failed", "cancelled") else None

        b_views = [wait_for(lambda j=job_id: ended(b, j), f"B's job {job_id}") for job_id in b_jobs]
        a_views = [
            wait_for(lambda j=job_id: ended(a, j), f"A's job {job_id}", timeout_s=240)
            for job_id in a_jobs
        ]
        run.check_alive()

        b_endings = [
            (
                view["state"],
                view["attempt"],
                [(h["attempt"], h["outcome"]) for h in view["history"]],
            )
            for view in b_views
        ]
        assert b_endings == [("succeeded", 1, [(1, "succeeded")])] * B_JOBS

        def shipped(job_id: str) -> list[str] | None:
            texts = [line["text"] for line in b.logs(job_id)[0]]
            return texts or None

        # Logs travel on their own path: a line may arrive a flush after its job ended.
        b_logs = [
            wait_for(lambda j=job_id: shipped(j), f"B's log of {job_id}") for job_id in b_jobs
        ]
        missing = {job_id for job_id, texts in zip(b_jobs, b_logs, strict=True) if not texts}
        why = [e for e in run.events() if e.get("job_id") in missing]
        assert b_logs == [[f"b-{n}"] for n in range(B_JOBS)], "\n".join(map(json.dumps, why))
        assert refused == [422, 422, 422, 422, 422, 413, 422, 422, 422]
        assert [view["state"] for view in a_views[:6]] == ["succeeded"] * 6
        flooded, dropped_bytes = a.logs(a_jobs[0])
        kept = sum(len(line["text"].encode()) for line in flooded)
        said = any("line(s) dropped" in line["text"] for line in flooded)
        assert (kept < FLOOD_LINE_BYTES // 4, said or dropped_bytes > 0) == (True, True)


# -- an attacker without credentials ------------------------------------------------------------

ROUNDS = 3
SAMPLES = 30
"""Per round and phase: the heartbeats, claims and reads each phase's median is taken over."""
FLOOD_READS = 4_200
SETTLE_S = 0.05


class Probe:
    """A Run on the wire (moonrun's own client, on an endpoint of its own) and a user reading
    their job: what the attack must not slow down. Each call is timed, in milliseconds."""

    def __init__(self, cl: Cluster, owner: Owner, job_id: str) -> None:
        endpoint_id, token = cl.create_endpoint("probe")
        key = Ed25519PrivateKey.generate()
        self.loop = asyncio.new_event_loop()
        public = signing.b64url(key.public_key().public_bytes_raw())
        self.loop.run_until_complete(join(cl.platform.url, token, public))
        self.run = PlatformClient(cl.platform.url, endpoint_id, key)
        self.loop.run_until_complete(self._register())
        self.owner, self.job_id = owner, job_id

    async def _register(self) -> None:
        await self.run.__aenter__()
        await self.run.register("probe-boot", 1)
        await self.run.reconcile([])

    def sample(self, times: dict[str, list[float]], keep_up: Callable[[], None]) -> None:
        for _ in range(SAMPLES):
            keep_up()
            # Both phases pause alike before each sample: the attacker's sockets reopened just
            # now are then held, as a real attacker's are, rather than timed in the instant
            # the platform reads their heads (this test's own burst, in step with the probe).
            time.sleep(SETTLE_S)
            for name, call in (
                ("heartbeat", lambda: self.loop.run_until_complete(self.run.heartbeat())),
                ("claim", lambda: self.loop.run_until_complete(self.run.claim(1))),
                ("read", lambda: self.owner.job(self.job_id)),
            ):
                started = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - started) * 1000)

    def heartbeat(self) -> None:
        """Keep the probe's session (untimed)."""
        self.loop.run_until_complete(self.run.heartbeat())

    def close(self) -> None:
        self.loop.run_until_complete(self.run.__aexit__())
        self.loop.close()


class Attacker:
    """No credentials: stalled bodies on the Run routes, the user API and the sign-in form,
    and heads that grow past every bound; kept up while it attacks."""

    def __init__(self, port: int) -> None:
        big_head = b"GET /api/v1/servers HTTP/1.1\r\nHost: p\r\nX-Big: " + b"x" * 60_000
        self.stalled = [
            Stalled(port, stalled_post("/run/v1/heartbeat"), 16),
            Stalled(port, stalled_post("/run/v1/jobs/claim"), 32),
            Stalled(port, stalled_post("/api/v1/servers"), 16),
            Stalled(port, stalled_post("/login"), 200, b"username=x"),
            Stalled(port, big_head, 6),
        ]

    def keep_up(self) -> None:
        for stalled in self.stalled:
            stalled.keep_up()

    def close(self) -> None:
        for stalled in self.stalled:
            stalled.close()


def test_an_attacker_without_credentials_slows_neither_a_run_nor_a_user(tmp_path: Path) -> None:
    """Beside a real Run, a Run's heartbeats and claims and a user's reads keep their median
    latency within 2x of a quiet run while an attacker without credentials holds stalled
    bodies on the Run routes, the user API and the sign-in form, sends heads past every bound,
    and another user's 4,200 blocking reads have been sent and closed. Quiet and attacked
    phases alternate, three rounds of each, so the machine's own drift falls on both."""
    with cluster(tmp_path, open_files=4096) as cl:
        run = cl.add_run("shared", capacity=2)
        owner = Owner(cl, "owner-b", run.endpoint_id)
        mallory = Owner(cl, "mallory", run.endpoint_id)
        job_id = owner.submit("noop", None)
        wait_for(lambda: owner.job(job_id)["state"] == "succeeded" or None, "B's job")
        parked = mallory.submit("sleep", {"seconds": 3600})
        token = mallory.client.headers["Authorization"]
        flood = (
            f"GET /api/v1/jobs/{parked}?wait_s=60&until=terminal HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: {token}\r\n\r\n"
        ).encode()
        probe = Probe(cl, owner, job_id)
        quiet: dict[str, list[float]] = {"heartbeat": [], "claim": [], "read": []}
        attacked: dict[str, list[float]] = {"heartbeat": [], "claim": [], "read": []}
        try:
            for round_ in range(ROUNDS):
                probe.sample(quiet, lambda: None)
                attacker = Attacker(cl.platform.port)
                try:
                    if round_ == 0:
                        for sent in range(FLOOD_READS):
                            with socket.create_connection(("127.0.0.1", cl.platform.port)) as s:
                                s.sendall(flood)
                            if sent % 500 == 0:  # on a busy machine the flood outlasts a session
                                probe.heartbeat()
                    probe.sample(attacked, attacker.keep_up)
                finally:
                    attacker.close()
        finally:
            probe.close()
            owner.client.close()
            mallory.client.close()
        run.check_alive()
    ratios = {
        name: statistics.median(attacked[name]) / statistics.median(quiet[name]) for name in quiet
    }
    medians = {name: round(statistics.median(quiet[name]), 2) for name in quiet}
    assert all(ratio <= 2.0 for ratio in ratios.values()), (ratios, "quiet ms:", medians)
