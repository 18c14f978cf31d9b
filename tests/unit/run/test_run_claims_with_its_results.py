"""Run asks for its next jobs with its results when the platform grants with results
(docs/protocol.md, "Claims with results"): the places a results batch frees are claimed in
that request, and what it grants is journaled and started, so a busy Run's next job comes one
round trip sooner. Against a platform that does not say so, its results carry no claim.

One real `Agent` against the fake platform of `tests/support/run_kit.py`, capacity 1: after
the first claim, every job comes in the answer to the result before it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from moonrun.run.agent import Agent, RunConfig
from moonrun.run.handlers.noop import NoopHandler
from moonrun.run.identity import Identity
from moonrun.run.journal import Journal
from tests.support.run_kit import FakeRunClient

JOBS = 5
HANG_GUARD_S = 60.0


async def run_jobs(tmp_path: Path, client: FakeRunClient) -> None:
    config = RunConfig(
        platform_url="http://fake.invalid", data_dir=tmp_path, capacity=1, claim_wait_s=25.0
    )
    identity = Identity.__new__(Identity)  # never used: the fake client signs nothing
    agent = Agent(config, identity, Journal.open(tmp_path), {"noop": NoopHandler()}, client=client)  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        client.offer(JOBS)
        while client.reported < JOBS or agent._running:
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(running, HANG_GUARD_S)


@pytest.mark.parametrize("grants_with_results", [True, False], ids=["says so", "older"])
def test_a_busy_run_claims_its_next_jobs_with_its_results(
    tmp_path: Path, grants_with_results: bool
) -> None:
    client = FakeRunClient(jobs=True, record=False, claims_with_results=grants_with_results)
    asyncio.run(asyncio.wait_for(run_jobs(tmp_path, client), HANG_GUARD_S))
    by_results = JOBS - 1 if grants_with_results else 0
    # The first job is claimed apart, and so is the wait for more once the last has run.
    assert (client.reported, client.acked, client.claimed_with_results) == (JOBS, JOBS, by_results)
    assert client.claims == JOBS + 1 - by_results
