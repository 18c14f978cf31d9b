"""`moonrun platform serve` as a real process: restarts over a durable store, and its secret file.

Black-box: the tests start the command, speak HTTP to it (the user API and the signed Run API,
docs/protocol.md, "Signing" to "Reconciliation" and "User API") with the real clock, SIGKILL it
and start it again.
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
from tests.support import launcher
from tests.support.console_kit import sign_in
from tests.support.launcher import ADMIN_TOKEN, command_env, free_port, moonrun, serve_command
from tests.support.seeds import seed_from
from tests.support.stores import StoreFactory

# A real platform process: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 40


class PlatformProcess(launcher.PlatformProcess):
    """`moonrun platform serve` (tests/support/launcher.py) with the user API at hand."""

    def api(self, method: str, path: str, body: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return self.client.request(method, path, json=body, headers=headers)

    def created(self, path: str, body: Any) -> dict[str, Any]:
        response = self.api("POST", path, body)
        assert response.status_code == 201, response.text
        answer: dict[str, Any] = response.json()
        return answer


@contextmanager
def platform_process(
    workdir: Path, store_url: str, secret_file: Path, admin_token: str = ADMIN_TOKEN
) -> Iterator[PlatformProcess]:
    """A platform that is always killed at the end; a failure carries the platform's log tail."""
    platform = PlatformProcess(workdir, store_url, admin_token=admin_token, secret_file=secret_file)
    try:
        yield platform
    except Exception as error:
        error.add_note(f"--- platform output (last {LOG_TAIL_LINES} lines) ---")
        error.add_note(platform.tail(LOG_TAIL_LINES))
        raise
    finally:
        platform.close()


@dataclass
class Run:
    """A Run on one joined endpoint, signing with the real clock (docs/protocol.md, "Signing")."""

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


def serve_until_it_exits(
    tmp_path: Path, secret_file: Path, admin_token: str = ADMIN_TOKEN
) -> subprocess.CompletedProcess[str]:
    """Run `moonrun platform serve` expecting it to refuse to start (bounded by a timeout)."""
    command = serve_command("memory://", free_port(), secret_file, tmp_path / "data")
    return subprocess.run(
        command,
        cwd=tmp_path,
        env=command_env(admin_token),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str], exit_code: int = 1) -> str:
    """The single `moonrun: error:` line of a refused start, checked for exit code and shape."""
    lines = result.stderr.splitlines()
    exit_with_one_line = (exit_code, "", 1)
    assert exit_with_one_line == (result.returncode, result.stdout, len(lines)), result.stderr
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
    kills = int(os.environ.get("MOONRUN_CRASH_KILLS", "20"))  # `make soak` runs hundreds
    rng = random.Random(seed_from("MOONRUN_CRASH_SEED"))
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


# -- the bootstrap admin -----------------------------------------------------------------------


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON log lines of a platform's output (other lines skipped)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_different_bootstrap_token_at_restart_rotates_the_admins_token(tmp_path: Path) -> None:
    """Restarted with another bootstrap token, the platform answers it and 401s the old one,
    with one log line saying so that holds neither token."""
    store_url = f"file:{tmp_path / 'platform.db'}"
    old_token, new_token = ADMIN_TOKEN, "mra_" + secrets.token_urlsafe(32)
    with platform_process(tmp_path, store_url, tmp_path / "platform.secret") as platform:
        platform.start()
        platform.kill()
        platform.admin_token = new_token
        platform.start()
        assert platform.client is not None
        answers = [
            platform.client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
            for token in (old_token, new_token)
        ]
        platform.kill()
        platform.start()
        again = platform.api("GET", "/api/v1/me").status_code
        output = platform.log.read_text()
    assert [answer.status_code for answer in answers] == [401, 200]
    assert answers[1].json()["name"] == "admin"
    assert again == 200
    rotated = [line for line in json_lines(output) if "rotated" in line["msg"]]
    assert [(line["level"], line["user"]) for line in rotated] == [("warning", "admin")]
    assert (old_token.removeprefix("mra_") in output, new_token.removeprefix("mra_") in output) == (
        False,
        False,
    )


@pytest.mark.parametrize("token", ["x", "mra_" + "a" * 31, "b" * 31])
def test_serve_refuses_a_bootstrap_token_shorter_than_32_characters(
    tmp_path: Path, token: str
) -> None:
    """A bootstrap token under 32 characters after `mra_` stops the start: one line, exit 2."""
    result = serve_until_it_exits(tmp_path, tmp_path / "platform.secret", admin_token=token)
    line = one_error_line(result, exit_code=2)
    assert "MOONRUN_BOOTSTRAP_ADMIN_TOKEN" in line
    assert "32 characters" in line


def test_a_platform_without_an_admin_says_how_to_make_one(tmp_path: Path) -> None:
    """Started on a new store without a bootstrap token, the platform serves and warns, on
    stderr and in its JSON log, that no admin exists, naming `moonrun admin bootstrap`."""
    store_url = f"file:{tmp_path / 'platform.db'}"
    with platform_process(tmp_path, store_url, tmp_path / "platform.secret", "") as platform:
        platform.start()
        output = platform.log.read_text()
    warnings = [line for line in output.splitlines() if line.startswith("moonrun: warning:")]
    logged = [line for line in json_lines(output) if "no platform admin" in line["msg"]]
    assert len(warnings) == 1
    assert "moonrun admin bootstrap --store URL" in warnings[0]
    assert [line["level"] for line in logged] == ["warning"]


def admin_bootstrap(
    tmp_path: Path, store_url: str, *arguments: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """`moonrun admin bootstrap` against the store, with no platform running."""
    return subprocess.run(
        moonrun("admin", "bootstrap", "--store", store_url, *arguments),
        cwd=tmp_path,
        env=command_env(""),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_admin_bootstrap_offline_gives_a_token_and_a_console_password(tmp_path: Path) -> None:
    """`moonrun admin bootstrap --password-stdin` on a store prints a token the platform then
    accepts, and the admin signs in to the console with the password."""
    store_url = f"file:{tmp_path / 'platform.db'}"
    made = admin_bootstrap(tmp_path, store_url, "--password-stdin", stdin="moon-over-water\n")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert re.fullmatch(r"mra_[A-Za-z0-9_-]{43}", token), made.stdout
    with platform_process(tmp_path, store_url, tmp_path / "platform.secret", "") as platform:
        platform.admin_token = token
        platform.start()
        me = platform.api("GET", "/api/v1/me")
        assert platform.client is not None
        signed = sign_in(platform.client, "admin", "moon-over-water")  # type: ignore[arg-type]
        jobs = platform.client.get("/jobs")
        output = platform.log.read_text()
    assert (me.status_code, me.json()["platform_admin"]) == (200, True)
    assert (signed.status_code, signed.headers.get("location")) == (303, "/jobs")
    assert jobs.status_code == 200
    assert "no platform admin" not in output


def test_admin_bootstrap_again_rotates_the_token(tmp_path: Path) -> None:
    """A second `moonrun admin bootstrap` gives a new token; the first stops working."""
    store_url = f"file:{tmp_path / 'platform.db'}"
    first, second = (admin_bootstrap(tmp_path, store_url) for _ in range(2))
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    store = open_store(store_url)
    try:
        holders = [store.user_by_api_token(token_hash(r.stdout.strip())) for r in (first, second)]
    finally:
        store.close()
    assert [holder.name if holder else None for holder in holders] == [None, "admin"]


@pytest.mark.parametrize(
    ("arguments", "stdin"),
    [
        (("--name", "no spaces"), ""),
        (("--password-stdin",), "short\n"),
        (("--password-stdin",), ""),
    ],
    ids=["bad-name", "short-password", "no-password"],
)
def test_admin_bootstrap_refuses_bad_usage_with_exit_code_2(
    tmp_path: Path, arguments: tuple[str, ...], stdin: str
) -> None:
    """A bad name or password is one error line and exit code 2, and prints no token."""
    result = admin_bootstrap(tmp_path, f"file:{tmp_path / 'platform.db'}", *arguments, stdin=stdin)
    one_error_line(result, exit_code=2)
