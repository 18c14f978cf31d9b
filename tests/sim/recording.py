"""The store as the simulation sees it: a real store, opened and reopened as a platform process
would, behind a thin wrapper that records every job write the store says it committed."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from moonrun.clock import Clock
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.protocol import IdempotencyRecord, ScheduleWrite, Store
from tests.sim.history import History

StoreWrapper = Callable[[Store], Store]
"""Wraps a freshly opened store (the planted bugs of `tests.sim.bugs` are such wrappers)."""


class RecordingStore:
    """Delegates everything to the store; tells the history about each committed job write
    and each job it deleted.

    It also answers `active_jobs` and `active_deadlines` in job id order: the protocol promises
    no order, and MemoryStore's (a set's) depends on the interpreter's hash seed, which would
    make a seed replay differently in another process.
    """

    def __init__(self, inner: Store, history: History, clock: Clock) -> None:
        self._inner = inner
        self._history = history
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update_jobs(
        self, job_ids: Sequence[str], change: Callable[[Job], Job]
    ) -> dict[str, tuple[Job, Job]]:
        done = self._inner.update_jobs(job_ids, change)
        now = self._clock.now()
        for job_id in job_ids:
            if job_id in done:
                before, after = done[job_id]
                if after is not before:
                    self._history.wrote(now, before, after)
        return done

    def claim_jobs(
        self,
        endpoint_id: str,
        now: int,
        limit: int,
        grant: Callable[[Job], Job],
        after_owner: str | None = None,
    ) -> list[Job]:
        before: dict[str, Job] = {}

        def granting(job: Job) -> Job:
            before[job.id] = job
            return grant(job)

        claimed = self._inner.claim_jobs(endpoint_id, now, limit, granting, after_owner)
        for job in claimed:
            self._history.wrote(self._clock.now(), before.get(job.id), job)
        return claimed

    def insert_jobs(
        self,
        jobs: Sequence[Job],
        idempotency: IdempotencyRecord | None = None,
        group: Group | None = None,
    ) -> None:
        self._inner.insert_jobs(jobs, idempotency, group)
        for job in jobs:
            self._history.wrote(self._clock.now(), None, job)

    def release_held(
        self,
        group_id: str,
        how_many: Callable[[int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        done = self._inner.release_held(group_id, how_many, release)
        for before, after in done.values():
            if after is not before:
                self._history.wrote(self._clock.now(), before, after)
        return done

    def release_key(
        self,
        owner_id: str,
        key: str,
        limit: int,
        declare: bool,
        how_many: Callable[[int, int, int], int],
        release: Callable[[Job], Job],
    ) -> dict[str, tuple[Job, Job]]:
        done = self._inner.release_key(owner_id, key, limit, declare, how_many, release)
        for before, after in done.values():
            if after is not before:
                self._history.wrote(self._clock.now(), before, after)
        return done

    def insert_job(self, job: Job) -> None:
        self.insert_jobs([job])

    def replace_job(self, job: Job, expected: Job) -> bool:
        stored = self._inner.replace_job(job, expected)
        if stored:
            self._history.wrote(self._clock.now(), expected, job)
        return stored

    def fire_schedules(self, writes: Sequence[ScheduleWrite]) -> list[bool]:
        stored = self._inner.fire_schedules(writes)
        made = [
            job
            for w, won in zip(writes, stored, strict=True)
            if won
            for job in ((w.job,) if w.job is not None else w.group_jobs)
        ]
        # Only the jobs the store holds now: a firing answered but not made must not be
        # recorded as made (the checker's `schedule_not_fired` would never see it).
        found = self._inner.get_jobs([job.id for job in made]) if made else {}
        for job in made:
            if job.id in found and job.id not in self._history.latest:
                self._history.wrote(self._clock.now(), None, found[job.id])
        return stored

    def delete_jobs(self, job_ids: Sequence[str], deletable: Callable[[Job], bool]) -> list[Job]:
        deleted = self._inner.delete_jobs(job_ids, deletable)
        for job in deleted:
            self._history.deleted(self._clock.now(), job)
        return deleted

    def active_jobs(self, endpoint_id: str) -> list[Job]:
        return sorted(self._inner.active_jobs(endpoint_id), key=lambda job: job.id)

    def active_deadlines(self, endpoint_id: str) -> list[tuple[str, int | None]]:
        return sorted(self._inner.active_deadlines(endpoint_id))


def shared_memory_dir() -> str | None:
    """Where FileStore files go: /dev/shm when there is one (see `StoreKind`)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class StoreKind:
    """Opens the store of one seed, reopens it as a restarted platform process would, and opens
    it once more for a second platform process.

    `memory`: one MemoryStore object for every instance (it dies with its process, so a
    "restart" keeps the object, as tests/support/stores.py does). `file`: one SQLite file, each
    platform process with its own FileStore over it; a restart closes the store and opens the
    file again. The file lives in /dev/shm where there is one: the simulation exercises the
    SQL store's logic, its group commit and a reopen, not the disk (SIGKILL against a real
    disk is tests/process/test_crash_and_race.py's), and tmpfs makes its fsyncs free.
    """

    def __init__(self, name: str) -> None:
        if name not in ("memory", "file"):
            raise ValueError(f"unknown store {name!r} (memory or file)")
        self.name = name
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._memory: MemoryStore | None = None

    def open(self) -> Store:
        """A store for one more platform process (the first call creates it)."""
        if self.name == "memory":
            if self._memory is None:
                self._memory = MemoryStore()
            return self._memory
        if self._directory is None:
            self._directory = tempfile.TemporaryDirectory(
                prefix="moonrun-sim-", dir=shared_memory_dir()
            )
        return FileStore(Path(self._directory.name) / "platform.db")

    def reopen(self, store: Store) -> Store:
        """The store as a restarted platform process opens it."""
        if self.name == "memory":
            return store
        store.close()
        return self.open()

    def close(self, stores: Sequence[Store]) -> None:
        if self.name == "file":
            for store in stores:
                store.close()
        if self._directory is not None:
            self._directory.cleanup()
            self._directory = None
