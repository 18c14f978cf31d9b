"""`moonrun platform serve` as a real process: restarts over a durable store, and its secret file.

Black-box: the tests start the command, speak HTTP to it (the user API and the signed Run API,
PROTOCOL.md sections 2-4 and 6) with the real clock, SIGKILL it and start it again.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.scheduling.fingerprint import token_hash
from moonrun.security import signing
from moonrun.store import open_store
from tests.processes import command_env, free_port, serve_command
from tests.stores import StoreFactory

ROOT = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
STARTUP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 40


class PlatformProcess:
    """`moonrun platform serve` on one port, store and secret file; started and killed at will.

    Every instance appends its stdout and stderr to one log file, so a failure shows the tail
    across restarts.
    """

    def __init__(self, workdir: Path, store_url: str, secret_file: Path) -> None:
        self.workdir = workdir
        self.store_url = store_url
        self.secret_file = secret_file
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "platform.log"
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.client: httpx.Client | None = None

    def start(self) -> None:
        """Start an instance and wait, with a bound, until /healthz answers 200."""
        assert self.process is None, "the platform is already running"
        self.starts += 1
        command = serve_command(self.store_url, self.port, self.secret_file, self.workdir / "data")
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(command[1:])}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=command_env(ADMIN_TOKEN),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.client = httpx.Client(base_url=self.url, timeout=10.0)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        assert self.process is not None
        assert self.client is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise AssertionError(f"the platform exited with code {code} before /healthz")
            try:
                response = self.client.get("/healthz", timeout=1.0)
            except httpx.TransportError as error:
                last = repr(error)
            else:
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text}"
            time.sleep(0.05)
        raise AssertionError(f"/healthz did not answer 200 within {STARTUP_TIMEOUT_S} s: {last}")

    def kill(self) -> None:
        """SIGKILL the instance (no graceful shutdown) and reap it."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=30)
            self.process = None

    def log_tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty)"

    # -- user API ------------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None) -> httpx.Response:
        assert self.client is not None, "the platform is not running"
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        return self.client.request(method, path, json=body, headers=headers)

    def created(self, path: str, body: Any) -> dict[str, Any]:
        response = self.api("POST", path, body)
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer


@contextmanager
def platform_process(workdir: Path, store_url: str, secret_file: Path) -> Iterator[PlatformProcess]:
    """A platform that is always killed at the end; a failure carries the platform's log tail."""
    platform = PlatformProcess(workdir, store_url, secret_file)
    try:
        yield platform
    except Exception as error:
        error.add_note(f"--- platform output (last {LOG_TAIL_LINES} lines) ---")
        error.add_note(platform.log_tail())
        raise
    finally:
        platform.kill()


@dataclass
class Run:
    """A Run on one joined endpoint, signing with the real clock (PROTOCOL.md section 2)."""

    platform: PlatformProcess
    endpoint_id: str
    identity: Ed25519PrivateKey
    session_id: str = ""
    session_key: bytes = b""

    def signed(
        self, path: str, body: Any, *, identity: bool = False, age_s: int = 0
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of a signed POST, `created` `age_s` seconds ago."""
        data = json.dumps(body).encode()
        headers = signing.sign(
            "POST",
            path,
            "",
            data,
            key_id=f"endpoint:{self.endpoint_id}" if identity else f"session:{self.session_id}",
            key=self.identity if identity else self.session_key,
            created=int(time.time()) - age_s,
            nonce=signing.b64url(secrets.token_bytes(16)),
        )
        return data, {**headers, "Content-Type": "application/json"}

    def send(self, path: str, data: bytes, headers: dict[str, str]) -> httpx.Response:
        assert self.platform.client is not None, "the platform is not running"
        return self.platform.client.post(path, content=data, headers=headers)

    def post(self, path: str, body: Any, *, identity: bool = False) -> httpx.Response:
        return self.send(path, *self.signed(path, body, identity=identity))

    def register(self) -> None:
        body = {"boot_id": secrets.token_hex(8), "run_version": "0.1.0", "capacity": 4}
        response = self.post("/run/v1/sessions", body, identity=True)
        assert response.status_code == 201, response.text
        self.session_id = response.json()["session_id"]
        self.session_key = signing.b64url_decode(response.json()["session_key"])


def join(platform: PlatformProcess, name: str) -> Run:
    """Create an endpoint through the user API and join it with a new Ed25519 identity key."""
    join_token = platform.created("/api/v1/endpoints", {"name": name})["join_token"]
    identity = Ed25519PrivateKey.generate()
    raw = identity.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert platform.client is not None
    response = platform.client.post(
        "/run/v1/join",
        json={"join_token": join_token, "identity_public_key": signing.b64url(raw)},
    )
    assert response.status_code == 200, response.text
    return Run(platform, response.json()["endpoint_id"], identity)


@dataclass(frozen=True)
class Running:
    """A job that a Run claimed and acknowledged: its attempt evidence."""

    run: Run
    job_id: str
    attempt: int
    lease: str

    @property
    def evidence(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "lease": self.lease}


def start_a_job(platform: PlatformProcess) -> Running:
    """Users, an endpoint and its server, a registered and reconciled session, a running job."""
    owner = platform.created("/api/v1/users", {"name": "owner", "platform_admin": False})
    run = join(platform, "host-1")
    server = platform.created(
        "/api/v1/servers",
        {"name": "web-1", "endpoint_id": run.endpoint_id, "owner_id": owner["user"]["id"]},
    )
    run.register()
    reconciled = run.post("/run/v1/reconcile", {"entries": []})
    assert reconciled.status_code == 200, reconciled.text
    job = platform.created(f"/api/v1/servers/{server['id']}/jobs", {"kind": "noop"})
    claimed = run.post("/run/v1/jobs/claim", {"max_jobs": 1})
    assert claimed.status_code == 200, claimed.text
    (granted,) = claimed.json()["jobs"]
    assert (job["id"], 1) == (granted["job_id"], granted["attempt"])
    running = Running(run, job["id"], granted["attempt"], granted["lease"])
    acked = run.post(f"/run/v1/jobs/{running.job_id}/ack", running.evidence)
    assert (acked.status_code, acked.json().get("state")) == (200, "running"), acked.text
    return running


def fresh_store_url(factory: StoreFactory) -> str:
    """An empty durable store (created and migrated here), for the platform process to open."""
    store = factory.open()
    store.close()
    return factory.url()


def test_platform_restart_preserves_the_active_attempt(
    durable_factory: StoreFactory, tmp_path: Path
) -> None:
    """After SIGKILL and restart, the same session's fresh progress on the same lease is taken."""
    store_url = fresh_store_url(durable_factory)
    with platform_process(tmp_path, store_url, tmp_path / "platform.secret") as platform:
        platform.start()
        running = start_a_job(platform)

        platform.kill()
        platform.start()
        path = f"/run/v1/jobs/{running.job_id}/progress"
        progress = running.run.post(path, {**running.evidence, "seq": 1, "percent": 50})
        accepted = (200, False)
        assert accepted == (progress.status_code, progress.json().get("cancel_requested")), (
            progress.text
        )
        shown = platform.api("GET", f"/api/v1/jobs/{running.job_id}").json()
        still_running = ("running", running.attempt, 1)
        assert still_running == (shown["state"], shown["attempt"], shown["progress"]["seq"])

        platform.kill()
        store = open_store(store_url)
        try:
            stored = store.get_job(running.job_id)
        finally:
            store.close()
        assert stored is not None
        expected = ("running", running.attempt, token_hash(running.lease))
        assert expected == (stored.state.value, stored.attempt, stored.lease_hash)


def test_platform_restart_refuses_a_request_signed_before_it(
    durable_factory: StoreFactory, tmp_path: Path
) -> None:
    """A request signed before the restart is 401 signature_expired and leaves the job as it was."""
    store_url = fresh_store_url(durable_factory)
    with platform_process(tmp_path, store_url, tmp_path / "platform.secret") as platform:
        platform.start()
        running = start_a_job(platform)
        path = f"/run/v1/jobs/{running.job_id}/progress"
        # Signed 2 s before the kill: a captured request that the old instance never saw.
        captured = running.run.signed(path, {**running.evidence, "seq": 1}, age_s=2)

        platform.kill()
        platform.start()
        replayed = running.run.send(path, *captured)
        refused = (401, "signature_expired")
        assert refused == (replayed.status_code, replayed.json()["error"]["code"]), replayed.text
        shown = platform.api("GET", f"/api/v1/jobs/{running.job_id}").json()
        unchanged = ("running", running.attempt, None)
        assert unchanged == (shown["state"], shown["attempt"], shown["progress"])


# -- the secret file ---------------------------------------------------------------------------


def serve_until_it_exits(tmp_path: Path, secret_file: Path) -> subprocess.CompletedProcess[str]:
    """Run `moonrun platform serve` expecting it to refuse to start (bounded by a timeout)."""
    command = serve_command("memory://", free_port(), secret_file, tmp_path / "data")
    return subprocess.run(
        command,
        cwd=tmp_path,
        env=command_env(ADMIN_TOKEN),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single `moonrun: error:` line of a refused start, checked for exit code and shape."""
    lines = result.stderr.splitlines()
    exit_1_with_one_line = (1, "", 1)
    assert exit_1_with_one_line == (result.returncode, result.stdout, len(lines)), result.stderr
    assert lines[0].startswith("moonrun: error: "), result.stderr
    return lines[0]


def test_serve_refuses_a_secret_file_readable_by_others(tmp_path: Path) -> None:
    """A secret file of mode 0644 stops the start with one error line and exit code 1."""
    secret_file = tmp_path / "platform.secret"
    secret_file.write_text(secrets.token_hex(32) + "\n")
    secret_file.chmod(0o644)
    line = one_error_line(serve_until_it_exits(tmp_path, secret_file))
    assert str(secret_file) in line
    assert "chmod 600" in line


@pytest.mark.parametrize(
    "content",
    [
        b"not a secret\n",
        secrets.token_hex(32)[:63].encode() + b"\n",
        secrets.token_hex(32).encode() + b"0\n",
        b"g" * 64 + b"\n",
        b"",
        b"\xff\xfe" + secrets.token_hex(31).encode(),
    ],
    ids=["text", "63-hex", "65-hex", "64-non-hex", "empty", "not-utf8"],
)
def test_serve_refuses_a_secret_file_that_is_not_64_hex_characters(
    tmp_path: Path, content: bytes
) -> None:
    """A 0600 secret file without exactly 64 hex characters stops the start, one error line."""
    secret_file = tmp_path / "platform.secret"
    secret_file.write_bytes(content)
    secret_file.chmod(0o600)
    line = one_error_line(serve_until_it_exits(tmp_path, secret_file))
    assert str(secret_file) in line
    assert "64 hex characters" in line


def test_serve_creates_a_missing_secret_file_with_mode_0600(tmp_path: Path) -> None:
    """A missing secret file is created at start: 64 hex characters, mode 0600."""
    secret_file = tmp_path / "config" / "platform.secret"
    with platform_process(tmp_path, "memory://", secret_file) as platform:
        platform.start()
        mode = stat.S_IMODE(secret_file.stat().st_mode)
        content = secret_file.read_text()
    owner_only = 0o600
    assert owner_only == mode
    assert re.fullmatch(r"[0-9a-f]{64}\n?", content), repr(content)


def test_sigkill_while_serving_loses_no_acknowledged_job(tmp_path: Path) -> None:
    """SIGKILLed at random moments while eight clients create jobs, the platform has, once
    started again, every job it answered 201 for (an answer follows the commit of its write)."""
    store_url = f"file:{tmp_path / 'platform.db'}"
    kills = int(os.environ.get("MOONRUN_CRASH_KILLS", "50"))
    rng = random.Random(int(os.environ.get("MOONRUN_CRASH_SEED", "0")) or None)
    acknowledged: set[str] = set()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with platform_process(tmp_path, store_url, tmp_path / "platform.secret") as platform:
        platform.start()
        admin_id = platform.api("GET", "/api/v1/users").json()["users"][0]["id"]
        endpoint = platform.created("/api/v1/endpoints", {"name": "host-1"})["endpoint"]
        server = platform.created(
            "/api/v1/servers",
            {"name": "web-1", "endpoint_id": endpoint["id"], "owner_id": admin_id},
        )
        path = f"/api/v1/servers/{server['id']}/jobs"
        for _ in range(kills):
            stop = threading.Event()

            def create_until_gone(stop: threading.Event = stop) -> None:
                with httpx.Client(base_url=platform.url, timeout=5.0) as client:
                    while not stop.is_set():
                        try:
                            answer = client.post(path, json={"kind": "noop"}, headers=headers)
                        except httpx.TransportError:
                            return  # killed: this request was never answered
                        if answer.status_code == 201:
                            acknowledged.add(answer.json()["id"])

            lanes = [threading.Thread(target=create_until_gone) for _ in range(8)]
            for lane in lanes:
                lane.start()
            time.sleep(rng.uniform(0.02, 0.3))
            platform.kill()
            stop.set()
            for lane in lanes:
                lane.join()
            platform.start()
    store = open_store(store_url)
    try:
        missing = sorted(job_id for job_id in acknowledged if store.get_job(job_id) is None)
    finally:
        store.close()
    assert acknowledged, "no create was ever acknowledged"
    assert missing == []
