"""Session extensions that arrive together share one write (and one commit).

A heartbeat that must move its session's expiry hands the extension here and waits for it to
be committed: the first one starts a flush at the next turn of the event loop, those that come
before it runs join it, and those that come while it is in flight join the next one. Each is
answered only once the write holding it has committed (or with the write's error).
"""

from __future__ import annotations

import asyncio
from typing import Any

from moonrun.scheduling.time import Instant
from moonrun.service.waiting import Runner
from moonrun.store.protocol import Store


class SessionExtensions:
    """Pending session extensions, written together by one flusher at a time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: dict[str, tuple[Instant, Instant]] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None
        """The flush under way (held here: the loop keeps only a weak reference to a task,
        and a flusher collected mid-flight would leave its heartbeats waiting for ever)."""
        self.writes = 0
        """Writes made so far (for tests and benches)."""
        self.extended = 0
        """Extensions those writes held."""

    async def extend(
        self, session_id: str, seen_at: Instant, expires_at: Instant, run: Runner
    ) -> None:
        """Once committed: the session seen at `seen_at`, expiring at `expires_at` (never
        earlier than it already does)."""
        loop = asyncio.get_running_loop()
        known = self._pending.get(session_id)
        if known is None or known[1] < expires_at:
            self._pending[session_id] = (seen_at, expires_at)
        done: asyncio.Future[None] = loop.create_future()
        self._waiters.append(done)
        if not self._flushing:
            self._flushing = True
            # Started at the next turn of the loop: the heartbeats read in this turn join it.
            loop.call_soon(self._start, loop, run)
        await done

    def _start(self, loop: asyncio.AbstractEventLoop, run: Runner) -> None:
        self._flusher = loop.create_task(self._flush(run))

    async def _flush(self, run: Runner) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                waiters, self._waiters = self._waiters, []
                rows = [(sid, seen, expires) for sid, (seen, expires) in batch.items()]
                outcome: Any = None
                try:
                    await run(self._store.extend_sessions, rows)
                    self.writes += 1
                    self.extended += len(rows)
                except asyncio.CancelledError:  # the platform stops: nobody is answered
                    for waiter in waiters:
                        waiter.cancel()
                    raise
                except Exception as error:  # each caller gets the write's own error
                    outcome = error
                for waiter in waiters:
                    if waiter.done():
                        continue
                    if outcome is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(outcome)
        finally:
            self._flushing = False
