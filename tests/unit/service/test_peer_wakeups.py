"""What the other platform processes are told of this one's job changes (`Announcer`), and
what a change they announce wakes here (`Watch.peer_changed`, `Watch.peers_missed`): the
same waiters a local change would, each to read the store again (the record did not travel).
"""

from __future__ import annotations

import asyncio

from moonrun.service.waiting import ENDPOINT, JOB, Announcer, Watch
from tests.support.harness import World
from tests.support.stores import memory_factory


class Told:
    """Peers that record what they were told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str | None]] = []

    def announce(self, job_id: str, endpoint_id: str | None) -> None:
        self.told.append((job_id, endpoint_id))


def test_peers_hear_each_job_change_with_its_endpoint_only_when_it_concerns_claims() -> None:
    """A create (claimable) and a result (a place of capacity frees) name the endpoint; a
    claim and an ack (nothing claimable, no place freed) name only the job."""
    world = World(memory_factory())
    peers = Told()
    world.service.listen(Announcer(peers))
    run = world.run().start()
    job = world.submit()
    endpoint = world.endpoint.id
    assert peers.told == [(job.id, endpoint)]
    (granted,) = run.claim()
    run.ack(job.id, granted.attempt)
    run.result(job.id, granted.attempt)
    assert peers.told == [(job.id, endpoint), (job.id, None), (job.id, None), (job.id, endpoint)]


def test_a_peers_change_wakes_every_reader_of_the_job_and_its_endpoints_claims_if_named() -> None:
    async def scenario() -> None:
        watch = Watch()
        picky = watch.register(JOB, "job-1", wanted=lambda job: False)
        other = watch.register(JOB, "job-2")
        claims = watch.register(ENDPOINT, "ep-1")
        watch.peer_changed("job-1", None)
        await asyncio.sleep(0)
        # The reader waits for a record no change gives it: woken all the same, to read again.
        assert (picky.event.is_set(), other.event.is_set(), claims.event.is_set()) == (
            True,
            False,
            False,
        )
        watch.peer_changed("job-3", "ep-1")
        await asyncio.sleep(0)
        assert (other.event.is_set(), claims.event.is_set()) == (False, True)

    asyncio.run(scenario())


def test_when_peers_changes_may_have_gone_unheard_every_waiter_looks_again() -> None:
    async def scenario() -> None:
        watch = Watch()
        waiters = [watch.register(JOB, "job-1"), watch.register(ENDPOINT, "ep-1")]
        watch.peers_missed()
        await asyncio.sleep(0)
        assert [waiter.event.is_set() for waiter in waiters] == [True, True]

    asyncio.run(scenario())
