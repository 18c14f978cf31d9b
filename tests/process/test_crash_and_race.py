"""Durable stores under SIGKILL and under two concurrent platform processes.

Crash: a child applies transitions and prints each one after the store acknowledged it; we
kill it with SIGKILL at random moments, reopen the store, and find every acknowledged
transition present and every record whole (the kill timings' seed is printed; replay it with
`MOONRUN_CRASH_SEED`). Race: two processes claim from one store at once; both are granted
jobs, no (job, attempt) is granted twice and no job is lost.

Counts are parameters (`MOONRUN_CRASH_KILLS`, `MOONRUN_RACE_JOBS`) so a soak can run
thousands; `make test` runs the issue's minimums.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from moonrun.clock import ManualClock, SystemClock
from moonrun.scheduling.jobs import Job, JobState
from moonrun.store.protocol import Store
from tests.support.harness import World
from tests.support.seeds import seed_from
from tests.support.stores import StoreFactory, file_factory

# Real child and platform processes, SIGKILLed and racing: the real-process lane of `make test`
# (docs/testing.md).
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
KILLS = {"file": 20, "mysql": 10, "postgres": 10}
"""Kills in `make test`; `make soak` runs hundreds (KILLS)."""
RACE_JOBS = int(os.environ.get("MOONRUN_RACE_JOBS", "2000"))


def kills_for(store: str) -> int:
    return int(os.environ.get("MOONRUN_CRASH_KILLS", KILLS[store]))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.child", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        _, err = child.communicate(timeout=30)
        raise AssertionError(f"child did not start: {line!r} {err[-2000:]}")


def every_job(store: Store) -> list[Job]:
    return store.list_jobs(server_ids=None, state=None, limit=10**9)


def check_whole(job: Job) -> None:
    """A record read back after a crash is internally consistent."""
    assert job.state.is_terminal == (job.terminal is not None), job
    assert 0 <= job.attempt <= job.max_attempts, job
    if job.state.is_active:
        assert job.lease_hash is not None, job
        assert job.deadline_at is not None, job
    if job.state is JobState.QUEUED:
        assert job.attempt == 0, job


def test_sigkill_loses_no_acknowledged_transition(durable_factory: StoreFactory) -> None:
    """Every transition a killed child saw acknowledged is in the store, whole, after reopen."""
    acknowledged, _ = kill_and_check(durable_factory, threads=1)
    assert acknowledged, "the children never acknowledged anything"


def test_sigkill_during_group_commits_loses_no_acknowledged_write(tmp_path: Path) -> None:
    """Eight threads writing at once share FileStore transactions; however often the process
    is killed in the middle of them, every write it acknowledged is stored, whole."""
    factory = file_factory(lambda: tmp_path)
    acknowledged, (groups, units) = kill_and_check(factory, threads=8)
    assert acknowledged, "the children never acknowledged anything"
    assert units > groups, "no transaction held more than one unit: nothing was grouped"


def kill_and_check(
    factory: StoreFactory, threads: int, mode: str = "crash"
) -> tuple[dict[str, Any], tuple[int, int]]:
    """Start a child writing from `threads` threads (tasks, in mode `crash-loop`), SIGKILL it
    at a random moment, reopen the store and check it; as many times as the store's kill
    count. Returns what was acknowledged, and the last (transactions, units) a FileStore child
    reported (groups and calls of the loop's flusher, in mode `crash-loop`)."""
    world = World(factory)
    admin_token = "mra_bootstrap-admin-token"
    url = factory.url()
    world.store.close()
    acknowledged: dict[str, tuple[int, str]] = {}
    grouping = (0, 0)
    rng = random.Random(seed_from("MOONRUN_CRASH_SEED"))

    for _ in range(kills_for(factory.name)):
        child = spawn(mode, url, world.endpoint.id, world.server.id, admin_token, str(threads))
        wait_ready(child)
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGKILL, err[-2000:]
        for line in out.splitlines(keepends=True):
            if not line.endswith("\n") or not line.strip():
                continue  # torn by the kill (or a bare newline left of one): never acknowledged
            kind, *fields = line.split()
            if kind == "groups":
                grouping = max(grouping, (int(fields[0]), int(fields[1])))
                continue
            job_id, version, state = fields
            acknowledged[job_id] = max(acknowledged.get(job_id, (0, "-")), (int(version), state))

        store = factory.reopen(world.store)
        world.store = store
        for job in every_job(store):
            check_whole(job)
        for job_id, (version, state) in acknowledged.items():
            stored = store.get_job(job_id)
            assert stored is not None, f"acknowledged job {job_id} is missing"
            assert stored.version >= version, (stored, version)
            if stored.version == version and state != "-":
                assert state == stored.state.value, (stored, state)
    world.store.close()
    return acknowledged, grouping


def test_two_platform_processes_never_grant_an_attempt_twice(
    durable_factory: StoreFactory,
) -> None:
    """Two processes claiming from one store at once, where three owners' jobs take turns:
    both are granted jobs, no (job, attempt) is granted twice, no job is lost."""
    # The children run on the system clock, so the world starts at the real time too.
    world = World(durable_factory, clock=ManualClock(SystemClock().now()))
    servers = [world.server] + [
        world.directory.create_server(
            world.admin, f"race-{user.name}", endpoint_id=world.endpoint.id, owner_id=user.id
        )
        for user in (world.helper, world.stranger)
    ]
    job_ids = {world.submit(servers[n % 3], world.admin).id for n in range(RACE_JOBS)}
    run = world.run().start(capacity=1024)
    url = durable_factory.url()
    world.store.close()

    children = [spawn("race", url, run.session_id) for _ in range(2)]
    for child in children:
        wait_ready(child)
    outputs = []
    for child in children:  # both are ready: let them claim at once
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-2000:]
        outputs.append(out)

    granted_by = [
        sum(1 for line in out.splitlines() if line.startswith("grant ")) for out in outputs
    ]
    print(f"grants per process: {granted_by}")
    grants = Counter(
        (job_id, int(attempt))
        for out in outputs
        for line in out.splitlines()
        if line.startswith("grant ")
        for _, job_id, attempt in [line.split()]
    )
    store = durable_factory.reopen(world.store)
    try:
        assert [grant for grant, count in grants.items() if count > 1] == []
        assert all(count > 0 for count in granted_by), f"grants per process: {granted_by}"
        assert sum(grants.values()) >= RACE_JOBS
        assert job_ids == {job_id for job_id, _ in grants}
        states = Counter(store.get_job(job_id).state for job_id in job_ids)  # type: ignore[union-attr]
        assert dict(states) == {JobState.SUCCEEDED: RACE_JOBS}
    finally:
        store.close()
