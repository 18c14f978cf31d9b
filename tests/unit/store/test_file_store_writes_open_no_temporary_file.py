"""A FileStore write keeps its statement journal in memory, not in a temporary file.

Every write of the store is a unit in its own savepoint, and the jobs table has triggers (the
counts), so SQLite keeps a statement journal for each unit. With the default `temp_store`
that journal is a temporary file (`/var/tmp/etilqs_*`), opened, unlinked and written on the
event loop for each job created or changed: 8-11% of the platform's CPU a job in the peer
bench (docs/benchmarks.md). The journal only undoes a unit inside its transaction; a crash is
recovered from the WAL, so memory loses nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moonrun.scheduling.jobs import Event, JobState, transition
from moonrun.store.file import FileStore
from moonrun.store.sql import Cursor
from tests.support.jobkit import T0, queued_job


def temporary_files() -> list[str]:
    """SQLite's temporary files this process holds open (unlinked at once, so only /proc
    still names them)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if "etilqs_" in target:
            found.append(target)
    return found


def test_creating_and_changing_a_job_opens_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path / "p.db")
    seen: list[str] = []
    write = store._write

    def watched(work: Callable[[Cursor], Any]) -> Any:
        def looked_at(cursor: Cursor) -> Any:
            result = work(cursor)
            seen.extend(temporary_files())  # still in the unit's savepoint: its journal open
            return result

        return write(looked_at)

    monkeypatch.setattr(store, "_write", watched)
    job = queued_job()
    try:
        store.insert_jobs([job])
        cancelled = transition(job, Event.USER_CANCEL, JobState.CANCELLED, T0 + 1)
        assert store.replace_job(cancelled, job)
    finally:
        store.close()
    assert seen == []
