"""Heartbeats' liveness: each platform process notes the heartbeats it answers (`Beats`), and its
`LivenessFlusher` writes those of the last pass, every `liveness_flush_s`, in one store write.

Why not a write per heartbeat: an idle fleet must cost the store almost nothing (5,000 Runs
heartbeating every 10 s would be 500 commits a second). One write per pass per process, however
many Runs, keeps a session's stored `last_seen_at` at most a pass (and its write) behind the
beats any process received, which is what the endpoint's `online` needs: its last heartbeat at
most `liveness_bound_ms` old (docs/protocol.md, "Liveness").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

import anyio

from moonrun.errors import MoonrunError
from moonrun.scheduling.cadence import heartbeat_stretch
from moonrun.scheduling.time import Instant
from moonrun.service.config import SchedulingSettings
from moonrun.service.waiting import Runner

log = logging.getLogger("moonrun.liveness")


class Beats:
    """When each session last heartbeat at this process, and the beats not written yet.

    Noted on the event loop; registrations forget rotated sessions from threads, hence the
    copies before iterating (a dict's single operations are atomic under the GIL).
    """

    def __init__(self) -> None:
        self._last: dict[str, Instant] = {}
        self._unwritten: dict[str, Instant] = {}

    def beat(self, session_id: str, at: Instant, *, written: bool = False) -> None:
        """The session heartbeat at `at`; `written`: its `last_seen_at` was stored with it
        (its session's extension), so nothing is left to write for it."""
        if at > self._last.get(session_id, at - 1):
            self._last[session_id] = at
        pending = self._unwritten.get(session_id)
        if written:
            if pending is not None and pending <= at:
                self._unwritten.pop(session_id, None)
        elif pending is None or pending < at:
            self._unwritten[session_id] = at

    def last(self, session_id: str) -> Instant | None:
        """When the session last heartbeat here, if it did (written or not)."""
        return self._last.get(session_id)

    def forget(self, session_id: str) -> None:
        """The session was rotated or ended: it counts as connected no longer."""
        self._last.pop(session_id, None)

    def take(self) -> dict[str, Instant]:
        """The beats not written yet (each session's latest), now in the caller's hands."""
        taken, self._unwritten = self._unwritten, {}
        return taken

    def give_back(self, beats: Mapping[str, Instant]) -> None:
        """Beats whose write failed: written with the next pass (unless a later one is noted)."""
        for session_id, at in beats.items():
            pending = self._unwritten.get(session_id)
            if pending is None or pending < at:
                self._unwritten[session_id] = at

    def connected(self, since: Instant) -> int:
        """Sessions that heartbeat here at or after `since` (older ones are dropped)."""
        last = self._last
        for session_id in [sid for sid, at in list(last.items()) if at < since]:
            last.pop(session_id, None)
        return len(last)


class Cadence:
    """The heartbeat interval and session TTL this process tells Runs, stretched with the Runs
    that heartbeat to it (`scheduling/cadence.py`, `max_heartbeats_per_s`); counted again at
    most every `recount_ms`.

    When the stretch shrinks, Runs told the longer interval keep it until their next
    heartbeat's answer: until then an endpoint stays online by the longer bound.
    """

    def __init__(
        self,
        settings: SchedulingSettings,
        connected: Callable[[Instant], int],
        recount_ms: int = 2000,
    ) -> None:
        self._base, self._connected, self._recount_ms = settings, connected, recount_ms
        self._now = settings
        self._stretch = 1.0
        self._counted_at: Instant | None = None
        self._wide_bound_ms, self._wide_until = 0, 0

    @property
    def stretch(self) -> float:
        """The factor the base timings are stretched by now (1: not at all)."""
        return self._stretch

    def settings(self, now: Instant) -> SchedulingSettings:
        """The settings with the heartbeat interval and session TTL to tell Runs at `now`."""
        if self._counted_at is None or now - self._counted_at >= self._recount_ms:
            self._recount(now)
        return self._now

    def liveness_bound_ms(self, now: Instant) -> int:
        """How old an endpoint's last heartbeat may be while it shows online at `now`."""
        bound = self.settings(now).liveness_bound_ms
        return max(bound, self._wide_bound_ms) if now < self._wide_until else bound

    def _recount(self, now: Instant) -> None:
        self._counted_at = now
        base = self._base
        runs = self._connected(now - self._now.session_ttl_ms)
        stretch = heartbeat_stretch(runs, base.heartbeat_interval_s, base.max_heartbeats_per_s)
        if stretch == self._stretch:
            return
        if stretch < self._stretch:
            before = self._now.liveness_bound_ms
            self._wide_bound_ms, self._wide_until = before, now + before
        self._stretch = stretch
        self._now = replace(
            base,
            heartbeat_interval_s=base.heartbeat_interval_s * stretch,
            session_ttl_s=base.session_ttl_s * stretch,
        )


class LivenessFlusher:
    """Every `interval_s`, writes the beats noted since its last pass with one call of
    `record` (the store's `record_beats`: one transaction), run through `run`."""

    def __init__(
        self,
        beats: Beats,
        record: Callable[[Mapping[str, Instant]], None],
        run: Runner,
        interval_s: float,
    ) -> None:
        self._beats, self._record, self._run, self._interval_s = beats, record, run, interval_s
        self.writes = 0
        """Writes made so far (for tests and benches)."""
        self.recorded = 0
        """Beats those writes held."""

    async def flush(self) -> int:
        """One pass: the beats noted since the last one, in one write (none when there are
        none); answers how many. A failed write keeps its beats for the next pass."""
        batch = self._beats.take()
        if not batch:
            return 0
        try:
            await self._run(self._record, batch)
        except BaseException:
            self._beats.give_back(batch)
            raise
        self.writes += 1
        self.recorded += len(batch)
        return len(batch)

    async def run(self, stop: anyio.Event) -> None:
        """Pass after pass until `stop` (the beats of the last pass before it are not written:
        at most `interval_s` of them, which the Runs' next heartbeats bring again)."""
        while not stop.is_set():
            with anyio.move_on_after(self._interval_s):
                await stop.wait()
            if stop.is_set():
                return
            try:
                await self.flush()
            except MoonrunError as error:  # the store is down: the sweeper reports it
                log.warning(
                    "recording heartbeats failed", extra={"fields": {"error": error.message}}
                )
