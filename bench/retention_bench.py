"""Does a FileStore give pruned space back? The issue's figure: after pruning 90% of 1,000,000
finished jobs the file is at most 20% of its size.

The bench fills a temporary FileStore with `--jobs` finished jobs (default 1,000,000), each
with a `--payload` byte payload (default 2,000), ended 1 ms apart, bulk-loaded 5,000 to a
write; closes it (its size is the "before"); then, as the sweeper does, prunes the 90% that
ended first through the real `SchedulingService.prune` (one batch of `prune_batch` jobs a
transaction) and gives the space back with `release_space`, a step of RELEASE_PAGES at a time,
until nothing is left to give; and closes it again (the "after"). It prints both sizes, their
ratio against the bound of 0.2, and the longest and median time of a pruning batch and of a
release step (the write lock each held), besides how long each phase took (not figures).

    python bench/retention_bench.py [--jobs 1000000] [--payload 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from moonrun.clock import ManualClock
from moonrun.scheduling.jobs import JobState, Outcome, Terminal, create_job
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.scheduling import SchedulingService
from moonrun.service.sweeper import RELEASE_PAGES
from moonrun.store.file import FileStore

T0 = 1_790_000_000_000
DAY_MS = 24 * 3600 * 1000
BOUND = 0.2


def fill(path: Path, jobs: int, payload: int) -> int:
    """Fill a new store with finished jobs; its size once closed."""
    template = create_job(
        job_id="job-template",
        server_id="srv-1",
        endpoint_id="ep-1",
        owner_id="usr-1",
        kind="noop",
        payload={"blob": "x" * payload},
        policy=SchedulingSettings().default_policy(),
        now=T0,
    )
    store = FileStore(path)
    try:
        for start in range(0, jobs, 5000):
            store.insert_jobs(
                [
                    replace(
                        template,
                        id=f"job-{n:08d}",
                        state=JobState.SUCCEEDED,
                        updated_at=T0 + n,
                        terminal=Terminal(Outcome.SUCCEEDED, 1, T0 + n),
                    )
                    for n in range(start, min(start + 5000, jobs))
                ]
            )
    finally:
        store.close()
    return path.stat().st_size


def prune(path: Path, jobs: int) -> tuple[list[float], list[float]]:
    """Prune the 90% that ended first and give the space back; each step's seconds."""
    store = FileStore(path)
    settings = SchedulingSettings(retain_finished_s=DAY_MS / 1000)
    clock = ManualClock(T0 + jobs * 9 // 10 - 1 + DAY_MS)
    service = SchedulingService(store, clock, SeededTokenSource(1), settings)
    batches: list[float] = []
    releases: list[float] = []
    try:
        while True:
            began = time.perf_counter()
            deleted = service.prune(lambda job: None)
            if not deleted:
                break
            batches.append(time.perf_counter() - began)
        while True:
            began = time.perf_counter()
            if service.release_space(RELEASE_PAGES) == 0:
                break
            releases.append(time.perf_counter() - began)
    finally:
        store.close()
    return batches, releases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=2_000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moonrun-retention-") as directory:
        path = Path(directory) / "platform.db"
        began = time.perf_counter()
        before = fill(path, options.jobs, options.payload)
        filled = time.perf_counter() - began
        batches, releases = prune(path, options.jobs)
        after = path.stat().st_size
    ratio = after / before
    print(f"filled {options.jobs} jobs in {filled:.0f} s; pruned in {sum(batches):.0f} s")
    print(f"file before {before} bytes, after {after} bytes: {ratio:.3f} (bound {BOUND})")
    for name, steps in (("prune batch", batches), ("release step", releases)):
        if steps:
            print(
                f"{name}: {len(steps)} steps, median {statistics.median(steps) * 1000:.1f} ms, "
                f"longest {max(steps) * 1000:.1f} ms"
            )
    return 0 if ratio <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
