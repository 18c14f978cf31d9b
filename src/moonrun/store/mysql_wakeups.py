"""Wake-ups across platform processes on one MySQL database (a table of wake-ups, polled).

MySQL has no LISTEN/NOTIFY, so the processes tell one another through the append-only table
`job_wakeups` (migration 17): one row per committed job change, `(id, origin, job_id,
endpoint_id)`, `endpoint_id` set when the change concerns the endpoint's waiting claims (a job
became claimable, or an active one ended). `origin` names the process, so that it skips its
own rows (its waiters heard of the change already, from the service). The interface is
`pg_wakeups.PostgresWakeups`'s, so the wiring treats both alike.

Two threads per process:

- **the sender** takes what the service announced after each commit (`announce`, which never
  blocks) and inserts everything waiting in one multi-row INSERT (autocommit) on a connection
  of the store's pool. The job write itself is untouched. A change announced while the
  database does not answer, or past `announcements.QUEUE_BOUND` waiting, is dropped: a
  wake-up is a shortcut, and every waiting request looks again at its re-check anyway.
- **the poller** holds one dedicated connection (autocommit) and every `POLL_S` reads the rows
  past the last one it saw (one primary-key range read per process, however many requests
  wait), handing those of other processes to `heard(job_id, endpoint_id or None)`. When its
  connection breaks it connects again, pausing as `moonrun.backoff` says, and once polling
  again calls `missed()` and goes on from the newest row: every waiter looks again.

Ids are given out when a row is inserted, not when it commits, so a row may become visible
after a higher one the poller has read already. The poller remembers such holes below its
last id for `HOLE_WAIT_S` and reads them too (`WHERE id > last OR id IN (holes)`); a hole
never filled (a rolled-back insert, `auto_increment_increment` > 1) is forgotten then.

Rows are kept for `KEEP_S`: each poller notes, every poll, the newest id it has seen and
when; any id it saw `KEEP_S` ago or more is older than that, and it deletes such rows at most
`PRUNE_BATCH` at a time (again at the next poll while a batch was full), so every process
prunes and the table stays about `KEEP_S` of changes long.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from moonrun.backoff import Backoff
from moonrun.store.announcements import Announcements

POLL_S = 0.25
"""How often the poller reads the others' new rows: the bound of a wake-up across processes
(plus a read)."""
READ_LIMIT = 1_000
"""Rows one poll reads, at most (it polls again at once when it read that many)."""
HOLE_WAIT_S = 2.0
"""How long a hole below the last id read is looked for (an insert committing late)."""
HOLES_BOUND = 100
"""Holes remembered, at most (fewer than `READ_LIMIT`, so a poll always gets past them)."""
KEEP_S = 60.0
"""How long a row is kept: far longer than any poller lags behind while connected."""
PRUNE_BATCH = 5_000
"""Rows one prune deletes, at most."""
RECONNECT = Backoff(initial_s=0.05, max_s=5.0)
POLL_READ_TIMEOUT_S = 10
"""A poll or prune that gets no answer for this long gives its connection up and reconnects
(MySQL has no keepalive setting in its drivers: a silent cut would hold the poller otherwise)."""
SEND = "INSERT INTO job_wakeups (origin, job_id, endpoint_id) VALUES (%s, %s, %s)"

log = logging.getLogger("moonrun.store.wakeups")

Row = tuple[str, str, str | None]
"""(origin, job id, endpoint id or None): one announcement."""

_STOP: Row = ("", "", None)
"""Tells the sender to stop (no origin is empty)."""


class MySQLWakeups:
    """This process's announcements to, and wake-ups from, the other platform processes."""

    def __init__(
        self,
        connect: Callable[[], Any],
        send: Callable[[str, list[Row]], None],
        heard: Callable[[str, str | None], None],
        missed: Callable[[], None],
        *,
        reconnect: Backoff = RECONNECT,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._send = send
        self._heard = heard
        self._missed = missed
        self._reconnect = reconnect
        self._poll_s = poll_s
        self._clock = clock
        self.origin = secrets.token_hex(4)
        """Names this process in its rows (it skips its own)."""
        self._announcements = Announcements[Row](self._flush, _STOP)
        self._stopping = threading.Event()
        self._polling_thread: threading.Thread | None = None
        self._connection: Any = None
        self._last = 0
        self._holes: dict[int, float] = {}
        """Ids below `_last` not seen yet -> when to stop looking for them."""
        self._seen: deque[tuple[float, int]] = deque()
        """(when, the newest id seen then), oldest first: what is older than `KEEP_S`."""
        self._pruned_to = 0
        self.listening = threading.Event()
        """Set while the poller's connection is up (cleared when it breaks)."""
        self.connects = 0
        """Times the poller connected (1, plus one per reconnection)."""
        self.polls = 0
        """Reads of the table so far (one per poll, whatever the number of waiters)."""

    # -- announcing ------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Announcements never sent (the queue was full or the database did not answer)."""
        return self._announcements.dropped

    def announce(self, job_id: str, endpoint_id: str | None) -> None:
        """A job change this process committed: tell the others (soon, never blocking)."""
        self._announcements.put((self.origin, job_id, endpoint_id))

    def _flush(self, rows: list[Row]) -> None:
        self._send(SEND, rows)

    # -- polling ---------------------------------------------------------------------------

    def _poller(self) -> None:
        delays = self._reconnect.delays()
        while not self._stopping.is_set():
            connects = self.connects
            try:
                self._poll_until_stopped()
            except Exception as error:  # a broken connection, mostly: connect again
                self.listening.clear()
                self._close()
                if self._stopping.is_set():
                    return
                if self.connects > connects:  # it polled since: the pauses start afresh
                    delays = self._reconnect.delays()
                pause = next(delays)
                detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
                detail = detail or type(error).__name__
                log.warning(
                    f"polling for other platform processes' changes failed ({detail}); "
                    f"trying again in {pause:.2f} s"
                )
                self._stopping.wait(pause)
        self._close()

    def _poll_until_stopped(self) -> None:
        self.open()
        while not self._stopping.is_set():
            if not self.poll():
                self._stopping.wait(self._poll_s)

    def open(self) -> None:
        """Connect the poller and start from the newest row (`missed()` on a reconnection:
        what was written while it was away is not read)."""
        connection = self._connect()
        self._connection = connection
        with connection.cursor() as cursor:
            cursor.execute("SELECT COALESCE(MAX(id), 0) FROM job_wakeups")
            (newest,) = cursor.fetchone()
        self._last, self._holes = int(newest), {}
        self.connects += 1
        self.listening.set()
        if self.connects > 1:
            self._tell(self._missed)

    def poll(self) -> bool:
        """Read the rows past the last one (and the holes), hand the others' on, prune when
        due; whether it read a full batch (more may wait)."""
        now = self._clock()
        self._holes = {hole: until for hole, until in self._holes.items() if until > now}
        holes = sorted(self._holes)
        where = "id > %s" + (f" OR id IN ({', '.join(['%s'] * len(holes))})" if holes else "")
        with self._connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, origin, job_id, endpoint_id FROM job_wakeups "
                f"WHERE {where} ORDER BY id LIMIT %s",
                (self._last, *holes, READ_LIMIT),
            )
            rows = cursor.fetchall()
        self.polls += 1
        for id_, origin, job_id, endpoint_id in rows:
            if id_ <= self._last:
                if self._holes.pop(id_, None) is None:
                    continue
            else:
                # Over a table found empty, the ids below the first row were pruned, not
                # holes (its AUTO_INCREMENT goes on from there).
                below = id_ - HOLES_BOUND if self._last else id_
                for hole in range(max(self._last + 1, below), id_):
                    if len(self._holes) < HOLES_BOUND:
                        self._holes[hole] = now + HOLE_WAIT_S
                self._last = id_
            if origin != self.origin:
                self._tell(self._heard, job_id, endpoint_id)
        self._seen.append((now, self._last))
        full = len(rows) >= READ_LIMIT
        return self.prune(now) or full

    def prune(self, now: float) -> bool:
        """Delete rows older than `KEEP_S` (at most `PRUNE_BATCH`); whether more may be left."""
        old = now - KEEP_S
        while len(self._seen) > 1 and self._seen[1][0] <= old:
            self._seen.popleft()  # a newer note is old enough too: it bounds further
        if not self._seen or self._seen[0][0] > old or self._seen[0][1] <= self._pruned_to:
            return False
        bound = self._seen[0][1]
        with self._connection.cursor() as cursor:
            deleted = cursor.execute(
                "DELETE FROM job_wakeups WHERE id <= %s ORDER BY id LIMIT %s",
                (bound, PRUNE_BATCH),
            )
        if deleted < PRUNE_BATCH:
            self._pruned_to = bound
            return False
        return True

    def _tell(self, callback: Callable[..., None], *args: object) -> None:
        # A failing waker must not stop the polling: the waiters' re-check covers it.
        try:
            callback(*args)
        except Exception:
            log.exception("waking waiters for another platform process's change failed")

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a dead connection has nothing to report
                connection.close()

    @property
    def listener_pid(self) -> int | None:
        """The poller connection's id on the server (tests `KILL` it to see a reconnection)."""
        connection = self._connection
        if connection is None:
            return None
        with contextlib.suppress(Exception):
            thread_id: int = connection.thread_id()
            return thread_id
        return None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start polling and announcing (once)."""
        if self._polling_thread is not None:
            return
        self._polling_thread = threading.Thread(
            target=self._poller, name="moonrun-wakeups-poll", daemon=True
        )
        self._polling_thread.start()
        self._announcements.start()

    def stop(self) -> None:
        """Stop both threads (the poller within `POLL_S`); what waits to be sent is sent,
        unless the database has not taken it for a second."""
        self._stopping.set()
        self._announcements.stop()
        if self._polling_thread is not None:
            self._polling_thread.join(timeout=10)
        self.listening.clear()
