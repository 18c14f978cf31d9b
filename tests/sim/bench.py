"""How fast the simulation runs and how hard each seed is: `python -m tests.sim.bench`.

Prints, per store, seeds per second, steps (events), injected faults and deleted jobs (pruned
by retention or by the user) per seed, and the largest share of its liveness bound that any
job needed to end (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from tests.sim.history import History
from tests.sim.world import simulate


def bound_used(history: History) -> float:
    """The largest (time to end after faults stopped) / (liveness bound) of any job."""
    if history.calm_at is None or not history.liveness_bound_ms:
        return 0.0
    worst = 0.0
    ended: dict[str, int] = {}
    created: dict[str, int] = {}
    for write in history.writes:
        created.setdefault(write.after.id, write.at)
        if write.after.state.is_terminal:
            ended.setdefault(write.after.id, write.at)
    for job_id, at in ended.items():
        start = max(history.calm_at, created[job_id])
        worst = max(worst, (at - start) / history.liveness_bound_ms)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=300, help="seeds per store")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--stores", default="memory,file")
    args = parser.parse_args()
    for store in args.stores.split(","):
        faults: Counter[str] = Counter()
        steps = failing = simulated_ms = jobs = fences = deleted = 0
        used = 0.0
        started = time.perf_counter()
        for seed in range(args.first, args.first + args.seeds):
            outcome = simulate(seed, store)
            steps += outcome.steps
            simulated_ms += outcome.simulated_ms
            faults.update(outcome.faults)
            jobs += len(outcome.history.latest)
            fences += outcome.history.self_fences
            deleted += len(outcome.history.deletions)
            failing += bool(outcome.violations)
            used = max(used, bound_used(outcome.history))
        elapsed = time.perf_counter() - started
        n = args.seeds
        print(
            f"{store}: {n} seeds in {elapsed:.1f} s = {n / elapsed:.1f} seeds/s; per seed "
            f"{steps / n:.0f} steps, {jobs / n:.1f} jobs, "
            f"{simulated_ms / n / 1000:.0f} s simulated, "
            f"{(sum(faults.values()) - faults['journals_lost']) / n:.1f} faults, "
            f"{fences / n:.1f} self-fences, {deleted / n:.1f} jobs deleted; "
            f"{failing} failing; slowest job used "
            f"{used:.0%} of its liveness bound"
        )
        print(
            "  faults per seed: " + ", ".join(f"{k} {v / n:.1f}" for k, v in faults.most_common())
        )


if __name__ == "__main__":
    main()
