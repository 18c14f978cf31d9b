"""Seeds of the randomized tests: taken from the environment to replay, else drawn afresh,
and always printed (pytest shows a failed test's output) with the line that replays them."""

from __future__ import annotations

import os
import random


def seed_from(variable: str) -> int:
    """The seed in `variable` (to replay a run), else a fresh one; printed either way."""
    text = os.environ.get(variable, "").strip()
    seed = int(text) if text else random.SystemRandom().randrange(2**32)
    print(f"seed {seed} (replay with {variable}={seed})", flush=True)
    return seed
