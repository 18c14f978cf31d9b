"""A server's schedules in the console: the page lists them, creates one from the form (a bad
cron shown on the page, the form kept), previews the next times of a calendar as it is typed,
and pauses, resumes, runs now and deletes, each behind the session's CSRF token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console, csrf_of
from tests.support.stores import memory_factory

HOSTILE = '<script>alert("x")</script>'


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def form(page: str, **fields: str) -> dict[str, str]:
    base = {
        "csrf_token": csrf_of(page),
        "name": "nightly",
        "cron": "0 3 * * *",
        "timezone": "Europe/Berlin",
        "kind": "noop",
        "payload": "{}",
        "overlap": "skip",
        "catchup_window_s": "60",
    }
    return base | fields


def test_the_form_creates_a_schedule_that_the_page_then_lists(con: Console) -> None:
    olive = con.client("olive")
    path = f"/servers/{con.server_id}/schedules"
    page = olive.get(path).text

    made = olive.post(path, data=form(page, name=HOSTILE))
    listed = olive.get(made.headers["location"]).text

    assert made.status_code == 303
    assert "The schedule is created." in listed
    assert "&lt;script&gt;" in listed
    assert HOSTILE not in listed
    assert "<code>0 3 * * *</code>" in listed


def test_a_bad_cron_is_said_on_the_page_and_the_form_keeps_what_was_typed(con: Console) -> None:
    olive = con.client("olive")
    path = f"/servers/{con.server_id}/schedules"

    answer = olive.post(path, data=form(olive.get(path).text, cron="0 25 * * *", name="keep me"))

    assert answer.status_code == 422
    assert "cron hour: &#39;25&#39; is outside 0-23" in answer.text
    assert 'value="keep me"' in answer.text
    assert con.world.api("GET", "/api/v1/schedules").json()["schedules"] == []


def test_the_preview_shows_the_next_five_times_or_what_is_wrong(con: Console) -> None:
    olive = con.client("olive")
    path = f"/servers/{con.server_id}/schedules/preview"

    good = olive.get(path, params={"cron": "30 2 * * *", "timezone": "Europe/Berlin"}).text
    bad = olive.get(path, params={"cron": "30 2 * *", "timezone": "Europe/Berlin"}).text
    zone = olive.get(path, params={"cron": "@daily", "timezone": "Nowhere/Town"}).text

    assert len(re.findall(r"<li><time", good)) == 5
    assert "cron needs 5 fields" in bad
    assert "timezone" in zone


def test_pause_resume_run_now_and_delete_from_the_page(con: Console) -> None:
    olive = con.client("olive")
    path = f"/servers/{con.server_id}/schedules"
    olive.post(path, data=form(olive.get(path).text))
    schedule_id = con.world.api("GET", "/api/v1/schedules").json()["schedules"][0]["id"]

    def act(action: str) -> str:
        page = olive.get(path).text
        done = olive.post(f"/schedules/{schedule_id}/{action}", data={"csrf_token": csrf_of(page)})
        assert done.status_code == 303, done.text
        return olive.get(done.headers["location"]).text

    assert "paused" in act("pause")
    assert "The schedule fires again." in act("resume")
    ran = act("trigger")
    job_id = re.search(r'href="/jobs/(job_[a-z0-9]+)"', ran)
    assert job_id is not None
    assert "No schedules yet." in act("delete")


def test_a_form_without_the_csrf_token_changes_nothing(con: Console) -> None:
    olive = con.client("olive")
    path = f"/servers/{con.server_id}/schedules"
    olive.post(path, data=form(olive.get(path).text))
    schedule_id = con.world.api("GET", "/api/v1/schedules").json()["schedules"][0]["id"]

    refused = olive.post(f"/schedules/{schedule_id}/delete", data={"csrf_token": "forged"})

    assert refused.status_code == 403
    assert len(con.world.api("GET", "/api/v1/schedules").json()["schedules"]) == 1


def test_another_owners_schedules_page_is_forbidden(con: Console) -> None:
    stella = con.client("stella")

    assert stella.get(f"/servers/{con.server_id}/schedules").status_code == 403
