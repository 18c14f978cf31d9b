"""Logs that survive restarts, with real processes: a platform SIGKILLed while a job writes
its output loses none of the lines it acknowledged (issue 12 item 2; docs/protocol.md, "Logs on
disk")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e import Cluster, Server, cluster
from tests.support.launcher import wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes


@pytest.fixture
def one_host(tmp_path: Path) -> Iterator[tuple[Cluster, Server]]:
    with cluster(tmp_path) as cl:
        run = cl.add_run("host-1")
        yield cl, cl.create_server("server-1", run.endpoint_id)


def test_a_job_writing_across_a_platform_kill_keeps_every_line_in_order(
    one_host: tuple[Cluster, Server],
) -> None:
    """1,000 lines written slowly across a SIGKILL and restart of the platform: the job's logs
    hold exactly lines 1..1000 in order (Run sends again what was not acknowledged)."""
    cl, server = one_host
    script = "for i in $(seq 1 1000); do echo line-$i; sleep 0.003; done"
    with cl.explained():
        job = cl.submit(server, "command", {"argv": ["sh", "-c", script]})

        def some_lines() -> list[dict[str, Any]] | None:
            lines = cl.logs(job["id"])
            return lines if len(lines) >= 50 else None

        before = wait_for(some_lines, "the job's first 50 log lines")
        cl.platform.restart()
        done = cl.wait_state(job["id"], "succeeded", "failed", "cancelled", timeout_s=60)

        def all_lines() -> list[dict[str, Any]] | None:
            lines = cl.logs(job["id"])
            return lines if len(lines) >= 1000 else None

        lines = wait_for(all_lines, "the job's 1,000 log lines")
    assert len(before) < 1000  # the kill came while the job was still writing
    assert (done["state"], [line["text"] for line in lines]) == (
        "succeeded",
        [f"line-{n}" for n in range(1, 1001)],
    )
