"""End-to-end harness: `moonrun platform serve` and `moonrun run start` as real processes.

A `Cluster` owns one platform process (over a FileStore in the test's directory unless given
another store URL), its admin API client, and any number of Run processes, each with its own
data directory. Processes are started, SIGKILLed and started again at will; everything is
killed and closed when the `cluster` context ends, and a failure carries the tail of every
process's output. The processes are tests/support/launcher.py's; waits poll the user API with
a bounded deadline (these are real processes on the real clock); tests assert on what the
platform recorded, never on elapsed time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from moonrun.run.journal import Assignment, Journal
from tests.support.launcher import (
    LOG_TAIL_LINES,
    WAIT_TIMEOUT_S,
    PlatformProcess,
    RunProcess,
    Timings,
    wait_for,
)

JobView = dict[str, Any]


class Platform(PlatformProcess):
    """`moonrun platform serve` with the suite's short timings and more `flags`."""

    def __init__(
        self,
        workdir: Path,
        store_url: str,
        timings: Timings,
        flags: tuple[str, ...] = (),
        open_files: int | None = None,
    ) -> None:
        super().__init__(
            workdir, store_url, flags=[*timings.flags(), *flags], open_files=open_files
        )
        self.timings = timings


class Run(RunProcess):
    """`moonrun run start` on one data directory, joined to one endpoint of the cluster."""

    def __init__(
        self, cluster: Cluster, name: str, endpoint_id: str, data_dir: Path, capacity: int
    ) -> None:
        log = cluster.workdir / f"run-{name}.log"
        super().__init__(f"Run {name}", cluster.workdir, data_dir, log, capacity)
        self.cluster = cluster
        self.endpoint_id = endpoint_id

    def start(  # type: ignore[override]
        self,
        *,
        cancel_grace_s: float = 2.0,
        options: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> int:
        """Start Run (with more `options` and environment variables, if given) and wait until it
        has registered a new session; returns its generation."""
        before = self.cluster.endpoint(self.endpoint_id)["generation"]
        super().start(
            self.cluster.platform.url,
            cancel_grace_s=cancel_grace_s,
            options=options,
            extra_env=extra_env,
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
        run = Run(self, name, endpoint_id, data_dir, capacity)
        joined = run.join(self.platform.url, join_token)
        assert endpoint_id in joined, joined
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
            run.close()
        self.platform.close()
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

    def waiting(self, kind: str) -> int:
        """How many `claims` or `reads` wait at the platform now (its metrics)."""
        assert self.platform.client is not None
        metrics = self.platform.client.get("/metrics").text
        found = re.search(rf'^moonrun_waiting_requests{{kind="{kind}"}} (\S+)$', metrics, re.M)
        assert found is not None, metrics
        return int(float(found.group(1)))

    def output_tails(self) -> list[str]:
        notes = [f"--- platform output (last {LOG_TAIL_LINES} lines) ---", self.platform.tail()]
        for run in self.runs:
            notes += [f"--- {run.name} output (last {LOG_TAIL_LINES} lines) ---", run.tail()]
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
