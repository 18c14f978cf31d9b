"""Child processes for the crash and race tests: `python -m tests.child crash|race ...`.

Each prints one line per transition *after* the platform acknowledged it, flushing at once,
so the parent knows exactly which writes were acknowledged when it kills the process.
"""

from __future__ import annotations

import sys

from moonrun.clock import SystemClock
from moonrun.errors import MoonrunError
from moonrun.platform.config import SchedulingSettings
from moonrun.platform.directory import Directory
from moonrun.platform.service import SchedulingService
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.messages import Evidence
from moonrun.security.tokens import SystemTokenSource
from moonrun.store import open_store

SETTINGS = SchedulingSettings(max_claim_batch=16, backoff_initial_s=0, backoff_max_s=0)


def report(job: Job | None, job_id: str, version: int | None = None) -> None:
    """`ack JOB VERSION STATE` for a write the store acknowledged."""
    if job is not None:
        print(f"ack {job.id} {job.version} {job.state.value}", flush=True)
    else:
        print(f"ack {job_id} {version} -", flush=True)


def crash(url: str, endpoint_id: str, server_id: str, admin_token: str) -> None:
    """Apply transitions forever: create, claim, ack, progress and result, reporting each."""
    store = open_store(url)
    service = SchedulingService(store, SystemClock(), SystemTokenSource(), SETTINGS)
    admin = Directory(store, SystemClock(), SystemTokenSource()).authenticate(admin_token)
    session = service.register_session(
        endpoint_id, boot_id="crash-child", run_version="0.1.0", capacity=8
    ).session.id
    service.reconcile(session, [])
    print("ready", flush=True)
    seq = 0
    while True:
        created = service.create_job(admin, server_id, kind="noop", payload={"n": seq})
        report(created, created.id)
        for granted in service.claim(session, 4):
            report(store.get_job(granted.job_id), granted.job_id)
            evidence = Evidence(granted.attempt, granted.lease)
            outcome = "failed" if seq % 3 == 0 else "succeeded"
            for step in ("ack", "progress", "result")[: 1 + seq % 3]:
                try:
                    if step == "ack":
                        service.ack(session, granted.job_id, evidence)
                    elif step == "progress":
                        service.progress(session, granted.job_id, evidence, seq=1, percent=50)
                    else:
                        service.result(
                            session, granted.job_id, evidence, outcome=outcome, retryable=True
                        )
                except MoonrunError:
                    break
                report(store.get_job(granted.job_id), granted.job_id)
        seq += 1


def race(url: str, session_id: str) -> None:
    """Claim until nothing is left; print every grant, then finish the job."""
    store = open_store(url)
    service = SchedulingService(store, SystemClock(), SystemTokenSource(), SETTINGS)
    print("ready", flush=True)
    idle = 0
    while idle < 3:
        granted = service.claim(session_id, 16)
        idle = 0 if granted else idle + 1
        for grant in granted:
            print(f"grant {grant.job_id} {grant.attempt}", flush=True)
            evidence = Evidence(grant.attempt, grant.lease)
            service.ack(session_id, grant.job_id, evidence)
            service.result(session_id, grant.job_id, evidence, outcome="succeeded", retryable=False)
    store.close()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"crash": crash, "race": race}[command](*args)
