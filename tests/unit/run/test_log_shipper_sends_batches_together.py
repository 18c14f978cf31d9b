"""Run sends several attempts' log batches in one request to a platform that takes them so
(docs/protocol.md, "Log batches together"): one request an attempt fell behind a busy Run's
jobs. Each batch is still answered on its own: one refused for good is dropped alone, one
refused for now goes again, unchanged, in the next flush. Requests stay within the platform's
body limit; to an older platform each batch goes alone, as before."""

from __future__ import annotations

import pytest

from moonrun.errors import NotActive, StoreUnavailable
from moonrun.run.transfers import BATCH_BYTES, Attempt, LogShipper
from tests.support.run_kit import FakeRunClient

ATTEMPTS = [Attempt(f"job_{n}", 1, f"lease_{n}") for n in range(5)]


def shipper(client: FakeRunClient) -> LogShipper:
    return LogShipper(client, clock_us=lambda: 0)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("together", [True, False], ids=["says so", "older"])
async def test_every_attempts_batch_goes_in_one_request(together: bool) -> None:
    client = FakeRunClient(log_batches=together)
    logs = shipper(client)
    for attempt in ATTEMPTS:
        logs.add(attempt, "stdout", f"from {attempt.job_id}")
        logs.finish(attempt)
    await logs.flush()

    assert client.log_requests == (1 if together else len(ATTEMPTS))
    assert sorted(client.log_calls) == [
        (attempt.job_id, 1, 1, [f"from {attempt.job_id}"]) for attempt in ATTEMPTS
    ]
    assert len(client.final_calls) == len(ATTEMPTS)
    assert (logs._buffers, logs._pending, logs._ended) == ({}, {}, set())


@pytest.mark.anyio
async def test_a_batch_refused_for_good_is_dropped_alone_and_one_refused_for_now_goes_again() -> (
    None
):
    client = FakeRunClient(log_batches=True)
    client.errors = [NotActive("the attempt ended long ago"), StoreUnavailable("disk full")]
    logs = shipper(client)
    for attempt in ATTEMPTS[:3]:
        logs.add(attempt, "stdout", f"from {attempt.job_id}")
    await logs.flush()  # job_0 refused for good, job_1 for now, job_2 stored
    first = list(client.log_calls)
    await logs.flush()  # job_1 again, under the same seq, with the same line

    assert [call[0] for call in first] == ["job_0", "job_1", "job_2"]
    assert client.log_calls[3:] == [("job_1", 1, 1, ["from job_1"])]
    assert (logs.dropped, logs.shipped, client.log_requests) == (1, 2, 2)
    assert logs._pending == {}


@pytest.mark.anyio
async def test_batches_too_large_for_one_body_go_in_several_requests() -> None:
    client = FakeRunClient(log_batches=True, record=False)
    logs = LogShipper(client, clock_us=lambda: 0, batch_lines=10_000)  # type: ignore[arg-type]
    text = "x" * 16_000
    lines_each = BATCH_BYTES // 2 // len(text)  # about half a body's worth an attempt
    for attempt in ATTEMPTS[:3]:
        for _ in range(lines_each):
            logs.add(attempt, "stdout", text)
    await logs.flush()

    assert client.log_requests == 2  # two attempts' batches fit one body, the third does not
    assert client.log_lines == 3 * lines_each
