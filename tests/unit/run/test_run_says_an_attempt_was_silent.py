"""Run says with its result that an attempt printed no log line, and sends no log batch for it
(docs/protocol.md, "Silent attempts"): the platform then knows the attempt's logs are complete
without a request and a file of their own. An attempt that printed sends its last batch as
before, and so does every attempt against a platform that does not say it takes the word.

One real `Agent` against the fake platform of `tests/support/run_kit.py`: jobs of a kind that
prints one line take turns with `noop` jobs, which print nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, ClassVar

import pytest

from moonrun.run.handlers import ANY_PAYLOAD, HandlerResult, JobContext
from moonrun.run.handlers.noop import NoopHandler
from tests.support.run_kit import FakeRunClient, run_agent

JOBS = 6
HANG_GUARD_S = 60.0


class SayingHandler:
    """Prints one line, then succeeds."""

    resumable = True
    payload_schema = ANY_PAYLOAD

    async def run(self, context: JobContext) -> HandlerResult:
        context.log_line("stdout", "hello")
        return HandlerResult("succeeded", output={})


def kind_of(number: int) -> str:
    return "say" if number % 2 else "noop"


def run_jobs(tmp_path: Path, client: FakeRunClient) -> Coroutine[Any, Any, None]:
    handlers = {"noop": NoopHandler(), "say": SayingHandler()}
    return run_agent(tmp_path, client, handlers, jobs=JOBS, capacity=2)


def test_a_silent_attempt_says_so_with_its_result_and_sends_no_log_batch(tmp_path: Path) -> None:
    client = FakeRunClient(jobs=True, kind_of=kind_of, silent_results=True)
    asyncio.run(asyncio.wait_for(run_jobs(tmp_path, client), HANG_GUARD_S))
    silent = [f"job_{n}" for n in range(JOBS) if kind_of(n) == "noop"]
    saying = [f"job_{n}" for n in range(JOBS) if kind_of(n) == "say"]
    assert sorted(client.silent_jobs) == silent
    assert sorted(job for job, _, _ in client.final_calls) == saying
    assert sorted(job for job, _, _, _ in client.log_calls) == saying  # nothing for the silent


def test_against_a_platform_that_does_not_take_the_word_every_attempt_sends_its_last_batch(
    tmp_path: Path,
) -> None:
    client = FakeRunClient(jobs=True, kind_of=kind_of, silent_results=False)
    asyncio.run(asyncio.wait_for(run_jobs(tmp_path, client), HANG_GUARD_S))
    assert client.silent_jobs == []
    assert sorted(job for job, _, _ in client.final_calls) == [f"job_{n}" for n in range(JOBS)]


@pytest.mark.parametrize("said", ["a payload refused", "a handler's line"])
def test_an_attempt_whose_log_says_anything_is_not_silent(tmp_path: Path, said: str) -> None:
    """Run's own line about a refused payload counts as the attempt's output."""

    class NeedsAField(NoopHandler):
        payload_schema: ClassVar[dict[str, Any]] = {"type": "object", "required": ["needed"]}

    handler = NeedsAField() if said == "a payload refused" else SayingHandler()
    client = FakeRunClient(jobs=True, silent_results=True)
    run = run_agent(tmp_path, client, {"noop": handler}, jobs=1, capacity=1)
    asyncio.run(asyncio.wait_for(run, HANG_GUARD_S))
    assert (client.silent_jobs, [job for job, _, _ in client.final_calls]) == ([], ["job_0"])
