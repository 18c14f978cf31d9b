"""A blocking read waiting for a job's logs to be complete (`until=logs_complete`) on one
platform process is woken when Run's final log batch lands on another, over one PostgreSQL
database and one shared log directory (docs/operations.md, "Several platforms"): the final
batch is announced to the other processes as a job change is. The re-check is made 30 s here,
so a wait that ends was woken."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.protocol import LogLine
from moonrun.scheduling.jobs import Job
from moonrun.store.postgres import PostgresStore
from tests.integration.test_wakeups_across_platforms import (
    HANG_S,
    LONG_S,
    Lent,
    Pair,
    build_pair,
    waits,
)
from tests.support.harness import World
from tests.support.stores import postgres_factory


@pytest.fixture
def pair(postgres_url: str) -> Iterator[Pair]:
    world = World(postgres_factory(postgres_url))
    built = build_pair(world, PostgresStore(postgres_url))
    yield built
    for wakeups in built.peers:
        wakeups.stop()
    built.store.close()
    world.store.close()


def test_a_read_waiting_for_logs_on_one_platform_is_woken_by_the_final_batch_on_another(
    pair: Pair, tmp_path: Path
) -> None:
    world = pair.world
    here, there = FileLogStore(tmp_path, shared=True), FileLogStore(tmp_path, shared=True)
    run = world.run().start()
    job = world.submit()
    attempt = run.run_to_running(job.id)
    assert run.result(job.id, attempt).state.value == "succeeded"

    def logs_complete(job: Job) -> bool:
        return job.state.is_terminal and there.complete(job.id, job.attempt)

    async def scenario() -> None:
        read = asyncio.ensure_future(
            pair.service.wait_for_job(
                lambda: world.owner,
                job.id,
                logs_complete,
                wait_s=LONG_S,
                waiting=Lent().waiting(),
            )
        )
        await waits(pair.service, "reads")
        line = LogLine(0, "2026-12-03T00:00:00.000Z", "stdout", "the last line")
        here.append(job.id, attempt, 0, [line], final=True)
        world.service.logs_completed(job.id)
        await asyncio.wait_for(read, HANG_S)

    asyncio.run(scenario())
    assert there.complete(job.id, attempt)
