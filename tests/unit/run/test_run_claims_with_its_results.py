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

from moonrun.run.handlers.noop import NoopHandler
from tests.support.run_kit import FakeRunClient, run_agent

JOBS = 5
HANG_GUARD_S = 60.0


@pytest.mark.parametrize("grants_with_results", [True, False], ids=["says so", "older"])
def test_a_busy_run_claims_its_next_jobs_with_its_results(
    tmp_path: Path, grants_with_results: bool
) -> None:
    client = FakeRunClient(jobs=True, record=False, claims_with_results=grants_with_results)
    run = run_agent(tmp_path, client, {"noop": NoopHandler()}, jobs=JOBS, capacity=1)
    asyncio.run(asyncio.wait_for(run, HANG_GUARD_S))
    by_results = JOBS - 1 if grants_with_results else 0
    # The first job is claimed apart, and so is the wait for more once the last has run.
    assert (client.reported, client.acked, client.claimed_with_results) == (JOBS, JOBS, by_results)
    assert client.claims == JOBS + 1 - by_results
