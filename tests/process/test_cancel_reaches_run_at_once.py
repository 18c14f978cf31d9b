"""A cancel reaches a running command at once: with a lease of 120 s (renewals every 30 s,
when Run used to learn of a cancel), the command's process is gone a moment after the
cancel request, through the cancel watch Run keeps open (docs/protocol.md, "Cancellation").

The latencies (cancel request to the process gone) are printed, not asserted: a test on a
shared machine keeps no timing bound but its hang guard, which lies well below the 30 s a
renewal would have taken."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from tests.process.test_run_e2e import wait_running
from tests.support.e2e import cluster
from tests.support.launcher import Timings, pid_alive, wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

LONG_LEASE = Timings(lease_ttl_s=120, ack_timeout_s=10, session_ttl_s=20)
CANCELS = 6
HANG_GUARD_S = 15.0
"""Half of a renewal's interval (lease_ttl/4 = 30 s): only the cancel watch is this fast."""


def test_a_cancel_stops_a_running_command_long_before_its_next_renewal(tmp_path: Path) -> None:
    latencies: list[float] = []
    with cluster(tmp_path, timings=LONG_LEASE) as cl:
        run = cl.add_run(capacity=2)
        server = cl.create_server("web-1", run.endpoint_id)
        for n in range(CANCELS):
            pidfile = cl.pidfile(f"command-{n}")
            script = f'echo $$ > "{pidfile}"; exec sleep 600'
            job = cl.submit(server, "command", {"argv": ["sh", "-c", script]})
            wait_running(cl, run, job["id"])
            pid = cl.wait_pid(pidfile)

            asked = time.monotonic()
            answer = cl.api("POST", f"/api/v1/jobs/{job['id']}/cancel")
            wait_for(
                lambda p=pid: not pid_alive(p),
                f"the command {pid} to stop after its cancel",
                timeout_s=HANG_GUARD_S,
                every_s=0.01,
            )
            latencies.append(time.monotonic() - asked)
            assert answer.status_code == 202, answer.text
            done = cl.wait_state(job["id"], "cancelled", timeout_s=HANG_GUARD_S)
            assert done["cancel"]["result"] == "cancelled"
    ranked = sorted(latencies)
    print(
        f"\ncancel request to the command gone, {CANCELS} cancels: "
        f"median {statistics.median(ranked) * 1000:.0f} ms, max {ranked[-1] * 1000:.0f} ms"
    )
