"""FileStore on one event loop: create -> claim -> ack -> result lifecycles/s from N tasks,
each call made inline (as the platform's inline channels did: a COMMIT and fsync per write,
the loop waiting on each) against the same calls through the loop's flusher
(`FileStore.run_in_group`: the calls waiting share a COMMIT, taken off the loop).

The real SchedulingService over a temporary SQLite file (WAL, synchronous=FULL), the tasks
on one asyncio loop as the platform's requests are; the two ways alternate `--rounds` times in
the same run and each reports its median, and the transactions committed per lifecycle.

    python bench/loop_bench.py [--lifecycles 1500] [--tasks 1,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moonrun.scheduling.messages import Evidence
from moonrun.store.file import FileStore
from store_bench import Bench


async def lifecycles(bench: Bench, count: int, tasks: int, grouped: bool) -> float:
    store = bench.store
    assert isinstance(store, FileStore)
    service = bench.service

    async def call(work: Callable[..., Any], *args: Any) -> Any:
        if grouped:
            return await store.run_in_group(work, *args)
        return work(*args)

    create = partial(service.create_job, kind="noop")
    result = partial(service.result, outcome="succeeded", retryable=False)

    async def task(share: int) -> None:
        for _ in range(share):
            await call(create, bench.admin, bench.server.id)
            (granted,) = await call(service.claim, bench.session, 1)
            evidence = Evidence(granted.attempt, granted.lease)
            await call(service.ack, bench.session, granted.job_id, evidence)
            await call(result, bench.session, granted.job_id, evidence)

    shares = [count // tasks + (n < count % tasks) for n in range(tasks)]
    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for share in shares:
            group.create_task(task(share))
    return count / (time.perf_counter() - started)


def measure(count: int, tasks: int, grouped: bool) -> tuple[float, float]:
    """(lifecycles/s, transactions committed per lifecycle)."""
    with tempfile.TemporaryDirectory(prefix="moonrun-loop-") as tmp:
        store = FileStore(Path(tmp) / "platform.db")
        try:
            bench = Bench(store, capacity=tasks)
            before = store.groups_committed
            rate = asyncio.run(lifecycles(bench, count, tasks, grouped))
            return rate, (store.groups_committed - before) / count
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=1500)
    parser.add_argument("--tasks", default="1,16")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'tasks':>5} {'way':>8} {'lc/s':>8} {'commits/lc':>11} {'x inline':>9}")
    for tasks in (int(t) for t in args.tasks.split(",")):
        rates: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for grouped in (False, True):
                rates[grouped].append(measure(args.lifecycles, tasks, grouped))
        inline = statistics.median(rate for rate, _ in rates[False])
        for grouped in (False, True):
            rate = statistics.median(r for r, _ in rates[grouped])
            commits = statistics.median(c for _, c in rates[grouped])
            way = "flusher" if grouped else "inline"
            print(f"{tasks:5} {way:>8} {rate:8,.0f} {commits:11.2f} {rate / inline:9.2f}")


if __name__ == "__main__":
    main()
