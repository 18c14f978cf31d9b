"""Capped exponential backoff with full jitter: how every moonrun loop waits to try again.

The user client, Run (registration, claims, acks and results, artifact chunks) and the MySQL
store's conflict retries all draw their pauses here. Full jitter (each pause uniform in
`[0, ceiling)`, the ceiling growing from `initial_s` by `multiplier` up to `max_s`) keeps a
fleet that failed together from retrying together; of the usual variants it spreads retries
best for the least waiting (Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture
Blog, 2015). A leaf module: it imports nothing of moonrun, so any layer may use it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """The pauses between tries: `delays()` yields one per retry, without end."""

    initial_s: float
    max_s: float
    multiplier: float = 2.0
    draw: Callable[[], float] = field(default=random.random, compare=False, repr=False)
    """Uniform in [0, 1): the jitter (a test passes `lambda: 1.0` to see the ceilings)."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s or self.multiplier < 1:
            raise ValueError(f"a backoff needs 0 < initial_s <= max_s and multiplier >= 1: {self}")

    def ceiling(self, retry: int) -> float:
        """The longest pause before retry number `retry` (0 for the first retry)."""
        ceiling = self.initial_s
        for _ in range(retry):
            if ceiling >= self.max_s:
                break
            ceiling *= self.multiplier
        return min(ceiling, self.max_s)

    def delays(self) -> Iterator[float]:
        """Each retry's pause: `draw()` times that retry's ceiling. A fresh iterator starts
        from `initial_s` again (after a success, say)."""
        retry = 0
        while True:
            yield self.draw() * self.ceiling(retry)
            retry += 1


def jittered(seconds: float, spread: float, draw: Callable[[], float] = random.random) -> float:
    """`seconds` moved by up to `spread` of itself either way, uniformly (`draw` as above):
    periodic work of many hosts that started together drifts apart instead of staying in
    step."""
    if not 0 <= spread <= 1:
        raise ValueError(f"a jitter's spread is between 0 and 1: {spread}")
    return seconds * (1 + spread * (2 * draw() - 1))
