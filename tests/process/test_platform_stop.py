"""Stopping the platform (SIGTERM) is quick and quiet: waiting claims and blocking reads are
answered at once (an empty grant, the job as it is), so no connection is held until the
graceful shutdown's end and nothing is logged at error level (docs/operations.md, "The
platform")."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.support.e2e import cluster

# A real platform and Run: the real-process lane of `make test` (docs/testing.md).
pytestmark = [pytest.mark.processes, pytest.mark.alone]

GRACEFUL_SHUTDOWN_S = 10
"""`moonrun platform serve`'s graceful shutdown: before this change every stop took it whole."""


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
