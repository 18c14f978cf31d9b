"""The console (platform_web) without a browser: sign-in, sessions, CSRF, redirects, error pages,
security headers, cookie auth for the API, and a page canary (docs/protocol.md, "Console").

Pages are fetched in-process with a TestClient per person (each its own cookie jar). The
browser tests are in tests/process/test_console_browser.py.
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from moonrun.scheduling.fingerprint import token_hash
from moonrun.store.file import FileStore
from moonrun.web import console as console_room
from tests.integration.test_canary import (
    PAYLOAD,
    SECRET_REF,
    TYPED_BY_THE_USER,
    Canary,
    Seen,
    planted,
)
from tests.support.canary_scan import found_forms, haystack_of
from tests.support.console_kit import (
    PASSWORDS,
    Console,
    cheap_passwords,
    console,
    csrf_of,
    sign_in,
)
from tests.support.http_harness import HttpWorld
from tests.support.stores import file_factory, memory_factory

SESSION = "moonrun_session"
SIGN_IN = "moonrun_signin"
STYLESHEET = '<link rel="stylesheet" href="/static/moonlight.css">'
EXPECTED_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def location(response: Any) -> tuple[int, str | None]:
    return response.status_code, response.headers.get("location")


def cookie_attributes(response: Any) -> dict[str, set[str]]:
    """Each Set-Cookie of a response: its name and its lower-cased attributes (no value)."""
    found = {}
    for header in response.headers.get_list("set-cookie"):
        pair, *attributes = [part.strip() for part in header.split(";")]
        found[pair.split("=", 1)[0]] = {attribute.lower() for attribute in attributes}
    return found


def security_headers(response: Any) -> dict[str, str | None]:
    return {name: response.headers.get(name) for name in EXPECTED_HEADERS}


def error_page(response: Any) -> tuple[int, str, bool, str | None]:
    """(status, content type, styled, the big status code shown) of a console error page."""
    shown = re.search(r'<p class="big-code">(\d+)</p>', response.text)
    return (
        response.status_code,
        response.headers["content-type"],
        STYLESHEET in response.text,
        shown.group(1) if shown else None,
    )


def stellas_admin_places(con: Console) -> list[str]:
    """The servers that stella administers (none, unless someone added her)."""
    stella = con.users["stella"][0]
    return [server.name for server in con.world.store.list_servers() if stella in server.admin_ids]


# -- signed out --------------------------------------------------------------------------------

PAGES = [
    "/jobs",
    "/jobs?state=queued&server_id={server_id}",
    "/jobs?fragment=1",
    "/jobs/{job_id}",
    "/jobs/{job_id}?fragment=1",
    "/servers",
    "/endpoints",
    "/users",
]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_sends_a_signed_out_visitor_to_sign_in_and_back(con: Console, page: str) -> None:
    """Signed out, a page is a 303 to /login?next=<it>; signing in there lands on it."""
    path = page.format(server_id=con.server_id, job_id=con.submit())
    client = con.client(name=None)
    expected = (303, f"/login?next={quote(path, safe='')}")
    assert expected == location(client.get(path))
    (next_path,) = parse_qs(urlsplit(expected[1]).query)["next"]
    signed = sign_in(client, "ada", next=next_path)
    assert (303, path) == location(signed)
    assert client.get(path).status_code == 200


def test_the_root_leads_to_the_jobs(con: Console) -> None:
    """`/` is a 303 to /jobs, which asks a signed-out visitor to sign in."""
    client = con.client()
    assert location(client.get("/")) == (303, "/jobs")
    assert location(client.get("/jobs")) == (303, "/login?next=%2Fjobs")


@pytest.mark.parametrize(
    "route", ["/jobs/{job_id}/cancel", "/servers/{server_id}/admins", "/logout"]
)
def test_a_signed_out_form_post_changes_nothing_and_asks_to_sign_in(
    con: Console, route: str
) -> None:
    """A POST without the session cookie is a 303 to sign-in; the job stays queued."""
    job_id = con.submit()
    path = route.format(job_id=job_id, server_id=con.server_id)
    posted = con.client().post(path, data={"csrf_token": "x", "username": "stella"})
    assert posted.status_code == 303
    assert posted.headers["location"].startswith("/login?next=%2F")
    assert con.state(job_id) == "queued"
    assert stellas_admin_places(con) == []


@pytest.mark.parametrize(
    "route", ["/jobs/{job_id}/cancel", "/servers/{server_id}/admins", "/logout"]
)
def test_signing_in_after_an_expired_form_post_lands_on_a_page(con: Console, route: str) -> None:
    """A form posted after the session expired leads to sign-in; signing in there lands on a
    page (BUG: today `next` is the form's POST-only path, so the landing is a 404)."""
    job_id = con.submit()
    client = con.client("olive")
    form = {"csrf_token": csrf_of(client.get("/jobs").text), "username": "hugo"}
    con.world.clock.advance(12 * 3600 * 1000 + 1)
    posted = client.post(route.format(job_id=job_id, server_id=con.server_id), data=form)
    assert posted.status_code == 303
    (next_path,) = parse_qs(urlsplit(posted.headers["location"]).query)["next"]
    target = sign_in(client, "olive", next=next_path).headers["location"]
    landed = client.get(target)
    assert (target, landed.status_code) == (target, 200)


def test_a_session_ends_after_twelve_hours(con: Console) -> None:
    """12 hours after sign-in the cookie opens nothing: pages ask to sign in, the API is 401."""
    client = con.client("olive")
    con.world.clock.advance(12 * 3600 * 1000 - 1)
    assert client.get("/jobs").status_code == 200
    con.world.clock.advance(1)
    expected = [(303, "/login?next=%2Fjobs"), (401, None)]
    assert expected == [location(client.get("/jobs")), location(client.get("/api/v1/jobs"))]


# -- error pages -------------------------------------------------------------------------------

FORBIDDEN = [
    ("stella", "GET", "/jobs/{job_id}"),
    ("stella", "GET", "/jobs/{job_id}?fragment=1"),
    ("stella", "GET", "/jobs?server_id={server_id}"),
    ("stella", "POST", "/jobs/{job_id}/cancel"),
    ("olive", "GET", "/users"),
    ("olive", "GET", "/endpoints"),
    ("hugo", "POST", "/servers/{server_id}/admins"),
]


@pytest.mark.parametrize(("who", "method", "page"), FORBIDDEN)
def test_a_page_without_access_is_a_styled_403(
    con: Console, who: str, method: str, page: str
) -> None:
    """Signed in but not allowed: a 403 page in the console's style, nothing of the resource."""
    job_id = con.submit(kind="olive-secret-kind")
    client = con.client(who)
    path = page.format(job_id=job_id, server_id=con.server_id)
    form = {"csrf_token": csrf_of(client.get("/jobs").text), "username": "stella"}
    response = client.request(method, path, data=form if method == "POST" else None)
    assert error_page(response) == (403, "text/html; charset=utf-8", True, "403")
    assert "Not yours to see" in response.text
    assert "olive-secret-kind" not in response.text
    assert f">{who}" in response.text  # still signed in: the top bar names the user
    assert security_headers(response) == EXPECTED_HEADERS
    assert con.state(job_id) == "queued"
    assert stellas_admin_places(con) == []


@pytest.mark.parametrize(
    ("who", "method", "path"),
    [
        ("olive", "GET", "/jobs/job_does_not_exist"),
        ("olive", "GET", "/jobs/job_does_not_exist?fragment=1"),
        ("olive", "POST", "/jobs/job_does_not_exist/cancel"),
        ("olive", "GET", "/no-such-page"),
        ("olive", "GET", "/servers/srv_x"),
        ("olive", "GET", "/logout"),
        (None, "GET", "/no-such-page"),
        (None, "GET", "/static/no-such.css"),
    ],
)
def test_a_missing_page_is_a_styled_404(
    con: Console, who: str | None, method: str, path: str
) -> None:
    """No such job, page or method: a 404 page in the console's style, signed in or not."""
    client = con.client(who)
    form = {"csrf_token": csrf_of(client.get("/jobs").text)} if who else None
    response = client.request(method, path, data=form)
    assert error_page(response) == (404, "text/html; charset=utf-8", True, "404")
    assert "Nothing here" in response.text
    assert security_headers(response) == EXPECTED_HEADERS


def test_api_routes_keep_their_json_errors(con: Console) -> None:
    """Under /api/ a missing cookie is a JSON 401, no access a JSON 403, no route a JSON 404."""
    job_id = con.submit()
    signed_out, stella = con.client(), con.client("stella")
    answers = [
        signed_out.get("/api/v1/jobs"),
        stella.get(f"/api/v1/jobs/{job_id}"),
        stella.get("/api/v1/no-such-route"),
    ]
    expected = [
        (401, "application/json", "unauthenticated"),
        (403, "application/json", "forbidden"),
        (404, "application/json", "not_found"),
    ]
    actual = [
        (a.status_code, a.headers["content-type"], a.json()["error"]["code"]) for a in answers
    ]
    assert expected == actual


# -- signing in and out ------------------------------------------------------------------------


def test_signing_in_opens_a_session_for_that_user(con: Console) -> None:
    """The right password: a 303 to the page asked for, a session cookie, the user's pages."""
    client = con.client()
    signed = sign_in(client, "olive", next="/servers")
    assert location(signed) == (303, "/servers")
    assert {SESSION, SIGN_IN} == set(cookie_attributes(signed))
    page = client.get("/servers")
    assert page.status_code == 200
    assert ">web-1</h2>" in page.text
    assert ">db-1</h2>" not in page.text


@pytest.mark.parametrize(
    ("name", "password"), [("olive", "not-olives-password"), ("nobody", "not-anyones-password")]
)
def test_a_wrong_name_or_password_is_refused_the_same_way(
    con: Console, name: str, password: str
) -> None:
    """A 401 sign-in page saying so, with no session cookie and no echo of the password."""
    refused = sign_in(con.client(), name, password=password)
    assert location(refused) == (401, None)
    assert "Wrong name or password." in refused.text
    assert SESSION not in cookie_attributes(refused)
    assert password not in refused.text
    assert f'value="{name}"' in refused.text  # the name is kept for a second try


@pytest.mark.parametrize(
    ("token", "cookie"),
    [
        pytest.param(None, True, id="missing csrf_token"),
        pytest.param("", True, id="empty csrf_token"),
        pytest.param("a-guessed-token", True, id="wrong csrf_token"),
        pytest.param("form", False, id="no sign-in cookie"),
        pytest.param("chosen", True, id="a cookie and token the client chose"),
    ],
)
def test_the_sign_in_form_needs_its_csrf_token(
    con: Console, token: str | None, cookie: bool
) -> None:
    """Without the form's token (or its cookie), the right password still opens no session;
    nor with a value the client chose for both (the token must be one the platform issued)."""
    client = con.client()
    form = client.get("/login")
    if not cookie:
        client.cookies.clear()
    if token == "chosen":
        client.cookies.clear()
        client.cookies.set(SIGN_IN, "chosen-by-the-client")
        token = "chosen-by-the-client"
    fields = {"username": "olive", "password": PASSWORDS["olive"]}
    if token is not None:
        fields["csrf_token"] = csrf_of(form.text) if token == "form" else token
    refused = client.post("/login", data=fields)
    assert location(refused) == (403, None)
    assert "This sign-in form expired. Please try again." in refused.text
    assert SESSION not in cookie_attributes(refused)
    assert client.get("/jobs").status_code == 303


def test_a_sign_in_form_older_than_an_hour_is_refused(con: Console) -> None:
    """The form's token is bound to when its cookie was issued: an hour later it is refused,
    and the page offers a fresh form that works."""
    client = con.client()
    form = client.get("/login")
    con.world.clock.advance(3_600_000)
    fields = {"username": "olive", "password": PASSWORDS["olive"], "next": "/jobs"}
    refused = client.post("/login", data={**fields, "csrf_token": csrf_of(form.text)})
    assert location(refused) == (403, None)
    again = client.post("/login", data={**fields, "csrf_token": csrf_of(refused.text)})
    assert location(again) == (303, "/jobs")


def test_five_failed_sign_ins_slow_that_name_down_but_no_other(con: Console) -> None:
    """After 5 failures a name waits before its next try (even a right one), from any address;
    other names sign in, and the right password once the wait is over signs in."""
    attacker = con.client(address="203.0.113.7")
    failures = [sign_in(attacker, "olive", password=f"guess-{i}").status_code for i in range(5)]
    assert failures == [401] * 5
    throttled = sign_in(attacker, "olive")
    assert error_page(throttled)[:3] == (429, "text/html; charset=utf-8", True)
    assert "Too many failed sign-ins. Try again in 1 second(s)." in throttled.text
    assert throttled.headers["Retry-After"] == "1"
    assert SESSION not in cookie_attributes(throttled)
    elsewhere = con.client(address="198.51.100.2")
    assert sign_in(elsewhere, "olive").status_code == 429
    assert location(sign_in(elsewhere, "hugo")) == (303, "/jobs")
    con.world.clock.advance(1_000)
    assert location(sign_in(attacker, "olive")) == (303, "/jobs")


def test_each_further_failure_doubles_a_names_wait_up_to_a_minute(con: Console) -> None:
    """Failures past the 5th make the name wait 1, 2, 4 ... seconds, never more than 60: a
    guesser cannot lock its owner out for longer than that."""
    attacker = con.client(address="203.0.113.7")
    for i in range(5):
        assert sign_in(attacker, "olive", password=f"guess-{i}").status_code == 401
    waits = []
    for i in range(10):
        refused = sign_in(attacker, "olive", password=f"again-{i}")
        assert refused.status_code == 429
        waits.append(int(refused.headers["Retry-After"]))
        con.world.clock.advance(waits[-1] * 1000)
        assert sign_in(attacker, "olive", password=f"again-{i}").status_code == 401
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    con.world.clock.advance(60_000)
    assert location(sign_in(attacker, "olive")) == (303, "/jobs")


def test_a_wait_started_by_failures_is_not_lengthened_by_tries_during_it(con: Console) -> None:
    """Tries refused while a name waits count for nothing: the wait ends when it said."""
    attacker = con.client(address="203.0.113.7")
    for i in range(5):
        assert sign_in(attacker, "olive", password=f"guess-{i}").status_code == 401
    refused = [sign_in(attacker, "olive", password="x").status_code for _ in range(20)]
    con.world.clock.advance(1_000)
    assert (refused, location(sign_in(attacker, "olive"))) == ([429] * 20, (303, "/jobs"))


def test_fifty_failed_sign_ins_from_one_address_slow_that_address_down(con: Console) -> None:
    """Failures spread over many names from one address throttle that address (at a higher
    bound than per name: many people may share an address), not others."""
    attacker = con.client(address="203.0.113.8")
    failures = [sign_in(attacker, f"guess{i}", password="x").status_code for i in range(50)]
    assert failures == [401] * 50
    assert sign_in(attacker, "hugo").status_code == 429
    assert location(sign_in(con.client(address="198.51.100.3"), "hugo")) == (303, "/jobs")


def concurrent_sign_ins(con: Console, address: str, names: list[str]) -> list[int]:
    """One wrong password for each of `names`, all posted at once from `address` with one
    sign-in form: the status of each."""

    async def post_all() -> list[int]:
        transport = httpx.ASGITransport(app=con.world.app, client=(address, 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            form = await http.get("/login")
            fields = {"password": "wrong", "csrf_token": csrf_of(form.text), "next": "/jobs"}
            answers = await asyncio.gather(
                *(http.post("/login", data={**fields, "username": name}) for name in names)
            )
        return [answer.status_code for answer in answers]

    return asyncio.run(post_all())


def test_concurrent_wrong_passwords_for_one_name_are_checked_no_more_than_its_allowance(
    con: Console,
) -> None:
    """40 guesses for one name at once: a guess counts before its password is checked, so 5
    are checked (401) and the rest wait (429), as if they had come one after another."""
    statuses = concurrent_sign_ins(con, "203.0.113.20", ["olive"] * 40)
    assert (statuses.count(401), statuses.count(429)) == (5, 35)


def test_concurrent_wrong_passwords_from_one_address_are_checked_no_more_than_its_allowance(
    con: Console,
) -> None:
    """150 guesses for as many names from one address at once: 50 are checked, no more."""
    statuses = concurrent_sign_ins(con, "203.0.113.21", [f"guess{i}" for i in range(150)])
    assert (statuses.count(401), statuses.count(429)) == (50, 100)


def test_a_sign_in_that_succeeds_is_not_counted_against_its_address(con: Console) -> None:
    """The right password clears its name and takes back its address's count: 49 failures and
    any number of sign-ins from one address leave its 50th failure free."""
    attacker = con.client(address="203.0.113.22")
    failures = [sign_in(attacker, f"guess{i}", password="x").status_code for i in range(49)]
    signed = [location(sign_in(con.client(address="203.0.113.22"), "hugo")) for _ in range(3)]
    assert (failures, signed) == ([401] * 49, [(303, "/jobs")] * 3)
    assert sign_in(attacker, "guess-last", password="x").status_code == 401
    assert sign_in(attacker, "hugo").status_code == 429


@pytest.mark.parametrize(("https", "secure"), [(False, False), (True, True)])
def test_cookies_are_httponly_lax_and_secure_over_https(
    con: Console, https: bool, secure: bool
) -> None:
    """Both cookies: HttpOnly, SameSite=Lax, Path=/; Secure exactly when served over https."""
    client = con.client(https=https)
    form_cookies = cookie_attributes(client.get("/login"))
    session_cookies = cookie_attributes(sign_in(client, "olive"))
    cookies = {SIGN_IN: form_cookies[SIGN_IN], SESSION: session_cookies[SESSION]}
    found = {
        name: ({"httponly", "samesite=lax", "path=/"} <= attrs, ("secure" in attrs) == secure)
        for name, attrs in cookies.items()
    }
    assert found == {SIGN_IN: (True, True), SESSION: (True, True)}
    assert client.get("/jobs").status_code == 200


def test_the_store_keeps_only_the_hash_of_a_session_cookie(con: Console) -> None:
    """The store finds the session by the cookie's SHA-256, never by the cookie itself."""
    client = con.client()
    raw = sign_in(client, "olive").cookies[SESSION]
    store, now = con.world.store, con.world.clock.now()
    by_raw, by_hash = store.web_session_user(raw, now), store.web_session_user(token_hash(raw), now)
    assert (by_raw, by_hash.name if by_hash else None) == (None, "olive")


def test_a_file_store_has_no_session_cookie_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In an SQLite store, the database files hold the session's hash and not the cookie."""
    cheap_passwords(monkeypatch)
    with console(file_factory(lambda: tmp_path / "store"), tmp_path) as built:
        raw = sign_in(built.client(), "olive").cookies[SESSION]
        store = built.world.store
        assert isinstance(store, FileStore)
        files = [path for path in store.path.parent.iterdir() if path.is_file()]
        on_disk = b"".join(path.read_bytes() for path in files)
    assert (raw.encode() in on_disk, token_hash(raw).encode() in on_disk) == (False, True)


def test_signing_out_ends_the_session(con: Console) -> None:
    """After sign-out the old cookie opens nothing: no page, no API, no session in the store."""
    client = con.client("olive")
    raw = client.cookies[SESSION]
    out = client.post("/logout", data={"csrf_token": csrf_of(client.get("/jobs").text)})
    assert location(out) == (303, "/login")
    assert "max-age=0" in cookie_attributes(out)[SESSION]
    assert con.world.store.web_session_user(token_hash(raw), con.world.clock.now()) is None
    replay = con.client()
    old_cookie = {"Cookie": f"{SESSION}={raw}"}
    expected = [(303, "/login?next=%2Fjobs"), (401, None)]
    actual = [
        location(replay.get("/jobs", headers=old_cookie)),
        location(replay.get("/api/v1/jobs", headers=old_cookie)),
    ]
    assert expected == actual


def test_signing_out_needs_the_csrf_token(con: Console) -> None:
    """A sign-out POST without the session's token is a 403 page; the session lives on."""
    client = con.client("olive")
    refused = client.post("/logout", data={})
    assert error_page(refused) == (403, "text/html; charset=utf-8", True, "403")
    assert client.get("/jobs").status_code == 200


HOSTILE_TARGETS = [
    "//evil.example",
    "///evil.example",
    "https://evil.example",
    "http:evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "evil.example",
    "javascript:alert(1)",
    "",
]


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
def test_next_never_leads_off_the_site(con: Console, target: str) -> None:
    """A `next` that is not a path on this site becomes /jobs: on the form, after sign-in, and
    when a signed-in user opens /login."""
    client = con.client()
    form = client.get("/login", params={"next": target})
    assert 'name="next" value="/jobs"' in form.text
    assert location(sign_in(client, "olive", next=target)) == (303, "/jobs")
    assert location(client.get("/login", params={"next": target})) == (303, "/jobs")


def test_next_is_escaped_on_the_sign_in_form(con: Console) -> None:
    """A `next` path carrying markup is shown escaped in the form's hidden field."""
    form = con.client().get("/login", params={"next": '/jobs"><script>alert(1)</script>'})
    assert "<script>alert(1)" not in form.text
    assert 'value="/jobs&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in form.text


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/jobs?state=queued", "/jobs?state=queued"),
        ("/%2F%2Fevil.example", "/%2F%2Fevil.example"),
        ("/\t/evil.example", "/%09/evil.example"),
    ],
)
def test_next_paths_on_the_site_are_kept(con: Console, target: str, expected: str) -> None:
    """A path on this site is kept, and a control character in it is escaped (a browser would
    drop a raw tab and read `//evil.example`)."""
    assert (303, expected) == location(sign_in(con.client(), "olive", next=target))


# -- pages -------------------------------------------------------------------------------------


def all_pages(con: Console, job_id: str) -> dict[str, Any]:
    """Every kind of console page, as the platform admin (and a 403 as olive)."""
    ada, olive, signed_out = con.client("ada"), con.client("olive"), con.client()
    return {
        "login": signed_out.get("/login"),
        "sign-in refused": sign_in(signed_out, "olive", password="wrong-password"),
        "jobs": ada.get("/jobs"),
        "jobs fragment": ada.get("/jobs?fragment=1"),
        "job": ada.get(f"/jobs/{job_id}"),
        "job fragment": ada.get(f"/jobs/{job_id}?fragment=1"),
        "servers": ada.get("/servers"),
        "endpoints": ada.get("/endpoints"),
        "users": ada.get("/users"),
        "403": olive.get("/users"),
        "404": ada.get("/jobs/job_does_not_exist"),
        "422": ada.get("/jobs?state=sleeping"),
    }


def test_every_page_sends_the_security_headers(con: Console) -> None:
    """A strict CSP (scripts and styles from 'self' only), no framing, no sniffing, no store."""
    pages = all_pages(con, con.submit())
    missing = {name: security_headers(page) for name, page in pages.items()}
    assert dict.fromkeys(pages, EXPECTED_HEADERS) == missing


INLINE = re.compile(
    r"<script(?![^>]*\ssrc=)|<style|\sstyle=|\son[a-z]+=|javascript:", flags=re.IGNORECASE
)


def test_no_page_has_inline_script_or_style(con: Console) -> None:
    """Nothing the CSP would block: no inline script or style, no event handler attributes."""
    pages = all_pages(con, con.submit())
    found = {name: INLINE.findall(page.text) for name, page in pages.items()}
    assert {name: [] for name in pages} == found
    assert {200, 401, 403, 404, 422} == {page.status_code for page in pages.values()}


def test_the_stylesheet_and_script_are_served_from_the_site(con: Console) -> None:
    """The console's one stylesheet and one script come from /static (no CDN)."""
    client = con.client()
    css, js = client.get("/static/moonlight.css"), client.get("/static/console.js")
    expected = [(200, "text/css"), (200, "text/javascript")]
    actual = [(r.status_code, r.headers["content-type"].split(";")[0]) for r in (css, js)]
    assert expected == actual
    assert "--night-top: #070b18;" in css.text


def test_live_fragments_hold_only_the_live_region(con: Console) -> None:
    """The polled fragments are the `#live` region alone, not a whole page."""
    job_id = con.submit()
    client = con.client("olive")
    fragments = [client.get("/jobs?fragment=1"), client.get(f"/jobs/{job_id}?fragment=1")]
    starts = [
        (f.status_code, f.text.startswith('<div id="live"'), "<html" in f.text) for f in fragments
    ]
    assert starts == [(200, True, False), (200, True, False)]
    assert 'data-final="false"' in fragments[1].text


def test_a_job_page_shows_state_progress_logs_and_history(con: Console) -> None:
    """A running job's page: its state chip, progress, its latest attempt's logs."""
    job_id = con.submit(kind="backup")
    run = con.run.start()
    attempt = run.run_to_running(job_id)
    assert run.progress(job_id, attempt, 1, percent=40, message="copying").status_code == 200
    assert run.send_logs(job_id, attempt, 1, "first line", "second line").status_code == 202
    page = con.client("hugo").get(f"/jobs/{job_id}")
    assert page.status_code == 200
    shown = [
        '<span class="chip chip-running" data-testid="state">running</span>',
        '<progress max="100" value="40.0"',
        "40% · copying",
        "first line",
        "second line",
        '<button class="danger" type="submit">Cancel job</button>',
    ]
    assert [text for text in shown if text not in page.text] == []


def test_a_job_page_lists_its_artifacts_with_download_links(con: Console) -> None:
    """A complete artifact is a download link; one still uploading says so, with no link."""
    job_id = con.submit(kind="backup")
    run = con.run.start()
    attempt = run.run_to_running(job_id)
    assert run.put_chunk(job_id, attempt, "result.txt", 0, b"done", True).status_code == 202
    assert run.put_chunk(job_id, attempt, "partial.log", 0, b"so far").status_code == 202
    hugo = con.client("hugo")
    page = hugo.get(f"/jobs/{job_id}")
    link = f'href="/api/v1/jobs/{job_id}/artifacts/result.txt?attempt={attempt}"'
    assert [
        text for text in (link, "result.txt", "partial.log", "uploading") if text not in page.text
    ] == []
    assert "/artifacts/partial.log" not in page.text
    download = hugo.get(f"/api/v1/jobs/{job_id}/artifacts/result.txt?attempt={attempt}")
    assert (download.status_code, download.content) == (200, b"done")


def end_with_progress(con: Console, end: str, kind: str, **progress: Any) -> str:
    """A job that reported `progress` once and then ended `end`; answer its page's HTML."""
    job_id = con.submit(kind=kind)
    run = con.run.start()
    attempt = run.run_to_running(job_id)
    assert run.progress(job_id, attempt, 1, **progress).status_code == 200
    if end == "cancelled":
        headers = {"Authorization": f"Bearer {con.token('olive')}"}
        asked = con.client().post(f"/api/v1/jobs/{job_id}/cancel", headers=headers)
        assert asked.status_code == 202, asked.text
    if end != "running":
        assert run.result(job_id, attempt, end).status_code == 200
    assert con.state(job_id) == end
    page = con.client("olive").get(f"/jobs/{job_id}")
    assert page.status_code == 200
    text: str = page.text
    return text


PROGRESS_TEXT = re.compile(r'<p data-testid="progress">([^<]*)</p>')
PROGRESS_BAR = re.compile(r"<progress [^>]*>")


@pytest.mark.parametrize(
    ("end", "kind", "progress", "bar", "text"),
    [
        (
            "succeeded",
            "command",
            {"percent": None},
            '<progress max="100" value="100.0" aria-label="Progress">',
            "100% · complete",
        ),
        (
            "succeeded",
            "sleep",
            {"percent": 60, "message": "10.9 s left"},
            '<progress max="100" value="100.0" aria-label="Progress">',
            "100% · complete",
        ),
        (
            "failed",
            "sleep",
            {"percent": 60, "message": "10.9 s left"},
            '<progress max="100" value="60.0" aria-label="Progress" class="stopped">',
            "60% · stopped (failed)",
        ),
        (
            "cancelled",
            "backup",
            {"percent": 25, "message": "copying, 3.0 s left"},
            '<progress max="100" value="25.0" aria-label="Progress" class="stopped">',
            "25% · copying · stopped (cancelled)",
        ),
        ("failed", "command", {"percent": None}, None, "progress unknown · stopped (failed)"),
        (
            "running",
            "command",
            {"percent": None, "message": "compiling"},
            None,
            "in progress, amount unknown · compiling",
        ),
        (
            "running",
            "sleep",
            {"percent": 60, "message": "10.9 s left"},
            '<progress max="100" value="60.0" aria-label="Progress">',
            "60% · 10.9 s left",
        ),
    ],
    ids=[
        "succeeded-null",
        "succeeded-sleep",
        "failed",
        "cancelled",
        "failed-null",
        "running-null",
        "running",
    ],
)
def test_a_job_page_shows_progress_in_the_light_of_its_state(
    con: Console, end: str, kind: str, progress: dict[str, Any], bar: str | None, text: str
) -> None:
    """Succeeded is complete; failed and cancelled keep the last reading, stopped, with no
    time left; a null percent draws no bar; a running job shows what it reported."""
    html = end_with_progress(con, end, kind, **progress)
    shown = (PROGRESS_BAR.findall(html), PROGRESS_TEXT.findall(html))
    assert shown == ([bar] if bar else [], [text])


PROGRESS_CELL = re.compile(r'<td data-label="Progress">(.*?)</td>')


@pytest.mark.parametrize(
    ("end", "progress", "cell"),
    [
        ("succeeded", {"percent": None}, "100%"),
        (
            "failed",
            {"percent": 60, "message": "10.9 s left"},
            '60% <span class="muted">stopped</span>',
        ),
        ("running", {"percent": None}, '<span class="muted">?</span>'),
        ("running", {"percent": 40}, "40%"),
    ],
    ids=["succeeded-null", "failed", "running-null", "running"],
)
def test_the_jobs_table_shows_progress_in_the_light_of_the_state(
    con: Console, end: str, progress: dict[str, Any], cell: str
) -> None:
    """The jobs table's progress cell: complete, stopped, unknown, or the percent."""
    end_with_progress(con, end, "command", **progress)
    table = con.client("olive").get("/jobs")
    assert PROGRESS_CELL.findall(table.text) == [cell]


def test_the_cancel_form_needs_the_sessions_csrf_token(con: Console) -> None:
    """Cancel without the token, or with another session's, is a 403 page; with it, done."""
    job_id = con.submit()
    olive, hugo = con.client("olive"), con.client("hugo")
    hugos_token = csrf_of(hugo.get("/jobs").text)
    refused = [
        olive.post(f"/jobs/{job_id}/cancel", data={}),
        olive.post(f"/jobs/{job_id}/cancel", data={"csrf_token": hugos_token}),
    ]
    assert [r.status_code for r in refused] == [403, 403]
    assert con.state(job_id) == "queued"
    form = {"csrf_token": csrf_of(olive.get(f"/jobs/{job_id}").text)}
    assert (303, f"/jobs/{job_id}") == location(olive.post(f"/jobs/{job_id}/cancel", data=form))
    assert con.state(job_id) == "cancelled"


def test_an_owner_adds_a_server_administrator_by_name(con: Console) -> None:
    """The servers page form: the owner names a user, who then sees the server's jobs."""
    job_id = con.submit()
    olive, stella = con.client("olive"), con.client("stella")
    assert stella.get(f"/jobs/{job_id}").status_code == 403
    form = {"csrf_token": csrf_of(olive.get("/servers").text), "username": "stella"}
    added = olive.post(f"/servers/{con.server_id}/admins", data=form)
    assert location(added) == (303, "/servers")
    assert stella.get(f"/jobs/{job_id}").status_code == 200


# -- the API with the console cookie -----------------------------------------------------------


def test_the_api_accepts_the_cookie_for_reads(con: Console) -> None:
    """A signed-in browser may GET the user API with its session cookie alone."""
    job_id = con.submit()
    got = con.client("olive").get(f"/api/v1/jobs/{job_id}")
    assert (200, job_id) == (got.status_code, got.json()["id"])


def test_the_api_refuses_a_cookie_write_without_the_csrf_header(con: Console) -> None:
    """A cookie-authenticated POST needs X-CSRF-Token (the session's token): else a JSON 403."""
    job_id = con.submit()
    client = con.client("olive")
    path = f"/api/v1/jobs/{job_id}/cancel"
    refused = [client.post(path), client.post(path, headers={"X-CSRF-Token": "guessed"})]
    expected = [(403, "forbidden"), (403, "forbidden")]
    assert expected == [(r.status_code, r.json()["error"]["code"]) for r in refused]
    assert con.state(job_id) == "queued"
    token = csrf_of(client.get("/jobs").text)
    accepted = client.post(path, headers={"X-CSRF-Token": token})
    assert (accepted.status_code, accepted.json()["state"]) == (200, "cancelled")


# -- the page canary ---------------------------------------------------------------------------

CANARY_PASSWORDS = {
    "ada": "pw-page-canary-ada-0f3a9c71e2b4",
    "olive": "pw-page-canary-olive-8d24b6e1f059",
    "hugo": "pw-page-canary-hugo-3e7a1c95d2f8",
    "stella": "pw-page-canary-stella-6b0f4d82a1c7",
}
LOG_LINES = ("mounting the volume", "copying 3 of 9")


def console_routes() -> set[tuple[str, str]]:
    """(method, path template) of every console route."""
    return {
        (method, route.path)
        for route in console_room.router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }


@dataclass
class PageCanary:
    """The API canary's marked secrets, and every console page taken while they were live."""

    canary: Canary
    clients: dict[str, TestClient] = field(default_factory=dict)
    pages: list[Seen] = field(default_factory=list)
    routes: set[tuple[str, str]] = field(default_factory=set)
    sessions: dict[str, str] = field(default_factory=dict)

    def client(self, who: str, address: str = "testclient") -> TestClient:
        if who not in self.clients:
            self.clients[who] = TestClient(
                self.canary.world.app, follow_redirects=False, client=(address, 50000)
            )
        return self.clients[who]

    def visit(
        self,
        who: str,
        method: str,
        route: str,
        *,
        query: str = "",
        form: dict[str, str | list[str]] | None = None,
        csrf: bool = True,
        fresh: str | None = None,
        **ids: str,
    ) -> Any:
        """Request a console page as `who`; a POST form carries the session's CSRF token."""
        client = self.client(who)
        path = route.format(**ids) + (f"?{query}" if query else "")
        data: dict[str, str | list[str]] | None = None
        if method == "POST":
            data = dict(form or {})
            if csrf and who in self.sessions:
                data.setdefault(
                    "csrf_token", self.canary.world.platform.web.csrf(self.sessions[who])
                )
        response = client.request(method, path, data=data)
        if (method, route) in console_routes():
            self.routes.add((method, route))
        label = f"{method} {path} as {who} -> {response.status_code}"
        job_page = (method, route, response.status_code) == ("GET", "/jobs/{job_id}", 200)
        shows_payload = job_page and "fragment" not in query
        self.pages.append(Seen(label, response, fresh, shows_payload))
        return response

    def sign_in(self, who: str) -> Any:
        form = self.visit(who, "GET", "/login")
        fields = {
            "username": who,
            "password": CANARY_PASSWORDS[who],
            "csrf_token": csrf_of(form.text),
            "next": "/jobs",
        }
        fresh = f"console session of {who}"
        response = self.visit(who, "POST", "/login", form=fields, csrf=False, fresh=fresh)
        if response.status_code == 303:
            token = response.cookies[SESSION]
            self.sessions[who] = token
            self.canary.secret(f"console session of {who}", token, hashed=True)
        return response


def build_page_canary(world: HttpWorld) -> PageCanary:
    """Plant the markers, bring jobs into every state, and take every page while they live."""
    c = planted(world)
    p = PageCanary(c)
    users = {
        name: c.create_user(name, password, platform_admin=name == "ada")
        for name, password in CANARY_PASSWORDS.items()
    }
    _, host_a_join = c.create_endpoint("host-a")
    c.create_endpoint("host-b")  # its join token stays unused, and valid, all along
    run = c.join(host_a_join)
    servers = {}
    for name, owner in (("web-1", "olive"), ("db-1", "stella")):
        body = {"name": name, "endpoint_id": run.endpoint_id, "owner_id": users[owner][0]}
        created = c.call("POST", "/api/v1/servers", json=body)
        assert created.status_code == 201, created.text
        servers[name] = created.json()["id"]
    added = c.call(
        "POST",
        "/api/v1/servers/{server_id}/admins",
        token=users["olive"][1],
        server_id=servers["web-1"],
        json={"user_id": users["hugo"][0]},
    )
    assert added.status_code == 200, added.text
    for name in CANARY_PASSWORDS:
        assert p.sign_in(name).status_code == 303

    # Jobs in every state: the four claimed ones first, so that the claim takes exactly them.
    c.register(run, "boot-1")
    assert run.reconcile([]).status_code == 200
    olive, hugo, stella = (users[name][1] for name in ("olive", "hugo", "stella"))
    web1, db1 = servers["web-1"], servers["db-1"]
    jobs = {
        "running": c.submit(web1, olive),
        "retrying": c.submit(web1, hugo),
        "succeeded": c.submit(web1, olive),
        "failed": c.submit(web1, olive),
    }
    labels = {job_id: f"{label} job" for label, job_id in jobs.items()}
    for job_id, attempt in c.claim(run, 4, labels).items():
        assert run.ack(job_id, attempt).status_code == 200
    running = jobs["running"]
    assert run.progress(running, 1, 1, percent=40, message="warming up").status_code == 200
    assert run.send_logs(running, 1, 1, *LOG_LINES).status_code == 202
    stderr = {"ts": "2026-11-30T00:00:00.000Z", "stream": "stderr", "text": "disk is slow"}
    body = {"job_id": running, **run.evidence(running, 1), "seq": 2, "lines": [stderr]}
    assert run.post("/run/v1/logs", body).status_code == 202
    error = {"code": "exit_3", "message": "the mirror was busy"}
    for label, retryable in (("retrying", True), ("failed", False)):
        result = run.result(jobs[label], 1, "failed", retryable=retryable, error=error)
        assert result.status_code == 200, result.text
    assert run.result(jobs["succeeded"], 1, output={"ok": True}).status_code == 200
    jobs["stella's"] = c.submit(db1, stella)
    jobs["queued"] = c.submit(web1, olive)
    jobs["cancelled"] = c.submit(web1, olive)
    labels |= {job_id: f"{label} job" for label, job_id in jobs.items()}
    assert p.visit("olive", "POST", "/jobs/{job_id}/cancel", job_id=jobs["cancelled"]).is_redirect
    assert p.visit("hugo", "POST", "/jobs/{job_id}/cancel", job_id=running).is_redirect
    expected = {
        "running": "running",
        "retrying": "retrying",
        "succeeded": "succeeded",
        "failed": "failed",
        "stella's": "queued",
        "queued": "queued",
        "cancelled": "cancelled",
    }
    assert expected == {label: world.stored(job_id).state.value for label, job_id in jobs.items()}

    visit_everything(p, jobs, servers, c.markers)
    refused_and_missing(p, jobs, servers)

    # Run restarts (a new session key), confirms its job and ends it cancelled; the waiting
    # jobs run on new leases, one of them a second attempt. Then everything again.
    c.register(run, "boot-2")
    assert run.reconcile([run.entry(running, 1)]).status_code == 200
    assert run.cancel_poll(running, 1).status_code == 200
    assert run.result(running, 1, "cancelled").status_code == 200
    world.clock.advance(5_000)
    second = c.claim(run, 3, labels)
    assert {jobs["retrying"]: 2, jobs["stella's"]: 1, jobs["queued"]: 1} == second
    for job_id, attempt in second.items():
        assert run.ack(job_id, attempt).status_code == 200
    assert run.send_logs(jobs["retrying"], 2, 1, "second try").status_code == 202
    assert run.progress(jobs["stella's"], 1, 1, percent=75).status_code == 200
    jobs["queued later"] = c.submit(web1, olive)
    assert world.stored(running).state.value == "cancelled"
    visit_everything(p, jobs, servers, c.markers)
    remove = "/servers/{server_id}/admins/{user_id}/remove"
    hugo_id = users["hugo"][0]
    assert p.visit("hugo", "POST", remove, server_id=web1, user_id=hugo_id).status_code == 403
    assert p.visit("olive", "POST", remove, server_id=web1, user_id=hugo_id).is_redirect
    p.visit("hugo", "GET", "/servers")
    submits_and_reruns(p, jobs, servers)
    manage_everything(p, users, servers, jobs)
    visit_everything(p, jobs, servers, c.markers)
    assert p.visit("stella", "POST", "/logout").is_redirect
    p.visit("stella", "GET", "/jobs")
    return p


SHOWN_ONCE = re.compile(r'<pre class="secret" data-testid="secret">([^<]*)</pre>')


def shown_once(p: PageCanary, name: str, response: Any) -> str:
    """Plant the token an answer page showed (its one page) as a marker; answer it."""
    assert response.status_code == 200, response.text
    found = SHOWN_ONCE.search(response.text)
    assert found is not None
    p.canary.secret(name, found.group(1), hashed=True)
    return found.group(1)


def manage_everything(
    p: PageCanary,
    users: dict[str, tuple[str, str]],
    servers: dict[str, str],
    jobs: dict[str, str],
) -> None:
    """Every form of the access lifecycle and "Cancel selected", with their refusals: each
    token the console shows once is a marker from then on."""
    ada, nova_password, nova_later = "ada", "pw-canary-nova-8d2e6b0f4a13", "pw-canary-nova-2c9e"
    created = p.visit(
        ada, "POST", "/endpoints", form={"name": "host-c"}, fresh="join token of host-c"
    )
    shown_once(p, "join token of host-c", created)
    p.visit(ada, "POST", "/endpoints", form={"name": "host-a"})  # 409: taken
    endpoints = p.canary.world.store.list_endpoints()
    (host_c_id,) = [e.id for e in endpoints if e.name == "host-c"]
    (host_a_id,) = [e.id for e in endpoints if e.name == "host-a"]
    for action in ("drain", "undrain"):
        route = "/endpoints/{endpoint_id}/" + action
        assert p.visit(ada, "POST", route, endpoint_id=host_c_id).is_redirect
    p.canary.secret("password of nova", nova_password)
    form: dict[str, str | list[str]] = {"name": "nova", "password": nova_password}
    form["password_again"] = nova_password
    created = p.visit(ada, "POST", "/users", form=form, fresh="API token of nova")
    shown_once(p, "API token of nova", created)
    nova = p.canary.world.store.user_by_name("nova")
    assert nova is not None
    assert p.visit(ada, "POST", "/users", form={"name": "nova"}).status_code == 409
    form["password_again"] = nova_password + "-typo"
    assert p.visit(ada, "POST", "/users", form=form).status_code == 422
    rotated = p.visit(
        ada, "POST", "/users/{user_id}/token", user_id=nova.id, fresh="rotated API token of nova"
    )
    shown_once(p, "rotated API token of nova", rotated)
    p.canary.secret("new password of nova", nova_later)
    again = {"password": nova_later, "password_again": nova_later}
    assert p.visit(
        ada, "POST", "/users/{user_id}/password", user_id=nova.id, form=again
    ).is_redirect
    differ: dict[str, str | list[str]] = {"password": nova_later, "password_again": "other-pw-1"}
    p.visit(ada, "POST", "/users/{user_id}/password", user_id=nova.id, form=differ)  # 422
    for action in ("disable", "enable"):
        assert p.visit(ada, "POST", "/users/{user_id}/" + action, user_id=nova.id).is_redirect
    p.visit(ada, "POST", "/users/{user_id}/disable", user_id=users["ada"][0])  # 422: yourself
    body: dict[str, str | list[str]] = {"name": "web-3", "endpoint_id": host_c_id}
    body["owner_id"] = nova.id
    assert p.visit(ada, "POST", "/servers", form=body).is_redirect
    (web3,) = [s.id for s in p.canary.world.store.list_servers() if s.name == "web-3"]
    p.visit(ada, "GET", "/servers/{server_id}/remove", server_id=web3)
    p.visit("stella", "GET", "/servers/{server_id}/remove", server_id=servers["web-1"])  # 403
    p.visit("olive", "POST", "/servers/{server_id}/remove", server_id=servers["web-1"])  # 409
    assert p.visit(ada, "POST", "/servers/{server_id}/remove", server_id=web3).is_redirect
    p.visit(ada, "GET", "/endpoints/{endpoint_id}/remove", endpoint_id=host_c_id)
    p.visit(ada, "POST", "/endpoints/{endpoint_id}/remove", endpoint_id=host_a_id)  # 409
    assert p.visit(
        ada, "POST", "/endpoints/{endpoint_id}/remove", endpoint_id=host_c_id
    ).is_redirect
    p.visit("hugo", "POST", "/endpoints", form={"name": "host-h"})  # 403
    p.visit("hugo", "POST", "/users", form={"name": "hugo-2"})  # 403
    # Everyone's own account; olive's new password and API token.
    for who in CANARY_PASSWORDS:
        p.visit(who, "GET", "/account")
    p.canary.secret("new password of olive", "pw-canary-olive-later-5f1a")
    mine = {
        "password": "pw-canary-olive-later-5f1a",
        "password_again": "pw-canary-olive-later-5f1a",
    }
    assert p.visit("olive", "POST", "/account/password", form=dict(mine)).is_redirect
    own = p.visit("olive", "POST", "/account/token", fresh="rotated API token of olive")
    shown_once(p, "rotated API token of olive", own)
    # Cancel selected: olive's waiting jobs, stella's (not hers) and a secret typed as an id.
    selected = [
        jobs["queued later"],
        jobs["stella's"],
        str(p.canary.markers["join token of host-b"]),
    ]
    assert p.visit("olive", "POST", "/jobs/cancel", form={"job_id": selected}).is_redirect
    p.visit("olive", "GET", "/jobs", query="cancelled=1&cancelling=0&ended=0&refused=2")
    p.visit("olive", "POST", "/jobs/cancel", form={})  # 422: nothing selected
    for page in ("/endpoints", "/users", "/servers", "/account"):
        p.visit(ada, "GET", page, query="done=password_set")


def visit_everything(
    p: PageCanary, jobs: dict[str, str], servers: dict[str, str], markers: dict[str, Any]
) -> None:
    """Every page each person may open (and some they may not), and the signed-out pages."""
    for who in CANARY_PASSWORDS:
        p.visit(who, "GET", "/")
        p.visit(who, "GET", "/login", query="next=%2Fservers")
        p.visit(who, "GET", "/jobs")
        p.visit(who, "GET", "/jobs", query="fragment=1")
        for state in ("queued", "running", "retrying", "succeeded", "failed", "cancelled"):
            p.visit(who, "GET", "/jobs", query=f"state={state}")
        for server_id in servers.values():
            p.visit(who, "GET", "/jobs", query=f"server_id={server_id}")
        for job_id in jobs.values():
            p.visit(who, "GET", "/jobs/{job_id}", job_id=job_id)
            p.visit(who, "GET", "/jobs/{job_id}", query="fragment=1", job_id=job_id)
        for page in ("/servers", "/endpoints", "/users", "/jobs/new"):
            p.visit(who, "GET", page)
        for server_id in servers.values():
            p.visit(who, "GET", "/jobs/new", query=f"server_id={server_id}")
        p.visit(who, "GET", "/jobs", query="kind=noop")
        p.visit(who, "GET", "/jobs", query=f"id={jobs['running'][:10]}")
        # Secrets typed where an id belongs: a 404 page that does not echo them.
        for name in ("lease of running job attempt 1", "join token of host-b"):
            p.visit(who, "GET", "/jobs/{job_id}", job_id=quote(str(markers[name]), safe=""))
    p.visit("nobody", "GET", "/")
    p.visit("nobody", "GET", "/login")
    p.visit("nobody", "GET", "/jobs")
    p.visit("nobody", "GET", "/jobs/{job_id}", job_id=jobs["running"])
    p.visit("nobody", "GET", "/no-such-page")


def submits_and_reruns(p: PageCanary, jobs: dict[str, str], servers: dict[str, str]) -> None:
    """The submit form and Run again, taken and refused."""
    p.visit("stella", "POST", "/jobs/{job_id}/rerun", job_id=jobs["succeeded"])
    assert p.visit("olive", "POST", "/jobs/{job_id}/rerun", job_id=jobs["succeeded"]).is_redirect
    web1 = servers["web-1"]
    for form in (
        {"server_id": web1, "kind": "noop", "payload": "{}"},  # queued: a redirect to it
        {"server_id": web1, "kind": "no such kind", "payload": "{}"},  # 422 on the form
        {"server_id": web1, "kind": "noop", "payload": "{not json"},  # 422 on the form
        {"server_id": servers["db-1"], "kind": "noop", "payload": "{}"},  # 403 for olive
    ):
        p.visit("olive", "POST", "/jobs/new", form=form)


def refused_and_missing(p: PageCanary, jobs: dict[str, str], servers: dict[str, str]) -> None:
    """401, 403, 404, 422 and 429 pages, several of them to requests that carry secrets."""
    p.visit("stella", "GET", "/jobs/{job_id}", job_id=jobs["running"])
    p.visit("stella", "POST", "/jobs/{job_id}/cancel", job_id=jobs["running"])
    # A search refused: the jobs page says why and shows no refused value (a secret here).
    lease = quote(str(p.canary.markers["lease of running job attempt 1"]), safe="")
    p.visit("olive", "GET", "/jobs", query=f"state={lease}&kind={lease}&id={lease}")
    p.visit("olive", "POST", "/jobs/{job_id}/cancel", job_id=jobs["queued"], csrf=False)
    admins = "/servers/{server_id}/admins"
    p.visit("hugo", "POST", admins, server_id=servers["web-1"], form={"username": "stella"})
    password = CANARY_PASSWORDS["stella"]
    p.visit("olive", "POST", admins, server_id=servers["web-1"], form={"username": password})
    p.visit("stella", "POST", admins, server_id=servers["db-1"], form={"username": "ada"})
    p.visit("olive", "GET", "/jobs", query=f"state={quote(SECRET_REF)}")
    p.visit("olive", "GET", "/jobs", query=f"cursor={quote(CANARY_PASSWORDS['olive'])}")
    p.visit("olive", "GET", "/users")
    p.visit("hugo", "GET", "/endpoints")
    p.visit("ada", "GET", "/logout")
    # Sign-ins from another address: someone else's password five times, then a throttled
    # name (even with its own password), then a form without its token.
    p.client("guesser", address="203.0.113.9")
    form = p.visit("guesser", "GET", "/login")
    for password in [CANARY_PASSWORDS["hugo"]] * 5 + [CANARY_PASSWORDS["olive"]]:
        fields = {"username": "olive", "password": password, "csrf_token": csrf_of(form.text)}
        p.visit("guesser", "POST", "/login", form=fields, csrf=False)
    statuses = [seen.response.status_code for seen in p.pages[-6:]]
    assert statuses == [401, 401, 401, 401, 401, 429]
    fields = {"username": "hugo", "password": CANARY_PASSWORDS["hugo"]}
    p.visit("guesser", "POST", "/login", form=fields, csrf=False)


@pytest.fixture(scope="module")
def page_canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageCanary]:
    world = HttpWorld(memory_factory(), tmp_path_factory.mktemp("page-canary") / "artifacts")
    built = None
    try:
        built = build_page_canary(world)
        yield built
    finally:
        for client in built.clients.values() if built else ():
            client.close()
        world.close()


def test_the_page_canary_takes_every_console_route(page_canary: PageCanary) -> None:
    """Every GET and POST of the console is among the pages the canary scans."""
    assert console_routes() == page_canary.routes


def test_the_page_canary_takes_every_kind_of_page(page_canary: PageCanary) -> None:
    """Pages, redirects, and every refusal a person can meet are among the scanned pages."""
    statuses = {seen.response.status_code for seen in page_canary.pages}
    assert {200, 303, 401, 403, 404, 409, 422, 429} == statuses


def test_the_page_canary_pages_show_what_they_should(page_canary: PageCanary) -> None:
    """The scanned pages are the real thing: job pages with logs, the admin's lists."""
    bodies = "\n".join(seen.response.text for seen in page_canary.pages)
    shown = [*LOG_LINES, "disk is slow", "second try", "the mirror was busy", "host-b <span"]
    assert [text for text in shown if text not in bodies] == []
    assert len(page_canary.pages) > 250


PAYLOAD_BLOCK = re.compile(
    r'<pre class="payload" data-testid="payload"><code>(.*?)</code></pre>', re.S
)


@dataclass
class WithoutPayloadBlock:
    """A page as `haystack_of` reads it, its payload block taken out."""

    status_code: int
    headers: Any
    content: bytes

    @classmethod
    def of(cls, response: Any) -> WithoutPayloadBlock:
        page, taken = PAYLOAD_BLOCK.subn("", response.text)
        assert taken == 1
        return cls(response.status_code, response.headers, page.encode())


def test_no_secret_appears_in_any_console_page(page_canary: PageCanary) -> None:
    """No marker, in any encoding, in any console page's body or headers; what the user typed
    in a payload only in the job page's payload block (TYPED_BY_THE_USER)."""
    markers = page_canary.canary.markers
    leaks = []
    for seen in page_canary.pages:
        haystack = haystack_of(seen.response)
        outside = (
            haystack_of(WithoutPayloadBlock.of(seen.response)) if seen.shows_payload else haystack
        )
        for name, secret in markers.items():
            if name == seen.fresh:
                continue  # a sign-in sets its own new session cookie, by design
            scanned = outside if name in TYPED_BY_THE_USER else haystack
            leaks += [f"{seen.label}: {name} ({form})" for form in found_forms(secret, scanned)]
    assert leaks == []
    assert len(markers) > 60


def test_the_job_pages_show_the_payload_with_its_secret_reference_redacted(
    page_canary: PageCanary,
) -> None:
    """Each job page a reader took shows the marked payload, `secret_ref` redacted."""
    blocks = [
        PAYLOAD_BLOCK.search(seen.response.text) for seen in page_canary.pages if seen.shows_payload
    ]
    shown = [json.loads(html.unescape(block.group(1))) for block in blocks if block]
    assert len(shown) == len(blocks) > 10
    assert {json.dumps(p, sort_keys=True) for p in shown} == {
        json.dumps({**PAYLOAD, "secret_ref": "[redacted]"}, sort_keys=True)
    }


def test_each_token_shown_once_is_on_its_answer_page_only(page_canary: PageCanary) -> None:
    """The console's one-time tokens (a join token, new and rotated API tokens) are each on the
    answer page of the form that made it, and on no other page (the scan above)."""
    markers = page_canary.canary.markers
    shown = {
        seen.fresh: markers[seen.fresh] in seen.response.text
        for seen in page_canary.pages
        if seen.fresh is not None and not seen.fresh.startswith("console session of ")
    }
    expected = {
        "join token of host-c": True,
        "API token of nova": True,
        "rotated API token of nova": True,
        "rotated API token of olive": True,
    }
    assert expected == shown


def test_a_sign_in_sets_only_its_own_new_session_cookie(page_canary: PageCanary) -> None:
    """The excused sign-ins are the four successful ones, each with its token in Set-Cookie."""
    excused = [
        seen
        for seen in page_canary.pages
        if seen.fresh is not None and seen.fresh.startswith("console session of ")
    ]
    found = {
        seen.fresh: seen.response.cookies[SESSION] == page_canary.canary.markers[seen.fresh]
        for seen in excused
    }
    assert {f"console session of {name}": True for name in CANARY_PASSWORDS} == found
    assert [seen.label for seen in excused if seen.fresh in seen.response.text] == []


@pytest.mark.parametrize("number", ["9223372036854775808", "-9223372036854775809", "9" * 30])
def test_a_cursor_beyond_64_bits_is_a_styled_error_page(con: Console, number: str) -> None:
    """The jobs page with an overflowing cursor answers a 4xx page, never a 500."""
    cursor = base64.urlsafe_b64encode(f"{number}:job_x".encode()).decode().rstrip("=")
    response = con.client("ada").get(f"/jobs?cursor={cursor}")
    assert error_page(response)[:3] == (422, "text/html; charset=utf-8", True)


def test_an_owner_removes_a_server_administrator_with_a_button(con: Console) -> None:
    """The servers page lists each administrator with a Remove form; after it, the
    administrator no longer sees the server's jobs, and the form needs the CSRF token."""
    job_id = con.submit()
    olive, hugo = con.client("olive"), con.client("hugo")
    hugo_id = con.users["hugo"][0]
    action = f"/servers/{con.server_id}/admins/{hugo_id}/remove"
    page = olive.get("/servers").text
    assert f'action="{action}"' in page
    assert olive.post(action, data={"csrf_token": "wrong"}).status_code == 403
    assert hugo.get(f"/jobs/{job_id}").status_code == 200
    removed = olive.post(action, data={"csrf_token": csrf_of(page)})
    assert location(removed) == (303, "/servers")
    assert hugo.get(f"/jobs/{job_id}").status_code == 403


def test_a_server_administrator_sees_no_remove_buttons(con: Console) -> None:
    """Only the owner (or a platform admin) may take administration away."""
    page = con.client("hugo").get("/servers").text
    assert "/remove" not in page


def test_the_servers_page_says_whether_the_servers_host_is_online(con: Console) -> None:
    """Before its Run registers the host shows offline; once registered, online."""
    olive = con.client("olive")
    before = olive.get("/servers").text
    con.run.start()
    after = olive.get("/servers").text
    host = re.compile(r"<dt>Host</dt><dd><span class=\"chip [a-z-]+\">(\w+)</span>")
    assert (host.findall(before), host.findall(after)) == (["offline"], ["online"])
