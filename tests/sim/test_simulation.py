"""The whole system under every fault at once, seed after seed: every promise holds.

Each seed is one deterministic world (tests/sim/world.py): the real SchedulingService over a
real store, simulated Runs, a user, a faulty network and skewed clocks, all drawn from one
`random.Random(seed)`; the checker (tests/sim/checker.py) reads its history. `make test` runs
`SEEDS` seeds per store from a base seed chosen at random (`MOONRUN_SIM_BASE_SEED` fixes it);
`make soak SIM_SEEDS=N` runs N in all (`MOONRUN_SIM_SEEDS`). A failing seed is reported with
the one line that replays it: `MOONRUN_SIM_SEED=<seed> MOONRUN_SIM_STORE=<store>
.venv/bin/pytest tests/sim -k replay`.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.history import History
from tests.sim.timeline import timeline
from tests.sim.world import Outcome, simulate

SEEDS = {"memory": 250, "file": 80}
"""Seeds per store in `make test` (FileStore's are fewer and shorter: it is slower)."""
PARTS = 4
"""Each store's seeds run as this many tests, a block of seeds each, so that pytest-xdist
spreads them over its workers instead of leaving one worker with all of them."""
MAX_REPORTED = 3
ROOT = Path(__file__).resolve().parents[2]


def seed_count(store: str) -> int:
    """`SEEDS[store]`, or that store's share of MOONRUN_SIM_SEEDS (the soak's total)."""
    total = os.environ.get("MOONRUN_SIM_SEEDS")
    if not total:
        return SEEDS[store]
    share = SEEDS[store] / sum(SEEDS.values())
    return max(1, round(int(total) * share))


def base_seed() -> int:
    chosen = os.environ.get("MOONRUN_SIM_BASE_SEED")
    return int(chosen) if chosen else random.SystemRandom().randrange(2**31)


def failures(outcomes: list[Outcome]) -> list[str]:
    return [outcome.report() for outcome in outcomes if outcome.violations]


@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("store", ["memory", "file"])
def test_every_promise_holds_under_faults_for_every_seed(store: str, part: int) -> None:
    """Hundreds of seeds of faults: no lease overlaps, no result or commit is lost, every job
    ends within the liveness bound (this part's block of the store's seeds)."""
    total = seed_count(store)
    first, end = part * total // PARTS, (part + 1) * total // PARTS
    base, count = base_seed() + first, end - first
    failed: list[Outcome] = []
    for seed in range(base, base + count):
        outcome = simulate(seed, store)
        if outcome.violations:
            failed.append(outcome)
            if len(failed) >= MAX_REPORTED:
                break
    assert failures(failed) == [], (
        f"{len(failed)} failing seed(s) of {count} from base seed {base} on {store}; "
        f"replay one with: {failed[0].replay()}"
    )


def test_replay_of_one_seed_keeps_every_promise() -> None:
    """The seed MOONRUN_SIM_SEED (default 0) on MOONRUN_SIM_STORE (default memory), with the
    planted bug MOONRUN_SIM_BUG and moonrun's known bugs MOONRUN_SIM_KNOWN_BUGS (names, or
    `all`): on failure it prints each violation and the timeline of the first job."""
    seed = int(os.environ.get("MOONRUN_SIM_SEED", "0"))
    store = os.environ.get("MOONRUN_SIM_STORE", "memory")
    bug = os.environ.get("MOONRUN_SIM_BUG") or None
    known = tuple(n for n in os.environ.get("MOONRUN_SIM_KNOWN_BUGS", "").split(",") if n)
    outcome = simulate(seed, store, bug, known_bugs=known)
    story = ""
    first = next((v.job_id for v in outcome.violations if v.job_id), None)
    if first is not None:
        story = "\n" + timeline(outcome.history, first)
    assert [str(v) for v in outcome.violations] == [], (
        f"{outcome.report(limit=50)}\n{outcome.scenario}{story}"
    )


def digest(history: History) -> str:
    """A fingerprint of everything a seed did: every write, answer and stretch of work."""
    parts = [repr((w.at, w.before, w.after)) for w in history.writes]
    parts += [repr((a.at, a.cause.kind, a.job_id, a.value)) for a in history.answers]
    parts += [repr(work) for work in history.work]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def test_a_seed_runs_identically_in_another_process_with_another_hash_seed() -> None:
    """Replayable for real: the same seed in a fresh interpreter (another PYTHONHASHSEED, so
    another set order) records the very same history."""
    seed = random.SystemRandom().randrange(2**31)
    here = digest(simulate(seed, "memory").history)
    script = (
        "from tests.sim.test_simulation import digest\n"
        "from tests.sim.world import simulate\n"
        f"print(digest(simulate({seed}, 'memory').history))\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": str(seed % 1000 + 1), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert here == child.stdout.strip(), f"seed {seed} ran differently in another process"


def test_the_same_seed_gives_the_same_history_twice() -> None:
    """Determinism within a process: a seed on FileStore, run twice, records one history."""
    seed = random.SystemRandom().randrange(2**31)
    first, second = simulate(seed, "file"), simulate(seed, "file")
    assert digest(first.history) == digest(second.history), f"seed {seed} on file"
