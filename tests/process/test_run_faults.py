"""Run under faults, end to end with real processes (docs/protocol.md, "Signing", "Claims and
leases", "Logs" and "Run's own choices").

`moonrun platform serve` over a FileStore in the test's directory and `moonrun run start`
run as subprocesses with short timings (a lease lapses 4 s after its last renewal, a session
6 s after its last request). The tests only use the user API, Run's command line, Run's log
and Run's journal file, and the process signals SIGSTOP, SIGCONT and SIGKILL:

- transfers that hang (a proxy between Run and the platform holds every artifact chunk, or
  every log batch, forever) stop neither the heartbeat nor any job's lifecycle;
- a platform that stops answering for longer than the lease makes Run stop the attempt itself
  (self-fencing), and the platform retries it once its lease has lapsed;
- Run killed (SIGKILL) and restarted many times loses no job and gets no stale result in.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from moonrun.run.journal import Journal
from tests.support.faults import (
    FAST_TIMINGS,
    BlockingProxy,
    Platform,
    RunAgent,
    check_history,
    first_attempt_sleeps,
    is_terminal,
    processes,
)
from tests.support.launcher import wait_for
from tests.support.seeds import seed_from

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

LEASE_TTL_S = FAST_TIMINGS.lease_ttl_s
SELF_FENCED = "attempt self-fenced: no lease renewal accepted in time"


def instant(text: str) -> float:
    """Unix seconds of an RFC 3339 `...Z` time (as the platform and Run's log write them)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def attempts_of(view: dict[str, Any]) -> list[tuple[int, str]]:
    return [(past["attempt"], past["outcome"]) for past in view["history"]]


def held_states(run: RunAgent) -> dict[str, str]:
    """Run's journal as it is on disk now: each held job's local state."""
    return {job_id: entry.state for job_id, entry in Journal.open(run.data_dir).entries.items()}


def online_with_generation(platform: Platform, endpoint_id: str) -> int | None:
    endpoint = platform.endpoint(endpoint_id)
    return endpoint["generation"] if endpoint["online"] else None


# -- transfers that hang -----------------------------------------------------------------------


def watch_until_done(
    platform: Platform,
    endpoint_id: str,
    job_ids: list[str],
    timeout_s: float,
) -> tuple[list[dict[str, Any]], list[tuple[bool, int]]]:
    """Poll until every job is terminal, sampling the endpoint's (online, generation) meanwhile."""
    samples: list[tuple[bool, int]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        endpoint = platform.endpoint(endpoint_id)
        samples.append((endpoint["online"], endpoint["generation"]))
        views = [platform.job(job_id) for job_id in job_ids]
        if all(is_terminal(view) for view in views):
            return views, samples
        pending = [(view["id"], view["state"]) for view in views if not is_terminal(view)]
        assert time.monotonic() < deadline, f"jobs still not terminal: {pending}"
        time.sleep(0.25)


def run_jobs_behind_a_hanging_proxy(
    tmp_path: Path,
    hang_prefix: str,
    submit_quick_jobs: Callable[[Platform, str, Path], list[str]],
    check_held_transfers: Callable[[Platform, list[str]], None],
) -> None:
    """A proxy holds every request under `hang_prefix`; all else flows. Jobs must still finish.

    Jobs: one `sleep` twice as long as the lease (it succeeds on attempt 1 only if every
    renewal got through) and the quick jobs `submit_quick_jobs` makes. Checks: each job
    succeeded on attempt 1 with a one-entry history; the endpoint was online at every sample
    with the generation it had at the start (no session expiry, no re-registration); the proxy
    held at least one transfer; Run never self-fenced; `check_held_transfers` for the rest.
    """
    platform = Platform(tmp_path)
    run = RunAgent(tmp_path, capacity=8)
    proxy = BlockingProxy(tmp_path, platform.url, [hang_prefix])
    with processes(platform, proxy, run):
        platform.start()
        proxy.start()
        endpoint_id, join_token, server_id = platform.host("host-1")
        run.join(platform.url, join_token)
        run.start(proxy.url)
        generation = wait_for(
            lambda: online_with_generation(platform, endpoint_id),
            "Run to come online",
            timeout_s=30,
        )

        started = time.monotonic()
        long_sleep = platform.submit(server_id, "sleep", {"seconds": 2 * LEASE_TTL_S})
        work = tmp_path / "work"
        work.mkdir()
        job_ids = [long_sleep, *submit_quick_jobs(platform, server_id, work)]
        wait_for(
            lambda: proxy.stats()["held"].get(hang_prefix, 0) >= 1,
            f"the proxy to hold a request to {hang_prefix}",
            timeout_s=30,
        )
        at_hang = platform.job(long_sleep)
        views, samples = watch_until_done(platform, endpoint_id, job_ids, timeout_s=60)
        took_s = time.monotonic() - started
        stats = proxy.stats()
        events = run.events()

        outcomes = {
            view["id"]: (view["state"], view["attempt"], attempts_of(view)) for view in views
        }
        first_try = {job_id: ("succeeded", 1, [(1, "succeeded")]) for job_id in job_ids}
        assert first_try == outcomes
        # the long sleep's lease was renewed about every second, also while transfers were held
        assert at_hang["state"] in ("accepted", "running"), at_hang
        renewals_before = (at_hang["progress"] or {}).get("seq", 0)
        renewals = next(view for view in views if view["id"] == long_sleep)["progress"]["seq"]
        assert renewals - renewals_before >= LEASE_TTL_S, (renewals_before, renewals)
        always_online = [(True, generation)] * len(samples)
        assert always_online == samples
        assert samples, "the endpoint was never sampled"
        fenced = [event for event in events if event["msg"] == SELF_FENCED]
        assert fenced == []
        registrations = [event for event in events if event["msg"] == "registered and reconciled"]
        assert len(registrations) == 1, registrations
        assert stats["held"][hang_prefix] >= 1, stats
        for route in ("/run/v1/heartbeat", "/run/v1/jobs/acks", "/run/v1/jobs/results"):
            assert stats["forwarded"].get(route, 0) >= 1, (route, stats)
        # every job, the long sleep included, was done well before Run's transfers gave up
        assert took_s < 45, took_s
        check_held_transfers(platform, job_ids)


def artifact_jobs(platform: Platform, server_id: str, work: Path) -> list[str]:
    """Five `command` jobs that each write a file and name it as an artifact."""
    job_ids = []
    for index in range(5):
        path = work / f"out-{index}.txt"
        payload = {
            "argv": ["sh", "-c", f"echo artifact {index} > {path}"],
            "timeout_s": 30,
            "artifacts": [{"path": str(path), "name": f"out-{index}.txt"}],
        }
        job_ids.append(platform.submit(server_id, "command", payload))
    return job_ids


def log_jobs(platform: Platform, server_id: str, work: Path) -> list[str]:
    """Five `command` jobs printing 50 lines each, and three short `sleep` jobs (one log line)."""
    job_ids = []
    for index in range(5):
        script = f"for i in $(seq 1 50); do echo job {index} line $i; done; echo done >&2"
        payload = {"argv": ["sh", "-c", script], "timeout_s": 30}
        job_ids.append(platform.submit(server_id, "command", payload))
    for _ in range(3):
        job_ids.append(platform.submit(server_id, "sleep", {"seconds": 0.5}))
    return job_ids


def no_artifact_stored(platform: Platform, job_ids: list[str]) -> None:
    # The log store keeps each attempt's file (its final batch says the logs are complete
    # even for a command that printed nothing): everything else would be an artifact.
    data = platform.workdir / "platform-data"
    stored = sorted(
        str(path.relative_to(platform.workdir))
        for path in data.rglob("*")
        if path.is_file() and not path.is_relative_to(data / "logs")
    )
    assert stored == []


def no_log_line_stored(platform: Platform, job_ids: list[str]) -> None:
    stored = {job_id: platform.log_lines(job_id) for job_id in job_ids}
    assert {job_id: [] for job_id in job_ids} == stored


@pytest.mark.alone
def test_artifact_transfer_blocks(tmp_path: Path) -> None:
    """With every artifact chunk held forever, heartbeats and job lifecycles still complete."""
    run_jobs_behind_a_hanging_proxy(
        tmp_path, "/run/v1/artifacts/", artifact_jobs, no_artifact_stored
    )


@pytest.mark.alone
def test_log_ingest_blocks(tmp_path: Path) -> None:
    """With every log batch held forever, heartbeats and job lifecycles still complete."""
    run_jobs_behind_a_hanging_proxy(tmp_path, "/run/v1/logs", log_jobs, no_log_line_stored)


# -- a platform that stops answering -----------------------------------------------------------


PAUSE_S = 8.0
"""Longer than the lease (4 s) and than the session (6 s)."""


@pytest.mark.alone
def test_self_fencing_when_the_platform_is_paused(tmp_path: Path) -> None:
    """Run stops an attempt whose lease it cannot renew; the platform retries it after expiry."""
    platform = Platform(tmp_path)
    run = RunAgent(tmp_path, capacity=2)
    with processes(platform, run):
        platform.start()
        _, join_token, server_id = platform.host("host-1")
        run.join(platform.url, join_token)
        run.start(platform.url)
        # Attempt 1 outlasts the pause; attempt 2 ends at once.
        job_id = platform.submit(
            server_id, "command", {"argv": ["sh", "-c", first_attempt_sleeps(15)]}
        )
        platform.wait_job(
            job_id,
            lambda view: view["state"] == "running" and (view["progress"] or {}).get("seq", 0) >= 1,
            30,
            "attempt 1 running with a renewal",
        )

        platform.signal(signal.SIGSTOP)
        paused_at = time.time()
        journal_states: list[tuple[float, str]] = []  # (seconds into the pause, state) changes
        try:
            while (into_s := time.time() - paused_at) < PAUSE_S:
                state = held_states(run).get(job_id, "absent")
                if not journal_states or journal_states[-1][1] != state:
                    journal_states.append((round(into_s, 2), state))
                time.sleep(0.05)
        finally:
            resumed_at = time.time()
            platform.signal(signal.SIGCONT)

        retried = platform.wait_job(job_id, lambda view: view["attempt"] >= 2, 30, "attempt 2")
        done = platform.wait_job(job_id, is_terminal, 40, "the end of attempt 2")
        events = run.events()

        failure = retried["retry"]["last_failure"]
        assert (failure["reason"], failure["attempt"]) == ("lease_expired", 1)
        ended = ("succeeded", 2, {"outcome": "succeeded", "attempt": 2})
        terminal = done["terminal"]
        actual = (done["state"], done["attempt"], {k: terminal[k] for k in ("outcome", "attempt")})
        assert ended == actual
        # attempt 1 ended by lease expiry: no result of attempt 1 was ever recorded
        assert attempts_of(done) == [(1, "lease_expired"), (2, "succeeded")]
        results = [event["msg"] for event in events if event["msg"].startswith("result ")]
        assert results == ["result accepted"]  # attempt 2's; Run never finished attempt 1

        # Run stopped attempt 1 itself, while the platform could not answer, before the lease it
        # had last renewed could lapse (renewed at the latest just before the pause).
        fenced = [
            event
            for event in events
            if event["msg"] == SELF_FENCED and event.get("job_id") == job_id
        ]
        ended_by_platform = [
            (event["code"], instant(event["ts"]) - paused_at)
            for event in events
            if event["msg"] == "attempt ended by the platform" and event.get("job_id") == job_id
        ]
        assert [event["attempt"] for event in fenced] == [1], (
            f"no self-fencing; Run's attempt was ended by the platform instead: "
            f"{ended_by_platform} (code, seconds after the pause began; it lasted {PAUSE_S} s)"
        )
        fenced_after_s = instant(fenced[0]["ts"]) - paused_at
        assert fenced_after_s < LEASE_TTL_S, (
            f"Run self-fenced {fenced_after_s:.2f} s after the platform paused: the lease "
            f"({LEASE_TTL_S} s) may have lapsed first (resumed after {resumed_at - paused_at:.1f} "
            f"s); Run's journal during the pause (s, state): {journal_states}"
        )
        assert "self_fenced" in [state for _, state in journal_states], journal_states


# -- Run killed and restarted ------------------------------------------------------------------


JOBS = int(os.environ.get("MOONRUN_E2E_JOBS", "200"))
CYCLES = int(os.environ.get("MOONRUN_E2E_CYCLES", "20"))


def mixed_payloads(rng: random.Random, count: int) -> list[tuple[str, dict[str, Any] | None]]:
    """About one in four `noop`, the rest `sleep` of 0.2 to 1.5 s."""
    return [
        ("noop", None) if rng.random() < 0.25 else ("sleep", {"seconds": rng.uniform(0.2, 1.5)})
        for _ in range(count)
    ]


@pytest.mark.slow
def test_twenty_run_restarts_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Jobs across 20 SIGKILLs of Run all succeed exactly once, with no stale result accepted."""
    seed = seed_from("MOONRUN_E2E_SEED")
    rng = random.Random(seed)
    platform = Platform(tmp_path)
    run = RunAgent(tmp_path, capacity=8)
    started = time.monotonic()
    with processes(platform, run):
        platform.start()
        _, join_token, server_id = platform.host("host-1")
        run.join(platform.url, join_token)
        for kind, payload in mixed_payloads(rng, JOBS):
            platform.submit(server_id, kind, payload, max_attempts=50)

        run.start(platform.url)
        held_at_kill = []
        for cycle in range(CYCLES):
            # from 0.2 s (Run still starting) to 1.5 s (Run holding and finishing attempts)
            time.sleep(rng.uniform(0.2, 1.5))
            assert run.running, f"Run exited by itself before kill {cycle + 1}"
            run.signal(signal.SIGKILL)
            run.kill()
            held_at_kill.append(len(held_states(run)))
            time.sleep(rng.uniform(0.0, 0.5))
            run.start(platform.url)
        killed_s = time.monotonic() - started

        def all_terminal() -> list[dict[str, Any]] | None:
            assert run.running, "Run exited by itself"
            views = platform.jobs(server_id)
            return views if all(is_terminal(view) for view in views) else None

        views = wait_for(all_terminal, f"all {JOBS} jobs to end", timeout_s=150, every_s=0.5)
        total_s = time.monotonic() - started
        events = run.events()

        assert len(views) == JOBS
        problems = {view["id"]: found for view in views if (found := check_history(view))}
        assert problems == {}, f"seed {seed}"
        accepted = Counter(e["job_id"] for e in events if e["msg"] == "result accepted")
        assert [job_id for job_id, count in accepted.items() if count > 1] == []
        retried = sum(1 for view in views if view["attempt"] > 1)
        refused = sum(1 for event in events if event["msg"] == "result refused")
        print(
            f"\n{JOBS} jobs, {CYCLES} SIGKILLs of Run (seed {seed}): all succeeded once; "
            f"{retried} needed more than one attempt; {refused} results refused by the "
            f"platform; attempts held at each kill: {held_at_kill}; kills done after "
            f"{killed_s:.1f} s, all ended after {total_s:.1f} s"
        )
