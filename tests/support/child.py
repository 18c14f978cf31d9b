"""Child processes for the crash and race tests: `python -m tests.support.child crash|race ...`.

Each prints one line per transition *after* the platform acknowledged it, flushing at once,
so the parent knows exactly which writes were acknowledged when it kills the process.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from functools import partial

from moonrun.clock import SystemClock
from moonrun.errors import MoonrunError
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.records import User
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.store import open_store
from moonrun.store.file import FileStore
from moonrun.store.protocol import Store

SETTINGS = SchedulingSettings(max_claim_batch=16, backoff_initial_s=0, backoff_max_s=0)


_printing = threading.Lock()


def report(job: Job | None, job_id: str, version: int | None = None) -> None:
    """`ack JOB VERSION STATE` for a write the store acknowledged."""
    line = f"ack {job.id} {job.version} {job.state.value}" if job else f"ack {job_id} {version} -"
    with _printing:  # one whole line at a time, whichever thread reports
        print(line, flush=True)


def crash(url: str, endpoint_id: str, server_id: str, admin_token: str, threads: str = "1") -> None:
    """Apply transitions forever, from `threads` threads at once: create, claim, ack,
    progress and result, reporting each; several threads share the FileStore's group commits."""
    store = open_store(url)
    service = SchedulingService(store, SystemClock(), SystemTokenSource(), SETTINGS)
    admin = Directory(store, SystemClock(), SystemTokenSource()).authenticate(admin_token)
    session = service.register_session(
        endpoint_id, boot_id="crash-child", run_version="0.1.0", capacity=64
    ).session.id
    service.reconcile(session, [])
    workers = [
        threading.Thread(target=transitions, args=(store, service, admin, server_id, session))
        for _ in range(int(threads))
    ]
    print("ready", flush=True)
    for worker in workers:
        worker.start()
    while isinstance(store, FileStore):
        with _printing:
            print(f"groups {store.groups_committed} {store.units_committed}", flush=True)
        threading.Event().wait(0.02)
    for worker in workers:
        worker.join()


def transitions(
    store: Store, service: SchedulingService, admin: User, server_id: str, session: str
) -> None:
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


def crash_loop(
    url: str, endpoint_id: str, server_id: str, admin_token: str, tasks: str = "8"
) -> None:
    """As `crash`, from `tasks` asyncio tasks on one event loop, every call through the
    FileStore's loop flusher (as the platform's inline channels make them)."""
    store = open_store(url)
    assert isinstance(store, FileStore)
    service = SchedulingService(store, SystemClock(), SystemTokenSource(), SETTINGS)
    admin = Directory(store, SystemClock(), SystemTokenSource()).authenticate(admin_token)
    session = service.register_session(
        endpoint_id, boot_id="crash-child", run_version="0.1.0", capacity=64
    ).session.id
    service.reconcile(session, [])

    async def transitions_on_loop() -> None:
        group = store.run_in_group
        seq = 0
        while True:
            create = partial(service.create_job, kind="noop", payload={"n": seq})
            created = await group(create, admin, server_id)
            report(created, created.id)
            for granted in await group(service.claim, session, 4):
                report(store.get_job(granted.job_id), granted.job_id)
                evidence = Evidence(granted.attempt, granted.lease)
                outcome = "failed" if seq % 3 == 0 else "succeeded"
                for step in ("ack", "progress", "result")[: 1 + seq % 3]:
                    try:
                        if step == "ack":
                            await group(service.ack, session, granted.job_id, evidence)
                        elif step == "progress":
                            progress = partial(service.progress, seq=1, percent=50)
                            await group(progress, session, granted.job_id, evidence)
                        else:
                            result = partial(service.result, outcome=outcome, retryable=True)
                            await group(result, session, granted.job_id, evidence)
                    except MoonrunError:
                        break
                    report(store.get_job(granted.job_id), granted.job_id)
            seq += 1

    async def main() -> None:
        workers = [asyncio.create_task(transitions_on_loop()) for _ in range(int(tasks))]
        print("ready", flush=True)
        while True:
            with _printing:
                print(f"groups {store.flusher.groups} {store.flusher.calls}", flush=True)
            await asyncio.sleep(0.02)
            for worker in workers:
                if worker.done():
                    worker.result()

    asyncio.run(main())


def race(url: str, session_id: str) -> None:
    """Once told to go (a line on stdin), claim until nothing is left; print every grant,
    then finish the job."""
    store = open_store(url)
    service = SchedulingService(store, SystemClock(), SystemTokenSource(), SETTINGS)
    print("ready", flush=True)
    sys.stdin.readline()  # the parent starts both racers together
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


class FastClock:
    """Wall time `speed` times faster, from `start` at wall second `origin_s`: every child of
    one test reads the same clock, so it never goes back across kills."""

    def __init__(self, origin_s: float, start: int, speed: float) -> None:
        self._origin_s, self._start, self._speed = origin_s, start, speed

    def now(self) -> int:
        return self._start + int((time.time() - self._origin_s) * 1000 * self._speed)


def fire_schedules(url: str, origin_s: str, start: str, speed: str, threads: str = "2") -> None:
    """Decide due schedules forever from `threads` threads (firing passes racing as on two
    platforms), on a clock `speed` times faster than the wall's."""
    store = open_store(url)
    clock = FastClock(float(origin_s), int(start), float(speed))
    service = SchedulingService(store, clock, SystemTokenSource(), SETTINGS)

    def fire() -> None:
        while True:
            service.schedules.fire_due()

    firers = [threading.Thread(target=fire, daemon=True) for _ in range(int(threads))]
    print("ready", flush=True)
    for firer in firers:
        firer.start()
    threading.Event().wait()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {
        "crash": crash,
        "crash-loop": crash_loop,
        "race": race,
        "fire-schedules": fire_schedules,
    }[command](*args)
