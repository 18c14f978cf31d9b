"""`moonrun job delete JOB` and `Client.delete`: a finished job goes, with one line; a job that
has not ended, or one the caller may not manage, is one error line with its code (exit 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from moonrun.client import Client
from moonrun.errors import JobNotFinished, NotFound
from tests.support.console_kit import serve
from tests.support.http_harness import http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def finished(terminal: Terminal) -> str:
    """A job of the owner's, cancelled before it ran: finished."""
    cast = terminal.cast
    job_id: str = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    cancelled = cast.world.api("POST", f"/api/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    return job_id


def test_job_delete_deletes_a_finished_job_in_one_line(terminal: Terminal) -> None:
    job_id = finished(terminal)

    result = terminal("job", "delete", job_id)

    assert (result.exit_code, result.output.strip()) == (0, f"job {job_id} deleted (cancelled)")
    assert terminal.cast.world.store.get_job(job_id) is None


def test_job_delete_of_a_job_that_has_not_ended_is_one_error_line_with_its_code(
    terminal: Terminal,
) -> None:
    job_id = terminal.cast.world.submit(terminal.cast.server_id, terminal.cast.owner[1])["id"]

    result = terminal("job", "delete", job_id)

    assert result.exit_code == 1
    assert result.output.strip() == (
        "moonrun: error: job_not_finished: "
        "That job has not ended yet; only a finished job can be deleted."
    )


def test_job_delete_of_another_owners_job_is_not_found(terminal: Terminal) -> None:
    job_id = finished(terminal)

    result = terminal("job", "delete", job_id, token=terminal.cast.stranger[1])

    assert result.exit_code == 1
    assert result.output.strip() == "moonrun: error: not_found: no such job"
    assert terminal.cast.world.store.get_job(job_id) is not None


def test_the_client_deletes_a_finished_job_and_raises_typed_errors(terminal: Terminal) -> None:
    job_id = finished(terminal)
    waiting = terminal.cast.world.submit(terminal.cast.server_id, terminal.cast.owner[1])["id"]

    with Client(terminal.url, terminal.cast.owner[1]) as client:
        deleted = client.delete(job_id)
        with pytest.raises(JobNotFinished):
            client.delete(waiting)
        with pytest.raises(NotFound):
            client.delete(job_id)

    assert (deleted.id, deleted.state) == (job_id, "cancelled")


def test_a_delete_retried_after_a_lost_answer_says_the_first_try_may_have_deleted_it() -> None:
    """A 404 to a retried delete is raised, saying the first try may have deleted the job."""
    answers = iter([(503, "store_unavailable"), (404, "not_found")])

    def answer(request: httpx.Request) -> httpx.Response:
        status, code = next(answers)
        return httpx.Response(status, json={"error": {"code": code, "message": "no such job"}})

    client = Client(
        "http://platform", "t", transport=httpx.MockTransport(answer), sleep=lambda _: None
    )
    with client, pytest.raises(NotFound) as raised:
        client.delete("job_1")

    assert "the first try may have deleted it" in raised.value.message
