"""`AsyncClient` on one event loop against a real platform and a real Run (issue 28, point 11):
jobs submitted, waited on and followed side by side; a followed log and a cancel at once; a
`wait()` that rides through a platform restart. (Every test of tests/process/test_client.py
runs against `AsyncClient` too; these are what only an event loop does.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.client import AsyncClient, Job, JobState
from moonrun.errors import NotFound
from tests.support.e2e import Cluster, Server, cluster
from tests.support.launcher import ADMIN_TOKEN

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Server]]:
    with cluster(tmp_path_factory.mktemp("async-client")) as cl:
        run = cl.add_run()
        yield cl, cl.create_server("web-1", run.endpoint_id)


def test_jobs_submitted_at_once_are_waited_on_and_followed_side_by_side(
    shared: tuple[Cluster, Server],
) -> None:
    cl, server = shared

    async def one(client: AsyncClient, n: int) -> tuple[str, list[str]]:
        argv = ["sh", "-c", f"echo job {n}"]
        job = await client.submit(server.id, "command", {"argv": argv})
        ended = await client.wait(job.id, timeout_s=60, logs=True)
        return ended.state, [line.text async for line in client.logs(job.id, follow=True)]

    async def main() -> list[tuple[str, list[str]]]:
        async with AsyncClient(cl.platform.url, ADMIN_TOKEN) as client:
            return await asyncio.gather(*(one(client, n) for n in range(5)))

    with cl.explained():
        outcomes = asyncio.run(main())
    assert outcomes == [(JobState.SUCCEEDED, [f"job {n}"]) for n in range(5)]


def test_a_followed_log_ends_when_a_cancel_sent_beside_it_ends_the_job(
    shared: tuple[Cluster, Server],
) -> None:
    """One task follows a running command's log; another cancels the job once its first line
    came: the follow ends, the job is cancelled, and a cancel of no job raises `NotFound`."""
    cl, server = shared
    script = "echo first; sleep 60; echo never"

    async def main() -> tuple[list[str], Job, Job, str]:
        async with AsyncClient(cl.platform.url, ADMIN_TOKEN) as client:
            job = await client.submit(
                server.id, "command", {"argv": ["sh", "-c", script], "timeout_s": 120}
            )
            first = asyncio.Event()
            seen: list[str] = []

            async def follow() -> None:
                async for line in client.logs(job.id, follow=True):
                    seen.append(line.text)
                    first.set()

            following = asyncio.create_task(follow())
            await asyncio.wait_for(first.wait(), timeout=60)
            intent = await client.cancel(job.id)
            await asyncio.wait_for(following, timeout=60)
            ended = await client.wait(job.id, timeout_s=60)
            try:
                await client.cancel("job_doesnotexist0000")
            except NotFound as error:
                code = error.code
            return seen, intent, ended, code

    with cl.explained():
        seen, intent, ended, code = asyncio.run(main())
    assert (seen, intent.data["cancel"]["requested"]) == (["first"], True)
    assert (ended.state, code) == (JobState.CANCELLED, "not_found")


def test_wait_rides_through_a_platform_restart_to_the_jobs_outcome(tmp_path: Path) -> None:
    """The platform is SIGKILLed and started again while `wait()` holds a blocking read: the
    wait resumes once it answers (one retry a request: only the outage grace carries it) and
    answers the job succeeded, with its log."""
    with cluster(tmp_path) as cl:
        run = cl.add_run()
        server = cl.create_server("web-1", run.endpoint_id)

        async def main() -> tuple[Job, list[str]]:
            async with AsyncClient(
                cl.platform.url, ADMIN_TOKEN, retries=1, outage_grace_s=60
            ) as client:
                argv = ["sh", "-c", "sleep 2; echo done"]
                job = await client.submit(server.id, "command", {"argv": argv})
                waiting = asyncio.create_task(client.wait(job.id, timeout_s=120, logs=True))
                await asyncio.to_thread(cl.wait_state, job.id, "running")
                await asyncio.to_thread(cl.platform.restart)
                ended = await waiting
                return ended, [line.text async for line in client.logs(job.id)]

        with cl.explained():
            ended, lines = asyncio.run(main())
    assert (ended.state, ended.logs_complete, lines) == (JobState.SUCCEEDED, True, ["done"])
