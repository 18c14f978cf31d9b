"""Several platforms on one database behind a load balancer (docs/operations.md, "Several
platforms"), as real processes: three `moonrun platform serve` on one MySQL or PostgreSQL
database, sharing one secret file and one data directory for logs and artifacts, behind a
round-robin proxy (tests/support/round_robin_proxy.py: each request to the next platform), and
two real Runs that reach them only through the proxy.

A workload goes through the proxy: jobs whose commands print lines and write an artifact, a
cancel, a blocking read, a console sign-in and a page (once with each of its three requests
sent straight to another platform, which count failed sign-ins together), a schedule; then
one platform is SIGKILLed while jobs run, more work comes, and at the end nothing acknowledged
is lost: every job created ends exactly once, with every line it printed and its artifact,
readable through whichever platform answers. Nothing here asserts a duration; every wait is
bounded and polls.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.faults import check_history
from tests.support.launcher import (
    ADMIN_TOKEN,
    LOG_TAIL_LINES,
    PlatformProcess,
    Process,
    RunProcess,
    Timings,
    wait_for,
)
from tests.support.reports import failed
from tests.support.round_robin_proxy import RoundRobinProxy
from tests.support.stores import StoreFactory, mysql_factory, postgres_factory

# Real platform, Run and proxy processes, one SIGKILLed: the real-process lane (docs/testing.md).
pytestmark = pytest.mark.processes

PLATFORMS = 3
PASSWORD = "olive-owns-both-servers-4d2a"
LINES = 20
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
PROCESS_INFO = re.compile(r'^moonrun_process_info\{process="([^"]+)"', re.M)
TIMEOUT_S = 60.0
"""A bound on each wait for something that must happen (never a measure of speed)."""


@pytest.fixture(params=["mysql", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    """An empty database, created and migrated here, for the platforms to share."""
    factory: StoreFactory
    if request.param == "mysql":
        factory = mysql_factory(request.getfixturevalue("mysql_url"))
    else:
        factory = postgres_factory(request.getfixturevalue("postgres_url"))
    factory.open().close()
    return factory.url()


def script(tag: str, pause_s: float = 0) -> list[str]:
    """A command printing LINES lines and writing an artifact, both naming `tag`."""
    body = f"for i in $(seq 1 {LINES}); do echo {tag}-$i; done; "
    if pause_s:
        body += f"sleep {pause_s}; "
    body += f"printf 'artifact of {tag}' > out.txt"
    return ["sh", "-c", body]


@dataclass
class Deployment:
    """The proxy in front of three platforms, two Runs behind it, and the user API through it."""

    workdir: Path
    platforms: list[PlatformProcess]
    proxy: RoundRobinProxy
    admin: httpx.Client
    runs: list[RunProcess] = field(default_factory=list)
    created: dict[str, str] = field(default_factory=dict)
    """Every job whose create was acknowledged (201) -> what it is: `command:TAG`, `cancel`,
    or `schedule`."""

    def call(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        answer = self.admin.request(method, path, json=body)
        assert answer.status_code == status, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json()

    def submit(self, server_id: str, tag: str, pause_s: float = 0) -> str:
        payload = {"argv": script(tag, pause_s), "artifacts": [{"path": "out.txt", "name": "out"}]}
        body = {"kind": "command", "payload": payload}
        job_id: str = self.call("POST", f"/api/v1/servers/{server_id}/jobs", body, 201)["id"]
        self.created[job_id] = f"command:{tag}"
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        view: dict[str, Any] = self.call("GET", f"/api/v1/jobs/{job_id}")
        return view

    def wait_state(self, job_id: str, *states: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            view = self.job(job_id)
            return view if view["state"] in states else None

        found: dict[str, Any] = wait_for(probe, f"{job_id} in {states}", timeout_s=TIMEOUT_S)
        return found

    def logs(self, job_id: str) -> list[str]:
        lines: list[str] = []
        after_seq = -1
        while True:
            page = self.call("GET", f"/api/v1/jobs/{job_id}/logs?after_seq={after_seq}")
            lines += [line["text"] for line in page["lines"]]
            if not page["more"]:
                return lines
            after_seq = page["next_after_seq"]

    def artifact(self, job_id: str) -> bytes:
        # Run uploads a job's artifacts after its result, in a channel of their own: a job
        # that ended (its logs complete too) may still be uploading, more so when a chunk met
        # the killed platform and waits for its retry (docs/protocol.md, "Artifacts").
        def complete() -> list[dict[str, Any]] | None:
            listed: list[dict[str, Any]] = self.call("GET", f"/api/v1/jobs/{job_id}/artifacts")[
                "artifacts"
            ]
            return listed if any(a["complete"] for a in listed) else None

        listed = wait_for(complete, f"{job_id}'s artifact complete", timeout_s=TIMEOUT_S)
        assert [(a["name"], a["complete"]) for a in listed] == [("out", True)], listed
        answer = self.admin.get(f"/api/v1/jobs/{job_id}/artifacts/out")
        assert answer.status_code == 200, answer.text
        return answer.content

    def processes_answering(self, expected: int) -> set[str]:
        """The platform processes that answer scrapes of /metrics through the proxy, scraped
        until `expected` of them answered (other requests pass the proxy meanwhile, so which
        process answers a scrape is not known in advance), and a few times more."""
        seen: set[str] = set()
        for scrape in range(200):
            answer = self.admin.get("/metrics")
            assert answer.status_code == 200, answer.text
            seen.update(PROCESS_INFO.findall(answer.text))
            if len(seen) >= expected and scrape >= 2 * expected:
                break
        return seen

    def owned(self) -> list[Process]:
        return [*self.runs, self.proxy, *self.platforms]


@pytest.fixture
def deployment(
    store_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Deployment]:
    secret = tmp_path / "platform.secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    shared = tmp_path / "shared-data"
    flags = [*Timings().flags(), "--trusted-proxy", "127.0.0.1"]
    platforms = []
    for n in range(PLATFORMS):
        workdir = tmp_path / f"platform-{n}"
        workdir.mkdir()
        platform = PlatformProcess(
            workdir, store_url, flags=flags, secret_file=secret, name=f"platform {n}"
        )
        platform.data_dir = shared  # logs and artifacts: one directory for all three
        platforms.append(platform)
    proxy = RoundRobinProxy(tmp_path, [platform.url for platform in platforms])
    admin = httpx.Client(
        base_url=proxy.url, timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    built = Deployment(tmp_path, platforms, proxy, admin)
    try:
        for platform in platforms:
            platform.start()
        proxy.start()
        yield built
    except BaseException as error:
        for owner in built.owned():
            error.add_note(f"--- {owner.name} output (last {LOG_TAIL_LINES} lines) ---")
            error.add_note(owner.tail())
        raise
    finally:
        admin.close()
        if failed(request):  # a failure in the test's body never reaches the `except` above
            for owner in built.owned():
                print(f"--- {owner.name} output (last {LOG_TAIL_LINES} lines) ---")
                print(owner.tail())
        for owner in built.owned():
            owner.close()


def add_run(d: Deployment, name: str) -> tuple[str, RunProcess]:
    """An endpoint joined and served by a real Run that knows only the proxy's address."""
    created = d.call("POST", "/api/v1/endpoints", {"name": name}, 201)
    endpoint_id = created["endpoint"]["id"]
    data_dir = d.workdir / f"run-{name}"
    run = RunProcess(f"Run {name}", d.workdir, data_dir, d.workdir / f"run-{name}.log", 4)
    d.runs.append(run)
    run.join(d.proxy.url, created["join_token"])
    run.start(d.proxy.url)

    def online() -> bool:
        endpoints = d.call("GET", "/api/v1/endpoints")["endpoints"]
        return any(e["id"] == endpoint_id and e["online"] for e in endpoints)

    wait_for(online, f"{name} online", timeout_s=TIMEOUT_S)
    return endpoint_id, run


def sign_in_and_read_a_page(job_id: str, form: str, post: str, page: str) -> None:
    """The sign-in form from the platform at `form`, posted to the one at `post`, the jobs page
    from the one at `page`: the form's token is the shared secret's, the session is in the
    database. (Cookies do not tell ports apart: one browser for all three.)"""
    with httpx.Client(timeout=TIMEOUT_S) as browser:
        answer = browser.get(f"{form}/login", params={"next": "/jobs"})
        assert answer.status_code == 200, answer.text
        token = re.search(r'name="csrf_token" value="([^"]*)"', answer.text)
        assert token is not None
        fields = {"username": "olive", "password": PASSWORD, "csrf_token": token.group(1)}
        signed_in = browser.post(f"{post}/login", data={**fields, "next": "/jobs"})
        assert (signed_in.status_code, signed_in.headers.get("location")) == (303, "/jobs")
        listed = browser.get(f"{page}/jobs")
        assert listed.status_code == 200, listed.text
        assert job_id in listed.text


def guesses_are_counted_by_every_platform(urls: list[str]) -> None:
    """Five wrong passwords for one name, each to the next platform: the sixth try, on yet
    another, already waits (each platform counting alone would let it be checked)."""
    with httpx.Client(timeout=TIMEOUT_S) as browser:
        form = browser.get(f"{urls[0]}/login")
        token = re.search(r'name="csrf_token" value="([^"]*)"', form.text)
        assert token is not None
        fields = {"username": "nobody", "password": "a guess", "csrf_token": token.group(1)}
        answers = [browser.post(f"{urls[n % len(urls)]}/login", data=fields) for n in range(6)]
    assert [answer.status_code for answer in answers] == [401] * 5 + [429]


def test_three_platforms_behind_a_proxy_lose_nothing_acknowledged_when_one_is_killed(
    deployment: Deployment,
) -> None:
    d = deployment
    # /metrics says which process answered: three of them.
    before = d.processes_answering(PLATFORMS)
    assert len(before) == PLATFORMS, before

    olive = d.call("POST", "/api/v1/users", {"name": "olive", "password": PASSWORD}, 201)
    owner_id = olive["user"]["id"]
    servers = []
    for name in ("host-a", "host-b"):
        endpoint_id, _ = add_run(d, name)
        body = {"name": f"{name}-server", "endpoint_id": endpoint_id, "owner_id": owner_id}
        servers.append(d.call("POST", "/api/v1/servers", body, 201)["id"])

    # Jobs with logs and artifacts on both Runs; a blocking read of one, on whichever platform.
    first = [d.submit(server, f"w1-{n}-{i}") for n, server in enumerate(servers) for i in range(3)]
    read = d.call("GET", f"/api/v1/jobs/{first[0]}?wait_s=30&until=logs_complete")
    assert (read["state"], read["logs_complete"]) == ("succeeded", True), read

    # A cancel of a job under way.
    sleeping = d.call(
        "POST",
        f"/api/v1/servers/{servers[0]}/jobs",
        {"kind": "sleep", "payload": {"seconds": 60}},
        201,
    )["id"]
    d.created[sleeping] = "cancel"
    d.wait_state(sleeping, "running")
    d.call("POST", f"/api/v1/jobs/{sleeping}/cancel", {}, 202)  # Run is told, and stops it

    # A schedule: every minute by its calendar, and once now.
    schedule = d.call(
        "POST",
        f"/api/v1/servers/{servers[1]}/schedules",
        {
            "name": "minutely",
            "cron": "* * * * *",
            "job": {"kind": "command", "payload": {"argv": ["sh", "-c", "echo fired"]}},
        },
        201,
    )
    fired = d.call("POST", f"/api/v1/schedules/{schedule['id']}/trigger", {})["job_id"]
    assert fired is not None
    d.created[fired] = "schedule"

    sign_in_and_read_a_page(first[0], *(platform.url for platform in d.platforms))
    guesses_are_counted_by_every_platform([platform.url for platform in d.platforms])

    # A second wave, some of it running (and its waiting claims, logs and results on every
    # platform) when one platform is killed.
    second = [
        d.submit(server, f"w2-{n}-{i}", pause_s=1.5)
        for n, server in enumerate(servers)
        for i in range(4)
    ]
    d.wait_state(second[0], "running")
    killed = d.platforms[1]
    killed.kill()

    third = [d.submit(server, f"w3-{n}-{i}") for n, server in enumerate(servers) for i in range(3)]
    sign_in_and_read_a_page(third[0], d.proxy.url, d.proxy.url, d.proxy.url)

    # Every job created ends, exactly once.
    for job_id in d.created:
        d.wait_state(job_id, *TERMINAL)
    views = {job_id: d.job(job_id) for job_id in d.created}
    for job_id, what in d.created.items():
        view = views[job_id]
        if what == "cancel":
            assert view["state"] == "cancelled", view
            continue
        assert check_history(view) == [], (what, view)

    # Every line each command printed and its artifact, through whichever platform answers
    # (each read twice: two platforms).
    for job_id, what in d.created.items():
        if not what.startswith("command:"):
            continue
        tag = what.removeprefix("command:")
        expected = [f"{tag}-{i}" for i in range(1, LINES + 1)]
        d.call("GET", f"/api/v1/jobs/{job_id}?wait_s=30&until=logs_complete")
        assert d.logs(job_id) == d.logs(job_id) == expected, job_id
        assert d.artifact(job_id) == d.artifact(job_id) == f"artifact of {tag}".encode()

    # The schedule's calendar fired each of its times once, however many platforms decided it.
    listed = d.call("GET", f"/api/v1/jobs?server_id={servers[1]}&limit=200")["jobs"]
    times = Counter(
        job["schedule"]["scheduled_for"]
        for job in listed
        if job["schedule"] is not None and job["schedule"]["id"] == schedule["id"]
    )
    assert times, "the schedule's trigger made no job"
    assert set(times.values()) == {1}, times

    # The two left answer everything; /metrics names only them.
    after = d.processes_answering(PLATFORMS - 1)
    assert len(after) == PLATFORMS - 1, after
    assert after < before, (before, after)
    stats = d.proxy.stats()
    assert stats["refused"].get(killed.url, 0) >= 1, stats
