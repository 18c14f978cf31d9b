"""What the fault tests add to the launcher: the user API over a platform process, a fault
proxy and a private MariaDB, and the checks of how each job ended.

Each process writes its output to a log file in the test's directory (appended across
restarts), and is killed and reaped by `close()`; `processes()` never leaves one behind. The
platform is driven through its user API (httpx), Run only through its command line and its log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pymysql

from tests.support.launcher import (
    LOG_TAIL_LINES,
    STARTUP_TIMEOUT_S,
    PlatformProcess,
    Process,
    RunProcess,
    Timings,
    free_port,
    wait_for,
    wait_healthy,
)

PROXY_SCRIPT = Path(__file__).resolve().parent / "e2e_faults_proxy.py"

FAST_TIMINGS = Timings(lease_ttl_s=4)
"""Short platform timings: a lease is renewed every second and lapses after 4 s."""

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def first_attempt_sleeps(seconds: float) -> str:
    """A shell line that sleeps `seconds` in a job's first attempt only: a fault test needs its
    first attempts to outlast the fault, not its retries (an attempt reads its number from its
    working directory's name, `moonrun-<job>-<attempt>-<random>`)."""
    return f'case "$(basename "$PWD")" in moonrun-*-1-*) sleep {seconds};; esac'


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


class Platform(PlatformProcess):
    """`moonrun platform serve` over a FileStore in `workdir` (or `store_url`) with short
    timings, and the user API at hand."""

    def __init__(
        self,
        workdir: Path,
        timings: Timings = FAST_TIMINGS,
        *,
        store_url: str | None = None,
        piped: bool = False,
    ) -> None:
        super().__init__(workdir, store_url, flags=timings.flags(), piped=piped, name="platform")
        self.timings = timings

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

        return wait_for(probe, f"job {job_id}: {what}", timeout_s=timeout_s, every_s=0.1)


class RunAgent(RunProcess):
    """`moonrun run join` once, then `moonrun run start` as often as the test likes, with a
    one-second cancel grace."""

    def __init__(self, workdir: Path, capacity: int = 4, name: str = "run") -> None:
        super().__init__(name, workdir, workdir / f"{name}-data", workdir / f"{name}.log", capacity)

    def start(  # type: ignore[override]
        self, platform_url: str, *, cancel_grace_s: float = 1.0, **options: Any
    ) -> None:
        super().start(platform_url, cancel_grace_s=cancel_grace_s, **options)


class BlockingProxy(Process):
    """tests/support/e2e_faults_proxy.py in its own process: forwards all, holds `hang` prefixes."""

    def __init__(self, workdir: Path, upstream: str, hang: list[str]) -> None:
        super().__init__("proxy", workdir)
        self.upstream = upstream
        self.hang = hang
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=5.0)

    def start(self) -> None:
        command = [sys.executable, str(PROXY_SCRIPT), "--listen", str(self.port)]
        command += ["--upstream", self.upstream]
        for prefix in self.hang:
            command += ["--hang", prefix]
        self.spawn(command)
        wait_healthy(self, self.url, "/__proxy/stats")

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.client.get("/__proxy/stats").json()
        return stats

    def partition(self, mode: str) -> None:
        """Cut Run off the platform (`hang`: requests held unanswered; `drop`: connections
        closed at once), or heal it (`none`)."""
        answer = self.client.post("/__proxy/partition", json={"mode": mode})
        assert answer.status_code == 200, answer.text

    def close(self) -> None:
        super().close()
        self.client.close()


@contextmanager
def processes(*owners: Process) -> Iterator[None]:
    """Close every process at the end; a failure carries each process's log tail."""
    try:
        yield
    except BaseException as error:
        for owner in owners:
            error.add_note(f"--- {owner.name} output (last {LOG_TAIL_LINES} lines) ---")
            error.add_note(owner.tail())
        raise
    finally:
        for owner in reversed(owners):
            owner.close()


MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = ("mariadb-install-db", "mysql_install_db")


class PrivateMariaDB(Process):
    """A `mariadbd` of the test's own: its data directory in `workdir`, a free loopback port,
    no grant tables (root, no password). Never the machine's shared server, which other suites
    use at the same time: this one the test kills and starts again at will."""

    def __init__(self, workdir: Path) -> None:
        # A socket path must stay short (108 bytes); TCP is what the platform uses.
        self.rundir = Path(tempfile.mkdtemp(prefix="moonrun-mdb-"))
        super().__init__("mariadb", self.rundir, workdir / "mariadb.log")
        self.datadir = workdir / "mariadb-data"
        self.port = free_port()

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
        self.spawn(command)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert self.running, f"mariadbd exited: {self.tail()}"
            try:
                pymysql.connect(
                    host="127.0.0.1", port=self.port, user="root", connect_timeout=1
                ).close()
                return
            except pymysql.err.MySQLError:
                assert time.monotonic() < deadline, f"mariadbd did not answer: {self.tail()}"
                time.sleep(0.05)

    def create_database(self, name: str) -> None:
        connection = pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        finally:
            connection.close()

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.rundir, ignore_errors=True)
