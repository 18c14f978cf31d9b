"""What a platform process tells the others: queued without blocking, sent by one thread in
batches (the PostgreSQL and MySQL wake-ups share it; only how a batch is sent differs)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

QUEUE_BOUND = 10_000
"""Announcements waiting to be sent, at most: past it they are dropped (a database that does
not answer must not make the process hold every change it made meanwhile)."""
BATCH = 500
"""Announcements sent in one statement, at most."""

log = logging.getLogger("moonrun.store.wakeups")


class Announcements(Generic[T]):
    """Announcements of this process's committed changes, on their way to the others.

    `put` never blocks: an announcement made before `start`, after `stop`, or past
    `QUEUE_BOUND` waiting is not sent (a wake-up is a shortcut; every waiting request looks
    again at its re-check anyway). One thread sends what waits through `send`, at most `BATCH`
    at a time, in order and without repeats; a batch the database refuses is dropped.
    """

    def __init__(self, send: Callable[[list[T]], None], stop_mark: T) -> None:
        self._send = send
        self._stop_mark = stop_mark
        """Tells the thread to stop: a value no announcement is."""
        self._queue: queue.Queue[T] = queue.Queue(QUEUE_BOUND)
        self._thread: threading.Thread | None = None
        self._open = False
        self.dropped = 0
        """Announcements never sent (the queue was full or the database did not answer)."""

    @property
    def waiting(self) -> int:
        """Announcements queued and not sent yet."""
        return self._queue.qsize()

    def put(self, announcement: T) -> None:
        """Queue `announcement` for the others (never blocks)."""
        if not self._open:
            return
        try:
            self._queue.put_nowait(announcement)
        except queue.Full:
            self.dropped += 1

    def start(self) -> None:
        """Start the sending thread (once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._sender, name="moonrun-wakeups-send", daemon=True
        )
        self._open = True
        self._thread.start()

    def stop(self) -> None:
        """Send what waits and stop, unless the database has not taken it for a second."""
        self._open = False
        if self._thread is None:
            return
        try:
            self._queue.put(self._stop_mark, timeout=1.0)
        except queue.Full:  # the database does not take them: drop what waits, and stop
            with contextlib.suppress(queue.Empty):
                while True:
                    self._queue.get_nowait()
                    self.dropped += 1
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(self._stop_mark)
        self._thread.join(timeout=10)

    def _sender(self) -> None:
        while True:
            announcement = self._queue.get()
            if announcement == self._stop_mark:
                return
            batch = {announcement: None}  # ordered, without repeats
            while len(batch) < BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more == self._stop_mark:
                    self._flush(list(batch))
                    return
                batch[more] = None
            self._flush(list(batch))

    def _flush(self, batch: list[T]) -> None:
        try:
            self._send(batch)
        except Exception as error:  # the store said why; the waiters' re-check covers the loss
            self.dropped += len(batch)
            log.warning(f"wake-ups not sent to the other platform processes: {error}")
