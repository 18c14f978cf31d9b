"""Owners take turns at an endpoint's claims: which claimable jobs a claim grants, in what order.

One owner's backlog must not hold back another owner's next job. A claim goes round the
owners that have claimable jobs on the endpoint, in owner-id order from just after the owner
its endpoint's previous claim served last, and takes one job of each in turn, each owner's
oldest first (`eligible_at`, then `created_at`, then id), round after round, until it has
`limit` jobs or nobody has more: round robin between owners, first in first out within one.
A newcomer's job therefore waits for at most one turn of every other owner that has work.

The store reads as the turns go (`take_turns` asks it for the next owner, and for the oldest
jobs of the owners whose turns come), so a claim reads about `limit` jobs and one index entry
per owner it visits, however many jobs wait.

Priorities sit above the turns (`take_by_priority`): a claim takes the turns among the jobs
of the most urgent rank (`Job.claim_rank`, 0 for priority 9) that has waiting jobs, and goes
down a rank only for what is left of its `limit`; owners take turns within a rank, and a job
waits within its owner's FIFO order of that rank. Priorities are strict, without aging: a
steady stream of urgent jobs that keeps an endpoint busy holds back its less urgent ones for
as long as it lasts (docs/protocol.md, "Priorities", says why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

NextOwner = Callable[[str | None], str | None]
"""The smallest owner id above the given one (above nothing: the smallest of all) that has
waiting jobs on the endpoint, or None."""

Oldest = Callable[[Mapping[str, int]], Mapping[str, Sequence[T]]]
"""For each owner named, its first `n` claimable jobs in claim order (fewer when it has no
more; never more)."""

NextRank = Callable[[int | None], tuple[int, str] | None]
"""The smallest rank above the given one (above nothing: the smallest of all) that has
waiting jobs on the endpoint, with the smallest owner id waiting at it; or None."""

Turns = Callable[[int, str], tuple[NextOwner, Oldest[T]]]
"""`take_turns`' two questions asked within one rank, whose first owner is known."""


def take_by_priority(
    limit: int, after: str | None, next_rank: NextRank, turns: Turns[T]
) -> list[T]:
    """Up to `limit` jobs in the order a claim grants them: the turns among the jobs of the
    most urgent rank first (`take_turns`, from the first owner after `after`), then, for what
    is left of `limit`, those of the next rank down, and so on."""
    taken: list[T] = []
    found = next_rank(None)
    while found is not None and len(taken) < limit:
        rank, first = found
        next_owner, oldest = turns(rank, first)
        taken += take_turns(limit - len(taken), after, next_owner, oldest)
        if len(taken) < limit:
            found = next_rank(rank)
    return taken


def take_turns(limit: int, after: str | None, next_owner: NextOwner, oldest: Oldest[T]) -> list[T]:
    """Up to `limit` jobs in the order a claim grants them: owners take turns, one job each,
    from the first owner after `after` (wrapping round, `after` itself last), each owner's
    oldest first; an owner that runs out drops out of the turns.

    `oldest` is asked once per round of reading, for every owner whose share is not read yet;
    a second round, for more, comes only when some owner turned out to have fewer than its
    share. What it answers for an owner replaces what it answered before.
    """
    turns: list[str] = []
    queues: dict[str, Sequence[T]] = {}
    complete: set[str] = set()
    """Owners whose queue is everything they have."""
    cursor, wrapped, listed = after, after is None, False
    while True:
        live = sum(1 for owner in turns if owner not in complete or queues[owner])
        if live < limit and not listed:
            # Fewer owners that may still have jobs than jobs wanted: a later owner may get one.
            found = next_owner(cursor)
            if found is None or (wrapped and after is not None and found > after):
                listed, wrapped, cursor = wrapped, True, None
                continue
            turns.append(found)
            # Back at `after` the round is complete: the owners above it came first.
            cursor, listed = found, wrapped and found == after
            continue
        counts = shares(turns, limit, {owner: len(queues[owner]) for owner in complete})
        reads = {
            owner: wanted
            for owner, wanted in counts.items()
            if owner not in complete and wanted > len(queues.get(owner, ()))
        }
        if not reads:
            return interleave(turns, {owner: queues.get(owner, ()) for owner in turns}, limit)
        answered = oldest(reads)
        for owner, wanted in reads.items():
            queues[owner] = answered.get(owner, ())
            if len(queues[owner]) < wanted:
                complete.add(owner)


def shares(turns: Sequence[str], limit: int, held: Mapping[str, int]) -> dict[str, int]:
    """How many jobs each owner gets when owners take one job each in `turns` order, round
    after round, until `limit`: an owner in `held` has exactly that many, the others enough."""
    counts = dict.fromkeys(turns, 0)
    left, going = limit, list(turns)
    while left > 0 and going:
        staying = []
        for owner in going:
            if left == 0:
                break
            if owner in held and counts[owner] >= held[owner]:
                continue
            counts[owner] += 1
            left -= 1
            staying.append(owner)
        going = staying
    return counts


def interleave(turns: Sequence[str], queues: Mapping[str, Sequence[T]], limit: int) -> list[T]:
    """Round robin: the first job of each owner in `turns` order, then each one's second, and
    so on, up to `limit` jobs."""
    taken: list[T] = []
    depth = 0
    while len(taken) < limit:
        row = [queues[owner][depth] for owner in turns if depth < len(queues[owner])]
        if not row:
            break
        taken += row[: limit - len(taken)]
        depth += 1
    return taken
