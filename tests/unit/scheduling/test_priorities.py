"""Priorities sit above the owners' turns (scheduling/fairness.py, `take_by_priority`), in the
pure domain; and a job's priority is checked where it is made (scheduling/jobs.py).

`Ranks` below stands in for a store: per rank (0 is priority 9), each owner's claimable jobs in
claim order, plus ranks whose jobs are not claimable yet. It counts the rank reads a claim makes.
"""

from __future__ import annotations

import bisect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.errors import InvalidRequest
from moonrun.scheduling.fairness import NextOwner, Oldest, take_by_priority, take_turns
from moonrun.scheduling.jobs import MAX_PRIORITY, Job, create_job
from tests.support.jobkit import ENDPOINT, POLICY, T0

Queues = dict[int, dict[str, list[str]]]
"""rank -> owner -> jobs in claim order."""


class Ranks:
    def __init__(self, queues: Queues, later: tuple[int, ...] = ()) -> None:
        self.queues = queues
        self.later = later
        self.rank_reads = 0

    def ranks(self) -> list[int]:
        waiting = {rank for rank, owners in self.queues.items() if any(owners.values())}
        return sorted(waiting | set(self.later))

    def next_rank(self, after: int | None) -> tuple[int, str] | None:
        self.rank_reads += 1
        ranks = self.ranks()
        at = 0 if after is None else bisect.bisect_right(ranks, after)
        if at == len(ranks):
            return None
        rank = ranks[at]
        owners = self.owners(rank)
        return rank, owners[0] if owners else "usr-later"

    def owners(self, rank: int) -> list[str]:
        return sorted(owner for owner, jobs in self.queues.get(rank, {}).items() if jobs)

    def turns(self, rank: int, first: str) -> tuple[NextOwner, Oldest[str]]:
        owners = self.owners(rank) or [first]

        def next_owner(after: str | None) -> str | None:
            at = 0 if after is None else bisect.bisect_right(owners, after)
            return owners[at] if at < len(owners) else None

        def oldest(wants: dict[str, int]) -> dict[str, list[str]]:  # type: ignore[type-arg]
            queues = self.queues.get(rank, {})
            return {owner: queues.get(owner, [])[:n] for owner, n in wants.items()}

        return next_owner, oldest  # type: ignore[return-value]


def by_rank(ranks: Ranks, limit: int, after: str | None = None) -> list[str]:
    return take_by_priority(limit, after, ranks.next_rank, ranks.turns)


def test_the_most_urgent_rank_goes_first_and_the_next_only_for_what_is_left() -> None:
    ranks = Ranks(
        {
            0: {"usr-a": ["a-urgent"]},
            4: {"usr-a": ["a1", "a2"], "usr-b": ["b1", "b2"]},
            9: {"usr-c": ["c-low"]},
        }
    )
    assert by_rank(ranks, 4) == ["a-urgent", "a1", "b1", "a2"]
    assert by_rank(ranks, 10) == ["a-urgent", "a1", "b1", "a2", "b2", "c-low"]


def test_a_rank_with_nothing_claimable_yet_is_passed_over() -> None:
    ranks = Ranks({4: {"usr-a": ["a1"]}}, later=(0,))
    assert by_rank(ranks, 3) == ["a1"]


def test_a_claim_reads_no_rank_past_the_one_that_filled_it() -> None:
    ranks = Ranks({r: {"usr-a": [f"r{r}-{n}" for n in range(3)]} for r in range(10)})
    assert by_rank(ranks, 3) == ["r0-0", "r0-1", "r0-2"]
    assert ranks.rank_reads == 1


queues = st.dictionaries(
    st.integers(0, MAX_PRIORITY),
    st.dictionaries(st.sampled_from(["usr-a", "usr-b", "usr-c"]), st.integers(0, 4)),
    max_size=4,
)


@given(queues, st.integers(1, 20), st.sampled_from([None, "usr-a", "usr-b", "usr-c"]))
def test_each_rank_is_the_owners_turns_of_what_the_ranks_above_left(
    counts: dict[int, dict[str, int]], limit: int, after: str | None
) -> None:
    """The grant is, rank by rank, exactly what `take_turns` grants within the rank for what
    is left of the limit: never a job of a lower rank while a higher one had one left."""
    built: Queues = {
        rank: {owner: [f"{rank}-{owner}-{n}" for n in range(count)] for owner, count in o.items()}
        for rank, o in counts.items()
    }
    granted = by_rank(Ranks(built), limit, after)
    expected: list[str] = []
    for rank in sorted(built):
        left = limit - len(expected)
        if left <= 0:
            break
        owners = Ranks(built).turns(rank, "usr-none")
        expected += take_turns(left, after, *owners)
    assert granted == expected


def made(job_id: str = "job-1", **options: Any) -> Job:
    """A new job of the endpoint, with `options` (a priority, what it waits on)."""
    return create_job(
        job_id=job_id,
        server_id="srv-1",
        endpoint_id=ENDPOINT,
        owner_id="usr-1",
        kind="work",
        payload={},
        policy=POLICY,
        now=T0,
        **options,
    )


@pytest.mark.parametrize("priority", [-1, 10, 5.0, "5", True])
def test_a_priority_outside_0_to_9_or_not_an_integer_is_refused_naming_it(
    priority: object,
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        made(priority=priority)
    assert refused.value.fields[0][0] == "priority"


def test_a_job_names_no_priority_and_has_5_its_claim_rank_only_while_it_waits() -> None:
    job = made()
    assert (job.priority, job.claim_rank) == (5, 4)
    held = made("job-2", priority=9, after=("job-1",))
    assert (held.priority, held.claim_rank) == (9, None)
