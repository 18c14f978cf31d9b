"""A Run that runs for months stays the same size (issue 24, point 6).

One real `Agent` runs in this process against the fake platform of `tests/support/run_kit.py`
(its real journal on disk, its real batchers and log shipper): it claims, journals, acks, runs
and reports `noop` attempts, each of which also prints one log line so that the log shipper
has something per attempt to forget. One attempt in `STUCK_EVERY` works on until it
self-fences, no renewal being answered (as under a platform too loaded to answer in time,
while Run's session goes on): its journal entry must go too, without waiting for a
reconciliation that may not come for months. After the first 1,000 attempts, and again after
all of them, with Run idle and its log lines shipped, every container Run holds (every dict, set,
list, deque and queue reachable from the agent through its own objects), the event loop's
tasks and timers, and the process's resident memory are measured: none may have grown with
the attempts. The count is `MOONRUN_RUN_ATTEMPTS` (`make soak` runs the issue's 100,000).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
from pathlib import Path

from moonrun.run.agent import Agent, RunConfig
from moonrun.run.handlers import HandlerResult, JobContext
from moonrun.run.handlers.noop import NoopHandler
from moonrun.run.identity import Identity
from moonrun.run.journal import Journal
from tests.support.run_kit import FakeRunClient

ATTEMPTS = int(os.environ.get("MOONRUN_RUN_ATTEMPTS", "20000"))
"""Attempts in all (`make soak` raises it to the issue's 100,000)."""
FIRST = 1_000
"""The attempts after which Run's size is first measured."""
RSS_RATIO = 1.25
RSS_SLACK_BYTES = 8 * 1024 * 1024
"""What the allocator may add on top of the first measure (arenas, caches) without a leak."""
STUCK_EVERY = 500
"""One attempt in this many self-fences."""
LEASE_TTL_S = 2.0
"""Short, so that a stuck attempt self-fences (at about 5/8 of it) and is forgotten soon."""
HANG_GUARD_S = 600.0
"""Only a guard against a hang."""


class SayingNoop:
    """`noop`, printing one line first (so each attempt has log lines to ship)."""

    resumable = True
    payload_schema = NoopHandler.payload_schema

    async def run(self, context: JobContext) -> HandlerResult:
        context.log("stdout", f"attempt {context.job_id}")
        return await NoopHandler().run(context)


class Stuck:
    """Works until stopped (a self-fence cancels it)."""

    resumable = True
    payload_schema = NoopHandler.payload_schema

    async def run(self, context: JobContext) -> HandlerResult:
        await asyncio.Event().wait()
        raise AssertionError("never woken")


def kind_of(number: int) -> str:
    return "stuck" if number % STUCK_EVERY == STUCK_EVERY // 2 else "noop"


def containers(root: object) -> dict[str, int]:
    """The size of every container reachable from `root` through moonrun's own objects'
    attributes, by path (`agent.logs._buffers`), and of any moonrun object's batcher queue."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def visit(thing: object, path: str) -> None:
        if id(thing) in seen:
            return
        seen.add(id(thing))
        if isinstance(thing, dict | set | frozenset | list | collections.deque):
            sizes[path] = len(thing)
            return
        if isinstance(thing, asyncio.Queue):
            sizes[path] = thing.qsize()
            return
        module = type(thing).__module__
        if not module.startswith(("moonrun.", "tests.")):
            return
        attributes = getattr(thing, "__dict__", None) or {
            name: getattr(thing, name) for name in getattr(thing, "__slots__", ())
        }
        for name, value in attributes.items():
            visit(value, f"{path}.{name}")

    visit(root, "agent")
    return sizes


TIMERS_AT_MOST = 8
"""Live timers of Run's loop at a quiet moment: a few per loop of Run, whatever it ran."""
TASKS_OF_A_MOMENT = 4
"""Tasks of Run's loop that may be under way at the instant of a count (a batch being sent,
a write) on top of its long-lived ones: a leak of even one task per thousand attempts is
several times more over the attempts after the first measure."""


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def attempts_done(agent: Agent, client: FakeRunClient, count: int) -> None:
    """Wait until `count` attempts ended (reported or self-fenced), none is held, every line
    is shipped, and the journal holds nothing (or a self-fenced attempt's lease, which Run
    waits out before it forgets it, had time to lapse twice over)."""
    async with asyncio.timeout(HANG_GUARD_S):
        while not (
            client.reported + agent.self_fenced >= count
            and client.log_lines >= client.reported
            and client.finals >= client.reported
            and not containers(agent).get("agent._running")
        ):
            await asyncio.sleep(0.05)
        lapsed = asyncio.get_running_loop().time() + 2 * LEASE_TTL_S
        while agent.journal.entries and asyncio.get_running_loop().time() < lapsed:
            await asyncio.sleep(0.05)
        await agent.journal.sync()
        await asyncio.sleep(0.1)  # the last `running` write timers (RUNNING_WRITE_DELAY_S)


def measure(agent: Agent) -> tuple[dict[str, int], int]:
    gc.collect()
    loop = asyncio.get_running_loop()
    sizes = containers(agent)
    sizes["loop: tasks"] = len(asyncio.all_tasks(loop))
    sizes["loop: timers"] = sum(not timer.cancelled() for timer in getattr(loop, "_scheduled", []))
    return sizes, resident_bytes()


async def run_attempts(
    tmp_path: Path, total: int
) -> tuple[dict[str, int], dict[str, int], int, int]:
    client = FakeRunClient(
        jobs=True, record=False, kind_of=kind_of, renewals=False, lease_ttl_s=LEASE_TTL_S
    )
    config = RunConfig(
        platform_url="http://fake.invalid",
        data_dir=tmp_path,
        capacity=64,
        claim_wait_s=25.0,
        log_interval_s=0.02,
    )
    identity = Identity.__new__(Identity)  # never used: the fake client signs nothing
    agent = Agent(
        config,
        identity,
        Journal.open(tmp_path),
        {"noop": SayingNoop(), "stuck": Stuck()},
        client=client,  # type: ignore[arg-type]
    )
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        client.offer(FIRST)
        await attempts_done(agent, client, FIRST)
        first, first_rss = measure(agent)
        client.offer(total - FIRST)
        await attempts_done(agent, client, total)
        last, last_rss = measure(agent)
    finally:
        stop.set()
        await asyncio.wait_for(running, HANG_GUARD_S)
    assert client.acked == client.reported + agent.self_fenced == total
    assert client.finals == client.reported  # each reported attempt's last batch said so
    assert agent.self_fenced >= total // STUCK_EVERY - 1
    return first, last, first_rss, last_rss


def test_a_run_that_ran_many_attempts_holds_nothing_per_attempt(tmp_path: Path) -> None:
    quiet = logging.getLogger("moonrun")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # a log record per claim and result is not what is measured
    try:
        first, last, first_rss, last_rss = asyncio.run(run_attempts(tmp_path, ATTEMPTS))
    finally:
        quiet.setLevel(level)
    # A live timer is a moment's (a write or a pause about to run): bounded by Run's loops,
    # not by its attempts, and one more or less at the instant of a count on a loaded machine.
    timers = last.pop("loop: timers"), first.pop("loop: timers")
    assert max(timers) <= TIMERS_AT_MOST, timers
    # Tasks likewise: 20 and 22 were counted once on a loaded machine, a send under way.
    tasks = first.pop("loop: tasks"), last.pop("loop: tasks")
    assert tasks[1] <= tasks[0] + TASKS_OF_A_MOMENT, tasks
    grown = {
        path: (first.get(path, 0), size) for path, size in last.items() if size > first.get(path, 0)
    }
    assert grown == {}, f"after {FIRST:,} and {ATTEMPTS:,} attempts: {grown}"
    assert {"agent._running", "agent.journal.entries", "agent.logs._buffers"} <= set(first)
    assert last_rss <= first_rss * RSS_RATIO + RSS_SLACK_BYTES, (
        f"RSS {first_rss / 2**20:.1f} MiB after {FIRST:,} attempts, "
        f"{last_rss / 2**20:.1f} MiB after {ATTEMPTS:,}"
    )
