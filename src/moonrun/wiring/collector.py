"""The serving platform's garbage collector: collections by the clock, each walking little.

With thousands of Runs connected, a platform holds about 250 objects per Run (sessions,
connections, their timers, each waiting claim's coroutine), and CPython 3.11's collector,
left to its counters, stalled every request behind it (docs/benchmarks.md, issue 24):

- with its defaults (700, 10, 10), a full collection every 8 to 12 s over half a million
  objects, 430 to 530 ms each, at 2,000 Runs;
- with thresholds raised to (50,000, 20, 100), young collections walking 270,000 to 380,000
  objects, 200 to 430 ms each, at 5,000 Runs: the young counter counts allocations *less
  deallocations*, so when older objects die as fast as new ones are made (a waiting claim's
  state lives its 25 s, long enough to be promoted, then is replaced) it hardly moves while
  the young list grows; (1,000, 10, 100) gave 58 to 137 ms middle collections and a 536 ms
  full one instead.

So `platform serve` turns the counters off and collects by the clock (a daemon thread, so that
whatever the event loop is doing, the schedule holds): the young generation every
`YOUNG_S`, so that each walks only what a tenth of a second made; the young and middle ones
every `MIDDLE_EVERY` of those; everything every `FULL_S`, the one long pause left (about half a
second at 5,000 Runs), which frees cyclic garbage that lived long enough to be promoted.
Serving itself makes almost none (a request's objects are freed by reference counting: the
edge holds them weakly). What startup made is frozen out of every collection.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

YOUNG_S = 0.1
"""How often the young generation is collected."""
MIDDLE_EVERY = 10
"""Every this many young collections, the middle generation is collected with it (each second)."""
FULL_S = 600.0
"""How often everything is collected."""
FULL_EVERY = round(FULL_S / YOUNG_S)


def generation_at(tick: int) -> int:
    """Which generation the `tick`th collection (from 1) collects, with those younger."""
    if tick % FULL_EVERY == 0:
        return 2
    return 1 if tick % MIDDLE_EVERY == 0 else 0


class Collector:
    """Collects by the clock on a daemon thread until stopped."""

    def __init__(self, collect: Callable[[int], object] = gc.collect) -> None:
        self._collect = collect
        self._stop = threading.Event()
        self.ticks = 0
        self._thread = threading.Thread(target=self._run, name="moonrun-collector", daemon=True)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(YOUNG_S):
            self.ticks += 1
            self._collect(generation_at(self.ticks))

    def stop(self) -> None:
        """Stop collecting (and let the thread end); the caller turns the counters back on."""
        self._stop.set()
        self._thread.join()


def tune_for_serving() -> Collector:
    """Freeze what exists now (call once startup is done), turn CPython's counters off and
    collect by the clock from now on."""
    gc.collect()  # what startup left as garbage goes now, not into the frozen generation
    gc.freeze()
    gc.disable()
    return Collector().start()
