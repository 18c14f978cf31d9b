"""Owners take turns at an endpoint's claims (scheduling/fairness.py), in the pure domain.

`Endpoint` below stands in for a store: each owner's claimable jobs in claim order (a job is
`owner-n`, n its place in its owner's FIFO), and owners whose waiting jobs are not claimable
yet. It counts what a claim reads, as the stores' index reads would.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from hypothesis import given
from hypothesis import strategies as st

from moonrun.scheduling.fairness import interleave, shares, take_turns


class Endpoint:
    """Claimable jobs per owner; `later` owners wait with nothing claimable yet."""

    def __init__(self, queues: Mapping[str, int], later: Sequence[str] = ()) -> None:
        self.queues = {
            owner: [f"{owner}-{n}" for n in range(count)] for owner, count in queues.items()
        }
        self.owners = sorted({*(o for o, count in queues.items() if count), *later})
        self.rows_read = 0
        self.owner_reads = 0
        self.read_rounds = 0

    def next_owner(self, after: str | None) -> str | None:
        self.owner_reads += 1
        at = 0 if after is None else bisect.bisect_right(self.owners, after)
        return self.owners[at] if at < len(self.owners) else None

    def oldest(self, wants: Mapping[str, int]) -> dict[str, list[str]]:
        self.read_rounds += 1
        found = {owner: self.queues.get(owner, [])[:count] for owner, count in wants.items()}
        self.rows_read += sum(len(jobs) for jobs in found.values())
        return found

    def claim(self, limit: int, after: str | None = None) -> list[str]:
        """What one claim grants, and the jobs leave the queues as a claim's grants do."""
        granted = take_turns(limit, after, self.next_owner, self.oldest)
        for job in granted:
            owner = job.rsplit("-", 1)[0]
            self.queues[owner].remove(job)
            if not self.queues[owner]:
                self.owners.remove(owner)
        return granted


def owner_of(job: str) -> str:
    return job.rsplit("-", 1)[0]


def test_one_owners_backlog_does_not_hold_back_anothers_job() -> None:
    """Alice's 8,000 jobs wait before Bob's one: a claim of 4 grants Bob's job among them."""
    endpoint = Endpoint({"alice": 8_000, "bob": 1})
    assert endpoint.claim(4) == ["alice-0", "bob-0", "alice-1", "alice-2"]


def test_a_claim_of_one_at_a_time_alternates_between_owners() -> None:
    """Claims of one job each, every claim starting after the owner served last: Bob's job is
    the second granted, then Alice's backlog continues in her order."""
    endpoint = Endpoint({"alice": 100, "bob": 1})
    granted, last = [], None
    for _ in range(4):
        (job,) = endpoint.claim(1, last)
        granted.append(job)
        last = owner_of(job)
    assert granted == ["alice-0", "bob-0", "alice-1", "alice-2"]


def test_within_one_owner_the_oldest_job_is_granted_first() -> None:
    """FIFO holds inside an owner's turns, across claims."""
    endpoint = Endpoint({"alice": 7, "bob": 5})
    granted, last = [], None
    while claimed := endpoint.claim(3, last):
        granted += claimed
        last = owner_of(claimed[-1])
    for owner, count in (("alice", 7), ("bob", 5)):
        assert [f"{owner}-{n}" for n in range(count)] == [
            j for j in granted if owner_of(j) == owner
        ]


def test_turns_start_after_the_owner_served_last_and_wrap_round() -> None:
    """After Bob, Carol's turn comes, then Alice's, then Bob's again."""
    endpoint = Endpoint({"alice": 3, "bob": 3, "carol": 3})
    assert endpoint.claim(4, "bob") == ["carol-0", "alice-0", "bob-0", "carol-1"]
    assert endpoint.claim(2, "carol") == ["alice-1", "bob-1"]


def test_an_owner_that_runs_out_leaves_its_share_to_the_others() -> None:
    """Bob has one job and Carol two: Alice's turns fill the rest of the claim."""
    endpoint = Endpoint({"alice": 50, "bob": 1, "carol": 2})
    assert (endpoint.claim(7)) == [
        "alice-0",
        "bob-0",
        "carol-0",
        "alice-1",
        "carol-1",
        "alice-2",
        "alice-3",
    ]


def test_an_owner_with_nothing_claimable_yet_gives_its_turn_to_the_next() -> None:
    """Bob's jobs wait for their `not_before`: his turn goes to Carol."""
    endpoint = Endpoint({"alice": 5, "carol": 5}, later=["bob"])
    assert endpoint.claim(1, "alice") == ["carol-0"]


def test_with_more_owners_than_jobs_wanted_the_next_owners_in_turn_get_one_each() -> None:
    """Ten owners, a claim of three: the three after the last served, one job each, and no
    owner beyond them is asked for jobs."""
    endpoint = Endpoint({f"u{n}": 10 for n in range(10)})
    assert endpoint.claim(3, "u4") == ["u5-0", "u6-0", "u7-0"]
    assert (endpoint.rows_read, endpoint.owner_reads) == (3, 3)


def test_one_owner_alone_is_found_with_two_lookups() -> None:
    """Alice alone, served last: the claim looks above her (nobody), then from the start
    (Alice, where the round began), and no further."""
    endpoint = Endpoint({"alice": 10})
    assert endpoint.claim(4, "alice") == ["alice-0", "alice-1", "alice-2", "alice-3"]
    assert endpoint.owner_reads == 2


def test_an_owner_whose_few_jobs_are_all_granted_still_had_its_turn() -> None:
    """Alice's one job and Bob's first fill a claim of two: Carol is not even looked up."""
    endpoint = Endpoint({"alice": 1, "bob": 5, "carol": 5})
    assert endpoint.claim(2) == ["alice-0", "bob-0"]
    assert endpoint.owner_reads == 2


def test_a_claim_reads_about_its_limit_however_many_jobs_wait() -> None:
    """8,000 claimable jobs of Alice and one of Bob: a claim of 16 reads its shares (8 each),
    then 15 of Alice's once Bob's turn out to be one: two rounds, never Alice's backlog."""
    endpoint = Endpoint({"alice": 8_000, "bob": 1})
    granted = endpoint.claim(16)
    assert (len(granted), sum(1 for job in granted if owner_of(job) == "bob")) == (16, 1)
    assert (endpoint.read_rounds, endpoint.owner_reads) == (2, 3)
    assert endpoint.rows_read <= 2 * 16


def test_nothing_waiting_grants_nothing() -> None:
    endpoint = Endpoint({})
    assert (endpoint.claim(8, "alice"), endpoint.read_rounds) == ([], 0)


def round_robin(queues: Mapping[str, Sequence[str]], after: str | None, limit: int) -> list[str]:
    """The rule written the slow way: every owner's whole queue, turns in id order starting
    after `after`, one job per owner per round."""
    owners = sorted(owner for owner, queue in queues.items() if queue)
    start = 0 if after is None else bisect.bisect_right(owners, after)
    turns = owners[start:] + owners[:start]
    taken: list[str] = []
    for depth in range(max((len(q) for q in queues.values()), default=0)):
        taken += [queues[owner][depth] for owner in turns if depth < len(queues[owner])]
    return taken[:limit]


@given(
    counts=st.dictionaries(st.sampled_from("abcdefg"), st.integers(0, 12), max_size=7),
    later=st.lists(st.sampled_from("abcdefgh"), max_size=3),
    after=st.none() | st.sampled_from("0abcdefgh~"),
    limit=st.integers(0, 30),
)
def test_claims_grant_exactly_what_round_robin_over_every_waiting_job_would(
    counts: dict[str, int], later: list[str], after: str | None, limit: int
) -> None:
    """Reading as it goes, a claim grants the very jobs, in the very order, that round robin
    over the owners' whole queues would; it reads at most `limit` jobs a round, goes another
    round only when an owner turned out to have fewer than its share, and looks each owner up
    at most once (plus the two ends of the round)."""
    endpoint = Endpoint(counts, later)
    expected = round_robin(endpoint.queues, after, limit)
    assert expected == take_turns(limit, after, endpoint.next_owner, endpoint.oldest)
    assert endpoint.read_rounds <= 1 + len(endpoint.owners)
    assert endpoint.rows_read <= limit * endpoint.read_rounds
    assert endpoint.owner_reads <= len(endpoint.owners) + 2


def test_shares_and_interleave_are_round_robin_with_owners_that_run_out() -> None:
    """Shares of 7 between three owners, `b` holding one job: 3, 1, 3; of 2: the first two
    get one each; interleaved by rounds, never past the limit."""
    assert shares(["a", "b", "c"], 7, {"b": 1}) == {"a": 3, "b": 1, "c": 3}
    assert shares(["a", "b", "c"], 2, {}) == {"a": 1, "b": 1, "c": 0}
    queues = {"a": ["a0", "a1", "a2"], "b": ["b0"], "c": ["c0", "c1", "c2"]}
    assert interleave(["a", "b", "c"], queues, 7) == ["a0", "b0", "c0", "a1", "c1", "a2", "c2"]
    assert interleave(["a", "b", "c"], queues, 2) == ["a0", "b0"]
