"""A Run learns a cancel of its running attempt at once: `POST /run/v1/jobs/cancels` answers
the endpoint's active attempts a user asked to cancel (but those Run says it knows), and a
waiting one is answered by the cancel's commit, not by its re-check (docs/protocol.md,
"Cancellation")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

WATCH = "/run/v1/jobs/cancels"


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def running(
    cast: Cast, server_id: str | None = None, run: Any = None, token: str | None = None
) -> tuple[str, int]:
    job = cast.world.submit(server_id or cast.server_id, token or cast.owner[1])
    return job["id"], (run or cast.run).start().run_to_running(job["id"])


def cancel(cast: Cast, job_id: str, token: str) -> None:
    response = cast.world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=token)
    assert response.status_code == 202, response.text


def test_a_cancel_of_a_running_attempt_is_announced_to_its_run(cast: Cast) -> None:
    job_id, attempt = running(cast)
    quiet = cast.run.post(WATCH, {"wait_s": 0})
    cancel(cast, job_id, cast.owner[1])

    announced = cast.run.post(WATCH, {"wait_s": 0})

    assert (quiet.status_code, quiet.json()) == (200, {"cancels": []})
    assert announced.json() == {"cancels": [{"job_id": job_id, "attempt": attempt}]}


def test_a_cancel_run_already_knows_is_not_announced_again(cast: Cast) -> None:
    job_id, attempt = running(cast)
    cancel(cast, job_id, cast.owner[1])

    again = cast.run.post(WATCH, {"wait_s": 0, "known": [[job_id, attempt]]})

    assert again.json() == {"cancels": []}


def test_another_endpoints_cancel_is_not_announced(cast: Cast) -> None:
    job_id, _ = running(cast, cast.other_server_id, cast.other_run, cast.stranger[1])
    cancel(cast, job_id, cast.stranger[1])
    cast.run.start()

    mine = cast.run.post(WATCH, {"wait_s": 0})

    assert mine.json() == {"cancels": []}


def test_a_waiting_watch_is_answered_by_the_cancels_commit(cast: Cast) -> None:
    job_id, attempt = running(cast)
    watch = cast.world.platform.watch
    woken_before = watch.wakeups
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(cast.run.post(WATCH, {"wait_s": 30}).json())
    )
    waiter.start()
    while watch.waiting == 0:  # the watch is registered: the cancel below must wake it
        threading.Event().wait(0.01)

    cancel(cast, job_id, cast.owner[1])
    waiter.join(timeout=20)

    assert answers == [{"cancels": [{"job_id": job_id, "attempt": attempt}]}]
    assert watch.wakeups > woken_before


def test_a_watch_before_reconciling_is_refused(cast: Cast) -> None:
    run = cast.run
    registered = run.register()
    assert registered.status_code == 201, registered.text

    refused = run.post(WATCH, {"wait_s": 0})

    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "reconcile_required"
