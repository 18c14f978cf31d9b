"""Group commit: many writers' units in one SQLite transaction, made durable by one fsync.

Writers queue their units. The writer at the head of the queue leads: it takes every unit
waiting (up to `max_group`), runs each in its own savepoint on the one write connection
(a unit that fails rolls back alone), commits once, and only then hands every member its
answer. The others sleep until their unit is answered or they reach the head themselves.
Nothing is answered before the commit that holds it returned, so with `synchronous=FULL`
every answer follows a write that is on disk. While one group commits, the next one gathers.

The leader runs the units holding `gate` (the store's reads hold it too) and lets it go for
the COMMIT: see FileStore for why. The whole transaction, BEGIN to COMMIT, holds
`transaction`: the event loop's flusher (`store/loop_flush.py`) uses the same connection for
its groups, and takes the same lock.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

Translate = Callable[[BaseException], BaseException]


class _Unit:
    """One writer's work, its outcome, and the lock it sleeps on (held until it is woken)."""

    __slots__ = ("done", "error", "result", "wake", "work")

    def __init__(self, work: Callable[[sqlite3.Cursor], Any]) -> None:
        self.work = work
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.wake = threading.Lock()
        self.wake.acquire()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommit:
    """The write side of a FileStore: one connection, units committed in groups."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        translate: Translate,
        max_group: int = 64,
        gate: contextlib.AbstractContextManager[Any] | None = None,
    ) -> None:
        self._connection = connection
        self._gate = gate if gate is not None else contextlib.nullcontext()
        self._translate = translate
        self._max_group = max_group
        self._lock = threading.Lock()
        self._queue: deque[_Unit] = deque()
        self.transaction = threading.Lock()
        """Held from BEGIN to the end of COMMIT (or ROLLBACK) by whoever uses the connection."""
        self.groups = 0
        """How many transactions were committed (or attempted); for tests and benches."""
        self.units = 0
        """How many units those transactions held."""

    @property
    def pending(self) -> int:
        """Units queued or being committed right now."""
        return len(self._queue)

    def run(self, work: Callable[[sqlite3.Cursor], T]) -> T:
        """Run `work` in the next group; its result (or error) once that group committed."""
        unit = _Unit(work)
        with self._lock:
            self._queue.append(unit)
            leads = self._queue[0] is unit
        if not leads:
            unit.wake.acquire()  # released when our group committed, or when we are next
            if unit.done:
                return unit.outcome()  # type: ignore[no-any-return]
        with self._lock:
            group = list(itertools.islice(self._queue, self._max_group))
        try:
            self._commit(group)
        finally:
            with self._lock:
                for _ in group:
                    self._queue.popleft()  # the group is the head of the queue
                following = self._queue[0] if self._queue else None
            for member in group:
                member.done = True
                if member is not unit:
                    member.wake.release()
            if following is not None:
                following.wake.release()  # the next leader
        return unit.outcome()  # type: ignore[no-any-return]

    def close(self) -> None:
        self._connection.close()

    def _commit(self, group: list[_Unit]) -> None:
        """One transaction: each unit in a savepoint (unless it is alone), then one commit."""
        with self.transaction:
            self._commit_holding(group)

    def _commit_holding(self, group: list[_Unit]) -> None:
        self.groups += 1
        self.units += len(group)
        cursor = self._connection.cursor()
        alone = len(group) == 1
        try:
            # Waiting for another process's write lock happens outside the gate. (`no mutate`
            # on a line whose only literal is SQL: mutation testing would change its case,
            # which SQLite ignores; docs/testing.md.)
            cursor.execute("BEGIN IMMEDIATE")
            with self._gate:
                for unit in group:
                    if not alone:
                        cursor.execute("SAVEPOINT unit")  # pragma: no mutate
                    try:
                        unit.result = unit.work(cursor)
                    except Exception as error:
                        unit.error = self._translate(error)
                        if alone:
                            cursor.execute("ROLLBACK")  # pragma: no mutate
                            return
                        cursor.execute("ROLLBACK TO unit")  # pragma: no mutate
                    if not alone:
                        cursor.execute("RELEASE unit")  # pragma: no mutate
            cursor.execute("COMMIT")
        except BaseException as error:
            # BEGIN, a savepoint or the commit itself failed: nothing of the group is stored.
            if self._connection.in_transaction:
                # A broken connection may refuse even this; the next BEGIN will say so.
                with contextlib.suppress(sqlite3.Error):
                    cursor.execute("ROLLBACK")
            failure = self._translate(error) if isinstance(error, Exception) else error
            for unit in group:
                unit.result, unit.error = None, failure
            if not isinstance(error, Exception):
                raise
        finally:
            cursor.close()
