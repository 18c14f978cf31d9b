"""The simulation's kernel: one event queue on a manual clock, cooperative tasks, local clocks.

Every action happens at a simulated instant, in (instant, order of scheduling) order, so a
seed always replays the same way. Tasks are generators that yield effects (`Sleep`, `Wait`,
`Call`, `Submit`) and are resumed with the effect's outcome, so the simulated Run reads like
`moonrun.run.agent`'s async code. Nothing here sleeps or reads a real clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from moonrun.clock import ManualClock

Action = Callable[[], None]
Resume = Callable[[Any], None]
Body = Generator["Effect", Any, Any]


class Timer:
    """One scheduled action; `cancel` makes the queue skip it."""

    __slots__ = ("action", "cancelled", "when")

    def __init__(self, when: int, action: Action) -> None:
        self.when = when
        self.action = action
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """The one event queue. `step` runs the next action, moving the clock to its instant."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._queue: list[tuple[int, int, Timer]] = []
        self._order = 0
        self.steps = 0

    def now(self) -> int:
        return self.clock.now()

    def at(self, when: int, action: Action) -> Timer:
        timer = Timer(max(when, self.clock.now()), action)
        heapq.heappush(self._queue, (timer.when, self._order, timer))
        self._order += 1
        return timer

    def after(self, delay_ms: float, action: Action) -> Timer:
        return self.at(self.clock.now() + max(0, math.ceil(delay_ms)), action)

    def step(self) -> bool:
        """Run the next live action; False when nothing is left to do."""
        queue = self._queue
        while queue:
            when, _, timer = heapq.heappop(queue)
            if timer.cancelled:
                continue
            now = self.clock.now()
            if when > now:
                self.clock.advance(when - now)
            self.steps += 1
            timer.action()
            return True
        return False

    def next_at(self) -> int | None:
        """When the next live action is due (None: nothing is scheduled)."""
        queue = self._queue
        while queue and queue[0][2].cancelled:
            heapq.heappop(queue)
        return queue[0][0] if queue else None


class LocalClock:
    """A node's own monotonic clock: it runs at `rate` times true time and may jump forward.

    Run makes its self-fencing decisions on this clock (as the real Run does on its monotonic
    clock); the platform only ever reads the true clock.
    """

    def __init__(self, scheduler: Scheduler, rate: float = 1.0, start: float = 0.0) -> None:
        self._scheduler = scheduler
        self.rate = rate
        self._base_true = scheduler.now()
        self._base_local = start

    def now(self) -> float:
        return self._base_local + (self._scheduler.now() - self._base_true) * self.rate

    def true_at(self, local: float) -> int:
        """The true instant at which this clock reads `local`."""
        return self._base_true + math.ceil((local - self._base_local) / self.rate)

    def jump(self, ms: float) -> None:
        """Jump forward by `ms` (a suspended VM, a clock step): timers due by then fire."""
        self._base_local = self.now() + ms
        self._base_true = self._scheduler.now()


class Signal:
    """`asyncio.Event` for simulated tasks."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[Action] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()

    def clear(self) -> None:
        self._set = False

    def wait(self, wake: Action) -> None:
        if self._set:
            wake()
        else:
            self._waiters.append(wake)


class Effect:
    """What a task waits for; `arm` arranges for `resume(outcome)` to be called once."""

    def arm(self, node: Node, resume: Resume) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Sleep(Effect):
    """Wait `ms` on the node's own clock."""

    ms: float

    def arm(self, node: Node, resume: Resume) -> None:
        node.after(self.ms, lambda: resume(None))


@dataclass(frozen=True)
class Wait(Effect):
    """Wait for `signal` (resumed with True), or at most `timeout_ms` (resumed with False)."""

    signal: Signal
    timeout_ms: float | None = None

    def arm(self, node: Node, resume: Resume) -> None:
        state: dict[str, Any] = {"fired": False, "timer": None}

        def wake(value: bool) -> None:
            if state["fired"]:
                return
            state["fired"] = True
            if state["timer"] is not None:
                state["timer"].cancel()
            resume(value)

        if self.timeout_ms is not None:
            state["timer"] = node.after(self.timeout_ms, lambda: wake(False))
        self.signal.wait(lambda: wake(True))


@dataclass(frozen=True)
class Call(Effect):
    """One request to the platform (through the simulated network): the `SchedulingService`
    method `kind` with these arguments, taken by value when the request is made. Resumed with
    the answer or the error (a `MoonrunError`), `PlatformUnreachable` when nothing came back
    in time."""

    kind: str
    args: tuple[Any, ...]
    timeout_ms: float
    kwargs: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    signed: bool = True
    entries: dict[str, Any] = field(default_factory=dict)
    """What the request says about each job (for the history)."""

    def arm(self, node: Node, resume: Resume) -> None:
        node.rpc(self, resume)


@dataclass(frozen=True)
class Submit(Effect):
    """Hand an item to a batcher; resumed with that item's own answer or error."""

    batcher: Any
    item: Any

    def arm(self, node: Node, resume: Resume) -> None:
        self.batcher.submit(self.item, resume)


class Task:
    """A generator driven by the effects it yields; `cancel` closes it (its `finally` runs)."""

    def __init__(self, node: Node, body: Body, name: str) -> None:
        self.node = node
        self.name = name
        self._body = body
        self._token = 0
        self._stepping = False
        self._cancel_pending = False
        self.done = False
        self.result: Any = None
        self.finished = Signal()
        node.scheduler.after(0, lambda: self._step(None, 0))

    def _step(self, value: Any, token: int) -> None:
        if self.done or token != self._token or not self.node.alive:
            return
        self._token += 1
        self._stepping = True
        self.node.current = self
        try:
            effect = self._body.send(value)
        except StopIteration as stop:
            self.done = True
            self.result = stop.value
            self.finished.set()
            return
        finally:
            self._stepping = False
            self.node.current = None
        if self._cancel_pending:  # cancelled by itself: it ends at this suspension
            self.cancel()
            return
        mine = self._token
        scheduler = self.node.scheduler
        effect.arm(self.node, lambda outcome: scheduler.after(0, lambda: self._step(outcome, mine)))

    def cancel(self) -> None:
        """Close the task where it waits (its `finally` blocks run). A task that cancels
        itself goes on until it next waits, as an asyncio task does."""
        if self.done:
            return
        if self._stepping:
            self._cancel_pending = True
            return
        self.done = True
        self._token += 1
        self._body.close()
        self.finished.set()


class Node:
    """Something that runs tasks on its own clock and sends requests: a Run process, a user."""

    def __init__(self, scheduler: Scheduler, name: str, clock: LocalClock) -> None:
        self.scheduler = scheduler
        self.name = name
        self.clock = clock
        self.alive = True
        self.current: Task | None = None
        """The task running right now (asyncio.current_task())."""
        self.tasks: list[Task] = []
        self._timers: dict[int, tuple[float, Action, Timer]] = {}
        self._next_timer = 0

    def after(self, ms: float, action: Action) -> Timer:
        """Run `action` once `ms` have passed on this node's clock (never after it stops)."""
        key = self._next_timer
        self._next_timer += 1
        deadline = self.clock.now() + ms

        def fire() -> None:
            self._timers.pop(key, None)
            if self.alive:
                action()

        timer = self.scheduler.at(self.clock.true_at(deadline), fire)
        self._timers[key] = (deadline, fire, timer)
        return timer

    def jump_clock(self, ms: float) -> None:
        """The node's clock jumps forward: every timer due by the new reading fires now."""
        self.clock.jump(ms)
        for key, (deadline, fire, timer) in list(self._timers.items()):
            if timer.cancelled:
                del self._timers[key]
                continue
            timer.cancel()
            replacement = self.scheduler.at(self.clock.true_at(deadline), fire)
            self._timers[key] = (deadline, fire, replacement)

    def spawn(self, body: Body, name: str) -> Task:
        task = Task(self, body, name)
        self.tasks = [t for t in self.tasks if not t.done]
        self.tasks.append(task)
        return task

    def rpc(self, call: Call, resume: Resume) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """The node ends (a crash): its tasks are closed and its timers never fire."""
        self.alive = False
        for task in self.tasks:
            task.cancel()
        self.tasks = []
        for _, _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
