"""A change another platform process announces wakes this one's waiters whoever else waits:
the only waiter of the process, a reader of the job when no claim waits on the endpoint
named; and every waiter so woken is counted in `Watch.wakeups`, on top of those before
(`peer_changed` and `peers_missed` alike)."""

from __future__ import annotations

import asyncio

from moonrun.service.waiting import ENDPOINT, JOB, Watch


def test_a_peers_change_wakes_the_only_waiter_of_the_process() -> None:
    async def scenario() -> None:
        watch = Watch()
        reader = watch.register(JOB, "job-1")
        watch.peer_changed("job-1", None)
        await asyncio.sleep(0)
        assert (reader.event.is_set(), watch.wakeups) == (True, 1)

    asyncio.run(scenario())


def test_a_peers_change_naming_an_endpoint_nobody_claims_on_wakes_the_jobs_reader() -> None:
    async def scenario() -> None:
        watch = Watch()
        reader = watch.register(JOB, "job-1")
        elsewhere = watch.register(ENDPOINT, "ep-2")
        watch.peer_changed("job-1", "ep-1")
        await asyncio.sleep(0)
        assert (reader.event.is_set(), elsewhere.event.is_set()) == (True, False)

    asyncio.run(scenario())


def test_every_waiter_a_peers_change_wakes_is_counted_on_top_of_those_before() -> None:
    async def scenario() -> None:
        watch = Watch()
        for _ in range(2):
            watch.register(JOB, "job-1")
        watch.register(ENDPOINT, "ep-1")
        watch.peer_changed("job-1", "ep-1")
        assert watch.wakeups == 3
        watch.peer_changed("job-1", None)
        assert watch.wakeups == 5
        watch.peers_missed()
        assert watch.wakeups == 8
        watch.peers_missed()
        assert watch.wakeups == 11
        await asyncio.sleep(0)

    asyncio.run(scenario())
