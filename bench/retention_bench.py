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

The second figure (`--part serving`): does pruning cost serving? The peer bench's moonrun
throughput phase (bench/peer_bench.py: the real `moonrun platform serve` on a FileStore, one
real Run of capacity 16, `--peer-jobs` no-op jobs (default 3,000) created and awaited over 8
lanes) runs on a store that already holds `--serving-jobs` finished jobs (default 100,000,
2,000-byte payloads, ended months ago), with `--retain-finished 30d` (the sweeper prunes them
all, from its first pass on, while the phase runs) and, alternately, with `--retain-finished 0`
(the same store, nothing pruned). It prints each round's jobs/s, how many jobs retention
deleted before and during the phase, and the median of the ratios (bound: pruning costs at
most 10%).

    python bench/retention_bench.py [--part space|serving|both] [--jobs 1000000]
                                    [--payload 2000] [--serving-jobs 100000]
                                    [--peer-jobs 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moonrun.clock import ManualClock
from moonrun.scheduling.jobs import JobState, Outcome, Terminal, create_job
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.scheduling import SchedulingService
from moonrun.service.sweeper import RELEASE_PAGES
from moonrun.store.file import FileStore
from peer_bench import Moonrun, User

T0 = 1_790_000_000_000
DAY_MS = 24 * 3600 * 1000
BOUND = 0.2
COST_BOUND = 0.10
"""Pruning may cost the peer bench's throughput at most this share."""


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


# -- pruning beside serving -------------------------------------------------------------------


async def pruned_total(http: aiohttp.ClientSession, url: str) -> int:
    """`moonrun_jobs_pruned_total` from the platform's /metrics."""
    async with http.get(url + "/metrics") as answer:
        text = await answer.text()
    for line in text.splitlines():
        if line.startswith("moonrun_jobs_pruned_total "):
            return int(float(line.split()[1]))
    raise SystemExit("/metrics shows no moonrun_jobs_pruned_total")


@dataclass(frozen=True)
class Phase:
    jobs_per_s: float
    seconds: float
    pruned_before: int
    pruned_during: int


async def peer_phase(store_url: str, workdir: Path, flags: tuple[str, ...], jobs: int) -> Phase:
    """The peer bench's moonrun throughput phase (FileStore, Run capacity 16, 8 lanes) on
    this store, with these platform flags; jobs/s and what retention pruned meanwhile."""
    lanes = 8
    system = Moonrun(store_url, workdir, 16, flags)
    connector = aiohttp.TCPConnector(limit=lanes + 2)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            user = User(http, system.platform.url, "block", 0.01)
            server_id = await system.start(user)
            for _ in range(20):  # warm-up, as the peer bench's
                await user.until_terminal(await user.submit(server_id))

            async def lane(n: int) -> None:
                mine = [await user.submit(server_id) for _ in range(n, jobs, lanes)]
                for job_id in mine:
                    view = await user.until_terminal(job_id)
                    assert view["state"] == "succeeded", view

            before = await pruned_total(http, system.platform.url)
            started = time.perf_counter()
            async with asyncio.TaskGroup() as group:
                for n in range(lanes):
                    group.create_task(lane(n))
            seconds = time.perf_counter() - started
            after = await pruned_total(http, system.platform.url)
        return Phase(jobs / seconds, seconds, before, after - before)
    except BaseException:
        print(system.platform.tail(), file=sys.stderr)
        if system.run is not None:
            print(system.run.tail(), file=sys.stderr)
        raise
    finally:
        system.stop()


def serving_cost(options: argparse.Namespace) -> bool:
    """Alternate rounds with and without retention over copies of one filled store; prints
    each and the median ratio; whether pruning cost at most COST_BOUND."""
    modes = {"pruning": ("--retain-finished", "30d"), "kept": ("--retain-finished", "0")}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="moonrun-retention-serving-") as directory:
        base = Path(directory)
        filled = base / "filled.db"
        began = time.perf_counter()
        fill(filled, options.serving_jobs, options.payload)
        print(
            f"filled {options.serving_jobs} finished jobs ({filled.stat().st_size} bytes) in "
            f"{time.perf_counter() - began:.0f} s",
            flush=True,
        )
        for round_ in range(options.rounds):
            figures: dict[str, Phase] = {}
            for mode, flags in modes.items():
                workdir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=base))
                shutil.copyfile(filled, workdir / "platform.db")
                url = f"file:{workdir / 'platform.db'}"
                phase = asyncio.run(peer_phase(url, workdir, flags, options.peer_jobs))
                figures[mode] = phase
                print(
                    f"  round {round_ + 1}, {mode}: {phase.jobs_per_s:,.0f} jobs/s over "
                    f"{phase.seconds:.1f} s; pruned {phase.pruned_before} before the phase, "
                    f"{phase.pruned_during} during it",
                    flush=True,
                )
                shutil.rmtree(workdir)
            ratios.append(figures["pruning"].jobs_per_s / figures["kept"].jobs_per_s)
    ratio = statistics.median(ratios)
    print(
        f"pruning {options.serving_jobs} jobs beside the peer bench: {ratio:.2f} of its "
        f"throughput (median of {len(ratios)} rounds: "
        f"{', '.join(f'{r:.2f}' for r in ratios)}); cost {1 - ratio:.0%} (bound "
        f"{COST_BOUND:.0%})"
    )
    return 1 - ratio <= COST_BOUND


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["space", "serving", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=2_000)
    parser.add_argument("--serving-jobs", type=int, default=100_000)
    parser.add_argument("--peer-jobs", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    ok = True
    if options.part in ("serving", "both"):
        ok = serving_cost(options)
    if options.part in ("space", "both"):
        ok = space(options) and ok
    return 0 if ok else 1


def space(options: argparse.Namespace) -> bool:
    """The first figure: the file's size after pruning 90% of `--jobs`."""
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
    return ratio <= BOUND


if __name__ == "__main__":
    sys.exit(main())
