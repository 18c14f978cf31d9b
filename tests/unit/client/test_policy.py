"""`moonrun.client.policy`, the decisions both clients' loops make, without I/O: when a request
is tried again, how long a followed job rides out an outage, `wait`'s next blocking read, and
what a followed log does after each page."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from moonrun.backoff import Backoff
from moonrun.client import calls, policy
from moonrun.client.policy import Step
from moonrun.client.records import Job
from moonrun.errors import ChannelBusy, Unreachable, WaitTimedOut

CEILINGS = Backoff(initial_s=0.2, max_s=5.0, draw=lambda: 1.0)


def job(state: str, attempt: int = 1, **more: Any) -> Job:
    return Job.of(
        {
            "id": "job_1",
            "server_id": "srv_1",
            "kind": "noop",
            "state": state,
            "attempt": attempt,
            "max_attempts": 3,
            "created_at": "2026-12-03T12:00:00Z",
            **more,
        }
    )


def page(*texts: str, attempt: int = 1, more: bool = False, complete: bool | None = False) -> Any:
    lines = [
        {"attempt": attempt, "seq": n, "ts": "t", "stream": "stdout", "text": text}
        for n, text in enumerate(texts)
    ]
    return {
        "lines": lines,
        "attempt": attempt,
        "next_after_seq": len(texts) - 1,
        "more": more,
        "logs_complete": complete,
    }


def test_a_request_is_tried_again_after_growing_pauses_then_its_last_error_is_raised() -> None:
    request = httpx.Request("GET", "http://p/")
    retry = policy.Retry("http://p", retries=3, backoff=CEILINGS)
    busy = calls.TryAgain(ChannelBusy("busy"), after_s=1.5)
    pauses = [
        retry.pause(httpx.ConnectError("refused", request=request)),
        retry.pause(busy),
        retry.pause(httpx.ReadTimeout("slow", request=request)),
    ]
    with pytest.raises(Unreachable, match="cannot reach the platform at http://p: ConnectError"):
        retry.pause(httpx.ConnectError("refused", request=request))
    assert (pauses, retry.retried) == ([0.2, 1.5, 0.8], True)
    with pytest.raises(ChannelBusy):
        policy.Retry("http://p", retries=0, backoff=CEILINGS).pause(busy)
    with pytest.raises(Unreachable, match="no platform URL"):
        policy.Retry("p", 5, CEILINGS).pause(httpx.UnsupportedProtocol("p", request=request))


def test_an_outage_is_ridden_out_for_its_grace_from_the_first_failure() -> None:
    now = [100.0]
    whole = Backoff(initial_s=1.0, max_s=4.0, draw=lambda: 1.0)  # sums without rounding
    outage = policy.Outage(10.0, whole, lambda: now[0])
    pauses: list[float] = []
    down = Unreachable("down")

    def another_failure() -> None:
        pauses.append(outage.pause(down))
        now[0] += pauses[-1]

    while now[0] < 110.0:
        another_failure()
    with pytest.raises(Unreachable):
        outage.pause(down)
    assert (pauses, now[0]) == ([1.0, 2.0, 4.0, 3.0], 110.0)  # the last: what is left


def test_wait_reads_until_the_job_ended_and_its_logs_are_in_and_times_out_past_its_deadline() -> (
    None
):
    clock = lambda: 50.0  # noqa: E731
    running, ended = job("running"), job("succeeded", logs_complete=False)
    read = policy.job_read(running, logs=False, timeout_s=None, deadline=None, clock=clock)
    for_logs = policy.job_read(ended, logs=True, timeout_s=30, deadline=62.5, clock=clock)
    assert read is not None
    assert (read.params, read.wait_s) == ({"wait_s": 60.0, "until": "terminal"}, 60.0)
    assert for_logs is not None
    assert for_logs.params == {"wait_s": 12.5, "until": "logs_complete"}
    assert policy.job_read(ended, logs=False, timeout_s=None, deadline=None, clock=clock) is None
    with pytest.raises(WaitTimedOut, match="still succeeded, its logs not all in"):
        policy.job_read(ended, logs=True, timeout_s=1, deadline=50.0, clock=clock)


def test_a_followed_log_reads_on_moves_to_a_retry_and_stops_once_the_last_lines_are_in() -> None:
    follow = policy.LogFollow(
        "job_1", attempt=None, follow=True, settle_s=3.0, page_size=None, clock=lambda: 0.0
    )
    first = follow.paged(page("one", more=True))
    second = follow.paged(page("two"))
    retried = follow.judged(job("retrying", attempt=2))
    asks = follow.page().params
    third = follow.paged(page("three", attempt=2, complete=True))
    ended = follow.judged(job("succeeded", attempt=2))
    assert [(len(lines), step) for lines, step in (first, second, third)] == [
        (1, Step.PAGE),
        (1, Step.JOB),
        (1, Step.JOB),
    ]
    assert (retried, asks, ended) == (Step.PAGE, {"after_seq": -1, "attempt": 2}, Step.DONE)


def test_without_follow_the_pages_end_it_and_an_attempt_asked_for_ends_once_complete() -> None:
    once = policy.LogFollow(
        "job_1", attempt=None, follow=False, settle_s=3.0, page_size=50, clock=lambda: 0.0
    )
    asked = policy.LogFollow(
        "job_1", attempt=1, follow=True, settle_s=3.0, page_size=None, clock=lambda: 0.0
    )
    assert once.page().params == {"after_seq": -1, "limit": 50}
    assert once.paged(page("one"))[1] is Step.DONE
    assert asked.paged(page("one", complete=True))[1] is Step.DONE


def test_from_a_platform_that_does_not_say_it_stops_once_the_ended_job_is_quiet_for_settle_s() -> (
    None
):
    now = [0.0]
    follow = policy.LogFollow(
        "job_1", attempt=None, follow=True, settle_s=3.0, page_size=None, clock=lambda: now[0]
    )
    assert follow.paged(page("last", complete=None))[1] is Step.JOB
    assert follow.judged(job("succeeded")) is Step.PAUSE
    now[0] = 2.0
    assert follow.paged(page(complete=None))[1] is Step.PAUSE
    now[0] = 3.0
    assert follow.paged(page(complete=None))[1] is Step.DONE
