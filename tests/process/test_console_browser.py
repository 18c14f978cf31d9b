"""The console in a real browser: Debian's Chromium, driven by Playwright (sync API), against
the platform served over HTTP by uvicorn in a background thread.

The tests play Run with the signing client over the same HTTP server. They skip when
/usr/bin/chromium is missing on a developer machine, and fail under `CI=true`, where CI
installs it. A Content-Security-Policy violation or a script error on any page fails the test
that caused it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, expect, sync_playwright

from tests.support import needs
from tests.support.console_kit import (
    CHROMIUM,
    PASSWORDS,
    Console,
    cheap_passwords,
    console,
    launch_chromium,
    over_http,
    serve,
    sign_in_page,
)
from tests.support.stores import memory_factory

# A real platform process and Chromium: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

TIMEOUT_MS = 10_000
"""The longest wait for a page to show something (polling is every 2 s)."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        needs.missing(f"{CHROMIUM} is missing: the console's browser tests drive Debian's Chromium")
    with sync_playwright() as playwright:
        launched = launch_chromium(playwright)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Site:
    """The served console, one browser page on it, and what the page complained about."""

    con: Console
    url: str
    page: Page
    dialogs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def sign_in(self, name: str, path: str = "/jobs") -> None:
        sign_in_page(self.page, self.url, name, path)

    def on_console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            self.problems.append(message.text)

    def on_dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.accept()


@pytest.fixture
def site(browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    cheap_passwords(monkeypatch)
    expect.set_options(timeout=TIMEOUT_MS)
    with (
        console(memory_factory(), tmp_path) as con,
        serve(con.world.app) as served,
        over_http(con, served.url),
    ):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        found = Site(con, served.url, page)
        page.on("console", found.on_console)
        page.on("pageerror", lambda error: found.problems.append(str(error)))
        page.on("dialog", found.on_dialog)
        try:
            yield found
        finally:
            context.close()
    assert found.problems == []


def test_signing_in_lists_the_jobs_and_opens_one(site: Site) -> None:
    """Sign in on the form /jobs leads to; the list shows the owner's jobs; one opens."""
    backup = site.con.submit(kind="backup")
    report = site.con.submit(kind="report")
    site.con.submit("stella", site.con.other_server_id, kind="stellas-job")
    page = site.page
    page.goto(site.url + "/jobs")
    expect(page).to_have_url(site.url + "/login?next=%2Fjobs")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    site.sign_in("olive")
    rows = page.locator("table.cards tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.locator(".chip")).to_have_text(["queued", "queued"])
    expect(rows.locator("code")).to_have_text(["report", "backup"])
    expect(page.get_by_text("stellas-job")).to_have_count(0)
    page.get_by_role("link", name=backup).click()
    expect(page).to_have_url(f"{site.url}/jobs/{backup}")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Job {backup}")
    expect(page.get_by_test_id("state")).to_have_text("queued")
    assert report != backup


def test_cancelling_a_queued_job_shows_it_cancelled(site: Site) -> None:
    """Cancel (confirmed in the dialog) ends a queued job at once: the page says cancelled."""
    job_id = site.con.submit()
    site.sign_in("olive", f"/jobs/{job_id}")
    expect(site.page.get_by_test_id("state")).to_have_text("queued")
    site.page.get_by_role("button", name="Cancel job").click()
    expect(site.page.get_by_test_id("state")).to_have_text("cancelled")
    expect(site.page.get_by_test_id("cancel-result")).to_contain_text("cancelled at")
    expect(site.page.get_by_role("button", name="Cancel job")).to_have_count(0)
    assert site.dialogs == [f"Cancel job {job_id}?"]
    assert site.con.state(job_id) == "cancelled"


def test_cancelling_a_running_job_shows_the_intent_then_the_result(site: Site) -> None:
    """A running job shows the cancel intent; when Run reports `cancelled`, the page shows the
    result by itself (it polls), without a reload."""
    job_id = site.con.submit()
    run = site.con.run.start()
    attempt = run.run_to_running(job_id)
    page = site.page
    site.sign_in("olive", f"/jobs/{job_id}")
    expect(page.get_by_test_id("state")).to_have_text("running")
    page.get_by_role("button", name="Cancel job").click()
    expect(page.get_by_test_id("cancel-requested")).to_contain_text("yes")
    expect(page.get_by_test_id("cancel-result")).to_have_text("waiting for Run")
    expect(page.get_by_test_id("state")).to_have_text("running")
    page.evaluate("window.sameDocument = true")

    polled = run.cancel_poll(job_id, attempt)
    assert (polled.status_code, polled.json()["cancel_requested"]) == (200, True)
    reported = run.result(job_id, attempt, "cancelled")
    assert reported.status_code == 200, reported.text

    expect(page.get_by_test_id("state")).to_have_text("cancelled")
    expect(page.get_by_test_id("cancel-result")).to_contain_text("cancelled at")
    expect(page.get_by_role("heading", name="Outcome")).to_be_visible()
    assert page.evaluate("window.sameDocument") is True
    assert site.con.state(job_id) == "cancelled"


def test_a_server_administrator_sees_the_servers_jobs(site: Site) -> None:
    """hugo administers olive's web-1: he sees its jobs in the list and opens them."""
    job_id = site.con.submit("olive", kind="olives-backup")
    site.con.submit("stella", site.con.other_server_id, kind="stellas-job")
    page = site.page
    site.sign_in("hugo")
    row = page.locator("table.cards tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator('td[data-label="Server"]')).to_have_text("web-1")
    page.get_by_role("link", name=job_id).click()
    expect(page.get_by_test_id("state")).to_have_text("queued")
    expect(page.get_by_text("olives-backup")).to_be_visible()
    page.get_by_role("link", name="Servers").click()
    expect(page.get_by_role("heading", level=2)).to_have_text(["web-1"])


def test_another_owners_job_is_the_403_page(site: Site) -> None:
    """stella opens olive's job: a 403 page in the console's style, with nothing of the job."""
    job_id = site.con.submit(kind="olives-backup")
    site.sign_in("stella")
    response = site.page.goto(f"{site.url}/jobs/{job_id}")
    assert response is not None
    assert response.status == 403
    expect(site.page.get_by_role("heading", name="Not yours to see")).to_be_visible()
    expect(site.page.locator(".big-code")).to_have_text("403")
    expect(site.page.get_by_text("olives-backup")).to_have_count(0)
    expect(site.page.get_by_role("link", name="Back to jobs")).to_be_visible()


def test_signed_out_visitors_are_sent_to_sign_in_and_back(site: Site) -> None:
    """A signed-out page leads to /login?next=<it>; signing in returns there; signing out
    ends it (the page asks to sign in again)."""
    job_id = site.con.submit()
    path = f"/jobs/{job_id}"
    page = site.page
    page.goto(site.url + path)
    expect(page).to_have_url(f"{site.url}/login?next={quote(path, safe='')}")
    page.get_by_label("Name").fill("olive")
    page.get_by_label("Password").fill(PASSWORDS["olive"])
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(site.url + path)
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(site.url + "/login")
    page.goto(site.url + "/jobs?state=queued")
    expect(page).to_have_url(site.url + "/login?next=%2Fjobs%3Fstate%3Dqueued")


def test_a_form_post_without_its_csrf_token_is_refused(site: Site) -> None:
    """A cancel form whose csrf_token field is gone is the 403 page; the job stays queued."""
    job_id = site.con.submit()
    site.sign_in("olive", f"/jobs/{job_id}")
    page = site.page
    page.locator("form[data-confirm] input[name=csrf_token]").evaluate("field => field.remove()")
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator(".big-code")).to_have_text("403")
    expect(page.get_by_text("this form is missing its security token")).to_be_visible()
    assert site.con.state(job_id) == "queued"


@pytest.mark.parametrize(
    "path",
    [
        "/jobs",
        "/jobs/{job_id}",
        "/groups",
        "/servers",
        "/servers/{server_id}/remove",
        "/endpoints",
        "/users",
        "/account",
        "/login",
    ],
)
def test_pages_fit_a_375_px_wide_screen(site: Site, path: str) -> None:
    """At 375 px nothing is wider than the screen (no horizontal scrolling)."""
    # A payload with long unbroken strings: its block wraps rather than widens the page.
    payload = {"note": "y" * 300, "argv": ["a" * 200, "--flag"]}
    job_id = site.con.submit(kind="a-rather-long-job-kind-name", payload=payload)
    run = site.con.run.start()
    attempt = run.run_to_running(job_id)
    assert run.send_logs(job_id, attempt, 1, "x" * 300).status_code == 202
    page = site.page
    page.set_viewport_size({"width": 375, "height": 812})
    if path != "/login":
        site.sign_in("ada")
    page.goto(site.url + path.format(job_id=job_id, server_id=site.con.server_id))
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths == [375, 375]


# -- the access lifecycle's forms and Cancel selected -------------------------------------------


def page_width(page: Page) -> list[int]:
    widths: list[int] = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    return widths


def test_an_admin_creates_an_endpoint_and_sees_its_join_token_once(site: Site) -> None:
    """The answer page shows the join token and the `run join` line (and fits 375 px); back
    on the endpoints page the new endpoint is listed and the token is nowhere."""
    page = site.page
    site.sign_in("ada", "/endpoints")
    page.get_by_label("Name (e.g. the host's)").fill("host-c")
    page.get_by_role("button", name="Create endpoint").click()
    expect(page.get_by_role("heading", name="Endpoint host-c is created")).to_be_visible()
    token = page.get_by_test_id("secret").inner_text()
    expected = (
        f"moonrun run join --platform {site.url} --token {token} --data-dir /var/lib/moonrun-run"
    )
    expect(page.get_by_test_id("command")).to_have_text(expected)
    assert token.startswith("mrj_")
    page.set_viewport_size({"width": 375, "height": 812})
    assert page_width(page) == [375, 375]
    page.get_by_role("link", name="Back to endpoints").click()
    expect(page).to_have_url(site.url + "/endpoints")
    expect(page.locator('td[data-label="Name"]', has_text="host-c")).to_be_visible()
    assert token not in page.content()


def test_removing_an_endpoint_in_use_says_why(site: Site) -> None:
    """Remove… leads to a confirm page; host-a still hosts web-1, so the endpoints page says
    so and host-a stays."""
    page = site.page
    site.sign_in("ada", "/endpoints")
    page.get_by_role("link", name="Remove host-a").click()
    expect(page.get_by_role("heading", name="Remove endpoint host-a?")).to_be_visible()
    page.get_by_role("button", name="Remove endpoint").click()
    expect(page.get_by_test_id("problem")).to_have_text(
        f"1 server points at endpoint {site.con.run.endpoint_id}; remove them first"
    )
    expect(page.get_by_role("heading", name="Endpoints", exact=True)).to_be_visible()
    assert site.con.world.store.get_endpoint(site.con.run.endpoint_id) is not None


def test_an_admin_creates_a_user_then_disables_them(site: Site) -> None:
    """Create user shows the API token once; Disable (confirmed) marks the user disabled, and
    their password no longer signs in."""
    page = site.page
    site.sign_in("ada", "/users")
    page.get_by_label("Name", exact=True).fill("nova")
    page.locator("#user-password").fill("nova-sees-the-moon-77")
    page.locator("#user-password-again").fill("nova-sees-the-moon-77")
    page.get_by_role("button", name="Create user").click()
    expect(page.get_by_role("heading", name="User nova is created")).to_be_visible()
    token = page.get_by_test_id("secret").inner_text()
    assert token.startswith("mra_")
    page.get_by_role("link", name="Back to users").click()
    row = page.locator("tr", has_text="nova")
    expect(row.locator(".chip")).to_have_text("enabled")
    row.get_by_role("button", name="Disable nova").click()
    expect(page.get_by_test_id("notice")).to_have_text(
        "The user is disabled: their API tokens and console sessions are refused."
    )
    expect(page.locator("tr", has_text="nova").locator(".chip")).to_have_text("disabled")
    expect(page.get_by_role("button", name="Enable nova")).to_be_visible()
    assert site.dialogs == [
        "Disable nova? Their API tokens and console sessions stop working at once."
    ]
    assert token not in page.content()
    nova = site.con.world.store.user_by_name("nova")
    assert (nova is not None and nova.disabled) is True


def test_an_admin_creates_a_server_for_an_owner(site: Site) -> None:
    """Create server with an endpoint and an owner picked from the lists: the servers page
    says so and shows it; its owner sees it too."""
    page = site.page
    site.sign_in("ada", "/servers")
    page.get_by_label("Name", exact=True).fill("cache-1")
    page.get_by_label("Endpoint").select_option(site.con.other_run.endpoint_id)
    page.get_by_label("Owner").select_option(label="stella")
    page.get_by_role("button", name="Create server").click()
    expect(page.get_by_test_id("notice")).to_have_text("The server is created.")
    expect(page.get_by_role("heading", name="cache-1")).to_be_visible()
    (server,) = [s for s in site.con.world.store.list_servers() if s.name == "cache-1"]
    assert (server.endpoint_id, server.owner_id) == (
        site.con.other_run.endpoint_id,
        site.con.users["stella"][0],
    )


def test_cancel_selected_cancels_the_ticked_jobs_and_the_ticks_survive_the_refresh(
    site: Site,
) -> None:
    """Tick a running and a queued job; the list refreshes (the running job's progress shows)
    and both stay ticked; Cancel selected (confirmed) ends the queued one and leaves the
    running one cancelling, and a third job alone."""
    con, page = site.con, site.page
    running = con.submit(kind="first")
    run = con.run.start()
    attempt = run.run_to_running(running)
    queued = con.submit(kind="second")
    untouched = con.submit(kind="third")
    site.sign_in("olive")
    for job_id in (running, queued):
        page.get_by_label(f"Select job {job_id}").check()
    page.evaluate("document.querySelector('#live table').dataset.before = 'yes'")
    assert run.progress(running, attempt, 1, percent=40).status_code == 200
    row = page.locator("tr", has_text=running)
    expect(row.locator('td[data-label="Progress"]')).to_have_text("40%")
    assert page.evaluate("document.querySelector('#live table').dataset.before") is None
    ticked = [
        page.get_by_label(f"Select job {job_id}").is_checked()
        for job_id in (running, queued, untouched)
    ]
    assert ticked == [True, True, False]
    page.get_by_role("button", name="Cancel selected").click()
    expect(page.get_by_test_id("notice")).to_have_text(
        "1 job was cancelled; 1 job was asked to stop (cancelling)."
    )
    expect(page.locator("tr", has_text=queued).locator(".chip")).to_have_text("cancelled")
    expect(page.locator("tr", has_text=running)).to_contain_text("cancelling")
    expect(page.locator("tr", has_text=untouched).locator(".chip")).to_have_text("queued")
    expect(page.get_by_label(f"Select job {queued}")).to_have_count(0)
    assert site.dialogs == ["Cancel the selected jobs?"]
    states = [con.state(job_id) for job_id in (queued, running, untouched)]
    assert states == ["cancelled", "running", "queued"]


def test_the_forms_work_without_javascript(site: Site, browser: Browser) -> None:
    """With scripts off, Cancel selected (no confirm dialog) and the confirm page of Remove
    still work: the script only adds dialogs and live updates."""
    con = site.con
    queued = con.submit()
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        sign_in_page(page, site.url, "olive")
        page.get_by_label(f"Select job {queued}").check()
        page.get_by_role("button", name="Cancel selected").click()
        expect(page.get_by_test_id("notice")).to_have_text("1 job was cancelled.")
        page.goto(site.url + "/servers")
        page.get_by_role("link", name="Remove server web-1").click()
        page.get_by_role("button", name="Remove server").click()
        expect(page.get_by_test_id("notice")).to_have_text(
            "The server is removed; its ended jobs stay readable by platform admins."
        )
    finally:
        context.close()
    assert (con.state(queued), con.world.store.get_server(con.server_id)) == ("cancelled", None)
