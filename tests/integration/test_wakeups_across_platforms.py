"""Wake-ups across platform processes on one database (docs/operations.md, "PostgreSQL:
several platform processes").

Two platforms in one test process: two `SchedulingService`s over two store objects on one
database, wired as `wiring/settings.py` wires a platform (`share_wakeups`). On PostgreSQL a
claim or a blocking read waiting on one is woken by a change made on the other: their
re-check is made 30 s, far longer than any wait here, so a wait that ends was woken (MySQL's
wake-ups: test_mysql_wakeups_across_platforms.py). Nothing here asserts a duration;
`HANG_S` only stops a wait for something that must happen.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from fastapi.testclient import TestClient

from moonrun.backoff import Backoff
from moonrun.scheduling.jobs import JobState
from moonrun.service.scheduling import SchedulingService
from moonrun.service.waiting import Waiting
from moonrun.store.mysql_wakeups import MySQLWakeups
from moonrun.store.pg_wakeups import PostgresWakeups
from moonrun.store.postgres import PostgresStore
from moonrun.store.protocol import Store
from moonrun.wiring.app import create_app
from moonrun.wiring.settings import (
    PlatformConfig,
    build_platform,
    share_wakeups,
)
from tests.support.harness import World
from tests.support.stores import postgres_factory

T = TypeVar("T")
LONG_S = 30.0
"""The waits' re-check and length here: far longer than any test, so a wait that ends early
was woken."""
HANG_S = 10.0
"""A hang guard: a wait that must end, but did not within this, failed."""


class Lent:
    """What one request lends the service: store work inline, a place, a client that stays."""

    def __init__(self) -> None:
        self.reads = 0

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        self.reads += 1
        return work(*args)

    def leave(self) -> None:
        pass

    def enter(self) -> None:
        pass

    async def gone(self) -> None:
        await asyncio.Event().wait()

    def waiting(self) -> Waiting:
        return Waiting(self.run, self, self.gone, "192.0.2.1")


@dataclass
class Pair:
    """Platform A (the harness's world) and platform B: another store object and service
    over the same database."""

    world: World
    store: Store
    service: SchedulingService
    peers: list[PostgresWakeups | MySQLWakeups]

    def wait_for_claim(self, session_id: str, lent: Lent) -> Any:
        return self.service.wait_for_claim(session_id, 1, wait_s=LONG_S, waiting=lent.waiting())


def build_pair(world: World, other: Store, reconnect: Backoff | None = None) -> Pair:
    service = SchedulingService(other, world.clock, world.tokens, world.settings)
    peers = []
    for store, each in ((world.store, world.service), (other, service)):
        each.waiters.recheck_s = LONG_S
        wakeups = share_wakeups(store, each)
        if wakeups is not None:
            if reconnect is not None:
                wakeups._reconnect = reconnect
            wakeups.start()
            peers.append(wakeups)
    for wakeups in peers:
        assert wakeups.listening.wait(HANG_S)
        if isinstance(wakeups, PostgresWakeups):  # each announces once it heard the other
            assert heard_of_another(wakeups)
    return Pair(world, other, service, peers)


def heard_of_another(wakeups: PostgresWakeups) -> bool:
    give_up = time.monotonic() + HANG_S
    while not wakeups.others_listen():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.001)
    return True


@pytest.fixture
def postgres_pair(postgres_url: str) -> Iterator[Pair]:
    world = World(postgres_factory(postgres_url))
    pair = build_pair(world, PostgresStore(postgres_url))
    yield pair
    for wakeups in pair.peers:
        wakeups.stop()
    pair.store.close()
    world.store.close()


async def waits(service: SchedulingService, room: str) -> None:
    """Until a request waits in `room` on `service`."""
    for _ in range(1000):
        if service.waiters.held(room):
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"nothing waits in {room}")


def test_a_claim_waiting_on_one_postgres_platform_is_woken_by_a_job_created_on_another(
    postgres_pair: Pair,
) -> None:
    world = postgres_pair.world
    run = world.run().start()

    async def scenario() -> None:
        lent = Lent()
        claim = asyncio.ensure_future(postgres_pair.wait_for_claim(run.session_id, lent))
        await waits(postgres_pair.service, "claims")
        job = world.submit()
        granted = await asyncio.wait_for(claim, HANG_S)
        assert [each.job_id for each in granted.jobs] == [job.id]
        assert postgres_pair.service.waiters.wakeups >= 1

    asyncio.run(scenario())


def test_a_blocking_read_on_one_postgres_platform_is_woken_by_a_cancel_on_another(
    postgres_pair: Pair,
) -> None:
    world = postgres_pair.world
    job = world.submit()

    async def scenario() -> None:
        read = asyncio.ensure_future(
            postgres_pair.service.wait_for_job(
                lambda: world.owner,
                job.id,
                lambda job: job.state.is_terminal,
                wait_s=LONG_S,
                waiting=Lent().waiting(),
            )
        )
        await waits(postgres_pair.service, "reads")
        world.service.cancel_job(world.owner, job.id)
        ended = await asyncio.wait_for(read, HANG_S)
        assert ended.state is JobState.CANCELLED

    asyncio.run(scenario())


def end_listener(wakeups: PostgresWakeups | MySQLWakeups, url: str) -> None:
    """End the listener's connection from the server's side, as a restart or a network cut
    would."""
    pid = wakeups.listener_pid
    assert pid is not None
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_dropped_listener_connection_reconnects_and_wake_ups_resume(
    postgres_pair: Pair, postgres_url: str
) -> None:
    world = postgres_pair.world
    listener = postgres_pair.peers[1]
    run = world.run().start()
    end_listener(listener, postgres_url)
    for _ in range(int(HANG_S / 0.01)):
        if listener.connects >= 2 and listener.listening.is_set():
            break
        threading.Event().wait(0.01)
    assert listener.connects == 2
    assert listener.listening.is_set()

    async def scenario() -> None:
        claim = asyncio.ensure_future(postgres_pair.wait_for_claim(run.session_id, Lent()))
        await waits(postgres_pair.service, "claims")
        job = world.submit()
        granted = await asyncio.wait_for(claim, HANG_S)
        assert [each.job_id for each in granted.jobs] == [job.id]

    asyncio.run(scenario())


def test_a_change_made_while_the_listener_was_away_wakes_the_waiters_once_it_listens_again(
    postgres_url: str,
) -> None:
    """The notification of a change made while the listener was away is lost; once listening
    again, the listener wakes every waiter to read again, so none waits for its re-check."""
    world = World(postgres_factory(postgres_url))
    # Reconnect after exactly 1 s: time to make a change nobody listens to.
    pair = build_pair(world, PostgresStore(postgres_url), Backoff(1.0, 1.0, draw=lambda: 1.0))
    listener = pair.peers[1]
    run = world.run().start()
    try:

        async def scenario() -> None:
            claim = asyncio.ensure_future(pair.wait_for_claim(run.session_id, Lent()))
            await waits(pair.service, "claims")
            end_listener(listener, postgres_url)
            while listener.listening.is_set():
                await asyncio.sleep(0.001)
            job = world.submit()
            granted = await asyncio.wait_for(claim, HANG_S)
            assert [each.job_id for each in granted.jobs] == [job.id]
            assert listener.connects == 2

        asyncio.run(scenario())
    finally:
        for wakeups in pair.peers:
            wakeups.stop()
        pair.store.close()
        world.store.close()


# -- the wiring --------------------------------------------------------------------------------


def test_a_postgres_platform_listens_while_its_app_runs_and_other_stores_share_no_wake_ups(
    postgres_url: str, tmp_path: Path
) -> None:
    """`build_platform` gives a PostgreSQL platform its wake-ups (none on the file store);
    the app's lifespan starts them, and stops them at shutdown."""
    file_platform = build_platform(
        PlatformConfig(store_url=f"file:{tmp_path / 'platform.db'}", data_dir=tmp_path)
    )
    try:
        assert file_platform.peers is None
    finally:
        file_platform.close()
        file_platform.release()
    platform = build_platform(
        PlatformConfig(
            store_url=postgres_url, secret_file=tmp_path / "platform.secret", data_dir=tmp_path
        )
    )
    try:
        peers = platform.peers
        assert peers is not None
        assert not peers.listening.is_set()
        with TestClient(create_app(platform, sweep=False)):
            assert peers.listening.wait(HANG_S)
        assert not peers.listening.is_set()
        assert peers.listener_pid is None
    finally:
        platform.close()
        platform.release()


def test_each_reconnection_after_listening_again_starts_its_pauses_afresh(
    postgres_url: str,
) -> None:
    """The backoff grows only while connecting fails: a listener that listened again and
    then lost its connection once more pauses the first pause again (here 50 ms; the
    second would be 50 s)."""
    world = World(postgres_factory(postgres_url))
    pair = build_pair(
        world, PostgresStore(postgres_url), Backoff(0.05, 60.0, multiplier=1000, draw=lambda: 1.0)
    )
    listener = pair.peers[1]
    try:
        for times in (2, 3):
            end_listener(listener, postgres_url)
            for _ in range(int(HANG_S / 0.01)):
                if listener.connects == times and listener.listening.is_set():
                    break
                threading.Event().wait(0.01)
            assert listener.connects == times
    finally:
        for wakeups in pair.peers:
            wakeups.stop()
        pair.store.close()
        world.store.close()


def test_a_postgres_platform_alone_announces_nothing_until_another_listens(
    postgres_url: str,
) -> None:
    """Alone on its database a process makes no notifying commit for its changes; a second
    process that starts listening is heard by the first, and each then announces."""
    world = World(postgres_factory(postgres_url))
    first = share_wakeups(world.store, world.service)
    assert isinstance(first, PostgresWakeups)
    first.start()
    second_store = PostgresStore(postgres_url)
    second: PostgresWakeups | None = None
    try:
        assert first.listening.wait(HANG_S)
        world.submit()
        assert first.unsent >= 1
        assert not first.others_listen()

        second_service = SchedulingService(second_store, world.clock, world.tokens, world.settings)
        second = share_wakeups(second_store, second_service)
        assert isinstance(second, PostgresWakeups)
        second.start()
        assert heard_of_another(first)
        assert heard_of_another(second)
        unsent = first.unsent
        world.submit()
        assert first.unsent == unsent
    finally:
        for wakeups in (first, second):
            if wakeups is not None:
                wakeups.stop()
        second_store.close()
        world.store.close()
