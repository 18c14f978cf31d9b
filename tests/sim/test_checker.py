"""The checker can fail: each bug planted on purpose is reported by the rule meant for it,
with a seed whose replay command reproduces the very same report, and that seed is clean
without the bug."""

from __future__ import annotations

import pytest

from tests.sim.bugs import BUGS
from tests.sim.world import Outcome, simulate

FIRST_SEED = 1000
SEARCH = 300
"""How many seeds a search may try. A claim ignoring the lease and a lost commit show in
almost every seed; a stale result reaches the service in about one seed in thirty (most
copies of an old result come after Run registered again, and are refused as rotated)."""
KNOWN_SEARCH = 600
"""The known bugs need rarer coincidences (a few seeds in a hundred show each)."""
PLANTED = [
    ("double_grant", "memory"),
    ("double_grant", "file"),
    ("lost_commit", "memory"),
    ("lost_commit", "file"),
    ("stale_result", "memory"),  # a service bug: the store does not matter, and file is slower
    ("dropped_firing", "memory"),
    ("double_firing", "file"),
    ("release_all", "memory"),
    ("key_release_all", "memory"),
    ("no_wait", "memory"),
    ("no_priority", "memory"),
    ("prune_group", "memory"),
    ("prune_awaited", "file"),
    ("delete_unfinished", "memory"),
    ("prune_early", "file"),
]


def first_caught(store: str, rule: str, seeds: range, **kwargs: object) -> Outcome:
    for seed in seeds:
        outcome = simulate(seed, store, **kwargs)  # type: ignore[arg-type]
        if rule in {violation.rule for violation in outcome.violations}:
            return outcome
    pytest.fail(f"no seed in {seeds} on {store} reported {rule}")


@pytest.mark.parametrize(("bug", "store"), PLANTED)
def test_the_checker_reports_a_planted_bug_with_a_seed_that_reproduces_it(
    bug: str, store: str
) -> None:
    """A claim that ignores the lease, a result accepted from a stale attempt, a write answered
    but never made: each is reported, its seed's replay reproduces it, and without it the
    seed is clean."""
    planted = BUGS[bug]
    caught = first_caught(store, planted.rule, range(FIRST_SEED, FIRST_SEED + SEARCH), bug=bug)
    command = f"MOONRUN_SIM_SEED={caught.seed} MOONRUN_SIM_STORE={store} MOONRUN_SIM_BUG={bug}"
    assert command in caught.report()
    again = simulate(caught.seed, store, bug)
    assert [str(v) for v in caught.violations] == [str(v) for v in again.violations]
    assert [str(v) for v in simulate(caught.seed, store).violations] == []


@pytest.mark.parametrize(
    ("known", "rule"),
    [
        ("ack_lease_from_last_send", "work_outside_lease"),
        ("reconcile_cancels_its_own_renewal", "liveness"),
        ("handler_starts_without_lease_check", "work_outside_lease"),
    ],
)
def test_the_checker_reports_each_known_bug_the_simulation_found(known: str, rule: str) -> None:
    """moonrun's bugs that this simulation found and that are not fixed yet (docs/simulation.md,
    "Findings"), reproduced on request: each is reported with a replayable seed, which is
    clean when the simulation steers around it."""
    caught = first_caught("memory", rule, range(KNOWN_SEARCH), known_bugs=(known,))
    assert f"MOONRUN_SIM_KNOWN_BUGS={known}" in caught.report()
    assert [str(v) for v in simulate(caught.seed, "memory").violations] == []
