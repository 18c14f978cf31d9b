"""SIGKILL while two platforms fire 50 schedules: after every restart, no (schedule, time) has
two jobs, and every schedule's last firing has its job (the job and the cursor move together)."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from moonrun.clock import ManualClock
from moonrun.scheduling.schedules import firing_job_id
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.directory import Directory
from moonrun.service.schedules import ScheduleSpec
from moonrun.service.scheduling import SchedulingService
from moonrun.service.specs import JobSpec
from moonrun.store.file import FileStore
from tests.process.test_crash_and_race import spawn, wait_ready
from tests.support.seeds import seed_from

# Real child processes, SIGKILLed: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

SCHEDULES = 50
SPEED = 240.0
"""The children's clock runs 240 times faster: a minutely schedule is due every 0.25 s."""
START = 1_795_000_000_000


def test_sigkill_while_schedules_fire_never_makes_two_jobs_for_one_time(tmp_path: Path) -> None:
    path = tmp_path / "platform.db"
    store = FileStore(path)
    clock = ManualClock(START)
    service = SchedulingService(store, clock, SeededTokenSource(5))
    directory = Directory(store, clock, SeededTokenSource(6))
    admin = directory.ensure_bootstrap_admin("mra_crash-admin-token")
    endpoint = service.create_endpoint(admin, "host-1").endpoint
    server = directory.create_server(admin, "web-1", endpoint_id=endpoint.id, owner_id=admin.id)
    for n in range(SCHEDULES):
        overlap = ("allow", "skip", "cancel_previous")[n % 3]
        spec = ScheduleSpec(f"s{n}", "* * * * *", JobSpec("noop"), overlap=overlap)
        service.schedules.create(admin, server.id, spec)
    store.close()
    origin = time.time()
    rng = random.Random(seed_from("MOONRUN_CRASH_SEED"))
    kills = int(os.environ.get("MOONRUN_CRASH_KILLS", "12"))

    for _ in range(kills):
        platforms = [
            spawn("fire-schedules", f"file:{path}", str(origin), str(START), str(SPEED))
            for _ in range(2)
        ]
        for platform in platforms:
            wait_ready(platform)
        time.sleep(rng.uniform(0.05, 0.6))
        for platform in platforms:
            platform.send_signal(signal.SIGKILL)
        for platform in platforms:
            _, err = platform.communicate(timeout=30)
            assert platform.returncode == -signal.SIGKILL, err[-2000:]

        store = FileStore(path)
        try:
            jobs = store.list_jobs(server_ids=None, state=None, limit=10**6)
            per_time = Counter((job.schedule_id, job.scheduled_for) for job in jobs)
            assert [key for key, count in per_time.items() if count > 1] == []
            for job in jobs:
                assert job.schedule_id is not None
                assert job.scheduled_for is not None
                assert job.id == firing_job_id(job.schedule_id, job.scheduled_for)
            for schedule in store.list_schedules():
                if schedule.last_job_id is not None:
                    assert store.get_job(schedule.last_job_id) is not None, schedule
        finally:
            store.close()

    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert jobs, "no schedule ever fired"
