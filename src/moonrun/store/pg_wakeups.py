"""Wake-ups across platform processes on one PostgreSQL database (LISTEN/NOTIFY).

Each process announces its committed job changes on the channel `moonrun_jobs` and listens
to everyone's. A payload is small: `<origin> <job id>`, plus ` <endpoint id>` when the change
concerns the endpoint's waiting claims (a job became claimable, or an active one ended).
`origin` names the process, so that it skips its own announcements (its waiters heard of the
change already, from the service).

Two threads per process:

- **the sender** takes what the service announced after each commit (`announce`, which never
  blocks), and sends everything waiting in one statement (`SELECT pg_notify(...) FROM
  unnest(...)`, in autocommit) on a connection of the store's pool. The job write itself is
  untouched: it holds its row locks no longer, and PostgreSQL's notification queue lock, taken
  at a notifying commit, is never taken inside it. A change announced while the database
  does not answer, or past `announcements.QUEUE_BOUND` waiting, is dropped: a wake-up is a
  shortcut, and every waiting request looks again at its re-check anyway (the queue and the
  sender are `announcements.Announcements`, shared with the MySQL wake-ups).
- **the listener** holds one dedicated connection (autocommit, TCP keepalives) that runs
  `LISTEN moonrun_jobs`, and hands each notification of another process to `heard(job_id,
  endpoint_id or None)`. When its connection breaks it connects again, pausing as the project's
  backoff says (`moonrun.backoff`), and once listening again calls `missed()`: what was
  announced in between is lost, so every waiter should look again.

A process alone on its database announces nothing. Each listener says it listens (a payload of
its origin alone) as soon as it listens, every `HELLO_S` after, and at once when it hears a
process it had not heard of; a process announces only while it heard another within
`PEER_TTL_S`. Alone, each change's announcement cost a notifying commit on the database and a
thread's wake-up in the platform for nobody (PostgreSQL end to end 6% slower in
`bench/peer_bench.py`). A process that starts listening is heard by the others within a
round trip; what they changed before that reaches its waiters at their re-check.
"""

from __future__ import annotations

import importlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from moonrun.backoff import Backoff
from moonrun.store.announcements import Announcements

CHANNEL = "moonrun_jobs"
POLL_S = 0.2
"""How often the listener looks whether it should stop (between notifications)."""
HELLO_S = 1.0
"""How often a listener says that it listens."""
PEER_TTL_S = 3.0
"""How long after a process last said it listens the others still announce to it."""
RECONNECT = Backoff(initial_s=0.05, max_s=5.0)
SEND = "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload"

log = logging.getLogger("moonrun.store.wakeups")

_STOP = ""
"""Tells the sender to stop (no payload is empty)."""


class PostgresWakeups:
    """This process's announcements to, and wake-ups from, the other platform processes."""

    def __init__(
        self,
        conninfo: str,
        send: Callable[[str, tuple[Any, ...]], None],
        heard: Callable[[str, str | None], None],
        missed: Callable[[], None],
        *,
        reconnect: Backoff = RECONNECT,
    ) -> None:
        self._conninfo = conninfo
        self._send = send
        self._heard = heard
        self._missed = missed
        self._reconnect = reconnect
        self.origin = secrets.token_hex(4)
        """Names this process in its payloads (it skips its own)."""
        self._psycopg: Any = importlib.import_module("psycopg")
        self._announcements = Announcements[str](self._flush, _STOP)
        self._stopping = threading.Event()
        self._listening_thread: threading.Thread | None = None
        self._connection: Any = None
        self.listening = threading.Event()
        """Set while the listener's LISTEN is in force (cleared when its connection breaks)."""
        self.connects = 0
        """Times the listener connected and listened (1, plus one per reconnection)."""
        self._peer_heard_at: float | None = None
        """When another process last said it listens (`time.monotonic()`)."""
        self._hello_due = 0.0
        """When the listener next says it listens (0: at once)."""
        self.unsent = 0
        """Announcements not made: no other process listened."""

    # -- announcing ------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Announcements never sent (the queue was full or the database did not answer)."""
        return self._announcements.dropped

    def others_listen(self) -> bool:
        """Whether another process said it listens within `PEER_TTL_S`."""
        heard = self._peer_heard_at
        return heard is not None and time.monotonic() - heard < PEER_TTL_S

    def announce(self, job_id: str, endpoint_id: str | None) -> None:
        """A job change this process committed: tell the others, if any listen (soon, never
        blocking)."""
        if not self.others_listen():
            self.unsent += 1
            return
        payload = f"{self.origin} {job_id}" + (f" {endpoint_id}" if endpoint_id else "")
        self._announcements.put(payload)

    def _flush(self, payloads: list[str]) -> None:
        self._send(SEND, (CHANNEL, payloads))

    # -- listening -------------------------------------------------------------------------

    def _listener(self) -> None:
        delays = self._reconnect.delays()
        while not self._stopping.is_set():
            connects = self.connects
            try:
                self._listen()
            except Exception as error:  # a broken connection, mostly: connect again
                self.listening.clear()
                if self._stopping.is_set():
                    return
                if self.connects > connects:  # it listened since: the pauses start afresh
                    delays = self._reconnect.delays()
                pause = next(delays)
                detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
                detail = detail or type(error).__name__
                log.warning(
                    f"listening for other platform processes' changes failed ({detail}); "
                    f"trying again in {pause:.2f} s"
                )
                self._stopping.wait(pause)

    def _listen(self) -> None:
        psycopg = self._psycopg
        with psycopg.connect(
            self._conninfo,
            autocommit=True,
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        ) as connection:
            self._connection = connection
            connection.execute(f"LISTEN {CHANNEL}")
            self.connects += 1
            self.listening.set()
            if self.connects > 1:
                self._tell(self._missed)  # what was announced while it was away is lost
            self._hello_due = 0.0
            while not self._stopping.is_set():
                if time.monotonic() >= self._hello_due:
                    connection.execute(f"NOTIFY {CHANNEL}, '{self.origin}'")
                    self._hello_due = time.monotonic() + HELLO_S
                for notify in connection.notifies(timeout=POLL_S):
                    self._hear(notify.payload)
                    if self._hello_due == 0.0:
                        break  # a process it had not heard of: answer it now

    def _hear(self, payload: str) -> None:
        parts = payload.split(" ")
        if parts[0] == self.origin:
            return
        if len(parts) == 1:  # another process says it listens
            if not self.others_listen():
                self._hello_due = 0.0
            self._peer_heard_at = time.monotonic()
            return
        if len(parts) not in (2, 3):
            return
        self._tell(self._heard, parts[1], parts[2] if len(parts) == 3 else None)

    def _tell(self, callback: Callable[..., None], *args: object) -> None:
        # A failing waker must not stop the listening: the waiters' re-check covers it.
        try:
            callback(*args)
        except Exception:
            log.exception("waking waiters for another platform process's change failed")

    @property
    def listener_pid(self) -> int | None:
        """The listener connection's server process (tests end it to see a reconnection)."""
        connection = self._connection
        if connection is None or connection.closed:
            return None
        pid: int = connection.info.backend_pid
        return pid

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start listening and announcing (once)."""
        if self._listening_thread is not None:
            return
        self._listening_thread = threading.Thread(
            target=self._listener, name="moonrun-wakeups-listen", daemon=True
        )
        self._listening_thread.start()
        self._announcements.start()

    def stop(self) -> None:
        """Stop both threads (the listener within `POLL_S`); what waits to be sent is sent,
        unless the database has not taken it for a second."""
        self._stopping.set()
        self._announcements.stop()
        if self._listening_thread is not None:
            self._listening_thread.join(timeout=10)
        self.listening.clear()
