"""Run's batcher on its own: which items travel together, and whose answer goes where.

A fake `send` records each batch and answers from a table (or fails the whole batch); a batch
can be held on its way with an event, so that what arrives meanwhile is seen to wait for the
next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from moonrun.errors import NotActive
from moonrun.run.batcher import Batcher
from moonrun.run.client import Unreachable

HANG_GUARD_S = 10.0
"""Only a guard against a hang; every wait below is expected to end well before it."""


class Sender:
    """Answers each item with its upper-cased self, or with the error queued for it."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.refused: dict[str, Exception] = {}
        self.failures: list[Exception] = []
        self.hold: asyncio.Event | None = None
        self.holding = asyncio.Event()

    async def __call__(self, items: list[str]) -> Sequence[str | Exception]:
        self.batches.append(items)
        if self.hold is not None:
            self.holding.set()
            await self.hold.wait()
            self.hold = None
        if self.failures:
            raise self.failures.pop(0)
        return [self.refused.get(item, item.upper()) for item in items]


async def settled(futures: Sequence[asyncio.Future[Any]]) -> list[Any]:
    """Each future's answer, or its error."""
    async with asyncio.timeout(HANG_GUARD_S):
        return list(await asyncio.gather(*futures, return_exceptions=True))


@pytest.mark.anyio
async def test_items_submitted_in_one_turn_travel_in_one_batch() -> None:
    """Three submissions without an await in between: one batch, each its own answer."""
    sender = Sender()
    batcher: Batcher[str, str] = Batcher(sender)

    answers = await settled([batcher.submit(item) for item in ("a", "b", "c")])

    one_batch = (["A", "B", "C"], [["a", "b", "c"]])
    assert one_batch == (answers, sender.batches)


@pytest.mark.anyio
async def test_items_submitted_while_a_batch_is_on_its_way_travel_together_next() -> None:
    """What arrives while a batch is being sent waits for it, then goes as one batch."""
    sender = Sender()
    sender.hold = asyncio.Event()
    batcher: Batcher[str, str] = Batcher(sender)
    first = batcher.submit("a")
    await sender.holding.wait()

    later = [batcher.submit("b"), batcher.submit("c")]
    sender.hold.set()
    answers = await settled([first, *later])

    two_batches = (["A", "B", "C"], [["a"], ["b", "c"]])
    assert two_batches == (answers, sender.batches)


@pytest.mark.anyio
async def test_one_refused_item_does_not_affect_the_others_in_its_batch() -> None:
    """An item's own error goes to its submitter only."""
    sender = Sender()
    refusal = NotActive("not active")
    sender.refused["b"] = refusal
    batcher: Batcher[str, str] = Batcher(sender)

    answers = await settled([batcher.submit(item) for item in ("a", "b", "c")])

    assert ["A", refusal, "C"] == answers


@pytest.mark.anyio
async def test_a_whole_batch_failure_goes_to_every_submitter_in_it() -> None:
    """No answer at all: every item of that batch gets the error, the next batch is sent."""
    sender = Sender()
    failure = Unreachable("jobs: connection refused")
    sender.failures.append(failure)
    batcher: Batcher[str, str] = Batcher(sender)

    failed = await settled([batcher.submit(item) for item in ("a", "b")])
    retried = await settled([batcher.submit(item) for item in ("a", "b")])

    assert ([failure, failure], ["A", "B"]) == (failed, retried)


@pytest.mark.anyio
async def test_a_wrong_number_of_answers_fails_the_whole_batch() -> None:
    """Answers that cannot be matched to items are no answers: every submitter gets an error."""

    async def short(items: list[str]) -> list[str]:
        return items[:1]

    batcher: Batcher[str, str] = Batcher(short)

    answers = await settled([batcher.submit(item) for item in ("a", "b")])

    assert [ValueError, ValueError] == [type(answer) for answer in answers]


@pytest.mark.anyio
async def test_items_with_the_same_key_never_share_a_batch() -> None:
    """A second message about the same job waits for the next batch; others keep their place."""
    sender = Sender()
    batcher: Batcher[str, str] = Batcher(sender, key=lambda item: item[0])

    answers = await settled([batcher.submit(item) for item in ("a1", "b1", "a2", "c1")])

    second_a_waits = (["A1", "B1", "A2", "C1"], [["a1", "b1", "c1"], ["a2"]])
    assert second_a_waits == (answers, sender.batches)


@pytest.mark.anyio
async def test_a_batch_stays_within_its_item_and_size_bounds() -> None:
    """At most max_items, and at most max_size in total unless one item alone is larger."""
    sender = Sender()
    by_count: Batcher[str, str] = Batcher(sender, max_items=2)
    await settled([by_count.submit(item) for item in ("a", "b", "c")])
    counted = sender.batches
    sender.batches = []
    by_size: Batcher[str, str] = Batcher(sender, size=len, max_size=4)

    await settled([by_size.submit(item) for item in ("aa", "bb", "c", "dddddd", "e")])

    two_at_most = [["a", "b"], ["c"]]
    four_bytes_at_most = [["aa", "bb"], ["c"], ["dddddd"], ["e"]]
    assert two_at_most == counted
    assert four_bytes_at_most == sender.batches


@pytest.mark.anyio
async def test_a_submitter_that_gave_up_leaves_the_others_their_answers() -> None:
    """A cancelled wait (a supervisor stopped meanwhile) is skipped when the answers come."""
    sender = Sender()
    sender.hold = asyncio.Event()
    batcher: Batcher[str, str] = Batcher(sender)
    gone, kept = batcher.submit("a"), batcher.submit("b")
    await sender.holding.wait()

    gone.cancel()
    sender.hold.set()
    answers = await settled([kept])
    await batcher.idle()

    answered_and_skipped = (["B"], True)
    assert answered_and_skipped == (answers, gone.cancelled())
