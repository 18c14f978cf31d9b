"""An attempt all of whose buffered lines the log shipper dropped (the loudest attempt, over the
bound of all buffers together) is not kept for ever: its note saying how many it lost is shipped
alone, and then the shipper holds nothing of it (issue 24, point 6: nothing per attempt outlives
the attempt)."""

from __future__ import annotations

import pytest

from moonrun.run.transfers import Attempt, LogShipper
from tests.support.run_kit import FakeRunClient

LEASE = "mrl_" + "l" * 43
NOTE = "[moonrun: 1 earlier line(s) dropped: output outran log shipping]"


@pytest.mark.anyio
async def test_an_attempt_whose_every_line_was_dropped_ships_its_note_and_is_forgotten() -> None:
    client = FakeRunClient(lease=LEASE)
    logs = LogShipper(client, capacity=2, clock_us=lambda: 0)  # type: ignore[arg-type]
    loud, quiet, third = (Attempt(f"job_{n}", 1, LEASE) for n in (1, 2, 3))
    logs.add(loud, "stdout", "a longer line than the others")
    logs.add(quiet, "stdout", "q")
    logs.add(third, "stdout", "t")  # over the bound: the loudest buffer loses its only line

    await logs.flush()
    await logs.flush()

    assert sorted(client.log_calls) == [
        ("job_1", 1, 1, [NOTE]),
        ("job_2", 1, 1, ["q"]),
        ("job_3", 1, 1, ["t"]),
    ]
    assert (logs._buffers, logs._pending) == ({}, {})
