"""Selector schedules in the console: `/schedules` lists the ones a person made with their
selector and creates one from its form; running one now shows its group (or that nothing
matched); a job it made links back to that page; another person sees none of them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console, csrf_of
from tests.support.stores import memory_factory


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        labelled = built.world.api(
            "PUT", f"/api/v1/servers/{built.server_id}/labels", json={"labels": {"role": "web"}}
        )
        assert labelled.status_code == 200, labelled.text
        yield built


def form(page: str, **fields: str) -> dict[str, str]:
    base = {
        "csrf_token": csrf_of(page),
        "name": "fleet nightly",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "kind": "noop",
        "payload": "{}",
        "overlap": "skip",
        "catchup_window_s": "60",
        "selector": "role=web",
        "max_parallel": "2",
    }
    return base | fields


def test_the_form_creates_a_selector_schedule_that_the_page_lists_with_its_selector(
    con: Console,
) -> None:
    olive = con.client("olive")
    page = olive.get("/schedules").text

    made = olive.post("/schedules", data=form(page))
    listed = olive.get(made.headers["location"]).text

    assert made.status_code == 303, made.text
    assert "The schedule is created." in listed
    assert "<code>role=web</code>" in listed
    assert "at most 2 at once" in listed
    (schedule,) = con.world.api("GET", "/api/v1/schedules").json()["schedules"]
    assert (schedule["server_id"], schedule["selector"], schedule["max_parallel"]) == (
        None,
        "role=web",
        2,
    )


def test_a_selector_that_does_not_parse_is_said_on_the_page_with_the_form_kept(
    con: Console,
) -> None:
    olive = con.client("olive")

    answer = olive.post("/schedules", data=form(olive.get("/schedules").text, selector="role=,,"))

    assert answer.status_code == 422
    assert "selector does not parse at position" in answer.text
    assert 'value="role=,,"' in answer.text


def test_run_now_shows_the_group_and_its_job_links_back_to_the_page(con: Console) -> None:
    olive = con.client("olive")
    olive.post("/schedules", data=form(olive.get("/schedules").text))
    schedule_id = con.world.api("GET", "/api/v1/schedules").json()["schedules"][0]["id"]

    done = olive.post(
        f"/schedules/{schedule_id}/trigger",
        data={"csrf_token": csrf_of(olive.get("/schedules").text)},
    )

    assert (done.status_code, done.headers["location"].split("?")[0]) == (303, "/schedules")
    page = olive.get(done.headers["location"]).text
    group = re.search(r'href="/groups/(grp_[a-z0-9]+)"', page)
    assert group is not None
    (job,) = con.world.api("GET", "/api/v1/jobs", params={"group": group.group(1)}).json()["jobs"]
    detail = olive.get(f"/jobs/{job['id']}").text
    assert f'href="/schedules#{schedule_id}"' in detail


def test_a_firing_that_matched_nothing_says_so(con: Console) -> None:
    olive = con.client("olive")
    olive.post("/schedules", data=form(olive.get("/schedules").text, selector="role=none"))
    schedule_id = con.world.api("GET", "/api/v1/schedules").json()["schedules"][0]["id"]

    done = olive.post(
        f"/schedules/{schedule_id}/trigger",
        data={"csrf_token": csrf_of(olive.get("/schedules").text)},
    )

    assert "no server matched" in olive.get(done.headers["location"]).text


def test_another_person_sees_none_of_them(con: Console) -> None:
    olive = con.client("olive")
    olive.post("/schedules", data=form(olive.get("/schedules").text, name="olives fleet"))

    assert "olives fleet" not in con.client("stella").get("/schedules").text
    assert "olives fleet" in con.client("ada").get("/schedules").text  # a platform admin
