"""The simulated network: every request and every answer is a message that may be dropped,
duplicated, delayed (and so reordered), or cut off or held by a partition."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from tests.sim.kernel import Action, Scheduler


@dataclass(frozen=True)
class NetworkFaults:
    """How unreliable the network is during a seed's fault phase (its calm phase has none)."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    max_delay_ms: int = 0
    latency_ms: tuple[int, int] = (1, 20)


@dataclass
class Partition:
    """Messages between `node` and `peer` (a platform instance; None: every one) are lost, or
    with `hold`, kept until the partition heals (a proxy that stops forwarding, then resumes)."""

    node: str
    peer: str | None
    until: int
    hold: bool
    held: list[Action] = field(default_factory=list)


CALM_LATENCY_MS = (1, 5)
"""Once faults stop: a reliable network, every message within this many milliseconds."""


class Network:
    def __init__(
        self, scheduler: Scheduler, rng: random.Random, faults: NetworkFaults, stats: Counter[str]
    ) -> None:
        self._scheduler = scheduler
        self._rng = rng
        self.faults = faults
        self._stats = stats
        self.calm = False
        self.partitions: list[Partition] = []

    def send(self, source: str, target: str, deliver: Action) -> None:
        """Send one message; `deliver` runs where (and if, and as often as) it arrives."""
        self.send_copies(source, [(target, deliver)] * self.copies())

    def retry_delay(self) -> int:
        """How late a duplicate comes: a retry (a proxy's, a TCP stack's) follows a timeout."""
        return self._rng.randint(100, max(200, self.faults.max_delay_ms))

    def copies(self) -> int:
        """How many copies of the next message arrive (0: it is dropped, 2: duplicated)."""
        rng, faults = self._rng, self.faults
        if self.calm:
            return 1
        if faults.drop and rng.random() < faults.drop:
            self._stats["dropped"] += 1
            return 0
        if faults.duplicate and rng.random() < faults.duplicate:
            self._stats["duplicated"] += 1
            return 2
        return 1

    def send_copies(self, source: str, copies: list[tuple[str, Action]]) -> None:
        """Send each copy to its target; every copy after the first is a late retry (which
        may go elsewhere: a proxy retrying on another instance)."""
        rng, faults = self._rng, self.faults
        for number, (target, deliver) in enumerate(copies):
            if self.calm:
                self._transit(source, target, deliver, rng.randint(*CALM_LATENCY_MS))
                continue
            latency = rng.randint(*faults.latency_ms)
            if number:
                latency += self.retry_delay()
            if faults.delay and rng.random() < faults.delay:
                self._stats["delayed"] += 1
                latency += rng.randint(faults.max_delay_ms // 10, faults.max_delay_ms)
            self._transit(source, target, deliver, latency)

    def _transit(self, source: str, target: str, deliver: Action, latency: int) -> None:
        def arrive() -> None:
            partition = self._cut(source, target)
            if partition is None:
                deliver()
            elif partition.hold:
                partition.held.append(deliver)
            else:
                self._stats["cut"] += 1

        self._scheduler.after(latency, arrive)

    def _cut(self, source: str, target: str) -> Partition | None:
        for partition in self.partitions:
            for a, b in ((source, target), (target, source)):
                if a == partition.node and (partition.peer is None or partition.peer == b):
                    return partition
        return None

    def partition(self, node: str, peer: str | None, duration_ms: int, hold: bool) -> None:
        """Cut `node` off from `peer` (or from every platform instance) for a while."""
        partition = Partition(node, peer, self._scheduler.now() + duration_ms, hold)
        self.partitions.append(partition)
        self._stats["partitions"] += 1
        self._scheduler.after(duration_ms, lambda: self._heal(partition))

    def _heal(self, partition: Partition) -> None:
        if partition not in self.partitions:
            return
        self.partitions.remove(partition)
        held, partition.held = partition.held, []
        for deliver in held:  # in the order they were held back, each with its latency
            self._scheduler.after(self._rng.randint(*CALM_LATENCY_MS), deliver)

    def become_calm(self) -> None:
        """Faults stop: every partition heals (held messages are let through) and the network
        is reliable from now on."""
        self.calm = True
        for partition in list(self.partitions):
            self._heal(partition)
