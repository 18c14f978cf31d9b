"""`make screenshots`: pictures of the console in docs/img/, taken in Debian's Chromium.

Seeds a platform (the test harness's: an in-memory store and a manual clock) with jobs in every
state, serves it over HTTP with uvicorn on a free port of 127.0.0.1, plays Run with the signing
client, and drives /usr/bin/chromium with Playwright to write:

- docs/img/jobs.png       the jobs list, as a platform admin
- docs/img/job.png        a running job with progress and logs, as its owner
- docs/img/forbidden.png  the 403 page: another owner's job
- docs/img/job-375.png    the same job detail on a 375 px wide screen
- docs/img/submit.png     the submit form, its payload refused with the schema's problems inline
- docs/img/endpoints.png  the endpoints page, as a platform admin (create, drain, remove)
- docs/img/users.png      the users page, as a platform admin (create, disable, rotate, password)

Exits 1 if a page at 375 px is wider than the screen (it would scroll sideways), or if a page
reports a Content-Security-Policy violation or a script error.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for the test kit

from playwright.sync_api import Page, sync_playwright
from tests.support.console_kit import (
    CHROMIUM,
    Console,
    console,
    launch_chromium,
    over_http,
    serve,
    sign_in_page,
)
from tests.support.stores import memory_factory

from moonrun.run.handlers import ANY_PAYLOAD
from moonrun.run.handlers.command import PAYLOAD_SCHEMA as COMMAND
from moonrun.run.handlers.sleep import PAYLOAD_SCHEMA as SLEEP

BUILT_INS = {"command": COMMAND, "noop": ANY_PAYLOAD, "sleep": SLEEP}
SEEDED_KINDS = (
    "nightly-backup",
    "db-migrate",
    "render-thumbnails",
    "mirror-sync",
    "weekly-report",
    "index-rebuild",
    "olives-secret-work",
)
"""The kinds host-a's Run advertises besides the built-ins (those of the seeded jobs)."""
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img"
NARROW = 375
STEP_MS = 9_000
"""How far the manual clock moves between two events (the pages show distinct times); Run
heartbeats at each step and reports progress now and then, as it would, so that its sessions
and leases stay alive."""


def seed(con: Console) -> str:
    """Jobs in every state on web-1 (olive's) and db-1 (stella's); answers the running one."""
    kinds = {**BUILT_INS, **dict.fromkeys(SEEDED_KINDS, ANY_PAYLOAD)}
    clock, run, other = con.world.clock, con.run.start(kinds=kinds), con.other_run.start()

    def tick() -> None:
        clock.advance(STEP_MS)
        for worker in (run, other):
            assert worker.heartbeat().status_code == 200

    def started(
        kind: str, owner: str = "olive", server_id: str | None = None, **body: Any
    ) -> tuple[str, int]:
        job_id = con.submit(owner, server_id, kind=kind, max_attempts=3, **body)
        tick()
        worker = other if server_id == con.other_server_id else run
        return job_id, worker.run_to_running(job_id)

    backup, attempt = started("nightly-backup")
    run.send_logs(backup, attempt, 1, "snapshot taken", "uploaded 14.2 GiB")
    tick()
    assert run.result(backup, attempt, output={"bytes": 15_246_000_000}).status_code == 200

    migrate, attempt = started("db-migrate")
    tick()
    error = {"code": "exit_2", "message": "migration 0042: column already exists"}
    assert run.result(migrate, attempt, "failed", error=error).status_code == 200

    render, rendering = started("render-thumbnails")
    vacuum, attempt = started("vacuum", "stella", con.other_server_id)
    progress = other.progress(vacuum, attempt, 1, percent=30, message="table 3 of 10")
    assert progress.status_code == 200, progress.text

    backoff = {"initial_s": 300, "multiplier": 2, "max_s": 3600}
    sync, attempt = started("mirror-sync", backoff=backoff)
    tick()
    error = {"code": "exit_75", "message": "the mirror is busy"}
    reported = run.result(sync, attempt, "failed", retryable=True, error=error)
    assert reported.status_code == 200

    early = run.progress(render, rendering, 1, percent=25, message="rendering 250 of 1000")
    assert early.status_code == 200, early.text

    report = con.submit(kind="weekly-report")
    cancelled = con.world.api("POST", f"/api/v1/jobs/{report}/cancel", token=con.token("olive"))
    assert cancelled.status_code == 200, cancelled.text
    tick()
    con.submit("stella", con.other_server_id, kind="db-backup")
    con.submit(kind="index-rebuild")
    tick()

    lines = [
        "found 1000 images in /data/incoming",
        "rendering at 320x240, 640x480",
        "rendered 250 of 1000",
        "rendered 500 of 1000",
        "rendered 620 of 1000",
    ]
    assert run.send_logs(render, rendering, 1, *lines).status_code == 202
    warning = {
        "ts": "2026-11-18T11:12:00.000Z",
        "stream": "stderr",
        "text": "warning: img_0413.jpg has no EXIF orientation; assuming upright",
    }
    body = {"job_id": render, **run.evidence(render, rendering), "seq": 2, "lines": [warning]}
    assert run.post("/run/v1/logs", body).status_code == 202
    tick()
    progress = run.progress(render, rendering, 2, percent=62, message="rendering 620 of 1000")
    assert progress.status_code == 200, progress.text
    states = {con.state(job_id) for job_id in (backup, migrate, sync, vacuum, report, render)}
    assert states == {"succeeded", "failed", "retrying", "running", "cancelled"}, states
    return render


def width_of(page: Page) -> int:
    width: int = page.evaluate("document.documentElement.scrollWidth")
    return width


def main() -> int:
    if not CHROMIUM.exists():
        print(f"screenshots: {CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with (
        tempfile.TemporaryDirectory() as scratch,
        console(memory_factory(), Path(scratch)) as con,
        serve(con.world.app) as served,
        over_http(con, served.url),
        sync_playwright() as playwright,
    ):
        running = seed(con)
        other_owners = con.submit(kind="olives-secret-work")
        browser = launch_chromium(playwright)

        def page_of(name: str, width: int, path: str) -> Page:
            context = browser.new_context(viewport={"width": width, "height": 900})
            page = context.new_page()
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on(
                "console",
                lambda message: (
                    problems.append(message.text)
                    if "Content Security Policy" in message.text
                    else None
                ),
            )
            sign_in_page(page, served.url, name, path)
            return page

        shots = [
            ("jobs.png", page_of("ada", 1280, "/jobs")),
            ("job.png", page_of("olive", 1280, f"/jobs/{running}")),
            ("forbidden.png", page_of("stella", 1280, f"/jobs/{other_owners}")),
        ]
        submit = page_of("olive", 1280, f"/jobs/new?server_id={con.server_id}")
        submit.get_by_label("Kind", exact=True).select_option("command")
        payload = '{"argv": "make -C /srv/app test", "timeout": 600}'
        submit.get_by_label("Payload (a JSON object)").fill(payload)
        submit.get_by_role("button", name="Submit", exact=True).click()
        submit.get_by_test_id("problems").wait_for()
        shots.append(("submit.png", submit))
        shots.append(("endpoints.png", page_of("ada", 1280, "/endpoints")))
        shots.append(("users.png", page_of("ada", 1280, "/users")))
        narrow = page_of("olive", NARROW, f"/jobs/{running}")
        shots.append(("job-375.png", narrow))
        for name, page in shots:
            page.screenshot(path=str(OUT / name), full_page=True)
            print(f"screenshots: wrote {(OUT / name).relative_to(ROOT)}")
        for path in ("/jobs", f"/jobs/{running}", "/servers", "/jobs/new", "/account"):
            narrow.goto(served.url + path)
            if width_of(narrow) > NARROW:
                problems.append(f"{path} is {width_of(narrow)} px wide at {NARROW} px")
        browser.close()
    for problem in problems:
        print(f"screenshots: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
