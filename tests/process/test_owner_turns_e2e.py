"""Owners take turns at claims, with a real platform and a real Run (issue 21, point 9).

Alice queues 8,000 no-ops on an endpoint, then Bob queues one. Claims used to take the
endpoint's oldest claimable jobs, so Bob's job waited behind all of Alice's (17 s in the
review); now owners take turns (docs/protocol.md, "Claims"), so it is granted in the Run's first
claims. Asserted on what the platform recorded (when each attempt was claimed), never on
elapsed time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.e2e import Cluster, Server, cluster

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

ALICE_JOBS = 8_000
BATCH = 1_000
CAPACITY = 8
OLDEST = 40
"""How many of Alice's oldest jobs are compared with Bob's: more than two claims' worth."""


def server_of(cl: Cluster, name: str, endpoint_id: str) -> Server:
    """A new user and a server of theirs on the endpoint."""
    user = cl.created("/api/v1/users", {"name": name, "platform_admin": False})["user"]
    body = {"name": f"{name}-server", "endpoint_id": endpoint_id, "owner_id": user["id"]}
    return Server(cl.created("/api/v1/servers", body)["id"], endpoint_id)


def claimed_at(cl: Cluster, job_id: str) -> str:
    """When the job's first attempt was claimed, once it has succeeded (RFC 3339, so that
    comparing the text compares the instants)."""
    view = cl.wait_state(job_id, "succeeded", timeout_s=180)
    at: str = view["history"][0]["claimed_at"]
    return at


def test_one_owners_8000_queued_jobs_do_not_hold_back_anothers_next_job(tmp_path: Path) -> None:
    """Alice's 8,000 no-ops, then Bob's one, on one endpoint; the Run (capacity 8) starts
    after both: Bob's job is claimed before Alice's 16th job (two claims' worth), where it
    used to be claimed after all 8,000."""
    with cluster(tmp_path) as cl:
        run = cl.add_run("shared", capacity=CAPACITY, start=False)
        alice = server_of(cl, "alice", run.endpoint_id)
        bob = server_of(cl, "bob", run.endpoint_id)
        alice_jobs: list[str] = []
        for _ in range(ALICE_JOBS // BATCH):
            batch = {"jobs": [{"kind": "noop"}] * BATCH}
            answer = cl.created(f"/api/v1/servers/{alice.id}/jobs/batch", batch)
            alice_jobs += [job["id"] for job in answer["jobs"]]
        bob_job = cl.submit(bob, "noop")["id"]

        started = time.monotonic()
        run.start()
        bob_claimed = claimed_at(cl, bob_job)
        print(f"Bob's job succeeded {time.monotonic() - started:.2f} s after the Run started")
        before_bob = [job for job in alice_jobs[:OLDEST] if claimed_at(cl, job) < bob_claimed]
        assert len(before_bob) < 2 * CAPACITY, (
            f"{len(before_bob)} of Alice's {OLDEST} oldest jobs were claimed before Bob's"
        )
