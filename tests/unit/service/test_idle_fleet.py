"""An idle fleet writes (almost) nothing (docs/protocol.md, "Joining and sessions", "Claims").

A waiting claim looks again with one read and writes only once something is claimable; a
session's expiry is rewritten only once less than half its TTL is left; the heartbeats whose
extensions fall due together share one commit. Counted in FileStore commits and store calls,
on a manual clock: nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from moonrun.service.waiting import Waiting
from moonrun.store.file import FileStore
from moonrun.store.protocol import Store
from tests.support.harness import SETTINGS, World
from tests.support.stores import StoreFactory, file_factory, memory_factory

T = TypeVar("T")
SECOND = 1000


class Counting:
    """A store that counts the calls made to it, by method name."""

    def __init__(self, store: Store) -> None:
        self.inner = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return found(*args, **kwargs)

        return counted


class Lent:
    """What a request lends a waiting claim: inline store work, a place, a client that stays."""

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        return work(*args)

    def leave(self) -> None:
        pass

    def enter(self) -> None:
        pass

    async def gone(self) -> None:
        await self.never.wait()

    def waiting(self) -> Waiting:
        return Waiting(self.run, self, self.gone)


def file_world(tmp_path: Path) -> World:
    counter = iter(range(1000))

    def make_dir() -> Path:
        directory = tmp_path / f"s{next(counter)}"
        directory.mkdir()
        return directory

    return World(file_factory(make_dir))


def counted_world(factory: StoreFactory) -> tuple[World, Counting]:
    world = World(factory)
    counting = Counting(world.store)
    world.service = type(world.service)(
        cast(Store, counting), world.clock, world.tokens, world.settings
    )
    return world, counting


def test_an_idle_waiting_claim_reads_and_never_commits(tmp_path: Path) -> None:
    """However often a waiting claim looks again with nothing claimable, it commits nothing:
    each look is one read (before, each was a claim's write and a session extension)."""
    world = file_world(tmp_path)
    store = world.store
    assert isinstance(store, FileStore)
    counting = Counting(store)
    service = type(world.service)(cast(Store, counting), world.clock, world.tokens, world.settings)
    registration = service.register_session(
        world.endpoint.id, boot_id="boot-1", run_version="0.1.0", capacity=4
    )
    service.reconcile(registration.session.id, [])
    service.waiters.recheck_s = 0.002
    service.waiters.draw = lambda: 1.0

    async def wait() -> None:
        await service.wait_for_claim(
            registration.session.id, 4, wait_s=0.3, waiting=Lent().waiting()
        )

    world.clock.advance(40 * SECOND)  # past half the session's TTL: only a heartbeat extends it
    before = store.groups_committed
    asyncio.run(wait())
    looks = counting.calls["next_claimable_at"]
    assert looks >= 5, "the claim should have looked again several times"
    # Neither the claim's first look nor any later one writes: nothing was claimable.
    assert store.groups_committed - before == 0
    assert counting.calls["claim_jobs"] == 0
    assert counting.calls["extend_session"] == 0


def test_a_waiting_claim_still_grants_what_becomes_claimable() -> None:
    """Its look finds a job created behind the platform's back (no wake-up): it is claimed."""
    world, counting = counted_world(memory_factory())
    service = world.service
    registration = service.register_session(
        world.endpoint.id, boot_id="boot-1", run_version="0.1.0", capacity=4
    )
    service.reconcile(registration.session.id, [])
    service.waiters.recheck_s = 0.002

    async def scenario() -> int:
        claim = asyncio.ensure_future(
            service.wait_for_claim(registration.session.id, 4, wait_s=30, waiting=Lent().waiting())
        )
        for _ in range(20):
            await asyncio.sleep(0)
        # Created by another service over the same store: this one's waiters are not told.
        other = type(service)(counting.inner, world.clock, world.tokens, world.settings)
        other.create_job(world.owner, world.server.id, kind="noop")
        granted = await asyncio.wait_for(claim, 10)
        return len(granted.jobs)

    assert asyncio.run(scenario()) == 1


def test_a_heartbeat_extends_its_session_only_when_less_than_half_its_ttl_is_left() -> None:
    world = World(memory_factory())
    run = world.run().start()
    ttl = SETTINGS.session_ttl_ms
    first = world.store.get_session(run.session_id)
    assert first is not None
    world.clock.advance(ttl // 2 - SECOND)  # more than half left: nothing written
    assert run.heartbeat().session_expires_at == first.expires_at
    stored = world.store.get_session(run.session_id)
    assert stored is not None
    assert stored.expires_at == first.expires_at
    world.clock.advance(2 * SECOND)  # less than half left: extended by the whole TTL
    now = world.clock.now()
    assert run.heartbeat().session_expires_at == now + ttl
    stored = world.store.get_session(run.session_id)
    assert stored is not None
    assert stored.expires_at == now + ttl
    assert stored.last_seen_at == now
    # Lazily extended, a session still lives while its Run heartbeats on time, even with one
    # heartbeat in every three lost.
    beat = round(SETTINGS.heartbeat_interval_s * 1000)
    for n in range(40):
        world.clock.advance(beat)
        if n % 3 != 1:
            run.heartbeat()


def test_heartbeats_arriving_together_share_one_commit(tmp_path: Path) -> None:
    world = file_world(tmp_path)
    store = world.store
    assert isinstance(store, FileStore)
    sessions = []
    for n in range(12):
        endpoint = world.join(f"fleet-{n}", 10 + n)
        registration = world.service.register_session(
            endpoint.id, boot_id="boot-1", run_version="0.1.0", capacity=1
        )
        sessions.append(registration.session.id)
    world.clock.advance(SETTINGS.session_ttl_ms // 2 + SECOND)
    lent = Lent()

    async def beats() -> list[Any]:
        return await asyncio.gather(
            *(world.service.heartbeat_shared(sid, lent.run) for sid in sessions)
        )

    before = store.groups_committed
    answers = asyncio.run(beats())
    assert store.groups_committed - before == 1
    now = world.clock.now()
    for sid, answer in zip(sessions, answers, strict=True):
        assert answer.session_expires_at == now + SETTINGS.session_ttl_ms
        stored = store.get_session(sid)
        assert stored is not None
        assert stored.expires_at == now + SETTINGS.session_ttl_ms
