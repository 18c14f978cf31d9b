"""A FileStore gives pruned space back to the file system: a new file keeps incremental vacuum,
so after pruning 90% of its jobs and giving the free pages back it is at most a fifth of its
size; a file made before that keeps its size until `moonrun store compact` (VACUUM), which also
turns incremental vacuum on. (The issue's million jobs are the soak's, not a unit test's.)"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from moonrun.cli import app
from moonrun.clock import ManualClock
from moonrun.scheduling.jobs import Job, JobState, Outcome, Terminal, create_job
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.scheduling import SchedulingService
from moonrun.service.sweeper import RELEASE_PAGES
from moonrun.store.file import INCREMENTAL, FileStore
from tests.unit.store.test_store_contract import POLICY, T0

JOBS = 20_000
BLOB = 2_000
"""Bytes of payload per job: the file holds about 45 MB."""
DAY_MS = 24 * 3600 * 1000


def finished_jobs(count: int) -> list[Job]:
    """`count` jobs that succeeded 1 ms apart from T0, each with a payload of BLOB bytes."""
    jobs = []
    for n in range(count):
        job = create_job(
            job_id=f"job-{n:06d}",
            server_id="srv-1",
            endpoint_id="ep-1",
            owner_id="usr-1",
            kind="report.build",
            payload={"blob": f"{n:06d}" + "x" * BLOB},
            policy=POLICY,
            now=T0,
        )
        ended = T0 + n
        jobs.append(
            replace(
                job,
                state=JobState.SUCCEEDED,
                updated_at=ended,
                terminal=Terminal(Outcome.SUCCEEDED, 1, ended),
            )
        )
    return jobs


def filled(path: Path, count: int) -> int:
    """Fill the store at `path` with `count` finished jobs; the file's size once closed."""
    store = FileStore(path)
    try:
        jobs = finished_jobs(count)
        for start in range(0, count, 1000):
            store.insert_jobs(jobs[start : start + 1000])
    finally:
        store.close()
    return path.stat().st_size


def auto_vacuum(path: Path) -> int:
    with closing(sqlite3.connect(path)) as connection:
        return int(connection.execute("PRAGMA auto_vacuum").fetchone()[0])


def prune_nine_tenths(path: Path, count: int) -> tuple[int, int]:
    """Prune the 90% of the jobs that ended first, as the sweeper does, and give the space
    back; (jobs left, pages given back)."""
    store = FileStore(path)
    try:
        settings = SchedulingSettings(retain_finished_s=DAY_MS / 1000)
        clock = ManualClock(T0 + count * 9 // 10 - 1 + DAY_MS)
        service = SchedulingService(store, clock, SeededTokenSource(1), settings)
        while service.prune(lambda job: None):
            pass
        released = 0
        while (pages := service.release_space(RELEASE_PAGES)) > 0:
            released += pages
        left = sum(store.job_counts().values())
    finally:
        store.close()  # the last connection checkpoints: the file is cut to its pages
    return left, released


def test_pruning_nine_tenths_of_a_new_file_store_leaves_at_most_a_fifth_of_its_size(
    tmp_path: Path,
) -> None:
    path = tmp_path / "platform.db"
    before = filled(path, JOBS)

    left, released = prune_nine_tenths(path, JOBS)
    after = path.stat().st_size

    assert (auto_vacuum(path), left) == (INCREMENTAL, JOBS // 10)
    assert released > 0
    assert after <= before // 5, f"{after} bytes of {before}"


def test_store_compact_gives_an_older_file_its_space_back_and_turns_incremental_vacuum_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "platform.db"
    with closing(sqlite3.connect(path)) as connection:  # as a moonrun before retention made it
        connection.execute("PRAGMA journal_mode = WAL")
    count = JOBS // 10
    before = filled(path, count)

    left, released = prune_nine_tenths(path, count)
    kept = path.stat().st_size
    compacted = CliRunner().invoke(app, ["store", "compact", "--store", f"file:{path}"])

    assert (left, released, kept) == (count // 10, 0, before)
    assert compacted.exit_code == 0, compacted.output
    assert compacted.output.startswith(f"compacted file:{path}: ")
    assert auto_vacuum(path) == INCREMENTAL
    assert path.stat().st_size <= before // 5
