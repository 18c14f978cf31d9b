"""The console's submit form, rerun button and job search, without a browser.

People are the console kit's: olive owns web-1 (on host-a), hugo administers it, stella owns
db-1, ada is a platform admin. host-a's Run advertises the built-in kinds unless a test says
otherwise.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from moonrun.run.handlers import ANY_PAYLOAD
from moonrun.run.handlers.command import PAYLOAD_SCHEMA as COMMAND
from moonrun.run.handlers.sleep import PAYLOAD_SCHEMA as SLEEP
from tests.support.console_kit import Console, cheap_passwords, console, csrf_of
from tests.support.stores import memory_factory

BUILT_INS = {"command": COMMAND, "noop": ANY_PAYLOAD, "sleep": SLEEP}


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        built.run.start(kinds=BUILT_INS)
        yield built


def form_fields(page: str) -> dict[str, str]:
    """The hidden fields of the page's submit form (its CSRF token, server and key)."""
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page))
    return {name: html.unescape(value) for name, value in fields.items()}


def submit(browser: TestClient, con: Console, **typed: str) -> Any:
    """Fill the submit form for web-1 as a person would, and post it."""
    page = browser.get("/jobs/new", params={"server_id": con.server_id})
    assert page.status_code == 200, page.text
    return browser.post("/jobs/new", data={**form_fields(page.text), **typed})


def test_the_submit_form_offers_the_kinds_the_run_advertised(con: Console) -> None:
    """The kind list is what host-a's Run advertised; each kind's fields are described and
    the payload editor starts with the first kind's required fields."""
    page = con.client("olive").get("/jobs/new", params={"server_id": con.server_id}).text
    options = re.findall(r'<option value="([a-z]+)"[^>]*data-skeleton', page)
    assert options == ["command", "noop", "sleep"]
    assert "The program and its arguments, run without a shell." in page
    assert '{"argv": []}</textarea>' in html.unescape(page)


def test_a_job_that_fits_is_queued_and_the_page_goes_to_it(con: Console) -> None:
    """A submit that fits redirects to the new job's page; the job is queued with its payload."""
    browser = con.client("olive")
    response = submit(browser, con, kind="command", payload='{"argv": ["echo", "hi"]}')
    assert response.status_code == 303
    job_id = response.headers["location"].removeprefix("/jobs/")
    stored = con.world.stored(job_id)
    assert (stored.kind, stored.payload(), con.state(job_id)) == (
        "command",
        {"argv": ["echo", "hi"]},
        "queued",
    )


def test_a_payload_that_does_not_fit_is_shown_again_with_each_problem_inline(
    con: Console,
) -> None:
    """422: the form comes back with what was typed and, under the editor, each field that
    does not fit; nothing is queued."""
    browser = con.client("olive")
    typed = '{"argv": "echo hi", "timeout": 5}'
    response = submit(browser, con, kind="command", payload=typed)
    page = html.unescape(response.text)
    problems = re.findall(r"<li><code>([^<]*)</code> ([^<]*)</li>", page)
    assert response.status_code == 422
    assert problems == [
        ("argv", "must be an array, not a string"),
        ("timeout", "is not a field of this kind (fields: argv, artifacts, timeout_s)"),
    ]
    assert f">{typed}</textarea>" in page
    assert 'aria-invalid="true"' in page
    assert con.world.store.list_jobs(server_ids=None, state=None, limit=10) == []


@pytest.mark.parametrize(
    ("typed", "code", "says"),
    [
        ({"kind": "comand", "payload": "{}"}, "unknown_kind", "did you mean 'command'?"),
        ({"kind": "command", "payload": '{"argv": [}'}, "invalid_request", "line 1, column 11"),
        ({"kind": "sleep", "payload": "[1]"}, "invalid_payload", "must be an object, not an array"),
        ({"kind": "noop", "payload": "{}", "max_attempts": "x"}, "invalid_request", "whole"),
    ],
    ids=["misspelt kind", "broken JSON", "not an object", "attempts not a number"],
)
def test_a_refused_submit_says_why_on_the_form(
    con: Console, typed: dict[str, str], code: str, says: str
) -> None:
    """Every refusal is the form again with its code and message, never an error page."""
    response = submit(con.client("olive"), con, **typed)
    page = html.unescape(response.text)
    assert response.status_code == 422
    assert f"<code>{code}</code>" in page
    assert says in page
    assert "Submit a job" in page


def test_a_form_posted_twice_queues_one_job(con: Console) -> None:
    """The form carries a key of its own: posting it again (a double click, a reload) answers
    the same job rather than queueing a second."""
    browser = con.client("olive")
    page = browser.get("/jobs/new", params={"server_id": con.server_id}).text
    data = {**form_fields(page), "kind": "noop", "payload": "{}"}
    first, again = browser.post("/jobs/new", data=data), browser.post("/jobs/new", data=data)
    assert first.headers["location"] == again.headers["location"]
    assert len(con.world.store.list_jobs(server_ids=None, state=None, limit=10)) == 1


def test_without_an_advertisement_any_kind_can_be_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Run that advertised nothing: the kind is a text field, and any kind is queued."""
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as con:
        browser = con.client("olive")
        page = browser.get("/jobs/new").text
        response = submit(browser, con, kind="anything.goes", payload="")
    assert "has not said which kinds it runs" in page
    assert response.status_code == 303


def test_only_the_servers_a_person_may_submit_to_are_offered(con: Console) -> None:
    """stella sees db-1 only; asking for web-1's form is the 404 page; posting to it is 403."""
    browser = con.client("stella")
    page = browser.get("/jobs/new").text
    other = browser.get("/jobs/new", params={"server_id": con.server_id})
    fields = {**form_fields(page), "server_id": con.server_id, "kind": "noop", "payload": "{}"}
    posted = browser.post("/jobs/new", data=fields)
    assert ("db-1" in page, "web-1" in page) == (True, False)
    assert (other.status_code, posted.status_code) == (404, 403)


def test_a_submit_without_its_csrf_token_is_refused(con: Console) -> None:
    """A cross-site form cannot submit jobs: 403, nothing queued."""
    browser = con.client("olive")
    data = {"server_id": con.server_id, "kind": "noop", "payload": "{}"}
    response = browser.post("/jobs/new", data=data)
    assert response.status_code == 403
    assert con.world.store.list_jobs(server_ids=None, state=None, limit=10) == []


# -- rerun -----------------------------------------------------------------------------------


def test_a_finished_job_page_offers_run_again_which_queues_a_new_job(con: Console) -> None:
    """A cancelled job's page has a Run again button; it queues a new job with the same
    payload and leads to it; a job that has not ended shows no such button."""
    job_id = con.submit("olive", kind="sleep", payload={"seconds": 3})
    browser = con.client("hugo")
    before = browser.get(f"/jobs/{job_id}").text
    browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": csrf_of(before)})
    page = browser.get(f"/jobs/{job_id}").text
    response = browser.post(f"/jobs/{job_id}/rerun", data=form_fields(page))
    new_id = response.headers["location"].removeprefix("/jobs/")
    assert ("Run again" in before, "Run again" in page) == (False, True)
    assert response.status_code == 303
    assert new_id != job_id
    assert con.world.stored(new_id).payload() == {"seconds": 3}


def test_run_again_is_refused_to_whoever_may_not_read_the_job(con: Console) -> None:
    """stella cannot rerun olive's job: the 403 page, nothing queued."""
    job_id = con.submit("olive", kind="noop")
    con.world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=con.token("olive"))
    browser = con.client("stella")
    token = csrf_of(browser.get("/jobs").text)
    response = browser.post(f"/jobs/{job_id}/rerun", data={"csrf_token": token})
    assert response.status_code == 403
    assert len(con.world.store.list_jobs(server_ids=None, state=None, limit=10)) == 1


# -- search ----------------------------------------------------------------------------------


def listed(page: str) -> list[str]:
    return re.findall(r'<a class="mono" href="/jobs/(job_\w+)">', page)


def test_the_jobs_list_finds_jobs_by_kind_and_by_the_start_of_their_id(con: Console) -> None:
    """`kind` keeps that kind; `id` keeps jobs whose id starts so, with or without `job_`."""
    sleep = con.submit("olive", kind="sleep", payload={"seconds": 1})
    noop = con.submit("olive", kind="noop")
    browser = con.client("olive")
    by_kind = listed(browser.get("/jobs", params={"kind": "sleep"}).text)
    by_id = listed(browser.get("/jobs", params={"id": noop[:10]}).text)
    without_prefix = listed(browser.get("/jobs", params={"id": noop.removeprefix("job_")}).text)
    assert (by_kind, by_id, without_prefix) == ([sleep], [noop], [noop])


def test_a_search_too_short_says_so_on_the_jobs_page(con: Console) -> None:
    """An id start of fewer than 3 characters after job_ is the jobs page with a message
    (422), not an error page; the refused value is not shown again."""
    con.submit("olive", kind="noop")
    response = con.client("olive").get("/jobs", params={"id": "ab"})
    assert response.status_code == 422
    assert 'data-testid="search-error"' in response.text
    assert listed(response.text) == []
    assert 'name="id" value=""' in response.text


def test_a_form_posted_after_signing_out_leads_back_to_its_page(con: Console) -> None:
    """Posted without a session, the submit form and Run again lead to sign-in, then back to
    the page they were on (not to a POST-only path)."""
    browser = con.client()
    data = {"csrf_token": "x", "kind": "noop"}
    submitted = browser.post("/jobs/new", data=data)
    rerun = browser.post("/jobs/job_abcdefgh/rerun", data=data)
    assert submitted.headers["location"] == "/login?next=%2Fjobs%2Fnew"
    assert rerun.headers["location"] == "/login?next=%2Fjobs%2Fjob_abcdefgh"
