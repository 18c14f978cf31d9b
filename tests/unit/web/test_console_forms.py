"""The console's forms for the access lifecycle and bulk cancel, without a browser: endpoints
(create with a one-time join token, drain, undrain, remove), users (create, disable, enable,
rotate a token, set a password), one's own account, servers (create, remove) and "Cancel
selected" on the jobs list.

Each form calls the same directory or service method as its API route, so these tests check
what the console adds: the pages, their CSRF checks, the messages a refusal becomes on the page
the form came from, and that a token is shown once and on no later page. The browser tests are
in tests/process/test_console_browser.py.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from moonrun.client import verbs
from moonrun.scheduling.fingerprint import token_hash
from moonrun.web import endpoints, jobs, pages
from tests.support.console_kit import PASSWORDS, Console, cheap_passwords, console, csrf_of, sign_in
from tests.support.http_harness import public_key_of
from tests.support.stores import memory_factory
from tests.unit.web.test_console import EXPECTED_HEADERS, error_page, location, security_headers

PROBLEM = re.compile(r'<p class="message error" role="alert" data-testid="problem">([^<]*)</p>')
NOTICE = re.compile(r'<p class="message" role="status" data-testid="notice">([^<]*)</p>')
SECRET = re.compile(r'<pre class="secret" data-testid="secret">([^<]*)</pre>')
COMMAND = re.compile(r'<pre class="secret" data-testid="command">([^<]*)</pre>')
CHECKBOX = re.compile(r'<input type="checkbox" name="job_id" value="([^"]+)"')
NEW_PASSWORD = "a-new-moonlit-password-31"


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def post(client: TestClient, path: str, page: str = "/jobs", **fields: Any) -> Any:
    """Post a form as a page of `page` would: with the session's CSRF token."""
    return client.post(path, data={"csrf_token": csrf_of(client.get(page).text), **fields})


def problem(response: Any) -> tuple[int, str | None]:
    """(status, the error message the page shows)."""
    found = PROBLEM.search(response.text)
    return response.status_code, html.unescape(found.group(1)) if found else None


def notice(response: Any) -> str | None:
    found = NOTICE.search(response.text)
    return html.unescape(found.group(1)) if found else None


def secret_of(response: Any) -> str:
    found = SECRET.search(response.text)
    assert found is not None, "the page shows no secret"
    return html.unescape(found.group(1))


def user_id(con: Console, name: str) -> str:
    return con.users[name][0]


def endpoint_id(con: Console, name: str) -> str:
    (found,) = [e.id for e in con.world.store.list_endpoints() if e.name == name]
    return found


def me(con: Console, token: str) -> tuple[int, str | None]:
    """(status, name) of GET /api/v1/me with `token`."""
    answer = con.world.api("GET", "/api/v1/me", token=token)
    return answer.status_code, answer.json().get("name") if answer.status_code == 200 else None


def every_page(client: TestClient, con: Console) -> dict[str, str]:
    """The HTML of every page a platform admin can open (and the live fragments)."""
    job_id = con.submit()
    paths = [
        "/jobs",
        "/jobs?fragment=1",
        f"/jobs/{job_id}",
        f"/jobs/{job_id}?fragment=1",
        "/servers",
        f"/servers/{con.server_id}/remove",
        "/endpoints",
        f"/endpoints/{con.run.endpoint_id}/remove",
        "/users",
        "/account",
    ]
    pages = {path: client.get(path) for path in paths}
    assert dict.fromkeys(paths, 200) == {path: page.status_code for path, page in pages.items()}
    return {path: page.text for path, page in pages.items()}


def store_snapshot(con: Console) -> tuple[Any, ...]:
    """What a refused form must not change: endpoints, users, servers, jobs."""
    store = con.world.store
    return (
        sorted((e.id, e.name, e.draining) for e in store.list_endpoints()),
        sorted((u.id, u.disabled, u.password_hash) for u in store.list_users()),
        sorted((s.id, s.admin_ids) for s in store.list_servers()),
        [me(con, con.token(name)) for name in PASSWORDS],
    )


# -- endpoints ---------------------------------------------------------------------------------


def test_creating_an_endpoint_shows_its_join_token_once_with_the_join_command(
    con: Console,
) -> None:
    """The answer page shows the join token and the `run join` line to copy, not cached; the
    token joins a host."""
    ada = con.client("ada")
    created = post(ada, "/endpoints", "/endpoints", name="host-c")
    token = secret_of(created)
    command = COMMAND.search(created.text)
    assert command is not None
    expected = (
        f"moonrun run join --platform http://testserver --token {token} "
        "--data-dir /var/lib/moonrun-run"
    )
    assert (200, expected) == (created.status_code, html.unescape(command.group(1)))
    assert security_headers(created) == EXPECTED_HEADERS
    assert "Endpoint host-c is created" in created.text
    assert token.startswith("mrj_")
    key = public_key_of(Ed25519PrivateKey.generate())
    joined = con.world.client.post(
        "/run/v1/join", json={"join_token": token, "identity_public_key": key}
    )
    assert (joined.status_code, joined.json()["endpoint_id"]) == (200, endpoint_id(con, "host-c"))


def test_the_join_line_names_the_data_directory_the_cli_names() -> None:
    """The console prints the same `--data-dir` as `moonrun endpoint create`."""
    assert verbs.RUN_DATA_DIR == endpoints.RUN_DATA_DIR


def test_a_one_time_token_is_on_no_later_page(con: Console) -> None:
    """A join token, a new user's API token and a rotated one appear on their answer page and
    on no page opened afterwards, nor their hashes."""
    ada = con.client("ada")
    join = secret_of(post(ada, "/endpoints", "/endpoints", name="host-c"))
    created = secret_of(post(ada, "/users", "/users", name="nova"))
    rotated = secret_of(post(ada, f"/users/{user_id(con, 'hugo')}/token", "/users"))
    own = secret_of(post(ada, "/account/token", "/account"))
    secrets = [join, created, rotated, own]
    pages = every_page(ada, con)
    for path in ("/endpoints?done=endpoint_drained", "/users?done=user_enabled"):
        pages[path] = ada.get(path).text
    leaks = [
        (path, index)
        for path, text in pages.items()
        for index, secret in enumerate(secrets)
        if secret in text or token_hash(secret) in text
    ]
    expected: list[tuple[str, int]] = []
    assert expected == leaks
    assert len({*secrets}) == 4


def test_a_new_endpoint_name_that_is_taken_or_not_a_name_is_a_message(con: Console) -> None:
    """A taken name is 409 and a bad one 422, each a message on the endpoints page."""
    ada = con.client("ada")
    taken = post(ada, "/endpoints", "/endpoints", name="host-a")
    bad = post(ada, "/endpoints", "/endpoints", name="not a name!")
    assert problem(taken) == (409, "an endpoint named 'host-a' already exists")
    assert problem(bad) == (422, "name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    assert "<h1>Endpoints</h1>" in bad.text
    assert sorted(e.name for e in con.world.store.list_endpoints()) == ["host-a", "host-b"]


def test_draining_and_undraining_an_endpoint(con: Console) -> None:
    """Drain leads back to the endpoints page, which says so and offers Undrain; Undrain
    puts the endpoint back in service."""
    ada = con.client("ada")
    host_a = con.run.endpoint_id
    drained = post(ada, f"/endpoints/{host_a}/drain", "/endpoints")
    assert location(drained) == (303, "/endpoints?done=endpoint_drained")
    page = ada.get(drained.headers["location"])
    assert notice(page) == pages.NOTICES["endpoint_drained"]
    assert f'action="/endpoints/{host_a}/undrain"' in page.text
    assert '<span class="chip chip-retrying">draining</span>' in page.text
    assert con.world.store.get_endpoint(host_a).draining is True  # type: ignore[union-attr]
    undrained = post(ada, f"/endpoints/{host_a}/undrain", "/endpoints")
    assert location(undrained) == (303, "/endpoints?done=endpoint_undrained")
    assert con.world.store.get_endpoint(host_a).draining is False  # type: ignore[union-attr]


def test_removing_an_endpoint_takes_a_confirm_step(con: Console) -> None:
    """Remove… opens a confirm page (nothing removed yet); its button removes the endpoint."""
    ada = con.client("ada")
    post(ada, "/endpoints", "/endpoints", name="host-c")
    host_c = endpoint_id(con, "host-c")
    listing = ada.get("/endpoints").text
    assert f'href="/endpoints/{host_c}/remove"' in listing
    confirm = ada.get(f"/endpoints/{host_c}/remove")
    assert (confirm.status_code, "Remove endpoint host-c?" in confirm.text) == (200, True)
    assert f'<form method="post" action="/endpoints/{host_c}/remove">' in confirm.text
    assert con.world.store.get_endpoint(host_c) is not None
    removed = ada.post(f"/endpoints/{host_c}/remove", data={"csrf_token": csrf_of(confirm.text)})
    assert location(removed) == (303, "/endpoints?done=endpoint_removed")
    assert con.world.store.get_endpoint(host_c) is None


def test_removing_an_endpoint_a_server_points_at_is_a_409_message(con: Console) -> None:
    """host-a hosts web-1: the endpoints page says so (409), and host-a stays."""
    ada = con.client("ada")
    host_a = con.run.endpoint_id
    refused = post(ada, f"/endpoints/{host_a}/remove", f"/endpoints/{host_a}/remove")
    expected = (409, f"1 server points at endpoint {host_a}; remove them first")
    assert expected == problem(refused)
    assert "<h1>Endpoints</h1>" in refused.text
    assert con.world.store.get_endpoint(host_a) is not None


def test_removing_an_endpoint_that_does_not_exist_is_a_404(con: Console) -> None:
    """The confirm page of no endpoint is the 404 page; the form says so on the page."""
    ada = con.client("ada")
    assert error_page(ada.get("/endpoints/ep_nope/remove"))[3] == "404"
    assert problem(post(ada, "/endpoints/ep_nope/remove", "/endpoints")) == (
        404,
        "no such endpoint",
    )


@pytest.mark.parametrize(
    ("method", "route", "fields"),
    [
        ("POST", "/endpoints", {"name": "host-z"}),
        ("POST", "/endpoints/{endpoint_id}/drain", {}),
        ("POST", "/endpoints/{endpoint_id}/undrain", {}),
        ("GET", "/endpoints/{endpoint_id}/remove", {}),
        ("POST", "/endpoints/{endpoint_id}/remove", {}),
    ],
)
def test_endpoint_forms_are_for_platform_admins_only(
    con: Console, method: str, route: str, fields: dict[str, str]
) -> None:
    """An owner gets the 403 page from each endpoint form, which changes nothing."""
    olive = con.client("olive")
    before = store_snapshot(con)
    path = route.format(endpoint_id=con.run.endpoint_id)
    response = post(olive, path, **fields) if method == "POST" else olive.get(path)
    assert error_page(response) == (403, "text/html; charset=utf-8", True, "403")
    assert before == store_snapshot(con)


# -- users -------------------------------------------------------------------------------------


def test_creating_a_user_shows_the_api_token_once_and_the_user_can_sign_in(con: Console) -> None:
    """A new platform admin with a password: the answer shows the API token, which works, and
    the password signs in to the console."""
    ada = con.client("ada")
    created = post(
        ada,
        "/users",
        "/users",
        name="nova",
        password=NEW_PASSWORD,
        password_again=NEW_PASSWORD,
        platform_admin="on",
    )
    token = secret_of(created)
    assert (created.status_code, "User nova is created" in created.text) == (200, True)
    assert security_headers(created) == EXPECTED_HEADERS
    assert NEW_PASSWORD not in created.text
    assert me(con, token) == (200, "nova")
    nova = con.world.store.user_by_name("nova")
    assert nova is not None
    assert nova.platform_admin is True
    signed = con.client()
    form = signed.get("/login")
    fields = {"username": "nova", "password": NEW_PASSWORD, "csrf_token": csrf_of(form.text)}
    assert location(signed.post("/login", data=fields)) == (303, "/jobs")


def test_a_user_created_without_a_password_uses_the_api_only(con: Console) -> None:
    """No password and no admin box: a plain user who has an API token and no password."""
    ada = con.client("ada")
    created = post(ada, "/users", "/users", name="rover", password="", password_again="")
    assert me(con, secret_of(created)) == (200, "rover")
    rover = con.world.store.user_by_name("rover")
    assert rover is not None
    assert (rover.platform_admin, rover.password_hash) == (False, None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"name": "not a name!"}, (422, "name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")),
        ({"name": "olive"}, (409, "a user named 'olive' already exists")),
        (
            {"name": "nova", "password": "short", "password_again": "short"},
            (422, "password must be 8 to 1024 characters"),
        ),
        (
            {"name": "nova", "password": NEW_PASSWORD, "password_again": NEW_PASSWORD + "x"},
            (422, "the two passwords differ"),
        ),
    ],
    ids=["bad name", "taken name", "short password", "passwords differ"],
)
def test_creating_a_user_that_cannot_be_is_a_message_on_the_users_page(
    con: Console, fields: dict[str, str], expected: tuple[int, str]
) -> None:
    """Each refusal is a message on the users page, which never shows the typed password."""
    ada = con.client("ada")
    users_before = len(con.world.store.list_users())
    refused = post(ada, "/users", "/users", **fields)
    assert expected == problem(refused)
    assert "<h1>Users</h1>" in refused.text
    assert [p for p in (fields.get("password"), "short") if p and p in refused.text] == []
    assert users_before == len(con.world.store.list_users())


def test_disabling_a_user_ends_their_access_and_enabling_lets_them_back(con: Console) -> None:
    """Disable refuses olive's session and token at once; Enable lets her sign in again."""
    ada, olive = con.client("ada"), con.client("olive")
    olive_id = user_id(con, "olive")
    disabled = post(ada, f"/users/{olive_id}/disable", "/users")
    assert location(disabled) == (303, "/users?done=user_disabled")
    page = ada.get(disabled.headers["location"])
    assert notice(page) == pages.NOTICES["user_disabled"]
    assert f'action="/users/{olive_id}/enable"' in page.text
    assert location(olive.get("/jobs")) == (303, "/login?next=%2Fjobs")
    assert me(con, con.token("olive")) == (401, None)
    assert location(sign_in(con.client(), "olive")) == (401, None)
    enabled = post(ada, f"/users/{olive_id}/enable", "/users")
    assert location(enabled) == (303, "/users?done=user_enabled")
    assert (me(con, con.token("olive")), location(sign_in(con.client(), "olive"))) == (
        (200, "olive"),
        (303, "/jobs"),
    )


def test_an_admin_cannot_disable_themself(con: Console) -> None:
    """The users page offers ada no Disable for herself; posted anyway, it is the 422
    message on the users page, and ada stays enabled."""
    ada = con.client("ada")
    ada_id = user_id(con, "ada")
    page = ada.get("/users").text
    assert f'action="/users/{ada_id}/disable"' not in page
    assert f'action="/users/{user_id(con, "olive")}/disable"' in page
    refused = post(ada, f"/users/{ada_id}/disable", "/users")
    assert problem(refused) == (422, "you cannot disable yourself")
    assert ada.get("/jobs").status_code == 200


def test_rotating_a_users_token_shows_the_new_one_once_and_revokes_the_old(
    con: Console,
) -> None:
    """The answer shows olive's new token, which works; her old one is refused."""
    ada = con.client("ada")
    rotated = post(ada, f"/users/{user_id(con, 'olive')}/token", "/users")
    token = secret_of(rotated)
    assert (rotated.status_code, "A new API token for olive" in rotated.text) == (200, True)
    assert "The old API tokens of olive stop working now." in rotated.text
    assert (me(con, token), me(con, con.token("olive"))) == ((200, "olive"), (401, None))


@pytest.mark.parametrize("name", ["olive", "admin"])
def test_a_platform_admin_sets_anyones_password(con: Console, name: str) -> None:
    """Set password works for any user, the bootstrap `admin` (who has none) included: the
    new password signs in."""
    ada = con.client("ada")
    person = con.world.store.user_by_name(name)
    assert person is not None
    fields = {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}
    set_ = post(ada, f"/users/{person.id}/password", "/users", **fields)
    assert location(set_) == (303, "/users?done=password_set")
    assert notice(ada.get("/users?done=password_set")) == "The password is set."
    client = con.client()
    form = client.get("/login")
    login = {"username": name, "password": NEW_PASSWORD, "csrf_token": csrf_of(form.text)}
    assert location(client.post("/login", data=login)) == (303, "/jobs")


def test_a_password_that_differs_or_is_short_is_a_message(con: Console) -> None:
    """On the users page and on the account page; the old password still signs in."""
    ada, olive = con.client("ada"), con.client("olive")
    olive_id = user_id(con, "olive")
    differ = {"password": NEW_PASSWORD, "password_again": "something-else-9"}
    short = {"password": "short", "password_again": "short"}
    answers = [
        problem(post(ada, f"/users/{olive_id}/password", "/users", **differ)),
        problem(post(ada, f"/users/{olive_id}/password", "/users", **short)),
        problem(post(olive, "/account/password", "/account", **differ)),
        problem(post(olive, "/account/password", "/account", **short)),
    ]
    expected = [
        (422, "the two passwords differ"),
        (422, "password must be 8 to 1024 characters"),
    ] * 2
    assert expected == answers
    assert location(sign_in(con.client(), "olive")) == (303, "/jobs")


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        ("/users", {"name": "nova"}),
        ("/users/{user_id}/disable", {}),
        ("/users/{user_id}/enable", {}),
        ("/users/{user_id}/token", {}),
        ("/users/{user_id}/password", {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}),
    ],
)
def test_user_forms_about_someone_else_are_for_platform_admins_only(
    con: Console, route: str, fields: dict[str, str]
) -> None:
    """olive gets the 403 page from each users form about hugo; nothing changes."""
    olive = con.client("olive")
    before = store_snapshot(con)
    response = post(olive, route.format(user_id=user_id(con, "hugo")), **fields)
    assert error_page(response) == (403, "text/html; charset=utf-8", True, "403")
    assert before == store_snapshot(con)


def test_any_signed_in_user_sets_their_own_password(con: Console) -> None:
    """The account page (behind one's name in the top bar) sets one's own password."""
    hugo = con.client("hugo")
    assert 'href="/account"' in hugo.get("/jobs").text
    fields = {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}
    set_ = post(hugo, "/account/password", "/account", **fields)
    assert location(set_) == (303, "/account?done=password_set")
    assert notice(hugo.get(set_.headers["location"])) == "The password is set."
    assert location(sign_in(con.client(), "hugo")) == (401, None)
    assert location(sign_in(con.client(), "hugo", password=NEW_PASSWORD)) == (303, "/jobs")


def test_any_signed_in_user_rotates_their_own_api_token(con: Console) -> None:
    """The account page gives hugo a new API token, shown once; his old one is refused."""
    hugo = con.client("hugo")
    rotated = post(hugo, "/account/token", "/account")
    token = secret_of(rotated)
    assert (rotated.status_code, "Your new API token" in rotated.text) == (200, True)
    assert 'href="/account"' in rotated.text
    assert (me(con, token), me(con, con.token("hugo"))) == ((200, "hugo"), (401, None))


def test_the_user_forms_by_id_about_oneself_lead_back_to_ones_account(con: Console) -> None:
    """As in the API, anyone may rotate their own token or set their own password by id; a
    non-admin then lands on their account page (the users page is not theirs to see)."""
    hugo = con.client("hugo")
    hugo_id = user_id(con, "hugo")
    rotated = post(hugo, f"/users/{hugo_id}/token", "/account")
    assert 'href="/account">Back to your account</a>' in rotated.text
    assert me(con, secret_of(rotated)) == (200, "hugo")
    fields = {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}
    assert location(post(hugo, f"/users/{hugo_id}/password", "/account", **fields)) == (
        303,
        "/account?done=password_set",
    )
    short = {"password": "short", "password_again": "short"}
    refused = post(hugo, f"/users/{hugo_id}/password", "/account", **short)
    assert problem(refused) == (422, "password must be 8 to 1024 characters")
    assert "<h1>Your account</h1>" in refused.text


# -- servers -----------------------------------------------------------------------------------


def test_a_platform_admin_creates_a_server_from_the_servers_page(con: Console) -> None:
    """The form's selects list the endpoints and the users; the new server is the owner's."""
    ada = con.client("ada")
    page = ada.get("/servers").text
    host_b, stella = con.other_run.endpoint_id, user_id(con, "stella")
    assert f'<option value="{host_b}">host-b ({host_b})</option>' in page
    assert f'<option value="{stella}">stella</option>' in page
    fields = {"name": "cache-1", "endpoint_id": host_b, "owner_id": stella}
    created = post(ada, "/servers", "/servers", **fields)
    assert location(created) == (303, "/servers?done=server_created")
    (server,) = [s for s in con.world.store.list_servers() if s.name == "cache-1"]
    assert (server.endpoint_id, server.owner_id) == (host_b, stella)
    assert ">cache-1</h2>" in con.client("stella").get("/servers").text


def test_only_platform_admins_see_the_create_server_form(con: Console) -> None:
    """An owner's servers page has no create form; posting it anyway is the 403 page."""
    olive = con.client("olive")
    assert 'method="post" action="/servers"' not in olive.get("/servers").text
    fields = {"name": "x-1", "endpoint_id": con.run.endpoint_id, "owner_id": user_id(con, "olive")}
    refused = post(olive, "/servers", "/servers", **fields)
    assert error_page(refused)[3] == "403"
    assert len(con.world.store.list_servers()) == 2


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"name": "not a name!"}, (422, "name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")),
        ({"name": "x-1", "endpoint_id": "ep_nope"}, (404, "no such endpoint")),
        ({"name": "x-1", "owner_id": "usr_nope"}, (404, "no such user")),
    ],
    ids=["bad name", "no such endpoint", "no such owner"],
)
def test_creating_a_server_that_cannot_be_is_a_message(
    con: Console, fields: dict[str, str], expected: tuple[int, str]
) -> None:
    """A bad name or a missing endpoint or owner is a message on the servers page."""
    ada = con.client("ada")
    form = {"endpoint_id": con.run.endpoint_id, "owner_id": user_id(con, "olive"), **fields}
    refused = post(ada, "/servers", "/servers", **form)
    assert expected == problem(refused)
    assert "<h1>Servers</h1>" in refused.text
    assert len(con.world.store.list_servers()) == 2


def test_an_owner_removes_their_server_after_a_confirm_step(con: Console) -> None:
    """Remove server… opens a confirm page; its button removes olive's idle server."""
    olive = con.client("olive")
    assert f'href="/servers/{con.server_id}/remove"' in olive.get("/servers").text
    confirm = olive.get(f"/servers/{con.server_id}/remove")
    assert (confirm.status_code, "Remove server web-1?" in confirm.text) == (200, True)
    assert con.world.store.get_server(con.server_id) is not None
    removed = olive.post(
        f"/servers/{con.server_id}/remove", data={"csrf_token": csrf_of(confirm.text)}
    )
    assert location(removed) == (303, "/servers?done=server_removed")
    assert con.world.store.get_server(con.server_id) is None
    assert notice(olive.get("/servers?done=server_removed")) == pages.NOTICES["server_removed"]


@pytest.mark.parametrize("who", ["stella", "hugo"])
def test_only_the_owner_or_a_platform_admin_removes_a_server(con: Console, who: str) -> None:
    """stella (another owner) and hugo (web-1's administrator) get the 403 page from web-1's
    confirm page and form; web-1 stays."""
    client = con.client(who)
    path = f"/servers/{con.server_id}/remove"
    answers = [error_page(client.get(path))[3], error_page(post(client, path))[3]]
    expected = ["403", "403"]
    assert expected == answers
    assert con.world.store.get_server(con.server_id) is not None


def test_a_platform_admin_removes_any_server(con: Console) -> None:
    """ada removes stella's idle db-1."""
    ada = con.client("ada")
    removed = post(ada, f"/servers/{con.other_server_id}/remove", "/servers")
    assert location(removed) == (303, "/servers?done=server_removed")
    assert con.world.store.get_server(con.other_server_id) is None


def test_removing_a_server_with_a_job_not_ended_is_a_409_message(con: Console) -> None:
    """A queued job keeps web-1: the servers page says so (409), and web-1 stays."""
    con.submit()
    olive = con.client("olive")
    refused = post(olive, f"/servers/{con.server_id}/remove", "/servers")
    expected = (409, f"1 job has not ended on server {con.server_id}; cancel them first")
    assert expected == problem(refused)
    assert ">web-1</h2>" in refused.text
    assert con.world.store.get_server(con.server_id) is not None


# -- jobs: cancel selected ---------------------------------------------------------------------


def test_the_jobs_table_has_a_box_for_each_job_not_ended(con: Console) -> None:
    """Queued and running jobs can be ticked; an ended one has no box."""
    running = con.submit(kind="first")
    con.run.start().run_to_running(running)
    queued = con.submit()
    ended = con.submit()
    olive = con.client("olive")
    post(olive, f"/jobs/{ended}/cancel")
    pages = [olive.get("/jobs").text, olive.get("/jobs?fragment=1").text]
    assert [[queued, running]] * 2 == [CHECKBOX.findall(page) for page in pages]
    assert 'action="/jobs/cancel"' in pages[0]


def test_cancel_selected_cancels_each_and_says_how_many(con: Console) -> None:
    """One form, five ids: the queued job ends cancelled, the running one is cancelling, the
    ended one is left alone, stella's and a missing one are counted as not cancelled."""
    running = con.submit(kind="first")
    run = con.run.start()
    run.run_to_running(running)
    queued = con.submit()
    ended = con.submit()
    stellas = con.submit("stella", con.other_server_id)
    olive = con.client("olive")
    post(olive, f"/jobs/{ended}/cancel")
    ids = [queued, running, ended, stellas, "job_missing", queued]
    answer = post(olive, "/jobs/cancel", job_id=ids)
    expected = (303, "/jobs?cancelled=1&cancelling=1&ended=1&refused=2")
    assert expected == location(answer)
    page = olive.get(answer.headers["location"])
    said = (
        "1 job was cancelled; 1 job was asked to stop (cancelling); 1 job had already ended; "
        "2 jobs could not be cancelled (not yours, or gone)."
    )
    assert said == notice(page)
    states = [con.state(job_id) for job_id in (queued, running, ended, stellas)]
    expected_states = ["cancelled", "running", "cancelled", "queued"]
    assert expected_states == states
    assert con.world.stored(running).cancel is not None


def test_cancel_selected_goes_back_to_the_same_listing(con: Console) -> None:
    """The filters and page of the list the form was on are kept."""
    job_id = con.submit()
    olive = con.client("olive")
    page = f"/jobs?server_id={con.server_id}&state=queued"
    fields = {"job_id": job_id, "server_id": con.server_id, "state": "queued"}
    answer = post(olive, "/jobs/cancel", page, **fields)
    expected = f"/jobs?server_id={con.server_id}&state=queued&cancelled=1&cancelling=0"
    assert (303, expected + "&ended=0&refused=0") == location(answer)
    listing = olive.get(page).text
    assert f'<input type="hidden" name="server_id" value="{con.server_id}">' in listing
    assert '<input type="hidden" name="state" value="queued">' in listing


def test_cancel_selected_with_nothing_selected_is_a_message(con: Console) -> None:
    """A 422 message on the jobs page; the jobs stay queued."""
    job_id = con.submit()
    refused = post(con.client("olive"), "/jobs/cancel")
    assert problem(refused) == (422, "select at least one job to cancel")
    assert job_id in refused.text
    assert con.state(job_id) == "queued"


def test_cancel_selected_takes_at_most_200_jobs(con: Console) -> None:
    """200 ids are cancelled one by one; 201 are a 413 message on the jobs page; a form of
    far more fields is the 413 page before anything is read."""
    olive = con.client("olive")
    job_id = con.submit()
    some = [job_id] + [f"job_missing_{i}" for i in range(199)]
    done = post(olive, "/jobs/cancel", job_id=some)
    assert location(done) == (303, "/jobs?cancelled=1&cancelling=0&ended=0&refused=199")
    too_many = post(olive, "/jobs/cancel", job_id=[f"job_{i}" for i in range(201)])
    assert problem(too_many) == (413, "select at most 200 jobs at once")
    far_too_many = post(olive, "/jobs/cancel", job_id=[f"job_{i}" for i in range(400)])
    assert error_page(far_too_many) == (413, "text/html; charset=utf-8", True, "413")
    assert "a console form has at most 232 fields" in far_too_many.text


def test_other_forms_keep_the_small_field_limit(con: Console) -> None:
    """Any other form with more than 32 fields is the 413 page, and changes nothing."""
    ada = con.client("ada")
    olive_id = user_id(con, "olive")
    extra = {f"f{i}": "x" for i in range(40)}
    refused = post(ada, f"/users/{olive_id}/disable", "/users", **extra)
    assert error_page(refused)[3] == "413"
    assert me(con, con.token("olive")) == (200, "olive")


def test_cancel_selected_counts_cancel_counts_from_the_query_only() -> None:
    """The jobs page's notice is built from counts alone; anything else in the query is 0."""
    counts = jobs.CancelCounts.of("2", "x", "<b>", "99999")
    assert (jobs.CancelCounts(2, 0, 0, 0), "2 jobs were cancelled.") == (counts, counts.notice())


# -- every form --------------------------------------------------------------------------------

FORMS = [
    ("ada", "/endpoints", {"name": "host-z"}),
    ("ada", "/endpoints/{endpoint_id}/drain", {}),
    ("ada", "/endpoints/{endpoint_id}/undrain", {}),
    ("ada", "/endpoints/{spare_endpoint_id}/remove", {}),
    ("ada", "/users", {"name": "nova"}),
    ("ada", "/users/{user_id}/disable", {}),
    ("ada", "/users/{user_id}/enable", {}),
    ("ada", "/users/{user_id}/token", {}),
    (
        "ada",
        "/users/{user_id}/password",
        {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD},
    ),
    ("ada", "/servers", {"name": "x-1", "endpoint_id": "{endpoint_id}", "owner_id": "{user_id}"}),
    ("olive", "/servers/{server_id}/remove", {}),
    ("olive", "/account/password", {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}),
    ("olive", "/account/token", {}),
    ("olive", "/jobs/cancel", {"job_id": "{job_id}"}),
]


def _filled(con: Console, text: str, job_id: str, spare: str) -> str:
    return text.format(
        endpoint_id=con.run.endpoint_id,
        spare_endpoint_id=spare,
        user_id=user_id(con, "olive"),
        server_id=con.server_id,
        job_id=job_id,
    )


@pytest.mark.parametrize("csrf", ["missing", "another session's"])
@pytest.mark.parametrize(("who", "route", "fields"), FORMS, ids=[route for _, route, _ in FORMS])
def test_every_form_needs_the_sessions_csrf_token(
    con: Console, who: str, route: str, fields: dict[str, str], csrf: str
) -> None:
    """Without its own session's CSRF token a form is the "form has expired" 403 page, and
    changes nothing."""
    spare = con.world.create_endpoint("host-spare").endpoint_id
    job_id = con.submit()
    client = con.client(who)
    data = {name: _filled(con, value, job_id, spare) for name, value in fields.items()}
    if csrf != "missing":
        data["csrf_token"] = csrf_of(con.client("hugo").get("/jobs").text)
    before = (store_snapshot(con), con.state(job_id))
    refused = client.post(_filled(con, route, job_id, spare), data=data)
    assert error_page(refused) == (403, "text/html; charset=utf-8", True, "403")
    assert "This form has expired" in refused.text
    assert before == (store_snapshot(con), con.state(job_id))


@pytest.mark.parametrize(("who", "route", "fields"), FORMS, ids=[route for _, route, _ in FORMS])
def test_every_form_signed_out_asks_to_sign_in_and_lands_on_its_page(
    con: Console, who: str, route: str, fields: dict[str, str]
) -> None:
    """A form posted after the session ended leads to sign-in, then to the form's page."""
    spare = con.world.create_endpoint("host-spare").endpoint_id
    job_id = con.submit()
    client = con.client(who)
    data = {name: _filled(con, value, job_id, spare) for name, value in fields.items()}
    data["csrf_token"] = csrf_of(client.get("/jobs").text)
    con.world.clock.advance(12 * 3600 * 1000 + 1)
    before = store_snapshot(con)
    posted = client.post(_filled(con, route, job_id, spare), data=data)
    page = "/" + route.split("/")[1]
    assert location(posted) == (303, f"/login?next=%2F{page[1:]}")
    assert before == store_snapshot(con)
    assert (303, page) == location(sign_in(client, who, next=page))


@pytest.mark.parametrize("page", ["/servers", "/endpoints", "/users", "/account"])
def test_a_page_says_only_fixed_notices(con: Console, page: str) -> None:
    """`done` picks one of the console's own texts; anything else shows nothing (a link
    cannot make a page say what it wants)."""
    ada = con.client("ada")
    crafted = ada.get(page, params={"done": "Your session expired: call 555-0100", "message": "x"})
    assert (crafted.status_code, notice(crafted)) == (200, None)
    assert "555-0100" not in crafted.text
    assert notice(ada.get(page, params={"done": "password_set"})) == "The password is set."
