"""Bounded retry policy: max attempts and capped exponential backoff, jitter only downward."""

from __future__ import annotations

import math
from dataclasses import dataclass

from moonrun.errors import InvalidRequest
from moonrun.scheduling.time import seconds_to_ms

MAX_ATTEMPTS_LIMIT = 1000
MAX_BACKOFF_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts a job gets and how long it waits between them."""

    max_attempts: int
    initial_s: float
    multiplier: float
    max_s: float
    jitter: float = 0.0
    """Fraction of a delay that a random draw may take away (0 = none); the cap always holds."""

    def __post_init__(self) -> None:
        check_int("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        _check_float("initial_s", self.initial_s, 0.0, MAX_BACKOFF_S)
        _check_float("multiplier", self.multiplier, 1.0, 100.0)
        _check_float("max_s", self.max_s, 0.0, MAX_BACKOFF_S)
        _check_float("jitter", self.jitter, 0.0, 1.0)
        # Floats throughout, so a policy reads back from any store exactly as it was built.
        for name in ("initial_s", "multiplier", "max_s", "jitter"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def backoff_s(self, attempt: int) -> float:
        """min(max_s, initial_s * multiplier^(attempt-1)), before jitter."""
        if attempt < 1:
            raise InvalidRequest(f"attempt must be >= 1, got {attempt}")
        delay = self.initial_s
        for _ in range(attempt - 1):
            if delay >= self.max_s:
                break
            delay *= self.multiplier
        return min(self.max_s, delay)

    def backoff_ms(self, attempt: int, draw: float = 0.0) -> int:
        """The wait after `attempt` failed, with `draw` in [0, 1) removing up to `jitter` of it."""
        if not 0.0 <= draw < 1.0:
            raise InvalidRequest(f"jitter draw must be in [0, 1), got {draw}")
        return seconds_to_ms(self.backoff_s(attempt) * (1.0 - self.jitter * draw))

    def allows_another_attempt(self, attempt: int) -> bool:
        """True when an attempt numbered `attempt` may be followed by another."""
        return attempt < self.max_attempts


def check_int(name: str, value: object, low: int, high: int) -> None:
    """`InvalidRequest` unless `value` is an integer (not a bool) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}")


def _check_float(name: str, value: object, low: float, high: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidRequest(f"{name} must be a number from {low:g} to {high:g}")
