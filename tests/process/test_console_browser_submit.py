"""The console's submit form, Run again and job search in Debian's Chromium (Playwright).

Fixtures are tests/process/test_console_browser.py's: a served console, one browser page, and any
Content-Security-Policy violation or script error fails the test that caused it.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from moonrun.run.handlers import ANY_PAYLOAD
from moonrun.run.handlers.command import PAYLOAD_SCHEMA as COMMAND
from moonrun.run.handlers.sleep import PAYLOAD_SCHEMA as SLEEP
from tests.process import test_console_browser
from tests.process.test_console_browser import Site

# A real platform process and Chromium: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

browser = test_console_browser.browser
site = test_console_browser.site

BUILT_INS = {"command": COMMAND, "noop": ANY_PAYLOAD, "sleep": SLEEP}


def test_submitting_a_job_shows_the_schemas_problems_inline_then_queues_it(site: Site) -> None:
    """The form offers the advertised kinds; a payload that does not fit comes back with each
    problem under the editor; fixed, it queues the job and opens its page."""
    site.con.run.start(kinds=BUILT_INS)
    page = site.page
    site.sign_in("olive")
    page.get_by_role("link", name="Submit a job").click()
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
    page.get_by_label("Kind", exact=True).select_option("command")
    editor = page.get_by_label("Payload (a JSON object)")
    expect(editor).to_have_value('{"argv": []}')
    editor.fill('{"argv": "echo hi"}')
    page.get_by_role("button", name="Submit", exact=True).click()
    expect(page.get_by_test_id("problems")).to_have_text("argv must be an array, not a string")
    expect(editor).to_have_value('{"argv": "echo hi"}')
    expect(editor).to_have_attribute("aria-invalid", "true")
    editor.fill('{"argv": ["echo", "hi"]}')
    page.get_by_role("button", name="Submit", exact=True).click()
    expect(page.get_by_test_id("state")).to_have_text("queued")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Job job_")
    jobs = site.con.world.store.list_jobs(server_ids=None, state=None, limit=10)
    assert [(job.kind, job.payload()) for job in jobs] == [("command", {"argv": ["echo", "hi"]})]


def test_choosing_another_kind_starts_the_editor_from_its_fields(site: Site) -> None:
    """Changing the kind puts that kind's required fields in an untouched editor, but never
    replaces what the person typed."""
    site.con.run.start(kinds=BUILT_INS)
    page = site.page
    site.sign_in("olive", f"/jobs/new?server_id={site.con.server_id}")
    kind, editor = (
        page.get_by_label("Kind", exact=True),
        page.get_by_label("Payload (a JSON object)"),
    )
    kind.select_option("sleep")
    expect(editor).to_have_value("{}")
    kind.select_option("command")
    expect(editor).to_have_value('{"argv": []}')
    editor.fill('{"argv": ["true"]}')
    kind.select_option("noop")
    expect(editor).to_have_value('{"argv": ["true"]}')


def test_run_again_queues_a_finished_job_as_a_new_one(site: Site) -> None:
    """A cancelled job's page offers Run again (confirmed in a dialog); it opens the new job,
    queued, with the same kind."""
    job_id = site.con.submit(kind="sleep", payload={"seconds": 5})
    site.con.world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=site.con.token("olive"))
    page = site.page
    site.sign_in("hugo", f"/jobs/{job_id}")
    expect(page.get_by_test_id("state")).to_have_text("cancelled")
    page.get_by_role("button", name="Run again").click()
    expect(page.get_by_test_id("state")).to_have_text("queued")
    expect(page.get_by_role("heading", level=1)).not_to_contain_text(job_id)
    expect(page.get_by_text("sleep", exact=True)).to_be_visible()
    assert site.dialogs == [f"Run job {job_id} again, as a new job?"]


def test_the_jobs_list_is_searched_by_kind_and_by_the_start_of_an_id(site: Site) -> None:
    """Kind keeps that kind's jobs; the start of an id (without job_) keeps that job; a start
    too short says so."""
    backup = site.con.submit(kind="backup")
    report = site.con.submit(kind="report")
    page = site.page
    site.sign_in("olive")
    rows = page.locator("table.cards tbody tr")
    expect(rows).to_have_count(2)
    page.get_by_label("Kind", exact=True).fill("backup")
    page.get_by_role("button", name="Filter").click()
    expect(rows.locator("a.mono")).to_have_text([backup])
    page.get_by_label("Kind", exact=True).fill("")
    page.get_by_label("Id starts with").fill(report.removeprefix("job_")[:6])
    page.get_by_role("button", name="Filter").click()
    expect(rows.locator("a.mono")).to_have_text([report])
    page.get_by_label("Id starts with").fill("ab")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("search-error")).to_contain_text("id_prefix")
    expect(rows).to_have_count(0)


def test_the_submit_form_fits_a_375_px_wide_screen(site: Site) -> None:
    """At 375 px the form, its problems and the kinds' field tables fit the screen."""
    site.con.run.start(kinds=BUILT_INS)
    page = site.page
    page.set_viewport_size({"width": 375, "height": 812})
    site.sign_in("olive", f"/jobs/new?server_id={site.con.server_id}")
    page.get_by_label("Payload (a JSON object)").fill('{"argv": "x", "a-rather-long-field": 1}')
    page.get_by_role("button", name="Submit", exact=True).click()
    expect(page.get_by_test_id("problems")).to_be_visible()
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths == [375, 375]
