"""`wait(logs=True)` returns once the job's logs are all in, and following a finished job's logs
returns at once (issue 28, point 4): `wait(id)` then `logs(id)` gave no line for a short job,
whose lines travel after its result, and `logs(follow=True)` on a finished job waited seconds
for lines that could no longer come. With `Client` and with `AsyncClient` alike."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.both_clients import FLAVOURS, Flavour, connect
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory
from tests.unit.client.test_follow_through_outages import Restartable


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Restartable]:
    with http_world(memory_factory(), tmp_path) as cast:
        platform = Restartable(cast)
        platform.start()
        try:
            yield platform
        finally:
            platform.stop()


def finished_job(cast: Cast) -> tuple[str, int]:
    """A job whose Run reported its result and sent one batch (not yet the last)."""
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    run = cast.run.start()
    attempt = run.run_to_running(job_id)
    assert run.send_logs(job_id, attempt, 1, "one").status_code == 202
    assert run.result(job_id, attempt).status_code == 200
    return job_id, attempt


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_wait_for_logs_then_logs_gives_every_line_of_a_short_job(
    served: Restartable, flavour: Flavour
) -> None:
    """The job has ended and its last lines are still on their way when `wait` begins."""
    cast = served.cast
    job_id, attempt = finished_job(cast)

    def last_batch() -> None:
        assert cast.run.send_logs(job_id, attempt, 2, "two", final=True).status_code == 202

    later = threading.Timer(0.3, last_batch)
    with connect(flavour, served.url, cast.owner[1]) as client:
        later.start()
        try:
            ended = client.wait(job_id, logs=True)
        finally:
            later.join()
        texts = [line.text for line in client.logs(job_id)]
    assert (ended.state, ended.logs_complete, texts) == ("succeeded", True, ["one", "two"])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_following_a_finished_jobs_complete_logs_returns_at_once(
    served: Restartable, flavour: Flavour
) -> None:
    cast = served.cast
    job_id, attempt = finished_job(cast)
    assert cast.run.send_logs(job_id, attempt, 2, "two", final=True).status_code == 202
    pauses: list[float] = []
    with connect(flavour, served.url, cast.owner[1], sleep=pauses.append) as client:
        texts = [line.text for line in client.logs(job_id, follow=True)]
        of_the_attempt = [line.text for line in client.logs(job_id, attempt=1, follow=True)]
    assert (texts, of_the_attempt, pauses) == (["one", "two"], ["one", "two"], [])
