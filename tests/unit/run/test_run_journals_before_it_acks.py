"""Run's journal entry for a granted attempt is on disk (fsynced) before Run acks it.

A journal entry lost in a crash after the ack would only turn into a retry, which the restart
tests allow, so they cannot see an ack sent before the fsync. Here the journal's fsync is slow
and every step is noted in order: the claim's answer, the fsync of the journal, the ack.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from moonrun.run import journal
from tests.unit.run.test_agent import TERMINAL, events, running_agent, served_platform

SLOW_FSYNC_S = 0.2
"""Long enough that an ack not waiting for the fsync would be sent during it."""


@pytest.mark.anyio
async def test_a_claimed_attempt_is_journaled_and_fsynced_before_its_ack_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served_platform(tmp_path) as world:
        real_fsync = os.fsync

        def slow_fsync(descriptor: int) -> None:
            """The journal's fsync, slow, noted when it returned with the entries it holds."""
            path = os.readlink(f"/proc/self/fd/{descriptor}")
            if not Path(path).name.startswith(journal.FILE_NAME):
                real_fsync(descriptor)
                return
            time.sleep(SLOW_FSYNC_S)
            real_fsync(descriptor)
            world.timeline.append(("journal fsynced", Path(path).read_bytes().count(b'"put"')))

        monkeypatch.setattr(journal.os, "fsync", slow_fsync)
        job_id = world.submit()
        async with running_agent(world, tmp_path, capacity=1):
            await world.wait_state(job_id, *TERMINAL)

    steps = events(world.timeline, "claim answered", "journal fsynced", "acks sent")
    first_claim = steps.index(("claim answered", [job_id]))
    assert steps[first_claim : first_claim + 3] == [
        ("claim answered", [job_id]),
        ("journal fsynced", 1),
        ("acks sent", [job_id]),
    ]
