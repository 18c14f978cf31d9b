"""`moonrun platform serve` SIGKILLed at random moments while 50 schedules of `@every 1s` fire:
after every kill, no (schedule, time) has two jobs, every job is the one its (schedule, time)
names, and every schedule's last firing has its job (the job and the cursor move in one write).
On MySQL and PostgreSQL two platforms serve the one database and one of them is killed at a
time, the other firing on.

`tests/process/test_schedules_crash.py` kills a bare firing loop on a fast clock; this kills
the real server (its firing loop, sweeper and HTTP layer), on the wall clock, across the
restart's catch-up firing. Kills: `MOONRUN_CRASH_KILLS` (`make soak` runs hundreds), timings
replayable with `MOONRUN_CRASH_SEED`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from moonrun.scheduling.schedules import firing_job_id
from moonrun.store import open_store
from tests.support.launcher import PlatformProcess, command_env, wait_healthy
from tests.support.seeds import seed_from
from tests.support.stores import StoreFactory

# Real platform processes, SIGKILLed: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

SCHEDULES = 50
KILLS = {"file": 4, "mysql": 2, "postgres": 2}
"""Kills in `make test` (a platform starts in 1 to 5 s: about 40 s in all); `make soak` sets
MOONRUN_CRASH_KILLS."""
OVERLAPS = ("allow", "skip", "cancel_previous")


def kills_for(store: str) -> int:
    return int(os.environ.get("MOONRUN_CRASH_KILLS", KILLS[store]))


def check_once_per_time(store_url: str) -> int:
    """Read the store as it is now: each (schedule, time) has at most one job, the one its id
    names, and each schedule's last firing has its job. Answers how many jobs fired."""
    store = open_store(store_url)
    try:
        jobs = store.list_jobs(server_ids=None, state=None, limit=10**6)
        per_time = Counter((job.schedule_id, job.scheduled_for) for job in jobs)
        assert [key for key, count in per_time.items() if count > 1] == []
        for job in jobs:
            assert job.schedule_id is not None, job
            assert job.scheduled_for is not None, job
            assert job.id == firing_job_id(job.schedule_id, job.scheduled_for), job
        for schedule in store.list_schedules():
            if schedule.last_job_id is not None:
                assert store.get_job(schedule.last_job_id) is not None, schedule
        return len(jobs)
    finally:
        store.close()


def fired_more_than(store_url: str, jobs: int, *, patience_s: float = 120.0) -> int:
    """Check the store until more than `jobs` have fired (each look checked as after a kill);
    answers the last count, which the caller asserts on."""
    deadline = time.monotonic() + patience_s
    count = check_once_per_time(store_url)
    while count <= jobs and time.monotonic() < deadline:
        time.sleep(0.5)
        count = check_once_per_time(store_url)
    return count


def test_sigkill_of_a_serving_platform_never_makes_two_jobs_for_one_scheduled_time(
    durable_factory: StoreFactory, tmp_path: Path
) -> None:
    durable_factory.open().close()  # an empty store (the SQL databases wiped)
    store_url = durable_factory.url()
    instances = 1 if durable_factory.name == "file" else 2
    platforms = [
        PlatformProcess(
            tmp_path / f"platform-{n}" if n else tmp_path,
            store_url,
            secret_file=tmp_path / "platform.secret",
            name=f"platform {n}",
        )
        for n in range(instances)
    ]
    for platform in platforms[1:]:
        platform.workdir.mkdir()
    rng = random.Random(seed_from("MOONRUN_CRASH_SEED"))
    fired: list[int] = []
    try:
        for platform in platforms:  # started together: a start takes seconds
            platform.spawn(platform.command(), env=command_env(platform.admin_token))
        for platform in platforms:
            wait_healthy(platform, platform.url)
        first = platforms[0]
        admin_id = first.client.get("/api/v1/users").json()["users"][0]["id"]
        endpoint = first.client.post("/api/v1/endpoints", json={"name": "host-1"}).json()
        server = first.client.post(
            "/api/v1/servers",
            json={"name": "web-1", "endpoint_id": endpoint["endpoint"]["id"], "owner_id": admin_id},
        ).json()
        for n in range(SCHEDULES):
            made = first.client.post(
                f"/api/v1/servers/{server['id']}/schedules",
                json={
                    "name": f"s{n}",
                    "cron": "@every 1s",
                    "job": {"kind": "noop"},
                    "overlap": OVERLAPS[n % 3],
                },
            )
            assert made.status_code == 201, made.text

        for _ in range(kills_for(durable_factory.name)):
            time.sleep(rng.uniform(0.3, 1.5))  # a few times fire (and the restart's catch-up)
            victim = rng.choice(platforms)
            victim.kill()
            fired.append(check_once_per_time(store_url))
            victim.start()
        # Times fire after the restarts, not only the first firing of each schedule: wait for
        # them rather than for a fixed time (a loaded CI machine fires late, never twice).
        fired.append(fired_more_than(store_url, 2 * SCHEDULES))
    except Exception as error:
        for platform in platforms:
            error.add_note(f"--- {platform.name} output (last 40 lines) ---")
            error.add_note(platform.tail(40))
        raise
    finally:
        for platform in platforms:
            platform.close()

    fired.append(check_once_per_time(store_url))
    assert fired[-1] > 2 * SCHEDULES, fired
    if durable_factory.name == "file":
        with sqlite3.connect(store_url.removeprefix("file:")) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
