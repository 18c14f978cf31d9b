"""Concurrency keys' use cases: release what a key's limit allows, when it may have changed.

What a key decides is pure (`scheduling/concurrency.py`). A job with a key is made held by
its key, and the service asks the store to release the key's held jobs (`Store.release_key`,
one write serialised per owner and key) right after every write that may free or need a
place: a create of jobs with the key (which also sets the key's limit to theirs), a write
that ended jobs with it, a group's release of jobs with it. A release lost to a crash is made
by the sweeper (`repair`), which walks the keys with held jobs; releasing is idempotent.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from moonrun.clock import Clock
from moonrun.errors import MoonrunError
from moonrun.scheduling import concurrency as domain
from moonrun.scheduling.jobs import Job
from moonrun.store.protocol import Store

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger("moonrun.keys")

REPAIR_BATCH = 20
"""Keys with held jobs the sweeper looks at in one pass (it walks them all in turn)."""


class ConcurrencyKeys:
    """Releases of concurrency keys' held jobs, told to `written` once each is committed."""

    def __init__(
        self, store: Store, clock: Clock, written: Callable[[Job, Job | None], None]
    ) -> None:
        self._store, self._clock, self._written = store, clock, written
        self._repaired_after: tuple[str, str] | None = None

    def follow(self, done: Iterable[tuple[Job | None, Job]], *, declare: bool = False) -> None:
        """Release what the keys of these written jobs allow now, once per key: the keys of
        jobs that ended, or that wait on their key (new, or just released by their group).
        With `declare` (new jobs), each key's limit becomes the one its newest job carries.
        A failure is logged and left to the sweeper (the write before stands)."""
        keys: dict[tuple[str, str], int] = {}
        for before, after in done:
            if after.concurrency is not None and (
                domain.ended(before, after) or domain.waiting(before, after)
            ):
                keys[after.owner_id, after.concurrency.key] = after.concurrency.limit
        self._release_all(keys, declare=declare)

    def _release_all(self, keys: Mapping[tuple[str, str], int], *, declare: bool) -> int:
        released = 0
        for (owner_id, key), limit in keys.items():
            try:
                released += self.release(owner_id, key, limit, declare=declare)
            except MoonrunError as error:
                log.warning("key %r: left to the sweeper: %s", key, error.message)
        return released

    def release(self, owner_id: str, key: str, limit: int, *, declare: bool = False) -> int:
        """Release as many of the key's held jobs as its limit allows now (the key's limit
        set to `limit` first when `declare`, or when it has none); how many it released."""
        now = self._clock.now()
        done = self._store.release_key(
            owner_id,
            key,
            limit,
            declare,
            domain.to_release,
            functools.partial(_release, now=now),
        )
        released = 0
        for before, after in done.values():
            if after is not before:
                released += 1
                self._written(after, before)
        return released

    def repair(self, limit: int = REPAIR_BATCH) -> int:
        """Release what lost writes left held, in a few keys with held jobs (the next few at
        every call, round and round); how many jobs it released."""
        found = self._store.held_keys(self._repaired_after, limit)
        self._repaired_after = found[-1] if len(found) == limit else None
        # A key without a row yet (its first release was lost) takes the limit 1 until
        # its next create declares one: never more than asked.
        return self._release_all(dict.fromkeys(found, 1), declare=False)


def _release(job: Job, *, now: int) -> Job:
    return domain.release(job, now)
