"""Stopping the platform (SIGTERM) is quick and quiet: waiting claims and blocking reads are
answered at once (an empty grant, the job as it is), so no connection is held until the
graceful shutdown's end and nothing is logged at error level (docs/operations.md, "The
platform")."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from moonrun.service.waiting import Waiting, Watch
from tests.e2e import cluster

GRACEFUL_SHUTDOWN_S = 10
"""`moonrun platform serve`'s graceful shutdown: before this change every stop took it whole."""


@pytest.mark.processes
def test_a_platform_with_a_run_and_a_blocking_read_stops_well_within_its_shutdown_grace(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as cl:
        run = cl.add_run("host-1")
        server = cl.create_server("server-1", run.endpoint_id)
        later = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        job = cl.submit(server, "noop", not_before=later)
        answered: list[httpx.Response] = []

        def blocking_read() -> None:
            with httpx.Client(base_url=cl.platform.url, timeout=90) as user:
                answered.append(
                    user.get(
                        f"/api/v1/jobs/{job['id']}",
                        params={"wait_s": 60, "until": "terminal"},
                        headers=dict(cl.platform.client.headers) if cl.platform.client else {},
                    )
                )

        reader = threading.Thread(target=blocking_read)
        reader.start()
        time.sleep(1.0)  # the read and Run's claim are waiting at the platform
        started = time.monotonic()
        cl.platform.terminate()
        code = cl.platform.wait_exit()
        took = time.monotonic() - started
        reader.join(timeout=30)
        log = cl.platform.log.read_text()
    assert code in (0, -15)  # uvicorn raises the SIGTERM it caught again, once it has stopped
    # Generous, this lane runs alone: the old stop took the whole graceful shutdown (10 s+).
    assert took < GRACEFUL_SHUTDOWN_S / 2, f"the platform took {took:.1f} s to stop"
    assert [(r.status_code, r.json()["state"]) for r in answered] == [(200, "queued")]
    errors = [
        line
        for line in log.splitlines()
        if line.startswith("{") and json.loads(line).get("level") in ("error", "critical")
    ]
    assert errors == []
    assert "Traceback" not in log


def test_a_stopping_watch_answers_every_waiter_at_once_with_what_it_read_last() -> None:
    watch = Watch()
    reads: list[int] = []

    class Place:
        def leave(self) -> None: ...

        def enter(self) -> None: ...

    async def run(work, *args):  # type: ignore[no-untyped-def]
        return work(*args)

    async def never_gone() -> None:
        await asyncio.Event().wait()

    def read() -> int:
        reads.append(len(reads))
        return len(reads)

    async def scenario() -> int:
        waiting = Waiting(run, Place(), never_gone)
        stopper = threading.Timer(0.2, watch.stop)
        stopper.start()
        value = await watch.wait_until(
            read,
            lambda _: False,
            on=("job", "job_1"),
            rooms=(),
            deadline=time.monotonic() + 3600,
            waiting=waiting,
        )
        stopper.join()
        return value

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 1
    assert (reads, watch.waiting) == ([0], 0)
    assert watch.stopping
