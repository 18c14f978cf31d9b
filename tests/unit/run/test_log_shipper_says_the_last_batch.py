"""Run tells the platform when an attempt's logs are complete (issue 28, point 4): once the
attempt has ended, its last batch carries `final` (docs/protocol.md, "Sending logs"); with no
line left to send, that batch has none. A last batch that failed is sent again under its seq,
then saying it is the last."""

from __future__ import annotations

from typing import Any

import pytest

from moonrun.run.client import Unreachable
from moonrun.run.transfers import Attempt, LogShipper
from tests.support.run_kit import FakeRunClient

LEASE = "mrl_" + "l" * 43
ATTEMPT = Attempt("job_1", 1, LEASE)


def shipper(client: Any) -> LogShipper:
    return LogShipper(client, clock_us=lambda: 0)


@pytest.mark.anyio
async def test_an_ended_attempts_last_lines_go_in_a_batch_that_says_it_is_the_last() -> None:
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client)
    logs.add(ATTEMPT, "stdout", "one")
    await logs.flush()
    logs.add(ATTEMPT, "stdout", "two")
    logs.finish(ATTEMPT)
    await logs.flush()
    await logs.flush()

    assert client.log_calls == [("job_1", 1, 1, ["one"]), ("job_1", 1, 2, ["two"])]
    assert client.final_calls == [("job_1", 1, 2)]
    assert (logs._buffers, logs._pending, logs._ended) == ({}, {}, set())


@pytest.mark.anyio
async def test_an_attempt_that_ended_with_every_line_sent_sends_an_empty_last_batch() -> None:
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client)
    logs.add(ATTEMPT, "stdout", "one")
    await logs.flush()
    logs.finish(ATTEMPT)
    await logs.flush()

    assert client.log_calls == [("job_1", 1, 1, ["one"]), ("job_1", 1, 2, [])]
    assert client.final_calls == [("job_1", 1, 2)]


@pytest.mark.anyio
async def test_a_last_batch_that_failed_is_sent_again_under_its_seq_still_the_last() -> None:
    client = FakeRunClient(lease=LEASE)
    client.errors = [Unreachable("no answer")]
    logs = shipper(client)
    logs.add(ATTEMPT, "stdout", "one")
    logs.finish(ATTEMPT)
    await logs.flush()
    await logs.flush()

    assert client.log_calls == [("job_1", 1, 1, ["one"]), ("job_1", 1, 1, ["one"])]
    assert client.final_calls == [("job_1", 1, 1), ("job_1", 1, 1)]
    assert logs._ended == set()


@pytest.mark.anyio
async def test_a_batch_on_its_way_when_the_attempt_ends_is_sent_again_as_the_last() -> None:
    """Sent before the attempt ended and not answered: the same seq and lines go again, now
    saying they are the last (nothing came after them)."""
    client = FakeRunClient(lease=LEASE)
    client.errors = [Unreachable("no answer")]
    logs = shipper(client)
    logs.add(ATTEMPT, "stdout", "one")
    await logs.flush()
    logs.finish(ATTEMPT)
    await logs.flush()

    assert client.log_calls == [("job_1", 1, 1, ["one"]), ("job_1", 1, 1, ["one"])]
    assert client.final_calls == [("job_1", 1, 1)]
