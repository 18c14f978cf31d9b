"""Real processes for the fault tests: `moonrun platform serve`, `moonrun run start`, a proxy.

Each process writes its output to a log file in the test's directory (appended across
restarts), and is killed and reaped by `stop()`; the helpers never leave a process behind
when used as context managers. The platform is driven through its user API (httpx), Run only
through its command line and its log.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pymysql

from tests.support.processes import command_env, free_port

ROOT = Path(__file__).resolve().parents[2]
PROXY_SCRIPT = Path(__file__).resolve().parent / "e2e_faults_proxy.py"
ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
STARTUP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 60

FAST_TIMINGS: dict[str, float] = {
    "lease-ttl-s": 4,
    "ack-timeout-s": 3,
    "heartbeat-interval-s": 1,
    "session-ttl-s": 6,
    "backoff-initial-s": 0.5,
    "backoff-max-s": 2,
    "sweep-interval-s": 0.2,
}
"""Short platform timings: a lease is renewed every second and lapses after 4 s."""

T = TypeVar("T")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def is_terminal(view: dict[str, Any]) -> bool:
    return view["state"] in TERMINAL


def check_history(view: dict[str, Any]) -> list[str]:
    """What is wrong with a finished job's attempts (empty when nothing is)."""
    problems = []
    attempts = [past["attempt"] for past in view["history"]]
    outcomes = [past["outcome"] for past in view["history"]]
    terminal = view["terminal"] or {}
    if view["state"] != "succeeded":
        problems.append(f"state {view['state']}")
    if view["attempt"] < 1 or terminal.get("attempt") != view["attempt"]:
        problems.append(f"attempt {view['attempt']}, terminal attempt {terminal.get('attempt')}")
    if attempts != sorted(set(attempts)) or not attempts or attempts[-1] != view["attempt"]:
        problems.append(f"history attempts {attempts}")
    if outcomes.count("succeeded") != 1 or outcomes[-1:] != ["succeeded"]:
        problems.append(f"history outcomes {outcomes}")
    return problems


def wait_until(
    probe: Callable[[], T | None], timeout_s: float, what: str, every_s: float = 0.1
) -> T:
    """Poll `probe` until it returns something other than None/False; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


class Process:
    """One subprocess at a time, its output appended to `log`."""

    def __init__(self, name: str, log: Path, *, piped: bool = False) -> None:
        self.name = name
        self.log = log
        self.piped = piped
        """Output through a pipe that this process copies to `log`, rather than straight into
        the file: a child whose file size is limited (RLIMIT_FSIZE) can still write it."""
        self.process: subprocess.Popen[bytes] | None = None
        self.copier: threading.Thread | None = None
        self.starts = 0

    def spawn(self, command: list[str], cwd: Path) -> None:
        assert self.process is None, f"{self.name} is already running"
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- {self.name} start {self.starts}: {' '.join(command[1:])}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=command_env(ADMIN_TOKEN),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.piped else log,
                stderr=subprocess.STDOUT,
            )
        if self.piped:
            self.copier = threading.Thread(target=self._copy, args=(self.process,), daemon=True)
            self.copier.start()

    def _copy(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with self.log.open("ab") as log:
            for line in process.stdout:
                log.write(line)
                log.flush()

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def stop(self) -> None:
        """SIGKILL (after SIGCONT, in case it was paused) and reap."""
        if self.process is None:
            return
        if self.process.poll() is None:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.process.pid, signum)
                except ProcessLookupError:
                    break
        self.process.wait(timeout=30)
        if self.copier is not None:
            self.copier.join(timeout=30)
            self.copier = None
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def tail(self) -> str:
        if not self.log.exists():
            return "(no output)"
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty)"


def wait_healthy(process: Process, client: httpx.Client, path: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        assert process.process is not None
        code = process.process.poll()
        if code is not None:
            raise AssertionError(f"{process.name} exited with code {code} before answering")
        try:
            response = client.get(path, timeout=1.0)
        except httpx.TransportError as error:
            last = repr(error)
        else:
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text}"
        time.sleep(0.05)
    raise AssertionError(f"{process.name} did not answer {path} in {STARTUP_TIMEOUT_S} s: {last}")


class Platform:
    """`moonrun platform serve` over a FileStore in `workdir` (or `store_url`), with the user
    API at hand."""

    def __init__(
        self,
        workdir: Path,
        timings: dict[str, float] | None = None,
        *,
        store_url: str | None = None,
        piped: bool = False,
    ) -> None:
        self.workdir = workdir
        self.timings = dict(FAST_TIMINGS if timings is None else timings)
        self.store_url = store_url or f"file:{workdir / 'platform.db'}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = Process("platform", workdir / "platform.log", piped=piped)
        self.client = httpx.Client(
            base_url=self.url,
            timeout=10.0,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "moonrun",
            "platform",
            "serve",
            "--store",
            self.store_url,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--secret-file",
            str(self.workdir / "platform.secret"),
            "--data-dir",
            str(self.workdir / "platform-data"),
        ]
        for flag, value in self.timings.items():
            command += [f"--{flag}", str(value)]
        self.process.spawn(command, self.workdir)
        wait_healthy(self.process, self.client, "/healthz")

    def close(self) -> None:
        self.process.stop()
        self.client.close()

    # -- user API ------------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None) -> Any:
        response = self.client.request(method, path, json=body)
        assert response.status_code < 300, f"{method} {path}: {response.text}"
        return response.json()

    def host(self, name: str) -> tuple[str, str, str]:
        """An endpoint, its join token and a server on it: (endpoint_id, join_token, server_id)."""
        owner = self.api(
            "POST", "/api/v1/users", {"name": f"{name}-owner", "platform_admin": False}
        )
        created = self.api("POST", "/api/v1/endpoints", {"name": name})
        endpoint_id = created["endpoint"]["id"]
        server = self.api(
            "POST",
            "/api/v1/servers",
            {"name": f"{name}-server", "endpoint_id": endpoint_id, "owner_id": owner["user"]["id"]},
        )
        return endpoint_id, created["join_token"], server["id"]

    def submit(self, server_id: str, kind: str, payload: Any = None, **extra: Any) -> str:
        body = {"kind": kind, **extra}
        if payload is not None:
            body["payload"] = payload
        job_id: str = self.api("POST", f"/api/v1/servers/{server_id}/jobs", body)["id"]
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        view: dict[str, Any] = self.api("GET", f"/api/v1/jobs/{job_id}")
        return view

    def jobs(self, server_id: str) -> list[dict[str, Any]]:
        """Every job of the server, all pages."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"server_id": server_id, "limit": 200}
            if cursor:
                params["cursor"] = cursor
            response = self.client.get("/api/v1/jobs", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            found.extend(page["jobs"])
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    def endpoint(self, endpoint_id: str) -> dict[str, Any]:
        for endpoint in self.api("GET", "/api/v1/endpoints")["endpoints"]:
            if endpoint["id"] == endpoint_id:
                found: dict[str, Any] = endpoint
                return found
        raise AssertionError(f"endpoint {endpoint_id} is not listed")

    def log_lines(self, job_id: str) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = self.api("GET", f"/api/v1/jobs/{job_id}/logs")["lines"]
        return lines

    def wait_job(
        self, job_id: str, accept: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            view = self.job(job_id)
            return view if accept(view) else None

        return wait_until(probe, timeout_s, f"job {job_id}: {what}")


class RunAgent:
    """`moonrun run join` once, then `moonrun run start` as often as the test likes."""

    def __init__(self, workdir: Path, capacity: int = 4, name: str = "run") -> None:
        self.workdir = workdir
        self.data_dir = workdir / f"{name}-data"
        self.data_dir.mkdir(exist_ok=True)
        self.capacity = capacity
        self.process = Process(name, workdir / f"{name}.log")

    def join(self, platform_url: str, token: str) -> None:
        command = [
            sys.executable,
            "-m",
            "moonrun",
            "run",
            "join",
            "--platform",
            platform_url,
            "--token",
            token,
            "--data-dir",
            str(self.data_dir),
        ]
        joined = subprocess.run(
            command,
            cwd=self.workdir,
            env=command_env(ADMIN_TOKEN),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert joined.returncode == 0, joined.stderr

    def start(self, platform_url: str) -> None:
        command = [
            sys.executable,
            "-m",
            "moonrun",
            "run",
            "start",
            "--platform",
            platform_url,
            "--data-dir",
            str(self.data_dir),
            "--capacity",
            str(self.capacity),
            "--cancel-grace-s",
            "1",
        ]
        self.process.spawn(command, self.workdir)

    def kill(self) -> None:
        self.process.stop()

    def events(self) -> list[dict[str, Any]]:
        """Run's JSON log lines, across all its starts (other lines are skipped)."""
        found: list[dict[str, Any]] = []
        if not self.process.log.exists():
            return found
        for line in self.process.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found


class BlockingProxy:
    """tests/support/e2e_faults_proxy.py in its own process: forwards all, holds `hang` prefixes."""

    def __init__(self, workdir: Path, upstream: str, hang: list[str]) -> None:
        self.workdir = workdir
        self.upstream = upstream
        self.hang = hang
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = Process("proxy", workdir / "proxy.log")
        self.client = httpx.Client(base_url=self.url, timeout=5.0)

    def start(self) -> None:
        command = [sys.executable, str(PROXY_SCRIPT), "--listen", str(self.port)]
        command += ["--upstream", self.upstream]
        for prefix in self.hang:
            command += ["--hang", prefix]
        self.process.spawn(command, self.workdir)
        wait_healthy(self.process, self.client, "/__proxy/stats")

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.client.get("/__proxy/stats").json()
        return stats

    def partition(self, mode: str) -> None:
        """Cut Run off the platform (`hang`: requests held unanswered; `drop`: connections
        closed at once), or heal it (`none`)."""
        answer = self.client.post("/__proxy/partition", json={"mode": mode})
        assert answer.status_code == 200, answer.text

    def close(self) -> None:
        self.process.stop()
        self.client.close()


@contextmanager
def processes(*owners: Platform | RunAgent | BlockingProxy | PrivateMariaDB) -> Iterator[None]:
    """Stop every process at the end; a failure carries each process's log tail."""
    try:
        yield
    except BaseException as error:
        for owner in owners:
            error.add_note(f"--- {owner.process.name} output (last {LOG_TAIL_LINES} lines) ---")
            error.add_note(owner.process.tail())
        raise
    finally:
        for owner in reversed(owners):
            if isinstance(owner, RunAgent):
                owner.kill()
            else:
                owner.close()


MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = ("mariadb-install-db", "mysql_install_db")


class PrivateMariaDB:
    """A `mariadbd` of the test's own: its data directory in `workdir`, a free loopback port,
    no grant tables (root, no password). Never the machine's shared server, which other suites
    use at the same time: this one the test kills and starts again at will."""

    def __init__(self, workdir: Path) -> None:
        self.datadir = workdir / "mariadb-data"
        # A socket path must stay short (108 bytes); TCP is what the platform uses.
        self.rundir = Path(tempfile.mkdtemp(prefix="moonrun-mdb-"))
        self.port = free_port()
        self.process = Process("mariadb", workdir / "mariadb.log")

    @staticmethod
    def missing() -> str | None:
        """Why no private MariaDB can run here, or None when it can."""
        if not Path(MARIADBD).exists():
            return f"{MARIADBD} is not installed (apt-get install mariadb-server)"
        if not any(shutil.which(name) for name in INSTALL_DB):
            return "mariadb-install-db is not installed (apt-get install mariadb-server)"
        return None

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def _as_user(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def install(self) -> None:
        """Create the system tables in a fresh data directory."""
        tool = next(path for name in INSTALL_DB if (path := shutil.which(name)))
        installed = subprocess.run(
            [
                tool,
                "--no-defaults",
                f"--datadir={self.datadir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *self._as_user(),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr

    def start(self) -> None:
        """Start the server on the data directory and port (again, after a kill) and wait,
        with a bound, until it answers."""
        command = [
            MARIADBD,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--socket={self.rundir / 'sock'}",
            f"--pid-file={self.rundir / 'pid'}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=32M",
            *self._as_user(),
        ]
        self.process.spawn(command, self.rundir)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert self.process.alive(), f"mariadbd exited: {self.process.tail()}"
            try:
                pymysql.connect(
                    host="127.0.0.1", port=self.port, user="root", connect_timeout=1
                ).close()
                return
            except pymysql.err.MySQLError:
                assert time.monotonic() < deadline, (
                    f"mariadbd did not answer: {self.process.tail()}"
                )
                time.sleep(0.05)

    def create_database(self, name: str) -> None:
        connection = pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        finally:
            connection.close()

    def kill(self) -> None:
        """SIGKILL, as a crashed or powered-off database server: nothing is flushed."""
        self.process.stop()

    def close(self) -> None:
        self.process.stop()
        shutil.rmtree(self.rundir, ignore_errors=True)
