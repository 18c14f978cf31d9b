"""When the clients try again and how long they wait: the decisions, without I/O.

`Client` and `AsyncClient` run the same loops, one calling `time.sleep` and the other
awaiting `asyncio.sleep`; every decision in them is made here, once: the pause before a
request's next try (`Retry`), how long a followed job rides through a platform that does not
answer (`Outage`), the next blocking read of `wait` (`job_read`, `group_read`), and what a
followed log does after each page (`LogFollow`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Any, Final

import httpx

from moonrun.backoff import Backoff
from moonrun.client import calls
from moonrun.client.records import Group, Job, LogLine
from moonrun.errors import Unreachable, WaitTimedOut

RETRY_BACKOFF: Final = Backoff(initial_s=0.2, max_s=5.0)
"""Pauses between tries of one request: full jitter under a ceiling doubling 0.2 s to 5 s."""
FOLLOW_POLL: Final = Backoff(initial_s=0.2, max_s=2.0)
"""Pauses between reads of a followed log while no line comes (again from 0.2 s once one does)."""
WAIT_CHUNK_S: Final = 60.0
"""The longest one blocking read asks the platform to wait (it caps waits at 60 s itself)."""
LOG_SETTLE_S: Final = 3.0
"""How long `logs(follow=True)` keeps reading after the job has ended: Run ships log lines
about once a second, so the last ones may arrive just after the result."""
OUTAGE_GRACE_S: Final = 60.0
"""How long `wait` and a followed log keep trying a platform that does not answer (a restart,
a deploy) before they give up with `Unreachable`."""
PAGE_SIZE: Final = 100

RETRIED: Final = (httpx.TransportError, calls.TryAgain)
"""What a try may fail with that `Retry.pause` decides about (anything else is raised)."""


class Retry:
    """The tries of one request. No answer (a transport error) and 429 or 503 (`TryAgain`)
    are tried again after a pause from `backoff` (at least the answer's Retry-After),
    `retries` times; then the last error is raised, no answer as `Unreachable`."""

    def __init__(self, platform: str, retries: int, backoff: Backoff) -> None:
        self.platform = platform
        self.retries = retries
        self.backoff = backoff
        self.tried = 0
        self._delays = backoff.delays()

    @property
    def retried(self) -> bool:
        """Whether the try about to be sent is a retry (its first may have been taken)."""
        return self.tried > 0

    def pause(self, error: Exception) -> float:
        """After a try failed with `error`: the pause before the next, or raises what the
        caller sees."""
        last = self.tried >= self.retries
        self.tried += 1
        if isinstance(error, httpx.UnsupportedProtocol):
            raise Unreachable(
                f"{self.platform!r} is no platform URL (it needs http:// or https://)"
            ) from None
        if isinstance(error, httpx.TransportError):
            if last:
                raise Unreachable(
                    f"cannot reach the platform at {self.platform}: {type(error).__name__}"
                ) from None
            pause = next(self._delays)
        elif isinstance(error, calls.TryAgain):
            if last:
                raise error.error from None
            pause = max(next(self._delays), error.after_s)
        else:
            raise error
        return min(pause, self.backoff.max_s)


def broken_off(platform: str, error: httpx.TransportError) -> Unreachable:
    """A streamed answer that broke off after its body began: not tried again, since what
    was written of it would be written twice."""
    return Unreachable(
        f"the answer from {platform} broke off: {type(error).__name__} (not tried again: "
        "part of it was already written)"
    )


class Outage:
    """A read tried again while the platform does not answer (a restart, an outage), for up
    to `grace_s` from the first failure: what follows a job (`wait`, `logs` with `follow`)
    fails on the job's own outcome, not on a platform that comes back."""

    def __init__(self, grace_s: float, backoff: Backoff, clock: Callable[[], float]) -> None:
        self.grace_s = grace_s
        self.backoff = backoff
        self._clock = clock
        self._failed_at: float | None = None
        self._delays = backoff.delays()

    def pause(self, error: Unreachable) -> float:
        """After a read found the platform unreachable: the pause before the next, or raises
        `error` once the grace has passed."""
        now = self._clock()
        failed_at = self._failed_at = now if self._failed_at is None else self._failed_at
        if now - failed_at >= self.grace_s:
            raise error
        left = self.grace_s - (now - failed_at)
        return min(next(self._delays), self.backoff.max_s, left)


def deadline(timeout_s: float | None, clock: Callable[[], float]) -> float | None:
    return None if timeout_s is None else clock() + timeout_s


def _chunk(deadline: float | None, clock: Callable[[], float]) -> float | None:
    """How long the next blocking read may wait: None once the deadline has passed."""
    left = WAIT_CHUNK_S if deadline is None else deadline - clock()
    return None if left <= 0 else max(0.001, min(left, WAIT_CHUNK_S))


def job_read(
    job: Job,
    *,
    logs: bool,
    timeout_s: float | None,
    deadline: float | None,
    clock: Callable[[], float],
) -> calls.Call[Job] | None:
    """`wait`'s next blocking read of `job`, None once it has ended (with `logs`, and its
    logs are all in); raises `WaitTimedOut` past the deadline."""
    if job.ended and (job.logs_complete or not logs):
        return None
    wait_s = _chunk(deadline, clock)
    if wait_s is None:
        still = job.state if not job.ended else f"{job.state}, its logs not all in,"
        raise WaitTimedOut(f"job {job.id} is still {still} after {timeout_s} s")
    return calls.job_when(job.id, "logs_complete" if logs else "terminal", wait_s)


def group_read(
    group: Group, *, timeout_s: float | None, deadline: float | None, clock: Callable[[], float]
) -> calls.Call[Group] | None:
    """`wait_group`'s next blocking read, None once the group is done; raises `WaitTimedOut`
    past the deadline."""
    if group.done:
        return None
    wait_s = _chunk(deadline, clock)
    if wait_s is None:
        raise WaitTimedOut(f"group {group.id} has not ended after {timeout_s} s")
    return calls.group_when_done(group.id, wait_s)


class Step(enum.Enum):
    """What a followed log does next."""

    PAGE = "read the next page at once"
    JOB = "read the job, then ask `judged`"
    PAUSE = "sleep `pause_s()`, then read the next page"
    DONE = "stop"


class LogFollow:
    """The log lines of one attempt (the latest that has logs unless given), page after page;
    with `follow`, until the attempt's lines are all in and, without `attempt`, it is the
    job's last (from a platform that does not say so, until the job has ended and no line
    came for `settle_s`). Without `attempt` it moves on to each new attempt."""

    def __init__(
        self,
        job_id: str,
        *,
        attempt: int | None,
        follow: bool,
        settle_s: float,
        page_size: int | None,
        clock: Callable[[], float],
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.follow = follow
        self.settle_s = settle_s
        self.page_size = page_size
        self._clock = clock
        self._current = attempt
        self._after_seq = -1
        self._pauses: Iterator[float] = FOLLOW_POLL.delays()
        self._ended_at: float | None = None
        self._complete: bool | None = None
        self._got_lines = False

    def page(self) -> calls.Call[dict[str, Any]]:
        """The read of the next page: after the last line handed over."""
        return calls.logs_page(
            self.job_id, after_seq=self._after_seq, attempt=self._current, page_size=self.page_size
        )

    def paged(self, page: dict[str, Any]) -> tuple[list[LogLine], Step]:
        """A page read: its lines, and what to do next."""
        lines = [LogLine.of(line) for line in page["lines"]]
        if page["attempt"] is not None and self._current is None:
            self._current = page["attempt"]
        self._after_seq = page["next_after_seq"]
        if page["more"]:
            return lines, Step.PAGE
        if not self.follow:
            return lines, Step.DONE
        self._got_lines = bool(lines)
        if lines:
            self._pauses = FOLLOW_POLL.delays()
        self._complete = page.get("logs_complete")  # None: a platform that does not say
        if self._complete and self.attempt is not None:
            return lines, Step.DONE  # the attempt asked for has all its lines in
        if self._ended_at is None or self._complete:
            return lines, Step.JOB
        return lines, self._settled()

    def judged(self, job: Job) -> Step:
        """The job read after a page (`Step.JOB`): what to do next."""
        if self.attempt is None and self._current is not None and job.attempt > self._current:
            self._current, self._after_seq = job.attempt, -1  # a retry: follow its attempt
            return Step.PAGE
        if self._complete and job.ended:
            return Step.DONE  # the job's last attempt, and its lines are all in
        if job.ended:
            self._ended_at = self._clock()
        return self._settled()

    def pause_s(self) -> float:
        return next(self._pauses)

    def _settled(self) -> Step:
        ended_at = self._ended_at
        settled = ended_at is not None and self._clock() - ended_at >= self.settle_s
        if self._complete is None and settled and not self._got_lines:
            return Step.DONE
        return Step.PAUSE
