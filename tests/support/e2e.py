"""End-to-end harness: `moonrun platform serve` and `moonrun run start` as real processes.

A `Cluster` owns one platform process (over a FileStore in the test's directory unless given
another store URL), its admin API client, and any number of Run processes, each with its own
data directory. Processes are started, SIGKILLed and started again at will; everything is
killed and closed when the `cluster` context ends, and a failure carries the tail of every
process's output. Waits poll the user API with a bounded deadline (these are real processes
on the real clock); tests assert on what the platform recorded, never on elapsed time.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from moonrun.run.journal import Assignment, Journal
from tests.support.processes import command_env, free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
STARTUP_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05
LOG_TAIL_LINES = 40

JobView = dict[str, Any]


@dataclass(frozen=True)
class Timings:
    """The platform's timing flags: short, so that the suite is fast."""

    lease_ttl_s: float = 8
    ack_timeout_s: float = 3
    heartbeat_interval_s: float = 1
    session_ttl_s: float = 6
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 2
    sweep_interval_s: float = 0.2

    def flags(self) -> list[str]:
        return [
            f"--lease-ttl-s={self.lease_ttl_s}",
            f"--ack-timeout-s={self.ack_timeout_s}",
            f"--heartbeat-interval-s={self.heartbeat_interval_s}",
            f"--session-ttl-s={self.session_ttl_s}",
            f"--backoff-initial-s={self.backoff_initial_s}",
            f"--backoff-max-s={self.backoff_max_s}",
            f"--sweep-interval-s={self.sweep_interval_s}",
        ]


def moonrun(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "moonrun", *arguments]


def wait_for(probe: Callable[[], Any], what: str, *, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """Poll `probe` until it returns something truthy (returned); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(text[-lines:]) or "(empty)"


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a process's output file (other lines are skipped)."""
    events = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an orphan's zombie may linger)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


class Process:
    """One command, restartable; every instance appends its output to one log file."""

    def __init__(self, name: str, workdir: Path, log: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.log = log
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, command: list[str], extra_env: dict[str, str] | None = None) -> None:
        assert self.process is None, f"{self.name} is already running"
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(command[3:])}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=self.workdir,
                env={**command_env(ADMIN_TOKEN), **(extra_env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def check_alive(self) -> None:
        assert self.process is not None, f"{self.name} is not running"
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited with code {code}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (no graceful shutdown) and reap."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=30)
            self.process = None

    def stop(self) -> int:
        """SIGTERM (graceful shutdown), wait with a bound, and reap; returns the exit code."""
        self.terminate()
        return self.wait_exit()

    def terminate(self) -> None:
        """SIGTERM, without waiting."""
        assert self.process is not None, f"{self.name} is not running"
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self) -> int:
        """Wait with a bound for the process to exit, and reap; returns the exit code."""
        assert self.process is not None, f"{self.name} is not running"
        try:
            code = self.process.wait(timeout=30)
        finally:
            self.kill()
        return code


class Platform(Process):
    """`moonrun platform serve` on one port, store and secret file."""

    def __init__(
        self,
        workdir: Path,
        store_url: str,
        timings: Timings,
        flags: tuple[str, ...] = (),
        open_files: int | None = None,
    ) -> None:
        super().__init__("the platform", workdir, workdir / "platform.log")
        self.store_url = store_url
        self.timings = timings
        self.flags = flags
        self.open_files = open_files
        """`ulimit -n` for the platform, when given."""
        self.secret_file = workdir / "platform.secret"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client: httpx.Client | None = None

    def start(self) -> None:
        """Start an instance and wait, with a bound, until /healthz answers 200."""
        command = moonrun(
            "platform",
            "serve",
            "--store",
            self.store_url,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--secret-file",
            str(self.secret_file),
            "--data-dir",
            str(self.workdir / "platform-data"),
            *self.timings.flags(),
            *self.flags,
        )
        if self.open_files is not None:
            command = ["sh", "-c", f'ulimit -n {self.open_files} && exec "$@"', "sh", *command]
        self.spawn(command)
        self.client = httpx.Client(
            base_url=self.url,
            timeout=10.0,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        client = self.client

        def healthy() -> bool:
            self.check_alive()
            try:
                return client.get("/healthz", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, "/healthz to answer 200", timeout_s=STARTUP_TIMEOUT_S)

    def kill(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        super().kill()

    def restart(self) -> None:
        """SIGKILL and start again on the same store, secret and port."""
        self.kill()
        self.start()


class Run(Process):
    """`moonrun run start` on one data directory, joined to one endpoint."""

    def __init__(
        self, cluster: Cluster, name: str, endpoint_id: str, data_dir: Path, capacity: int
    ) -> None:
        super().__init__(f"Run {name}", cluster.workdir, cluster.workdir / f"run-{name}.log")
        self.cluster = cluster
        self.endpoint_id = endpoint_id
        self.data_dir = data_dir
        self.capacity = capacity

    def start(
        self,
        *,
        cancel_grace_s: float = 2.0,
        options: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> int:
        """Start Run (with more `options` and environment variables, if given) and wait until it
        has registered a new session; returns its generation."""
        before = self.cluster.endpoint(self.endpoint_id)["generation"]
        self.spawn(
            moonrun(
                "run",
                "start",
                "--platform",
                self.cluster.platform.url,
                "--data-dir",
                str(self.data_dir),
                "--capacity",
                str(self.capacity),
                "--cancel-grace-s",
                str(cancel_grace_s),
                *options,
            ),
            extra_env,
        )

        def registered() -> int:
            self.check_alive()
            generation: int = self.cluster.endpoint(self.endpoint_id)["generation"]
            return generation if generation > before else 0

        generation: int = wait_for(registered, f"{self.name} to register")
        return generation

    def restart(self) -> int:
        """SIGKILL and start again on the same data directory."""
        self.kill()
        return self.start()

    def journal(self) -> dict[str, Assignment]:
        """Run's journal as it is on disk now."""
        return Journal.open(self.data_dir).entries

    def write_journal(self, entries: list[Assignment]) -> None:
        """Replace the journal on disk (Run must be stopped)."""
        assert not self.running, "write the journal only while Run is stopped"
        Journal(self.data_dir, {entry.job_id: entry for entry in entries}).rewrite()

    def events(self, message: str | None = None) -> list[dict[str, Any]]:
        """Run's JSON log lines (across its restarts), optionally only those with `message`."""
        events = read_events(self.log)
        return [e for e in events if message is None or e.get("msg") == message]


@dataclass
class Server:
    id: str
    endpoint_id: str


@dataclass
class Cluster:
    """A platform, its Runs, and helpers over the user API (as the bootstrap admin)."""

    workdir: Path
    platform: Platform
    runs: list[Run] = field(default_factory=list)
    pidfiles: list[Path] = field(default_factory=list)
    owner_id: str | None = None

    # -- user API ------------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None) -> httpx.Response:
        assert self.platform.client is not None, "the platform is not running"
        return self.platform.client.request(method, path, json=body)

    def created(self, path: str, body: Any) -> dict[str, Any]:
        response = self.api("POST", path, body)
        assert response.status_code == 201, f"{path}: {response.status_code} {response.text}"
        answer: dict[str, Any] = response.json()
        return answer

    def endpoint(self, endpoint_id: str) -> dict[str, Any]:
        response = self.api("GET", "/api/v1/endpoints")
        assert response.status_code == 200, response.text
        for view in response.json()["endpoints"]:
            if view["id"] == endpoint_id:
                found: dict[str, Any] = view
                return found
        raise AssertionError(f"endpoint {endpoint_id} is not listed")

    def owner(self) -> str:
        if self.owner_id is None:
            created = self.created("/api/v1/users", {"name": "owner", "platform_admin": False})
            self.owner_id = created["user"]["id"]
        return self.owner_id

    def create_endpoint(self, name: str) -> tuple[str, str]:
        """A new endpoint: its id and its one-time join token."""
        created = self.created("/api/v1/endpoints", {"name": name})
        return created["endpoint"]["id"], created["join_token"]

    def create_server(self, name: str, endpoint_id: str) -> Server:
        body = {"name": name, "endpoint_id": endpoint_id, "owner_id": self.owner()}
        return Server(self.created("/api/v1/servers", body)["id"], endpoint_id)

    def add_run(self, name: str = "host-1", *, capacity: int = 4, start: bool = True) -> Run:
        """Create an endpoint, `moonrun run join` a fresh data directory to it, and start Run."""
        endpoint_id, join_token = self.create_endpoint(name)
        data_dir = self.workdir / f"run-{name}"
        data_dir.mkdir()
        joined = subprocess.run(
            moonrun(
                "run",
                "join",
                "--platform",
                self.platform.url,
                "--token",
                join_token,
                "--data-dir",
                str(data_dir),
            ),
            cwd=self.workdir,
            env=command_env(ADMIN_TOKEN),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert joined.returncode == 0, f"run join failed: {joined.stdout}{joined.stderr}"
        assert endpoint_id in joined.stdout, joined.stdout
        run = Run(self, name, endpoint_id, data_dir, capacity)
        self.runs.append(run)
        if start:
            run.start()
        return run

    def submit(self, server: Server, kind: str, payload: Any = None, **options: Any) -> JobView:
        """Queue a job (options: max_attempts, backoff, not_before); returns its JobView."""
        body: dict[str, Any] = {"kind": kind, **options}
        if payload is not None:
            body["payload"] = payload
        return self.created(f"/api/v1/servers/{server.id}/jobs", body)

    def job(self, job_id: str) -> JobView:
        response = self.api("GET", f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        view: JobView = response.json()
        return view

    def wait_job(
        self,
        job_id: str,
        predicate: Callable[[JobView], bool],
        what: str,
        *,
        timeout_s: float = WAIT_TIMEOUT_S,
    ) -> JobView:
        """Poll the job until `predicate(view)` holds; fail (with the last view) after a bound."""
        last: list[JobView] = []

        def probe() -> JobView | None:
            view = self.job(job_id)
            last[:] = [view]
            return view if predicate(view) else None

        try:
            found: JobView = wait_for(probe, f"job {job_id}: {what}", timeout_s=timeout_s)
        except AssertionError as error:
            error.add_note(f"last JobView: {json.dumps(last[0] if last else None)}")
            raise
        return found

    def wait_state(self, job_id: str, *states: str, timeout_s: float = WAIT_TIMEOUT_S) -> JobView:
        return self.wait_job(
            job_id, lambda view: view["state"] in states, f"state in {states}", timeout_s=timeout_s
        )

    def logs(self, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """Every log line of the attempt (the latest by default), page after page."""
        query = "" if attempt is None else f"&attempt={attempt}"
        lines: list[dict[str, Any]] = []
        after_seq = -1
        while True:
            path = f"/api/v1/jobs/{job_id}/logs?after_seq={after_seq}{query}"
            response = self.api("GET", path)
            assert response.status_code == 200, response.text
            page = response.json()
            lines += page["lines"]
            if not page["more"]:
                return lines
            after_seq = page["next_after_seq"]

    # -- host processes ------------------------------------------------------------------------

    def pidfile(self, name: str) -> Path:
        """A path for a command to write its PID to; that process is killed at the end."""
        path = self.workdir / f"{name}.pid"
        self.pidfiles.append(path)
        return path

    def wait_pid(self, path: Path) -> int:
        def written() -> int | None:
            text = path.read_text().strip() if path.exists() else ""
            return int(text) if text.isdigit() else None

        pid: int = wait_for(written, f"a PID in {path.name}")
        return pid

    def _kill_recorded_processes(self) -> None:
        for path in self.pidfiles:
            text = path.read_text().strip() if path.exists() else ""
            if text.isdigit():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(text), signal.SIGKILL)

    def close(self) -> None:
        for run in self.runs:
            run.kill()
        self.platform.kill()
        self._kill_recorded_processes()

    @contextmanager
    def explained(self) -> Iterator[None]:
        """Attach every process's output tail to a failure raised inside."""
        try:
            yield
        except BaseException as error:
            for note in self.output_tails():
                error.add_note(note)
            raise

    def output_tails(self) -> list[str]:
        notes = [f"--- platform output (last {LOG_TAIL_LINES} lines) ---", tail(self.platform.log)]
        for run in self.runs:
            notes += [f"--- {run.name} output (last {LOG_TAIL_LINES} lines) ---", tail(run.log)]
        return notes


@contextmanager
def cluster(
    workdir: Path,
    *,
    store_url: str | None = None,
    timings: Timings | None = None,
    platform_flags: tuple[str, ...] = (),
    open_files: int | None = None,
) -> Iterator[Cluster]:
    """A started platform (FileStore in `workdir` unless `store_url`; more `platform_flags`;
    under `ulimit -n open_files` when given); always torn down.

    A failure inside carries the tail of the platform's and every Run's output.
    """
    url = store_url or f"file:{workdir / 'platform.db'}"
    platform = Platform(workdir, url, timings or Timings(), platform_flags, open_files)
    built = Cluster(workdir, platform)
    try:
        platform.start()
        yield built
    except BaseException as error:
        for note in built.output_tails():
            error.add_note(note)
        raise
    finally:
        built.close()
