"""The job page's Delete: offered for a finished job only, a form that needs the session's CSRF
token like every console POST, and it deletes the job with its logs and artifacts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console, csrf_of
from tests.support.stores import memory_factory


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def cancelled(con: Console) -> str:
    job_id = con.submit()
    assert con.world.api("POST", f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    return job_id


def test_only_a_finished_jobs_page_offers_delete(con: Console) -> None:
    olive = con.client("olive")
    waiting, done = con.submit(), cancelled(con)

    offered = [f"/jobs/{job}/delete" in olive.get(f"/jobs/{job}").text for job in (waiting, done)]

    assert offered == [False, True]


def test_delete_needs_the_sessions_csrf_token_and_then_deletes_the_job(con: Console) -> None:
    job_id = cancelled(con)
    olive, hugo = con.client("olive"), con.client("hugo")
    hugos_token = csrf_of(hugo.get("/jobs").text)

    refused = [
        olive.post(f"/jobs/{job_id}/delete", data={}).status_code,
        olive.post(f"/jobs/{job_id}/delete", data={"csrf_token": hugos_token}).status_code,
    ]
    kept = con.state(job_id)
    form = {"csrf_token": csrf_of(olive.get(f"/jobs/{job_id}").text)}
    deleted = olive.post(f"/jobs/{job_id}/delete", data=form)
    listed = olive.get(deleted.headers["location"])

    assert (refused, kept) == ([403, 403], "cancelled")
    assert (deleted.status_code, deleted.headers["location"]) == (303, "/jobs?deleted=1")
    assert "The job was deleted, with its logs and artifacts." in listed.text
    assert con.world.store.get_job(job_id) is None
    assert olive.get(f"/jobs/{job_id}").status_code == 404


def test_deleting_a_job_that_has_not_ended_is_a_409_page_and_keeps_it(con: Console) -> None:
    job_id = con.submit()
    olive = con.client("olive")
    form = {"csrf_token": csrf_of(olive.get(f"/jobs/{job_id}").text)}

    refused = olive.post(f"/jobs/{job_id}/delete", data=form)

    assert refused.status_code == 409
    assert "only a finished job can be deleted" in refused.text
    assert con.state(job_id) == "queued"
