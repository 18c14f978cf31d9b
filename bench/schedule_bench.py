"""How late 1,000 active schedules fire on FileStore: every one due at the same minute.

In process, on a FileStore in a temporary directory, with the platform's own firing pass
(`Schedules.fire_due`, batches of 100, as `service/firing.py` runs it back to back while
batches come full). The clock is the platform's own but set to the minute boundary each
round, so a schedule's lateness is: the firing loop's interval (0.25 s, the worst case of
when the boundary falls) plus the time until the pass holding it committed its job.

    python bench/schedule_bench.py [--schedules 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from moonrun.clock import ManualClock
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.directory import Directory
from moonrun.service.firing import FIRE_INTERVAL_S
from moonrun.service.schedules import FIRE_BATCH, ScheduleSpec
from moonrun.service.scheduling import SchedulingService
from moonrun.service.specs import JobSpec
from moonrun.store.file import FileStore

MINUTE = 60_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        store = FileStore(Path(workdir) / "platform.db")
        clock = ManualClock((1_795_000_000_000 // MINUTE) * MINUTE + 1)
        service = SchedulingService(store, clock, SeededTokenSource(1))
        directory = Directory(store, clock, SeededTokenSource(2))
        admin = directory.ensure_bootstrap_admin("mra_bench-admin-token-000000000000")
        endpoint = service.create_endpoint(admin, "host-1").endpoint
        server = directory.create_server(admin, "web-1", endpoint_id=endpoint.id, owner_id=admin.id)
        for n in range(args.schedules):
            spec = ScheduleSpec(f"s{n}", "* * * * *", JobSpec("noop"), overlap="allow")
            service.schedules.create(admin, server.id, spec)
        late: list[float] = []
        for _ in range(args.rounds):
            clock.advance(MINUTE)
            began = time.perf_counter()
            while True:
                decided = service.schedules.fire_due()
                done_s = time.perf_counter() - began
                late.extend([FIRE_INTERVAL_S + done_s] * decided)
                if decided < FIRE_BATCH:
                    break
        store.close()
    late.sort()
    p50 = statistics.median(late)
    p99 = late[int(len(late) * 0.99) - 1]
    print(
        f"schedule bench: {args.schedules} schedules due together, {args.rounds} rounds: "
        f"fired {len(late)}; lateness p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"max {late[-1] * 1000:.0f} ms (including the loop's {FIRE_INTERVAL_S * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    main()
