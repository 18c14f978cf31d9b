"""`moonrun platform serve`'s HTTP edge as a real process: slow clients, stalled bodies, heads
too large or malformed, the connection cap, proxies.

Black-box: the tests start the command (with a low open-files limit where it matters) and speak
raw TCP and HTTP to it with the real clock; every wait is bounded, no answer is timed.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.console_kit import csrf_of
from tests.support.e2e import cluster
from tests.support.launcher import PlatformProcess, command_env, moonrun

# A real platform process: the real-process lane of `make test` (docs/testing.md).
pytestmark = [pytest.mark.processes, pytest.mark.alone]

ADMIN_TOKEN = "mra_platform-edge-admin-token-0000000000000"
OLIVE_PASSWORD = "olive-edge-password-5d1c"
SETTLE_BOUND_S = 30.0


@contextmanager
def served(tmp_path: Path, *flags: str, open_files: int | None = None) -> Iterator[PlatformProcess]:
    """`moonrun platform serve` on a free port with `flags`, under `ulimit -n open_files`;
    yields once /healthz answers 200, and kills the process afterwards."""
    platform = PlatformProcess(
        tmp_path, "memory://", flags=flags, open_files=open_files, admin_token=ADMIN_TOKEN
    )
    try:
        platform.start()
        yield platform
    finally:
        platform.close()


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def health_status(url: str) -> int | str:
    """/healthz's status, with a generous bound (the platform may be busy shedding an attack),
    or the name of the transport error."""
    try:
        return httpx.get(f"{url}/healthz", timeout=SETTLE_BOUND_S).status_code
    except httpx.TransportError as error:
        return type(error).__name__


def slow_client(port: int, first: bytes) -> socket.socket:
    """A connection that has sent `first` of a request head (perhaps nothing) and no more."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    connection.setblocking(False)
    if first:
        connection.sendall(first)
    return connection


# Its timings need a core of their own: the real-process lane of `make test` (docs/testing.md).


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


def with_olive(platform: PlatformProcess) -> None:
    created = httpx.post(
        f"{platform.url}/api/v1/users",
        json={"name": "olive", "password": OLIVE_PASSWORD},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10.0,
    )
    assert created.status_code == 201, created.text


def sign_in_status(platform: PlatformProcess, name: str, password: str, forwarded_for: str) -> int:
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
        moonrun("platform", "serve", "--trusted-proxy", "proxy"),
        cwd=tmp_path,
        env=command_env(ADMIN_TOKEN),
        capture_output=True,
        text=True,
        timeout=60,
    )
    expected = (
        "moonrun: error: invalid_request: --trusted-proxy must be an IP address or network, "
        "not 'proxy'\n"
    )
    assert (refused.returncode, refused.stderr) == (1, expected)


# -- bodies that never arrive, heads that never end ---------------------------------------------


class Stalled:
    """Sockets that each send a request head announcing a body, and `first` of it, and no
    more: no credentials. `keep_up` opens a new one for every one the platform answered or
    closed, so the pressure stays on."""

    def __init__(self, port: int, head: bytes, count: int, first: bytes = b"") -> None:
        self.port, self.head, self.first = port, head, first
        self.sockets = [self._open() for _ in range(count)]

    def _open(self) -> socket.socket:
        return slow_client(self.port, self.head + self.first)

    def keep_up(self) -> None:
        for i, connection in enumerate(self.sockets):
            try:
                readable, _, _ = select.select([connection], [], [], 0)
                if not readable:
                    continue
                connection.close()
                self.sockets[i] = self._open()
            except OSError:  # reset, or the platform refused a new connection
                connection.close()
                with contextlib.suppress(OSError):
                    self.sockets[i] = self._open()

    def close(self) -> None:
        for connection in self.sockets:
            connection.close()


def stalled_post(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: platform", "Content-Length: 100", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


ATTACK_S = 15.0
"""How long the attacks below go on: longer than two session lifetimes of tests/support/e2e.py's
timings (6 s), so that a Run whose heartbeats were refused would show offline."""


def test_anonymous_stalled_bodies_on_run_routes_never_starve_a_signed_run(
    tmp_path: Path,
) -> None:
    """16 sockets on `POST /run/v1/heartbeat` and 32 on `/run/v1/jobs/claim`, no credentials,
    each announcing 100 bytes of body and sending none, kept up for 15 s: a real Run keeps its
    session (its endpoint is online at every look) and claims and runs every job submitted
    meanwhile. (Before, they held every place of the control and jobs channels.)"""
    with cluster(tmp_path) as cl:
        run = cl.add_run()
        server = cl.create_server("web-1", run.endpoint_id)
        attack = Stalled(cl.platform.port, stalled_post("/run/v1/heartbeat"), 16)
        claims = Stalled(cl.platform.port, stalled_post("/run/v1/jobs/claim"), 32)
        try:
            jobs, online = [], []
            until = time.monotonic() + ATTACK_S
            while time.monotonic() < until:
                attack.keep_up()
                claims.keep_up()
                online.append(cl.endpoint(run.endpoint_id)["online"])
                if len(jobs) < 10:
                    jobs.append(cl.submit(server, "noop")["id"])
                time.sleep(0.5)
            states = [cl.wait_state(job, "succeeded", "failed")["state"] for job in jobs]
        finally:
            attack.close()
            claims.close()
        assert (set(online), states) == ({True}, ["succeeded"] * 10)


def test_anonymous_stalled_bodies_on_the_user_api_never_starve_a_users_calls(
    tmp_path: Path,
) -> None:
    """16 sockets on `POST /api/v1/servers` with unfinished bodies, half with no credentials and
    half with a made-up token: every call of a real user meanwhile is answered (before, each was
    429 `channel_busy`: the stalled requests held the user channel's 16 places)."""
    with served(tmp_path) as platform:
        made_up = "Authorization: Bearer mra_" + "made-up-token" * 4
        attack = [
            Stalled(platform.port, stalled_post("/api/v1/servers"), 8),
            Stalled(platform.port, stalled_post("/api/v1/servers", made_up), 8),
        ]
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        try:
            statuses = []
            with httpx.Client(base_url=platform.url, headers=headers, timeout=10.0) as user:
                for i in range(20):
                    for stalled in attack:
                        stalled.keep_up()
                    statuses.append(user.get("/api/v1/servers").status_code)
                    created = user.post("/api/v1/endpoints", json={"name": f"host-{i}"})
                    statuses.append(created.status_code)
        finally:
            for stalled in attack:
                stalled.close()
        assert statuses == [200, 201] * 20


def test_stalled_sign_in_forms_under_a_low_open_files_limit_never_shut_out_healthz_or_a_run(
    tmp_path: Path,
) -> None:
    """Under `ulimit -n 1024` (896 connections), 900 sockets each send `POST /login` with an
    unfinished body: new connections still get in (each closes the connection that waited
    longest for its request), so /healthz answers, the admin's API calls are served and a Run
    claims and runs a job. (Before, a connection waiting for its body was never closed, and
    every new one was reset.)"""
    with cluster(tmp_path, open_files=1024) as cl:
        run = cl.add_run()
        server = cl.create_server("web-1", run.endpoint_id)
        forms = Stalled(cl.platform.port, stalled_post("/login"), 900, b"username=x")
        try:
            health = [health_status(cl.platform.url) for _ in range(5)]
            job = cl.submit(server, "noop")["id"]
            state = cl.wait_state(job, "succeeded", "failed")["state"]
            online = cl.endpoint(run.endpoint_id)["online"]
        finally:
            forms.close()
        assert (health, state, online) == ([200] * 5, "succeeded", True)


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def exchange(port: int, request: bytes, *, chunk: int = 65536) -> bytes:
    """Send `request` (stopping when the platform closes) while reading what it answers, until
    it closes the connection."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:

        def read() -> None:
            with contextlib.suppress(OSError):
                while data := connection.recv(65536):
                    received.extend(data)

        reader = threading.Thread(target=read)
        reader.start()
        with contextlib.suppress(OSError):
            for start in range(0, len(request), chunk):
                connection.sendall(request[start : start + chunk])
        reader.join(timeout=60)
        assert not reader.is_alive(), "the platform never closed the connection"
    return bytes(received)


def envelope(answer: bytes) -> tuple[int, str, str]:
    """The status, content type and error code of a raw HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    code = json.loads(body)["error"]["code"] if body.startswith(b"{") else body.decode()[:40]
    return int(lines[0].split()[1]), fields.get("content-type", ""), code


def test_a_64_mib_header_is_refused_with_431_and_never_held(tmp_path: Path) -> None:
    """One header line of 64 MiB: 431 `headers_too_large` in the JSON envelope once the line
    passes 8 KiB, and the platform's peak memory does not grow by anything like it (before: 200,
    with the whole head held and copied as it grew)."""
    with served(tmp_path) as platform:
        before = peak_rss_kib(platform.process.pid)
        head = b"GET /healthz HTTP/1.1\r\nHost: platform\r\nX-Big: " + b"a" * (64 << 20)
        answer = exchange(platform.port, head + b"\r\n\r\n")
        grown_kib = peak_rss_kib(platform.process.pid) - before
        assert envelope(answer) == (431, "application/json", "headers_too_large")
        assert grown_kib < 16 * 1024, f"peak memory grew by {grown_kib} KiB"
        assert health_status(platform.url) == 200


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        pytest.param(
            b"POST /run/v1/heartbeat HTTP/1.1\r\nHost: p\r\nContent-Length: -1\r\n\r\n",
            (400, "application/json", "invalid_request"),
            id="Content-Length -1",
        ),
        pytest.param(
            b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: p\r\n\r\n",
            (414, "application/json", "uri_too_long"),
            id="100,000-character path",
        ),
        pytest.param(
            b"POST /login HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            (400, "application/json", "invalid_request"),
            id="bad chunk size",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\n"
            + b"".join(b"X-%d: 1\r\n" % i for i in range(101))
            + b"\r\n",
            (431, "application/json", "headers_too_large"),
            id="101 headers",
        ),
    ],
)
def test_framing_the_platform_cannot_take_is_refused_in_the_json_envelope(
    tmp_path: Path, request_bytes: bytes, expected: tuple[int, str, str]
) -> None:
    """Not uvicorn's plain-text 400 (or a 200 for a head of any size): the platform's one error
    shape, then the connection closes, and the platform goes on serving."""
    with served(tmp_path) as platform:
        assert envelope(exchange(platform.port, request_bytes)) == expected
        assert health_status(platform.url) == 200


def test_a_client_leaving_mid_body_on_a_console_form_is_an_info_line_not_an_error(
    tmp_path: Path,
) -> None:
    """`POST /login` with 10 of its 100 bytes, then the client closes: one INFO line (status
    499, the client went), no ERROR and no 500 (before: "Exception in ASGI application" and a
    500)."""
    with served(tmp_path) as platform:
        connection = slow_client(platform.port, stalled_post("/login") + b"username=x")
        time.sleep(0.5)  # let the form start reading its body
        connection.close()

        def logged() -> list[dict[str, object]]:
            return [line for line in platform.events() if line.get("route") == "/login"]

        bound = time.monotonic() + SETTLE_BOUND_S
        while not logged() and time.monotonic() < bound:
            time.sleep(0.1)
        levels = {line["level"] for line in platform.events()}
        assert ([(line["level"], line["status"]) for line in logged()], levels) == (
            [("info", 499)],
            {"info"},
        )
