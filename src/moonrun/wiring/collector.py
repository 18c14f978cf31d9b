"""The serving platform's garbage collector: rare full collections over fewer objects.

With thousands of Runs connected, a platform holds about 250 objects per Run (sessions,
connections, their timers, each waiting claim's coroutine). CPython's default thresholds
(700, 10, 10) then ran a full collection every 8 to 12 s over half a million objects, and each
stalled the event loop for 430 to 530 ms: every request waiting behind it, heartbeats
included, came that much late, which is the p99 of `bench/fleet_bench.py` (338 ms at 2,000
Runs, 625 ms at 3,000), while the median stayed under 2 ms (docs/benchmarks.md, issue 24).

What startup made (imports, the app, its routes and models) lives as long as the process:
`gc.freeze()` moves it out of every collection. Young objects are collected after `THRESHOLDS`
[0] allocations instead of 700, so that a request's short-lived objects mostly die before a
collection looks at them, and fewer survive into the old generation; a full collection then
comes after `THRESHOLDS[0] * THRESHOLDS[1] * THRESHOLDS[2]` allocations at the soonest (and
only once the old generation grew by a quarter, as CPython always requires). Cycles are still
collected, only later: the cost is memory (RSS 264 -> 370 MiB at 3,000 Runs in the bench).
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 100)
"""Allocations before a young collection; young collections per middle one; middle ones per
full one (CPython's defaults: 700, 10, 10). In the fleet bench, heartbeat p99 at 2,000 / 3,000
Runs: defaults 338 / 625 ms; these 25 / 82 ms; (10,000, 50, 100) 38 / 231 ms, its middle
collections, over up to half a million young objects, taking up to 0.47 s."""


def tune_for_serving() -> None:
    """Freeze what exists now (call once startup is done) and collect less often from now on."""
    gc.collect()  # what startup left as garbage goes now, not into the frozen generation
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
