"""The platform knows when an attempt's logs are complete (issue 28, point 4; docs/protocol.md,
"Sending logs", "Reading logs"): Run's last batch of an attempt says `final`, the log store
keeps that (on disk too), and the job view and the logs answer say `logs_complete`; a Run that
never says so (older than the marker) has its attempt's logs complete once the transfer grace
after the attempt's end has passed, when no more lines are taken anyway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLine, LogStore
from tests.support.http_harness import Cast, SignedRun, http_world
from tests.support.stores import memory_factory

TS = "2026-11-30T00:00:00.000Z"


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LogStore:
    if request.param == "memory":
        return MemoryLogStore()
    return FileLogStore(tmp_path / "logs")


def test_a_final_batch_completes_its_attempts_logs_and_only_its_own(store: LogStore) -> None:
    store.append("job", 1, 5, lines(5, "one"))
    assert not store.complete("job", 1)
    store.append("job", 1, 6, lines(6, "two"), final=True)
    assert (store.complete("job", 1), store.complete("job", 2), store.complete("other", 1)) == (
        True,
        False,
        False,
    )


def test_a_final_batch_without_lines_completes_the_logs_and_makes_no_attempt_with_logs(
    store: LogStore,
) -> None:
    store.append("job", 1, 5, lines(5, "one"))
    store.append("job", 2, 9, [], final=True)
    assert (store.complete("job", 2), store.attempts("job")) == (True, [1])


def test_a_final_batch_sent_again_after_its_seq_was_stored_still_completes_the_logs(
    store: LogStore,
) -> None:
    """Its first copy was stored without the marker (a batch on its way when the attempt
    ended, its answer lost): Run sends it again, same seq, now the last."""
    store.append("job", 1, 5, lines(5, "one"))
    store.append("job", 1, 5, lines(5, "one"), final=True)
    assert store.complete("job", 1)
    assert [line.text for line in store.read("job", 1, -1).lines] == ["one"]


def test_logs_on_disk_stay_complete_after_a_restart_and_a_rewrite(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    first = FileLogStore(root)
    first.append("job", 1, 5, lines(5, "one"))
    first.append("job", 1, 5, lines(5, "one"), final=True)
    first.append("job", 2, 7, lines(7, "x" * 100), final=True)
    for seq in range(8, 2000):  # past its rewrite: the state record keeps the mark
        first.append("job", 3, seq, lines(seq, "y" * 100))
    first.append("job", 3, 2000, [], final=True)
    for seq in range(2001, 4000):
        first.append("job", 3, seq, lines(seq, "z" * 100))
    again = FileLogStore(root)
    assert [again.complete("job", attempt) for attempt in (1, 2, 3, 4)] == [
        True,
        True,
        True,
        False,
    ]


# -- the views ---------------------------------------------------------------------------------


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def running(cast: Cast) -> tuple[SignedRun, str, int]:
    run = cast.run.start()
    job = cast.world.submit(cast.server_id, cast.owner[1])
    return run, job["id"], run.run_to_running(job["id"])


def view(cast: Cast, job_id: str) -> Any:
    response = cast.world.api("GET", f"/api/v1/jobs/{job_id}", token=cast.owner[1])
    assert response.status_code == 200, response.text
    return response.json()


def logs_answer(cast: Cast, job_id: str, **params: Any) -> Any:
    path = f"/api/v1/jobs/{job_id}/logs"
    response = cast.world.api("GET", path, token=cast.owner[1], params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_jobs_logs_are_complete_once_it_ended_and_its_run_sent_the_last_batch(
    cast: Cast,
) -> None:
    run, job_id, attempt = running(cast)
    assert run.send_logs(job_id, attempt, 1, "one").status_code == 202
    assert run.result(job_id, attempt).status_code == 200
    ended = (view(cast, job_id), logs_answer(cast, job_id))

    assert run.send_logs(job_id, attempt, 2, "two", final=True).status_code == 202
    complete = (view(cast, job_id), logs_answer(cast, job_id))

    assert (ended[0]["state"], ended[0]["logs_complete"], ended[1]["logs_complete"]) == (
        "succeeded",
        False,
        False,
    )
    assert (complete[0]["logs_complete"], complete[1]["logs_complete"]) == (True, True)
    assert [line["text"] for line in complete[1]["lines"]] == ["one", "two"]


def test_a_last_batch_that_comes_before_the_result_completes_the_logs_once_the_job_ends(
    cast: Cast,
) -> None:
    run, job_id, attempt = running(cast)
    assert run.send_logs(job_id, attempt, 1, "one", final=True).status_code == 202
    while_running = view(cast, job_id)["logs_complete"]
    assert run.result(job_id, attempt).status_code == 200
    assert (while_running, view(cast, job_id)["logs_complete"]) == (False, True)


def test_without_the_marker_logs_are_complete_once_the_transfer_grace_has_passed(
    cast: Cast,
) -> None:
    """A Run older than the marker: its attempt's logs are complete once no line is taken."""
    run, job_id, attempt = running(cast)
    assert run.send_logs(job_id, attempt, 1, "one").status_code == 202
    assert run.result(job_id, attempt).status_code == 200
    grace_ms = round(cast.world.settings.transfer_grace_s * 1000)
    cast.world.clock.advance(grace_ms)
    at_the_grace = view(cast, job_id)["logs_complete"]
    cast.world.clock.advance(1)
    assert (at_the_grace, view(cast, job_id)["logs_complete"]) == (False, True)
    assert logs_answer(cast, job_id)["logs_complete"] is True


def test_a_job_cancelled_before_any_attempt_has_its_logs_complete(cast: Cast) -> None:
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    queued = view(cast, job_id)["logs_complete"]
    response = cast.world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=cast.owner[1])
    assert response.status_code == 200, response.text
    assert (queued, response.json()["logs_complete"], logs_answer(cast, job_id)) == (
        False,
        True,
        {**logs_answer(cast, job_id), "attempt": None, "lines": [], "logs_complete": True},
    )


def test_a_blocking_read_until_logs_complete_answers_once_the_last_batch_is_in(
    cast: Cast,
) -> None:
    """(The wake-up itself is the client test's; here, what each read answers.)"""
    run, job_id, attempt = running(cast)
    assert run.result(job_id, attempt).status_code == 200
    params = {"wait_s": 0.05, "until": "logs_complete"}
    path = f"/api/v1/jobs/{job_id}"
    before = cast.world.api("GET", path, token=cast.owner[1], params=params)
    assert run.send_logs(job_id, attempt, 1, final=True).status_code == 202
    after = cast.world.api("GET", path, token=cast.owner[1], params=params)
    assert (before.status_code, before.json()["logs_complete"]) == (200, False)
    assert (after.status_code, after.json()["logs_complete"]) == (200, True)
    assert before.headers["ETag"] != after.headers["ETag"]  # a change to follow by ETag too
