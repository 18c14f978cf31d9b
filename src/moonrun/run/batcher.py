"""Natural batching (as in group commit): items that wait together travel together, no timer.

Items submitted while no batch is on its way go out together at the next event-loop turn;
items submitted while a batch is on its way go together in the next one, as soon as it is
done. Each submitter gets its own item's answer or error; an error of the whole batch (no
answer at all) goes to every submitter in it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
ItemAnswer = TypeVar("ItemAnswer")

Send = Callable[[list[Item]], Awaitable[Sequence[ItemAnswer | Exception]]]
"""Sends one batch; answers, in order, each item's answer or the error it alone got."""


class Batcher(Generic[Item, ItemAnswer]):
    """Gathers submitted items into batches and hands each answer back to its submitter."""

    def __init__(
        self,
        send: Send[Item, ItemAnswer],
        *,
        max_items: int = 1000,
        size: Callable[[Item], int] | None = None,
        max_size: int = 0,
        key: Callable[[Item], Hashable] | None = None,
    ) -> None:
        """`size` and `max_size` bound a batch's total size (one item always fits); items with
        the same `key` never share a batch (a later one waits for the next)."""
        self._send = send
        self._max_items = max_items
        self._size = size
        self._max_size = max_size
        self._key = key
        self._queue: deque[tuple[Item, asyncio.Future[ItemAnswer]]] = deque()
        self._sender: asyncio.Task[None] | None = None

    def submit(self, item: Item) -> asyncio.Future[ItemAnswer]:
        """Queue `item`; the future holds its answer once its batch is answered."""
        future: asyncio.Future[ItemAnswer] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())
        return future

    async def idle(self) -> None:
        """Return once everything submitted so far has been sent and answered."""
        while self._sender is not None:
            await asyncio.shield(self._sender)

    async def _send_all(self) -> None:
        batch: list[tuple[Item, asyncio.Future[ItemAnswer]]] = []
        try:
            while self._queue:
                batch = self._take()
                try:
                    answers = await self._send([item for item, _ in batch])
                    if len(answers) != len(batch):
                        raise ValueError(f"{len(answers)} answers to a batch of {len(batch)}")
                except Exception as error:  # the whole batch failed: each submitter decides
                    answers = [error] * len(batch)
                for (_, future), answer in zip(batch, answers, strict=True):
                    if future.done():  # its submitter gave up waiting
                        continue
                    if isinstance(answer, Exception):
                        future.set_exception(answer)
                    else:
                        future.set_result(answer)
                batch = []
        except asyncio.CancelledError:
            for _, future in [*batch, *self._queue]:
                future.cancel()
            self._queue.clear()
            raise
        finally:
            self._sender = None

    def _take(self) -> list[tuple[Item, asyncio.Future[ItemAnswer]]]:
        """The next batch, oldest first, within the bounds; deferred items keep their place."""
        batch: list[tuple[Item, asyncio.Future[ItemAnswer]]] = []
        deferred: list[tuple[Item, asyncio.Future[ItemAnswer]]] = []
        keys: set[Hashable] = set()
        total = 0
        while self._queue and len(batch) < self._max_items:
            item, future = self._queue[0]
            cost = self._size(item) if self._size is not None else 0
            if batch and self._size is not None and total + cost > self._max_size:
                break
            self._queue.popleft()
            key = self._key(item) if self._key is not None else None
            if key is not None and key in keys:
                deferred.append((item, future))
                continue
            keys.add(key)
            total += cost
            batch.append((item, future))
        self._queue.extendleft(reversed(deferred))
        return batch
