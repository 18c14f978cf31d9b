"""Real-process faults: the database stopped, the disk full, the platform paused past every
lease, a Run cut off from the platform (issue 13, part 3).

Everything is a subprocess on loopback: `moonrun platform serve`, `moonrun run start`, a
`mariadbd` of the test's own (never the machine's shared server) and the fault proxy
(tests/support/e2e_faults_proxy.py). The timings are short (a lease lapses 4 s after its last
renewal,
a session 6 s after its last request). The jobs are `command`s that append a `start` and an
`end` mark, with the attempt's working directory (which names the job and the attempt) and
the time in nanoseconds, to one file: however the fault went, no (job, attempt) may start
twice, every start must have its end, and no two attempts of a job may overlap. Then every job
must have ended exactly once: succeeded, on one attempt whose result alone was accepted.
"""

from __future__ import annotations

import itertools
import json
import resource
import shlex
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import needs
from tests.support.faults import (
    BlockingProxy,
    Platform,
    PrivateMariaDB,
    RunAgent,
    check_history,
    first_attempt_sleeps,
    is_terminal,
    processes,
)
from tests.support.launcher import ADMIN_TOKEN, command_env, moonrun, wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

SELF_FENCED = "attempt self-fenced: no lease renewal accepted in time"
MAX_ATTEMPTS = 20
"""Far more than any fault here costs a job: the test is about how jobs end, not budgets."""


# -- jobs that leave marks ---------------------------------------------------------------------


def marked_command(
    marks: Path, seconds: float, *, say: bool = False, first_only: bool = False
) -> dict[str, Any]:
    """A `command` payload: `start`, sleep, `end`; stopped (SIGTERM) while it sleeps, it still
    writes `end` (once: a SIGTERM once it woke is ignored).
    With `say`, it also prints a line before and after (for the job's logs); with
    `first_only`, only the first attempt sleeps (the retries end at once)."""
    mark = f'echo "$1 $(basename "$PWD") $(date +%s%N)" >> {shlex.quote(str(marks))}'
    pause = first_attempt_sleeps(seconds) if first_only else f"sleep {seconds}"
    script = f"mark() {{ {mark}; }}; trap 'mark end; exit 143' TERM; "
    script += f"mark start; {pause}; trap '' TERM; mark end"
    if say:
        script = f"echo started; {script}; echo done"
    return {"argv": ["sh", "-c", script], "timeout_s": 120}


@dataclass
class Span:
    """One attempt as its marks tell it (nanoseconds)."""

    starts: list[int]
    ends: list[int]


def spans_of(marks: Path) -> dict[tuple[str, int], Span]:
    """(job id, attempt) -> its start and end marks."""
    spans: dict[tuple[str, int], Span] = defaultdict(lambda: Span([], []))
    for line in marks.read_text().splitlines() if marks.exists() else []:
        what, directory, at = line.split()
        job_id, attempt, _ = directory.removeprefix("moonrun-").rsplit("-", 2)
        span = spans[(job_id, int(attempt))]
        (span.starts if what == "start" else span.ends).append(int(at))
    return dict(spans)


def attempt_problems(marks: Path) -> list[str]:
    """What the marks show against "no attempt runs twice, no two attempts of a job at once"."""
    problems = []
    by_job: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for (job_id, attempt), span in sorted(spans_of(marks).items()):
        if len(span.starts) != 1 or len(span.ends) != 1:
            problems.append(
                f"{job_id} attempt {attempt}: {len(span.starts)} starts, {len(span.ends)} ends"
            )
            continue
        by_job[job_id].append((span.starts[0], span.ends[0], attempt))
    for job_id, spans in by_job.items():
        spans.sort()
        for (_, ended, before), (started, _, after) in itertools.pairwise(spans):
            if started < ended:
                problems.append(
                    f"{job_id}: attempt {after} started {(ended - started) / 1e6:.0f} ms "
                    f"before attempt {before} ended"
                )
    return problems


def results_accepted(run: RunAgent) -> Counter[str]:
    return Counter(e["job_id"] for e in run.events() if e["msg"] == "result accepted")


def json_lines(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def server_errors(platform: Platform) -> list[dict[str, Any]]:
    """Requests the platform answered 5xx other than a typed 503 (its request log)."""
    return [
        event
        for event in json_lines(platform.log)
        if event.get("msg") == "request"
        and event.get("status", 0) >= 500
        and event["status"] != 503
    ] + [event for event in json_lines(platform.log) if event.get("msg") == "unexpected error"]


def ended_exactly_once(
    platform: Platform, server_ids: list[str], runs: list[RunAgent], marks: Path, timeout_s: float
) -> list[dict[str, Any]]:
    """Wait until every job of the servers has ended; check each ended exactly once and that
    no attempt ran twice or beside another; returns the JobViews."""

    def all_ended() -> list[dict[str, Any]] | None:
        views = [view for server_id in server_ids for view in platform.jobs(server_id)]
        return views if all(is_terminal(view) for view in views) else None

    views = wait_for(all_ended, "every job to end", timeout_s=timeout_s, every_s=0.25)
    problems = {view["id"]: found for view in views if (found := check_history(view))}
    assert problems == {}
    accepted = sum((results_accepted(run) for run in runs), Counter())
    assert [job_id for job_id, count in accepted.items() if count > 1] == []
    assert attempt_problems(marks) == []
    ran = {job_id for job_id, _ in spans_of(marks)}
    assert {view["id"] for view in views} == ran
    return views


# -- load and health during a fault ------------------------------------------------------------


class Submitter(threading.Thread):
    """Submits one job after another, each under its own Idempotency-Key and sent again (same
    key, same body) until it is answered 201; records every answer."""

    def __init__(self, platform: Platform, server_id: str, payload: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url = platform.url
        self.path = f"/api/v1/servers/{server_id}/jobs"
        self.body = {"kind": "command", "payload": payload, "max_attempts": MAX_ATTEMPTS}
        self.answers: list[tuple[int, str | None]] = []
        self.job_ids: list[str] = []
        self.gave_up: list[str] = []
        self.halt = threading.Event()

    def created_since(self, count: int) -> int:
        return len(self.job_ids) - count

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=self.url, timeout=10.0, headers=headers) as client:
            number = 0
            while not self.halt.is_set():
                number += 1
                self.submit(client, f"load-{number}", time.monotonic() + 60)
                self.halt.wait(0.15)

    def submit(self, client: httpx.Client, key: str, give_up_at: float) -> None:
        while time.monotonic() < give_up_at:
            try:
                answer = client.post(self.path, json=self.body, headers={"Idempotency-Key": key})
            except httpx.TransportError as error:
                self.answers.append((0, type(error).__name__))
            else:
                code = answer.json()["error"]["code"] if answer.status_code >= 400 else None
                self.answers.append((answer.status_code, code))
                if answer.status_code == 201:
                    self.job_ids.append(answer.json()["id"])
                    return
            time.sleep(0.1)
        self.gave_up.append(key)


class HealthWatch(threading.Thread):
    """Polls /healthz every 0.1 s; records (status, body) each time."""

    def __init__(self, platform: Platform) -> None:
        super().__init__(daemon=True)
        self.url = platform.url
        self.seen: list[tuple[int, Any]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while not self.halt.wait(0.1):
                try:
                    answer = client.get("/healthz")
                except httpx.TransportError as error:
                    self.seen.append((0, type(error).__name__))
                    continue
                self.seen.append((answer.status_code, answer.json()))

    def last(self) -> tuple[int, Any] | None:
        return self.seen[-1] if self.seen else None


def stopped(*threads: Submitter | HealthWatch) -> None:
    for thread in threads:
        thread.halt.set()
    for thread in threads:
        thread.join(timeout=90)
        assert not thread.is_alive(), f"{type(thread).__name__} did not stop"


# -- MariaDB stopped for 10 s under load --------------------------------------------------------


OUTAGE_S = 10.0


def private_mariadb(tmp_path: Path) -> PrivateMariaDB:
    """A MariaDB server of this test's own; skipped where none can run (failed under CI)."""
    reason = PrivateMariaDB.missing()
    if reason is not None:
        needs.missing(reason)
    database = PrivateMariaDB(tmp_path)
    database.install()
    return database


def test_a_database_outage_is_a_typed_503_and_heals_without_a_restart(tmp_path: Path) -> None:
    """MariaDB killed for 10 s under load: users get 503 store_unavailable, /healthz is 503
    saying so; both recover on the same platform process, and every job ends exactly once."""
    database = private_mariadb(tmp_path)
    marks = tmp_path / "marks"
    platform = Platform(tmp_path, store_url=database.url("moonrun"))
    run = RunAgent(tmp_path, capacity=4)
    with processes(database, platform, run):
        database.start()
        database.create_database("moonrun")
        platform.start()
        endpoint_id, join_token, server_id = platform.host("host-1")
        run.join(platform.url, join_token)
        run.start(platform.url)
        wait_for(
            lambda: platform.endpoint(endpoint_id)["online"], "Run to come online", timeout_s=30
        )
        submitter = Submitter(platform, server_id, marked_command(marks, 1.5))
        health = HealthWatch(platform)
        submitter.start()
        health.start()
        wait_for(lambda: len(spans_of(marks)) >= 3, "three attempts to start", timeout_s=30)

        database.kill()
        down_at = time.monotonic()
        wait_for(
            lambda: (health.last() or (0, None))[0] == 503,
            "/healthz to say 503",
            timeout_s=OUTAGE_S,
        )
        during = wait_for(
            lambda: (503, "store_unavailable") in submitter.answers,
            "a typed 503",
            timeout_s=OUTAGE_S,
        )
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        database.start()
        up_at = time.monotonic()
        wait_for(lambda: (health.last() or (0, None))[0] == 200, "/healthz 200 again", timeout_s=30)
        healed_s = time.monotonic() - up_at
        created = len(submitter.job_ids)
        wait_for(lambda: submitter.created_since(created) >= 3, "three creates after", timeout_s=30)
        stopped(submitter, health)
        views = ended_exactly_once(platform, [server_id], [run], marks, timeout_s=60)

        unhealthy = [body for status, body in health.seen if status != 200]
        statuses = Counter(submitter.answers)
        assert during
        assert submitter.gave_up == []
        assert set(statuses) <= {(201, None), (503, "store_unavailable")}, statuses
        assert sorted(submitter.job_ids) == sorted(view["id"] for view in views)
        assert unhealthy, "no /healthz answer said the store was down"
        assert {body["error"]["code"] for body in unhealthy} == {"store_unavailable"}
        assert "cannot reach MySQL" in unhealthy[0]["error"]["message"]
        assert (platform.starts, platform.running) == (1, True)
        assert server_errors(platform) == []
        print(
            f"\n{len(views)} jobs across a {OUTAGE_S:.0f} s MariaDB outage: answers "
            f"{dict(statuses)}; /healthz 200 again {healed_s:.1f} s after the restart; "
            f"attempts per job {dict(Counter(view['attempt'] for view in views))}"
        )


# -- the FileStore's disk full -----------------------------------------------------------------


FULL_S = 4.0


def limit_file_size(pid: int, size: int | None) -> None:
    """Set process `pid`'s file size limit (RLIMIT_FSIZE, soft) to `size` bytes, or lift it:
    past it, every write fails with EFBIG (SIGXFSZ is ignored by Python), as on a full disk."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if size is None else size, hard))


def store_check(store_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        moonrun("store", "check", "--store", store_url),
        env=command_env(ADMIN_TOKEN),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_full_disk_is_a_typed_503_with_no_corruption_and_heals_with_space(
    tmp_path: Path,
) -> None:
    """No byte can be written for 4 s (RLIMIT_FSIZE of the platform): creates get 503
    store_unavailable, never a 500; once space is back the same process serves again, every job
    ends exactly once, the SQLite file checks whole, and its logs read back after a restart."""
    marks = tmp_path / "marks"
    platform = Platform(tmp_path, piped=True)
    run = RunAgent(tmp_path, capacity=4)
    with processes(platform, run):
        platform.start()
        endpoint_id, join_token, server_id = platform.host("host-1")
        run.join(platform.url, join_token)
        run.start(platform.url)
        wait_for(
            lambda: platform.endpoint(endpoint_id)["online"], "Run to come online", timeout_s=30
        )
        submitter = Submitter(platform, server_id, marked_command(marks, 0.5, say=True))
        health = HealthWatch(platform)
        submitter.start()
        health.start()
        wait_for(lambda: len(spans_of(marks)) >= 3, "three attempts to start", timeout_s=30)

        limit_file_size(platform.pid, 1)
        full_at = time.monotonic()
        during = wait_for(
            lambda: (503, "store_unavailable") in submitter.answers, "a typed 503", timeout_s=FULL_S
        )
        readable = platform.client.get(f"/api/v1/jobs/{submitter.job_ids[0]}")
        time.sleep(max(0.0, FULL_S - (time.monotonic() - full_at)))
        limit_file_size(platform.pid, None)
        created = len(submitter.job_ids)
        wait_for(lambda: submitter.created_since(created) >= 3, "three creates after", timeout_s=30)
        stopped(submitter, health)
        views = ended_exactly_once(platform, [server_id], [run], marks, timeout_s=60)
        statuses = Counter(submitter.answers)
        assert during
        assert readable.status_code == 200, readable.text  # reads need no space
        assert submitter.gave_up == []
        assert set(statuses) <= {(201, None), (503, "store_unavailable")}, statuses
        assert sorted(submitter.job_ids) == sorted(view["id"] for view in views)
        assert (platform.starts, platform.running) == (1, True)
        assert server_errors(platform) == []

        # Logs travel on their own path, after the result: wait until every job's lines have
        # arrived, so that the restart below checks what was stored, not what was in flight.
        wait_for(
            lambda: all(platform.log_lines(view["id"]) for view in views),
            "every job's log lines to arrive",
            timeout_s=60,
        )
        platform.kill()
        with sqlite3.connect(tmp_path / "platform.db") as db:
            integrity = db.execute("PRAGMA integrity_check").fetchall()
        checked = store_check(platform.store_url)
        assert (integrity, checked.returncode) == ([("ok",)], 0), checked.stdout + checked.stderr
        platform.start()  # again, on the same store and data directory
        logged = {view["id"]: len(platform.log_lines(view["id"])) for view in views}
        assert [job_id for job_id, lines in logged.items() if lines == 0] == []
        print(
            f"\n{len(views)} jobs across {FULL_S:.0f} s of a full disk: answers {dict(statuses)}; "
            f"/healthz answers {dict(Counter(status for status, _ in health.seen))}; log lines "
            f"per job after a restart {sorted(set(logged.values()))}"
        )


# -- the platform paused past every lease; a Run partitioned from the platform -----------------


PAUSE_S = 8.0
"""Longer than the lease (4 s) and the session (6 s)."""
LONG_JOB_S = 6.0
"""How long each job's first attempt sleeps: longer than the lease, so that it needs renewals,
and the fault (from about 1 s into it) catches it well before it would have finished. Later
attempts end at once: what they prove (each job ends once) needs no wait."""


def start_runs(platform: Platform, runs: list[RunAgent], urls: list[str]) -> list[str]:
    """One endpoint and server per Run, each Run started through its URL; the server ids."""
    server_ids = []
    for run, url in zip(runs, urls, strict=True):
        endpoint_id, join_token, server_id = platform.host(run.name)
        run.join(platform.url, join_token)
        run.start(url)
        wait_for(lambda e=endpoint_id: platform.endpoint(e)["online"], "Run online", timeout_s=30)
        server_ids.append(server_id)
    return server_ids


def all_running(platform: Platform, job_ids: list[str]) -> bool:
    """Every job running with at least one renewal accepted."""
    views = [platform.job(job_id) for job_id in job_ids]
    return all(v["state"] == "running" and (v["progress"] or {}).get("seq", 0) >= 1 for v in views)


def submit_long_jobs(platform: Platform, server_ids: list[str], marks: Path) -> list[str]:
    payload = marked_command(marks, LONG_JOB_S, first_only=True)
    return [
        platform.submit(server_id, "command", payload, max_attempts=MAX_ATTEMPTS)
        for server_id in server_ids
        for _ in range(2)
    ]


def fenced_attempts(run: RunAgent) -> list[tuple[str, int]]:
    return [(e["job_id"], e["attempt"]) for e in run.events() if e["msg"] == SELF_FENCED]


@pytest.mark.alone
def test_a_platform_paused_past_every_lease_makes_runs_self_fence_and_all_ends(
    tmp_path: Path,
) -> None:
    """The platform SIGSTOPped for 8 s while two Runs each hold two attempts: each Run's
    heartbeat gives up at the control channel's timeout (5 s) and Run takes its lost-contact
    path; each Run stops its attempts itself, no attempt runs twice or beside another, and
    every job ends once."""
    marks = tmp_path / "marks"
    platform = Platform(tmp_path)
    runs = [RunAgent(tmp_path, capacity=2, name=f"run-{n}") for n in (1, 2)]
    with processes(platform, *runs):
        platform.start()
        server_ids = start_runs(platform, runs, [platform.url] * len(runs))
        job_ids = submit_long_jobs(platform, server_ids, marks)
        wait_for(
            lambda: all_running(platform, job_ids), "every attempt running, renewed", timeout_s=30
        )

        platform.signal(signal.SIGSTOP)
        try:
            time.sleep(PAUSE_S)
        finally:
            platform.signal(signal.SIGCONT)
            resumed = datetime.now(UTC)
        views = ended_exactly_once(platform, server_ids, runs, marks, timeout_s=60)

        fenced = [sorted(fenced_attempts(run)) for run in runs]
        first_attempts = sorted((job_id, 1) for job_id in job_ids)
        assert first_attempts == sorted(attempt for per_run in fenced for attempt in per_run)
        assert all(per_run for per_run in fenced), fenced
        assert {view["id"]: view["attempt"] for view in views} == dict.fromkeys(job_ids, 2)
        assert server_errors(platform) == []
        # While the platform was still paused: a heartbeat without a timeout would only fail
        # once the platform, resumed, closes the connection.
        lost_contact = [
            any(
                e["msg"] == "heartbeat failed"
                and e.get("code") == "unreachable"
                and datetime.fromisoformat(e["ts"]) < resumed
                for e in run.events()
            )
            for run in runs
        ]
        assert lost_contact == [True, True]


@pytest.mark.alone
def test_a_run_partitioned_past_its_lease_self_fences_and_all_ends_once_healed(
    tmp_path: Path,
) -> None:
    """Run cut off from the platform for 8 s (its connections dropped for 4 s, then its
    requests held unanswered) while it holds two attempts: it stops them itself before their leases
    lapse; once healed it registers again, and every job ends exactly once, no attempt beside
    another."""
    marks = tmp_path / "marks"
    platform = Platform(tmp_path)
    run = RunAgent(tmp_path, capacity=2)
    proxy = BlockingProxy(tmp_path, platform.url, [])
    with processes(platform, proxy, run):
        platform.start()
        proxy.start()
        (server_id,) = start_runs(platform, [run], [proxy.url])
        job_ids = submit_long_jobs(platform, [server_id], marks)
        wait_for(lambda: all_running(platform, job_ids), "both attempts running", timeout_s=30)

        proxy.partition("drop")
        cut_at = time.monotonic()
        wait_for(
            lambda: {platform.job(job_id)["state"] for job_id in job_ids} == {"retrying"},
            "the platform to end both attempts as their leases lapse",
            timeout_s=PAUSE_S,
        )
        time.sleep(max(0.0, PAUSE_S / 2 - (time.monotonic() - cut_at)))
        proxy.partition("hang")
        time.sleep(max(0.0, PAUSE_S - (time.monotonic() - cut_at)))
        swallowed = proxy.stats()["partitioned"]
        proxy.partition("none")
        views = ended_exactly_once(platform, [server_id], [run], marks, timeout_s=60)

        assert swallowed.get("hang", 0) >= 1, swallowed
        assert swallowed.get("drop", 0) >= 1, swallowed
        assert sorted((job_id, 1) for job_id in job_ids) == sorted(fenced_attempts(run))
        assert {view["id"]: view["attempt"] for view in views} == dict.fromkeys(job_ids, 2)
        failures = {view["id"]: view["history"][0]["outcome"] for view in views}
        assert failures == dict.fromkeys(job_ids, "lease_expired")
        assert server_errors(platform) == []
