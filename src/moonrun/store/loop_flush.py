"""The event loop's flusher: calls made on the loop share one SQLite COMMIT and its fsync.

Why: FileStore's work runs inline on the event loop (a thread hop costs more than the work),
so every write a Run or a user asked for was a transaction of its own, one COMMIT and fsync
at a time, with the loop waiting on each: under the peer bench half of the platform's samples
were in COMMIT. Group commit (`group_commit.py`) gathers only writers on threads.

How: a call (a use case: a create, a claim, a batch of acks or results, a read) is handed
over and awaited (`run`). A flusher task takes every call waiting (up to `max_group`),
begins one transaction on the store's write connection and applies the calls one after
another on the loop. Inside a call every store write is a unit in a SAVEPOINT of its own, so a
write that fails rolls back alone and only the call that made it sees the error, and every
read sees what the group wrote so far. The flusher then hands the COMMIT to a thread of its
own and awaits it without holding the loop, so the calls that arrive meanwhile gather for the
next group. Only once the COMMIT has returned (on disk, with `synchronous=FULL`) are the
group's after-commit actions run (job events: the wake-ups of waiting claims and reads) and
its callers answered; a COMMIT that fails answers every one of them with the error. A call
made while nothing is in flight is applied in place, with no loop turn before it (`_in_place`:
a loop kept busy by an attacker's sockets makes every turn slow, and through a task the
noisy-neighbour test saw claims at 1.65-1.77x their quiet latency; in place, 0.97-1.02x), and
its COMMIT goes to the committer's thread like a group's; the calls made meanwhile gather for
the next group. A group of one, and a group that changed no row, commit on the loop: a thread
hop would only add to its latency, or there is nothing to sync. Groups grow as the load does.

A store method called inside an applied call returns once its unit is applied, not once it
is committed; the call's answer is what waits for the commit. Writers on threads keep using
`GroupCommit`; both take the connection's `transaction` lock from BEGIN to COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from moonrun.store.group_commit import GroupCommit, Translate

T = TypeVar("T")

log = logging.getLogger("moonrun.store")


@dataclass(eq=False, slots=True)
class _Call:
    """One caller's call, the context it was made in, and the future its answer goes to."""

    work: Callable[..., Any]
    args: tuple[Any, ...]
    context: contextvars.Context
    future: asyncio.Future[Any]


@dataclass(eq=False, slots=True)
class Applying:
    """The group being applied on one thread: its cursor, units, and after-commit actions."""

    cursor: sqlite3.Cursor
    thread: int
    translate: Translate
    changes_before: int
    units: int = 0
    after: list[Callable[[], None]] = field(default_factory=list)

    def write(self, work: Callable[[sqlite3.Cursor], T]) -> T:
        """One unit in its own savepoint: a unit that fails rolls back alone."""
        cursor = self.cursor
        if not cursor.connection.in_transaction:
            # SQLite gave up the group's transaction (it does on some I/O errors): a savepoint
            # now would open a new transaction of its own, outside the group.
            raise self.translate(sqlite3.OperationalError("the group's transaction was lost"))
        self.units += 1
        cursor.execute("SAVEPOINT unit")
        try:
            result = work(cursor)
        except Exception as error:
            # A failed rollback leaves the connection out of the transaction; the flusher then
            # fails the whole group.
            with contextlib.suppress(sqlite3.Error):
                cursor.execute("ROLLBACK TO unit")
                cursor.execute("RELEASE unit")
            raise self.translate(error) from None
        cursor.execute("RELEASE unit")
        return result


class LoopFlusher:
    """Calls awaited on event loops, applied in groups under one COMMIT on the write side."""

    def __init__(
        self,
        writes: GroupCommit,
        connection: sqlite3.Connection,
        gate: contextlib.AbstractContextManager[Any],
        translate: Translate,
        max_group: int = 64,
    ) -> None:
        self._writes = writes
        self._connection = connection
        self._gate = gate
        self._translate = translate
        self.max_group = max_group
        self.hand_over_from = 2
        """Groups of at least this many calls commit on the committer's thread."""
        self._waiting: dict[asyncio.AbstractEventLoop, list[_Call]] = {}
        """Per loop with a flusher task running, the calls waiting for its next group."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._applying: Applying | None = None
        self.committer = Committer()
        """Where COMMITs go (a test may hand in one that blocks or fails)."""
        self.groups = 0
        """Groups committed (or attempted); for tests and benches."""
        self.calls = 0
        """Calls those groups held."""

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """Apply `work(*args)` in the next group; its result (or error) once that group's
        COMMIT returned."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting.get(loop)
        if waiting is None and self._writes.transaction.acquire(blocking=False):
            # Nothing in flight: apply this call in place, with no loop turn before it (a
            # loop kept busy makes each turn slow), and hand its COMMIT to the committer's
            # thread; the calls that arrive meanwhile gather for the next group.
            answer: T = await self._in_place(
                loop, _Call(work, args, contextvars.copy_context(), loop.create_future())
            )
            return answer
        future: asyncio.Future[T] = loop.create_future()
        if waiting is None:
            waiting = self._waiting[loop] = []
            task = loop.create_task(self._flush(loop, waiting))
            self._tasks.add(task)  # a task nobody refers to may be collected mid-flight
            task.add_done_callback(self._tasks.discard)
        waiting.append(_Call(work, args, contextvars.copy_context(), future))
        return await future

    def _in_place(self, loop: asyncio.AbstractEventLoop, call: _Call) -> asyncio.Future[Any]:
        """Apply one call now, holding the transaction lock (taken), and hand its COMMIT to
        the committer's thread; the calls made meanwhile wait for the next group. The rest
        (after-commit actions, the answer, that next group) happens in the commit's callback,
        so a caller that goes away meanwhile takes none of it with it."""
        waiting: list[_Call] = []
        self._waiting[loop] = waiting
        transaction = self._writes.transaction
        try:
            outcomes, applying = self._apply([call])
        except BaseException:
            transaction.release()
            self._next_group(loop, waiting)
            raise
        if applying is None:  # the transaction could not begin: the call is answered
            transaction.release()
            self._next_group(loop, waiting)
            return call.future
        self._counted(applying, calls=1)
        if self._connection.total_changes == applying.changes_before:
            error: BaseException | None = None
            try:
                self._connection.execute("COMMIT")  # nothing to sync
            except Exception as failure:
                error = failure
                with contextlib.suppress(sqlite3.Error):
                    self._connection.execute("ROLLBACK")
            finally:
                transaction.release()
            self._answer(call, outcomes[0], applying, error)
            self._next_group(loop, waiting)
            return call.future

        def committed(done: asyncio.Future[None]) -> None:
            self._answer(call, outcomes[0], applying, done.exception())
            self._next_group(loop, waiting)

        self.committer.start(self._connection, transaction).add_done_callback(committed)
        return call.future

    def _answer(
        self,
        call: _Call,
        outcome: tuple[Any, BaseException | None],
        applying: Applying,
        error: BaseException | None,
    ) -> None:
        """Answer a call applied in place once its COMMIT returned (`error`: it failed, and
        nothing of it is stored, so no after-commit action runs)."""
        if error is not None:
            _settle(
                call.future, None, self._translate(error) if isinstance(error, Exception) else error
            )
            return
        _after_commit(applying)
        _settle(call.future, *outcome)

    def _counted(self, applying: Applying, *, calls: int) -> None:
        """A group applied, in the flusher's counters and the write side's."""
        self.groups += 1
        self.calls += calls
        self._writes.groups += 1
        self._writes.units += applying.units

    def _next_group(self, loop: asyncio.AbstractEventLoop, waiting: list[_Call]) -> None:
        """After a call applied in place: a flusher task for the calls made meanwhile."""
        if waiting:
            task = loop.create_task(self._flush(loop, waiting))
            self._tasks.add(task)  # a task nobody refers to may be collected mid-flight
            task.add_done_callback(self._tasks.discard)
        else:
            del self._waiting[loop]

    def applying(self) -> Applying | None:
        """The group this thread is applying right now, if any."""
        applying = self._applying
        if applying is not None and applying.thread == threading.get_ident():
            return applying
        return None

    def close(self) -> None:
        self.committer.close()

    async def _flush(self, loop: asyncio.AbstractEventLoop, waiting: list[_Call]) -> None:
        """Commit groups until no call waits."""
        try:
            while waiting:
                group = waiting[: self.max_group]
                del waiting[: self.max_group]
                try:
                    await self._commit(group)
                finally:
                    for call in group:
                        if not call.future.done():  # the flusher itself was stopped
                            call.future.cancel()
        finally:
            del self._waiting[loop]
            for call in waiting:
                call.future.cancel()

    async def _commit(self, group: list[_Call]) -> None:
        transaction = self._writes.transaction
        while not transaction.acquire(blocking=False):
            await asyncio.sleep(0.0005)  # a writer on a thread (or another loop) commits
        handed_over = False
        try:
            outcomes, applying = self._apply(group)
            if applying is None:
                return
            self._counted(applying, calls=len(group))
            if (
                len(group) < self.hand_over_from
                or self._connection.total_changes == applying.changes_before
            ):
                # A lone call: nothing else was waiting, so a thread hop would only add its
                # cost (and its wait for a core); or no row changed: nothing to sync.
                self._connection.execute("COMMIT")
            else:
                handed_over = True
                await self.committer.commit(self._connection, transaction)
        except Exception as error:
            if not handed_over and self._connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._connection.execute("ROLLBACK")
            failure = self._translate(error)
            for call in group:
                _settle(call.future, None, failure)
            return
        finally:
            if not handed_over:
                transaction.release()
        _after_commit(applying)
        for call, (result, refusal) in zip(group, outcomes, strict=True):
            _settle(call.future, result, refusal)

    def _apply(
        self, group: list[_Call]
    ) -> tuple[list[tuple[Any, BaseException | None]], Applying | None]:
        """BEGIN, and every call of the group on this thread; (outcomes, the group applied),
        or no group when the transaction could not begin or was lost (every call answered)."""
        connection = self._connection
        cursor = connection.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            failure = self._translate(error)
            for call in group:
                _settle(call.future, None, failure)
            return [], None
        applying = Applying(
            cursor, threading.get_ident(), self._translate, connection.total_changes
        )
        outcomes: list[tuple[Any, BaseException | None]] = []
        try:
            with self._gate:
                self._applying = applying
                try:
                    for call in group:
                        try:
                            outcomes.append((call.context.run(call.work, *call.args), None))
                        except Exception as error:
                            outcomes.append((None, error))
                finally:
                    self._applying = None
            if not connection.in_transaction:
                raise sqlite3.OperationalError("the group's transaction was lost")
        except BaseException as error:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    cursor.execute("ROLLBACK")
            failure = self._translate(error) if isinstance(error, Exception) else error
            for call in group:
                _settle(call.future, None, failure)
            if not isinstance(error, Exception):
                raise
            return [], None
        finally:
            cursor.close()
        return outcomes, applying


class Committer:
    """One thread that runs COMMITs handed over by flushers, so no loop waits on an fsync."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def commit(self, connection: sqlite3.Connection, transaction: Any) -> None:
        """COMMIT on the thread, which then lets go of `transaction`; returns once it did."""
        await self.start(connection, transaction)

    def start(self, connection: sqlite3.Connection, transaction: Any) -> asyncio.Future[None]:
        """Hand a COMMIT to the thread now; the future is done once it returned (or failed)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="moonrun-commit", daemon=True
                )
                self._thread.start()
        self._queue.put((connection, transaction, future))
        return future

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            connection, transaction, future = item
            error: BaseException | None = None
            try:
                self.commit_now(connection)
            except BaseException as failure:  # nothing of the group is stored
                error = failure
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
            finally:
                transaction.release()
            # A closed loop (RuntimeError) has nobody left waiting for this answer.
            with contextlib.suppress(RuntimeError):
                future.get_loop().call_soon_threadsafe(_settle, future, None, error)

    def commit_now(self, connection: sqlite3.Connection) -> None:
        """The COMMIT itself (its fsync), on the committer's thread."""
        connection.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread = None


def _after_commit(applying: Applying) -> None:
    """The committed group's after-commit actions (job events: waiters' wake-ups); one that
    fails is logged and the rest still run."""
    for action in applying.after:
        try:
            action()
        except Exception:
            log.exception("an after-commit action failed")


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
        return
    if isinstance(error, StopIteration):  # a future refuses it, and would never settle
        wrapped = RuntimeError(f"work raised StopIteration: {error!r}")
        error = wrapped.with_traceback(error.__traceback__)
    future.set_exception(error)
