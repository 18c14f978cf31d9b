"""Wake-ups across platform processes on one MySQL database (`store/mysql_wakeups.py`).

Two platforms in one test process, as in test_wakeups_across_platforms.py: two
`SchedulingService`s over two store objects on one database, wired by `share_wakeups`. Their
re-check is made 30 s, far longer than any wait here, so a wait that ends was woken by the
other process's row in `job_wakeups`. Nothing here asserts a duration; `HANG_S` only stops a
wait for something that must happen.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from moonrun.backoff import Backoff
from moonrun.scheduling.jobs import JobState
from moonrun.service.config import WaitLimits
from moonrun.service.scheduling import SchedulingService
from moonrun.store.mysql import MySQLStore
from moonrun.store.mysql_wakeups import MySQLWakeups
from moonrun.wiring.app import create_app
from moonrun.wiring.settings import (
    SAFETY_RECHECK_S,
    PlatformConfig,
    build_platform,
    recheck_s,
    share_wakeups,
)
from tests.integration.test_wakeups_across_platforms import (
    HANG_S,
    LONG_S,
    Lent,
    Pair,
    build_pair,
    waits,
)
from tests.support.harness import World
from tests.support.stores import mysql_factory


def admin(url: str) -> pymysql.connections.Connection:
    parsed = make_url(url)
    return pymysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "",
        password=parsed.password or "",
        database=parsed.database,
        autocommit=True,
    )


def mysql_pair(url: str, reconnect: Backoff | None = None) -> Pair:
    return build_pair(World(mysql_factory(url)), MySQLStore(url), reconnect)


def pollers(pair: Pair) -> list[MySQLWakeups]:
    """The pair's wake-ups: MySQL's, A's then B's."""
    found = [each for each in pair.peers if isinstance(each, MySQLWakeups)]
    assert found == pair.peers
    return found


def close(pair: Pair) -> None:
    for wakeups in pair.peers:
        wakeups.stop()
    pair.store.close()
    pair.world.store.close()


@pytest.fixture
def pair(mysql_url: str) -> Iterator[Pair]:
    made = mysql_pair(mysql_url)
    yield made
    close(made)


def test_a_mysql_store_shares_wake_ups_and_waits_look_again_only_every_five_seconds(
    pair: Pair,
) -> None:
    assert len(pollers(pair)) == 2
    assert recheck_s(pair.store) == SAFETY_RECHECK_S == 5.0


def test_a_claim_waiting_on_one_mysql_platform_is_woken_by_a_job_created_on_another(
    pair: Pair,
) -> None:
    world = pair.world
    run = world.run().start()

    async def scenario() -> None:
        lent = Lent()
        claim = asyncio.ensure_future(pair.wait_for_claim(run.session_id, lent))
        await waits(pair.service, "claims")
        job = world.submit()
        granted = await asyncio.wait_for(claim, HANG_S)
        assert [each.job_id for each in granted.jobs] == [job.id]
        assert pair.service.waiters.wakeups >= 1

    asyncio.run(scenario())


def test_a_blocking_read_on_one_mysql_platform_is_woken_by_a_cancel_on_another(
    pair: Pair,
) -> None:
    world = pair.world
    job = world.submit()

    async def scenario() -> None:
        read = asyncio.ensure_future(
            pair.service.wait_for_job(
                lambda: world.owner,
                job.id,
                lambda job: job.state.is_terminal,
                wait_s=LONG_S,
                waiting=Lent().waiting(),
            )
        )
        await waits(pair.service, "reads")
        world.service.cancel_job(world.owner, job.id)
        ended = await asyncio.wait_for(read, HANG_S)
        assert ended.state is JobState.CANCELLED

    asyncio.run(scenario())


def test_a_process_is_not_woken_by_its_own_rows(pair: Pair) -> None:
    """A's own change wakes A's waiters from its service; its row is for B alone."""
    a, b = pollers(pair)
    heard: list[tuple[str, str | None]] = []
    a._heard = lambda job_id, endpoint_id: heard.append((job_id, endpoint_id))
    b_heard: list[tuple[str, str | None]] = []
    b._heard = lambda job_id, endpoint_id: b_heard.append((job_id, endpoint_id))
    job = pair.world.submit()
    polls = a.polls
    for _ in range(int(HANG_S / 0.01)):
        if b_heard and a.polls > polls + 1:
            break
        threading.Event().wait(0.01)
    assert b_heard == [(job.id, job.endpoint_id)]
    assert heard == []


def end_poller(wakeups: MySQLWakeups, url: str) -> None:
    """End the poller's connection from the server's side, as a restart or a cut would."""
    thread_id = wakeups.listener_pid
    assert thread_id is not None
    with admin(url) as connection, connection.cursor() as cursor:
        cursor.execute(f"KILL {int(thread_id)}")


def test_a_broken_poller_connection_reconnects_wakes_every_waiter_and_wake_ups_resume(
    mysql_url: str,
) -> None:
    """What was written while the poller was away is not read: once polling again it wakes
    every waiter to look again (`missed()`), so none waits for its re-check; then the other
    process's changes wake them again."""
    # Reconnect after exactly 1 s: time to make a change nobody polls for.
    pair = mysql_pair(mysql_url, Backoff(1.0, 1.0, draw=lambda: 1.0))
    poller = pollers(pair)[1]
    world = pair.world
    run = world.run().start()
    try:

        async def scenario() -> None:
            claim = asyncio.ensure_future(pair.wait_for_claim(run.session_id, Lent()))
            await waits(pair.service, "claims")
            end_poller(poller, mysql_url)
            while poller.listening.is_set():
                await asyncio.sleep(0.001)
            job = world.submit()
            granted = await asyncio.wait_for(claim, HANG_S)
            assert [each.job_id for each in granted.jobs] == [job.id]
            assert poller.connects == 2
            # Polling again: the next change wakes a new claim as before.
            again = asyncio.ensure_future(pair.wait_for_claim(run.session_id, Lent()))
            await waits(pair.service, "claims")
            second = world.submit()
            granted = await asyncio.wait_for(again, HANG_S)
            assert [each.job_id for each in granted.jobs] == [second.id]

        asyncio.run(scenario())
    finally:
        close(pair)


def test_idle_waiting_claims_cost_one_poll_per_process_not_one_read_per_claim(
    mysql_url: str,
) -> None:
    """N claims wait on platform B with the re-check the wiring gives MySQL: while nothing
    changes, B reads the store once per poll, and the claims do not read (each looks again
    only after 2.5 to 5 s). Counted, not timed: the window is ten of B's polls, which at the
    old 0.25 s re-check gave every claim about ten reads."""
    claims = 50
    world = World(mysql_factory(mysql_url))
    other = MySQLStore(mysql_url)
    service = SchedulingService(
        other,
        world.clock,
        world.tokens,
        world.settings,
        WaitLimits(recheck_s=recheck_s(other)),
    )
    poller = share_wakeups(other, service)
    assert isinstance(poller, MySQLWakeups)
    poller.start()
    runs = [world.run(world.join(f"host-{n}", 10 + n)).start() for n in range(claims)]
    try:

        async def scenario() -> None:
            lent = Lent()
            waiting = [
                asyncio.ensure_future(
                    service.wait_for_claim(run.session_id, 1, wait_s=LONG_S, waiting=lent.waiting())
                )
                for run in runs
            ]
            for _ in range(int(HANG_S / 0.001)):
                if service.waiters.held("claims") == claims:
                    break
                await asyncio.sleep(0.001)
            assert service.waiters.held("claims") == claims, [w for w in waiting if w.done()]
            first, polls = lent.reads, poller.polls
            for _ in range(int(HANG_S / 0.01)):
                if poller.polls >= polls + 10:
                    break
                await asyncio.sleep(0.01)
            assert poller.polls >= polls + 10
            assert lent.reads - first <= claims // 10, (first, lent.reads)  # a handful at most
            service.waiters.stop()
            await asyncio.gather(*waiting)

        asyncio.run(scenario())
    finally:
        poller.stop()
        other.close()
        world.store.close()


def test_a_mysql_platform_polls_while_its_app_runs(mysql_url: str, tmp_path: Path) -> None:
    """`build_platform` gives a MySQL platform its wake-ups; the app's lifespan starts the
    poller, and stops it (and closes its connection) at shutdown."""
    platform = build_platform(
        PlatformConfig(
            store_url=mysql_url, secret_file=tmp_path / "platform.secret", data_dir=tmp_path
        )
    )
    try:
        peers = platform.peers
        assert isinstance(peers, MySQLWakeups)
        assert platform.service.waiters.recheck_s == SAFETY_RECHECK_S
        assert not peers.listening.is_set()
        with TestClient(create_app(platform, sweep=False)):
            assert peers.listening.wait(HANG_S)
        assert not peers.listening.is_set()
        assert peers.listener_pid is None
    finally:
        platform.close()
        platform.release()
