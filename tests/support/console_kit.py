"""The console's test kit: a platform with people who sign in, a TestClient per person, the
app served over real HTTP (uvicorn in a thread) for a browser, and Debian's Chromium.

Shared by tests/unit/web/test_console.py, tests/process/test_console_browser.py and
scripts/screenshots.py.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2 as httpx
import pytest
import uvicorn
from argon2 import PasswordHasher
from fastapi import FastAPI
from fastapi.testclient import TestClient

from moonrun.security import passwords
from tests.support.http_harness import HttpWorld, SignedRun
from tests.support.stores import StoreFactory

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's Chromium: the only browser the tests drive (never a downloaded one)."""
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORDS = {
    "ada": "ada-sees-every-moon-4e1b",
    "olive": "olive-owns-web-1-9c2d",
    "hugo": "hugo-helps-web-1-7a3f",
    "stella": "stella-owns-db-1-5b8e",
}
"""ada is a platform admin; olive owns web-1, which hugo administers; stella owns db-1."""
CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]*)"')


def cheap_passwords(monkeypatch: pytest.MonkeyPatch) -> None:
    """argon2id at its lowest cost for this test: each sign-in costs ~0.1 s at the production
    cost, and a console test signs in several people. The hashes stay real argon2id (the
    page canary and the user API tests keep the production cost)."""
    monkeypatch.setattr(
        passwords, "_HASHER", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    )


@dataclass
class Console:
    """A platform with four people who sign in, two joined endpoints and a server on each."""

    world: HttpWorld
    users: dict[str, tuple[str, str]]
    """name -> (user id, API token)"""
    run: SignedRun
    """Run on host-a, which hosts web-1."""
    other_run: SignedRun
    """Run on host-b, which hosts db-1."""
    server_id: str
    other_server_id: str
    clients: list[TestClient] = field(default_factory=list)

    def token(self, name: str) -> str:
        return self.users[name][1]

    def submit(self, name: str = "olive", server_id: str | None = None, **body: Any) -> str:
        """Queue a job as `name` (on web-1 unless told); answer its id."""
        job = self.world.submit(server_id or self.server_id, self.token(name), **body)
        job_id: str = job["id"]
        return job_id

    def state(self, job_id: str) -> str:
        return self.world.stored(job_id).state.value

    def client(
        self, name: str | None = None, *, https: bool = False, address: str = "testclient"
    ) -> TestClient:
        """A browser-like client with its own cookie jar, signed in as `name` if given."""
        client = TestClient(
            self.world.app,
            base_url="https://testserver" if https else "http://testserver",
            follow_redirects=False,
            client=(address, 50000),
        )
        self.clients.append(client)
        if name is not None:
            signed = sign_in(client, name)
            assert signed.status_code == 303, signed.text
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.world.close()


@contextmanager
def console(factory: StoreFactory, tmp_path: Path) -> Iterator[Console]:
    world = HttpWorld(factory, tmp_path / "artifacts")
    users = {
        name: world.create_user(name, password=password, platform_admin=name == "ada")
        for name, password in PASSWORDS.items()
    }
    run = world.create_endpoint("host-a")
    other_run = world.create_endpoint("host-b")
    server_id = world.create_server("web-1", run.endpoint_id, users["olive"][0])
    other_server_id = world.create_server("db-1", other_run.endpoint_id, users["stella"][0])
    added = world.api(
        "POST",
        f"/api/v1/servers/{server_id}/admins",
        token=users["olive"][1],
        json={"user_id": users["hugo"][0]},
    )
    assert added.status_code == 200, added.text
    built = Console(world, users, run, other_run, server_id, other_server_id)
    try:
        yield built
    finally:
        built.close()


def csrf_of(html: str) -> str:
    """The value of the first csrf_token field of a page."""
    found = CSRF_FIELD.search(html)
    assert found is not None, "the page has no csrf_token field"
    return found.group(1)


def sign_in(
    client: TestClient, name: str, password: str | None = None, next: str = "/jobs"
) -> httpx.Response:
    """Fetch the sign-in form (its CSRF cookie with it) and post it; answer the POST's response."""
    form = client.get("/login", params={"next": next})
    assert form.status_code == 200, form.text
    fields = {
        "username": name,
        "password": PASSWORDS[name] if password is None else password,
        "csrf_token": csrf_of(form.text),
        "next": next,
    }
    return client.post("/login", data=fields)


# -- real HTTP, and a real browser ------------------------------------------------------------


@dataclass
class Served:
    """An app served by uvicorn on a free port of 127.0.0.1, in a background thread."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread


@contextmanager
def serve(app: FastAPI, startup_timeout_s: float = 10.0) -> Iterator[Served]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="on",
        ws="none",  # no WebSocket routes; and no import of a WebSocket library
        log_config=None,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [listener]}, name="uvicorn", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start in time"
            time.sleep(0.01)
        yield Served(f"http://127.0.0.1:{port}", server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()
        assert not thread.is_alive(), "uvicorn did not stop"


@contextmanager
def over_http(console: Console, url: str) -> Iterator[None]:
    """The world's client (SignedRun's and the API helpers') goes through the served app."""
    served_client = httpx.Client(base_url=url, timeout=10)
    in_process = console.world.client
    console.world.client = served_client  # type: ignore[assignment]
    try:
        yield
    finally:
        console.world.client = in_process
        served_client.close()


def launch_chromium(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def sign_in_page(page: Page, base_url: str, name: str, path: str = "/jobs") -> None:
    """Open `path` signed out, sign in as `name` on the form it leads to, land on `path`."""
    page.goto(base_url + path)
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password").fill(PASSWORDS[name])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(base_url + path)
