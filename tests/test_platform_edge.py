"""`moonrun platform serve`'s HTTP edge as a real process: slow clients, connection cap, proxies.

Black-box: the tests start the command (with a low open-files limit where it matters) and speak
raw TCP and HTTP to it with the real clock; every wait is bounded, no answer is timed.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.console_kit import csrf_of
from tests.processes import command_env, free_port, serve_command

ADMIN_TOKEN = "mra_platform-edge-admin-token-0000000000000"
OLIVE_PASSWORD = "olive-edge-password-5d1c"
STARTUP_TIMEOUT_S = 30.0
SETTLE_BOUND_S = 30.0


@dataclass
class Served:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def served(tmp_path: Path, *flags: str, open_files: int | None = None) -> Iterator[Served]:
    """`moonrun platform serve` on a free port with `flags`, under `ulimit -n open_files`;
    yields once /healthz answers 200, and kills the process afterwards."""
    port = free_port()
    command = [
        *serve_command("memory://", port, tmp_path / "platform.secret", tmp_path / "data"),
        *flags,
    ]
    if open_files is not None:
        command = ["sh", "-c", f'ulimit -n {open_files} && exec "$@"', "sh", *command]
    log = tmp_path / "platform.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=command_env(ADMIN_TOKEN),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not healthy(url):
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no /healthz: " + log.read_text()[-4000:]
            time.sleep(0.05)
        yield Served(url, port, process, log)
    finally:
        process.kill()
        process.wait(timeout=30)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def slow_client(port: int, first: bytes) -> socket.socket:
    """A connection that has sent `first` of a request head (perhaps nothing) and no more."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    connection.setblocking(False)
    if first:
        connection.sendall(first)
    return connection


# Its timings need a core of their own: the serial lane of `make test` (docs/testing.md).
@pytest.mark.processes
def test_slow_clients_never_starve_healthz_and_are_closed_after_the_header_timeout(
    tmp_path: Path,
) -> None:
    """Under `ulimit -n 256`, 300 connections that send nothing or trickle a header line now
    and then: /healthz still answers, and every one of them is closed, unanswered, although
    the trickling ones keep sending past the header timeout."""
    with served(tmp_path, "--header-timeout-s", "3", open_files=256) as platform:
        clients = [
            slow_client(platform.port, b"" if i % 10 == 0 else b"GET /healthz HTTP/1.1\r\n")
            for i in range(300)
        ]
        try:
            health = httpx.get(f"{platform.url}/healthz", timeout=10.0)
            assert (health.status_code, health.json()) == (200, {"status": "ok"})
            still_open, answered = set(range(len(clients))), []
            bound = time.monotonic() + SETTLE_BOUND_S
            while still_open and time.monotonic() < bound:
                for i in sorted(still_open):
                    connection = clients[i]
                    try:
                        readable, _, _ = select.select([connection], [], [], 0)
                        if readable:
                            received = connection.recv(4096)
                            if received:
                                answered.append(received)
                            still_open.discard(i)
                        elif i % 10:
                            connection.send(b"X-Slow: 1\r\n")
                    except OSError:  # reset by the platform
                        still_open.discard(i)
                time.sleep(0.25)
            assert (len(still_open), answered) == (0, [])
            assert healthy(platform.url)
        finally:
            for connection in clients:
                connection.close()


def with_olive(platform: Served) -> None:
    created = httpx.post(
        f"{platform.url}/api/v1/users",
        json={"name": "olive", "password": OLIVE_PASSWORD},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10.0,
    )
    assert created.status_code == 201, created.text


def sign_in_status(platform: Served, name: str, password: str, forwarded_for: str) -> int:
    """Sign in through the console's form with an X-Forwarded-For header; the POST's status."""
    headers = {"X-Forwarded-For": forwarded_for}
    with httpx.Client(base_url=platform.url, headers=headers, timeout=10.0) as client:
        form = client.get("/login")
        assert form.status_code == 200, form.text
        fields = {"username": name, "password": password, "csrf_token": csrf_of(form.text)}
        return client.post("/login", data=fields).status_code


def test_x_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(tmp_path: Path) -> None:
    """By default a local peer cannot pose as 50 addresses: its 50 failed sign-ins, each with
    another X-Forwarded-For, slow down its own address, whatever the next header says."""
    with served(tmp_path) as platform:
        with_olive(platform)
        failures = [sign_in_status(platform, f"guess{i}", "x", f"203.0.113.{i}") for i in range(50)]
        assert failures == [401] * 50
        assert sign_in_status(platform, "olive", OLIVE_PASSWORD, "198.51.100.1") == 429


def test_x_forwarded_for_from_a_trusted_proxy_names_the_client(tmp_path: Path) -> None:
    """With --trusted-proxy 127.0.0.1, the address the proxy forwards is the one counted: 50
    failures from one client slow that client down, not another behind the same proxy."""
    with served(tmp_path, "--trusted-proxy", "127.0.0.1") as platform:
        with_olive(platform)
        failures = [sign_in_status(platform, f"guess{i}", "x", "203.0.113.9") for i in range(50)]
        assert failures == [401] * 50
        statuses = [
            sign_in_status(platform, "olive", OLIVE_PASSWORD, address)
            for address in ("203.0.113.9", "198.51.100.1")
        ]
        assert statuses == [429, 303]


def test_a_trusted_proxy_that_is_not_an_address_is_refused_at_start(tmp_path: Path) -> None:
    """uvicorn would take it as a literal that matches nothing; the platform says so instead."""
    refused = subprocess.run(
        [sys.executable, "-m", "moonrun", "platform", "serve", "--trusted-proxy", "proxy"],
        cwd=tmp_path,
        env=command_env(ADMIN_TOKEN),
        capture_output=True,
        text=True,
        timeout=60,
    )
    expected = "moonrun: error: --trusted-proxy must be an IP address or network, not 'proxy'\n"
    assert (refused.returncode, refused.stderr) == (1, expected)
