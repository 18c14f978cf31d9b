"""Fuzz: every user and Run route, driven with hostile JSON, answers only typed JSON errors.

Hypothesis builds each request from the route's own body model (so that most requests get
past the parser and into the checks behind it), then makes it hostile: a field replaced by a
lone surrogate, NUL, a bidi override, a huge string, a number beyond 64 bits, a wrong type or a
value nested hundreds of levels deep; a field dropped or added; or the whole body replaced by
something that is not JSON at all. Requests carry real credentials (the platform admin's token,
or the signature of host-a's registered Run), and real ids some of the time.

Every answer must be below 500, JSON, and for 4xx the error envelope; a 4xx must change nothing
in the store or the log store (a session's last-seen time aside: a correctly signed request
proves its Run alive). Afterwards every job of another owner, on another endpoint, still runs
to success on its first attempt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import socket
import threading
import time
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httptools
import hypothesis
import pytest
import uvicorn
from hypothesis import strategies as st
from pydantic import BaseModel

from moonrun.http import run_api, user_api
from moonrun.http.api import Route
from moonrun.http.edge import EdgeLimits, ServeSettings, server_config
from moonrun.store import codec
from tests.support.http_harness import ADMIN_TOKEN, Cast, http_world
from tests.support.stores import memory_factory

EXAMPLES = int(os.environ.get("MOONRUN_FUZZ_EXAMPLES", "25"))
"""Hostile requests per route (`make soak` raises it)."""

ROUTES: tuple[Route, ...] = (*user_api.ROUTES, *run_api.ROUTES)

HOSTILE_TEXT = st.sampled_from(
    [
        "\ud800",
        "a\udfffb",
        "\udc00\ud800",
        "\x00",
        "nul\x00inside",
        "\u202egnp.exe",
        "\x1b[2J\x1b[31mred",
        "line\r\nInjected: yes",
        "\ufeff",
        "\U0010ffff",
        "x" * 100_000,
        "",
        " ",
        "../../etc/passwd",
        "%00",
    ]
)
HOSTILE_NUMBER = st.sampled_from(
    [2**63, 2**64, -(2**63) - 1, 10**40, -1, 0, 1e308, -1e308, 1.5, 2**53 + 1]
)
WRONG_TYPE = st.sampled_from([None, True, False, [], {}, "1", 0, 0.0, [None], {"": None}])


def nested(depth: int, as_object: bool) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value} if as_object else [value]
    return value


DEEP = st.builds(nested, st.sampled_from([33, 100, 199, 250, 600]), st.booleans())
HOSTILE = st.one_of(HOSTILE_TEXT, HOSTILE_NUMBER, WRONG_TYPE, DEEP)


class Pools:
    """Real values a request may carry, gathered from the world as it is seeded."""

    def __init__(self, cast: Cast, jobs: list[str]) -> None:
        self.cast = cast
        self.job_ids = jobs
        self.server_ids = [cast.server_id]
        self.user_ids = [cast.owner[0], cast.helper[0]]
        self.endpoint_ids = [cast.run.endpoint_id]

    def plausible(self, name: str) -> st.SearchStrategy[Any]:
        """A value that is valid (or nearly) for a field of this name."""
        run = self.cast.run
        table: dict[str, st.SearchStrategy[Any]] = {
            "job_id": st.sampled_from(self.job_ids),
            "server_id": st.sampled_from(self.server_ids),
            "user_id": st.sampled_from(self.user_ids),
            "owner_id": st.sampled_from(self.user_ids),
            "endpoint_id": st.sampled_from(self.endpoint_ids),
            "attempt": st.integers(0, 3),
            "lease": st.sampled_from([*run.leases.values(), "mrl_not-a-lease"]),
            "seq": st.integers(0, 5),
            "max_jobs": st.integers(1, 4),
            "wait_s": st.just(0.01),
            "capacity": st.integers(1, 8),
            "kind": st.sampled_from(["noop", "sleep", "command", "Bad Kind"]),
            "payload": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
            "output": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
            "name": st.from_regex(r"\A[a-z][a-z0-9-]{0,10}\Z"),
            "outcome": st.sampled_from(["succeeded", "failed", "cancelled", "exploded"]),
            "retryable": st.booleans(),
            "percent": st.floats(0, 100),
            "message": st.text(max_size=20),
            "ts": st.just("2026-11-30T00:00:00.000Z"),
            "stream": st.sampled_from(["stdout", "stderr", "stdin"]),
            "text": st.text(max_size=20),
            "boot_id": st.just("boot-fuzz"),
            "run_version": st.just("0.1.0"),
            "not_before": st.just("2026-11-30T04:00:00.000Z"),
            "max_attempts": st.integers(1, 5),
            "password": st.just("a-long-enough-password-1"),
            "platform_admin": st.booleans(),
            "join_token": st.just("mrj_not-a-join-token"),
            "identity_public_key": st.just("A" * 43),
            "state": st.sampled_from(["queued", "running", "nonsense"]),
            "limit": st.integers(1, 50),
            "after_seq": st.integers(-1, 3),
        }
        return table.get(name, st.text(max_size=10))

    def body(self, model: type[BaseModel], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
        """A dict shaped like `model`, each field plausible (nested models followed)."""
        fields = {
            name: self._value(name, info.annotation, depth)
            for name, info in model.model_fields.items()
        }
        required = {n: s for n, s in fields.items() if model.model_fields[n].is_required()}
        optional = {n: s for n, s in fields.items() if n not in required}
        return st.fixed_dictionaries(required, optional=optional)

    def _value(self, name: str, annotation: Any, depth: int) -> st.SearchStrategy[Any]:
        for inner in _unwrapped(annotation):
            if isinstance(inner, type) and issubclass(inner, BaseModel) and depth < 3:
                return self.body(inner, depth + 1)
            if typing.get_origin(inner) is list:
                (item,) = typing.get_args(inner) or (str,)
                if isinstance(item, type) and issubclass(item, BaseModel) and depth < 3:
                    return st.lists(self.body(item, depth + 1), min_size=1, max_size=3)
        return self.plausible(name)


def _unwrapped(annotation: Any) -> list[Any]:
    """`X | None` as [X]; anything else as itself."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return [annotation]


@st.composite
def hostile_request(draw: st.DrawFn, route: Route, pools: Pools) -> tuple[Route, str, bytes | None]:
    """The route, its path (with query), and a hostile body."""
    params = {}
    for segment in route.segments:
        if segment.startswith("{"):
            name = segment[1:-1]
            value = draw(
                st.one_of(
                    pools.plausible(name).map(str),
                    HOSTILE_TEXT.filter(lambda t: len(t) < 300),
                    st.just("%ED%A0%80"),
                )
            )
            # A lone surrogate goes out as the bytes a hostile client would send (%ED%A0%80).
            params[name] = (
                value if value.startswith("%") else quote(value, safe="", errors="surrogatepass")
            )
    path = route.path.format(**params)
    if route.query is not None:
        query = draw(pools.body(route.query))
        query = draw(st.one_of(st.just(query), mutated(query)))
        if isinstance(query, dict):
            query = {k: _short_wait(k, v) for k, v in query.items()}
            texts = {k: v if isinstance(v, str) else json.dumps(v) for k, v in query.items()}
            # A URL over 64 KiB never leaves the client (httpx refuses it): keep it below.
            texts = {k: v[:4_000] for k, v in texts.items()}
            path += "?" + urlencode(texts, errors="surrogatepass")
    if route.raw_body:
        return route, path, draw(st.binary(max_size=64))
    if route.body is None:
        return route, path, draw(st.sampled_from([None, b"{}", b"\xff\xfe", b"[" * 300]))
    body = draw(pools.body(route.body))
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return route, path, draw(st.sampled_from([b"", b"{", b"\xff\xfe{}", b"NaN", b"[" * 300]))
    if choice in (1, 2):
        return route, path, _encoded(body)
    return route, path, _encoded(draw(mutated(body)))


def mutated(body: Any) -> st.SearchStrategy[Any]:
    """The body with one field (at any depth) replaced, dropped, or joined by a stranger."""
    paths = list(_paths(body))
    if not paths:
        return HOSTILE
    return st.tuples(st.sampled_from(paths), st.integers(0, 2), HOSTILE).map(
        lambda picked: _apply(body, *picked)
    )


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield (*prefix, index)
            yield from _paths(inner, (*prefix, index))


def _apply(body: Any, path: tuple[Any, ...], how: int, hostile: Any) -> Any:
    copy = json.loads(json.dumps(body))
    *parents, last = path
    holder = copy
    for step in parents:
        holder = holder[step]
    if how == 0 or isinstance(holder, list):
        holder[last] = hostile
    elif how == 1:
        del holder[last]
    else:
        holder["\ud800" if isinstance(hostile, int) else "extra_field"] = hostile
    return copy


def _short_wait(key: str, value: Any) -> Any:
    """A blocking read or claim waits a hundredth of a second at most: every wait the API
    allows is valid, and a long one would only test the clock."""
    if key == "wait_s" and isinstance(value, int | float) and not isinstance(value, bool):
        return min(value, 0.01) if value > 0 else value
    return value


def _encoded(body: Any) -> bytes:
    if isinstance(body, dict):
        body = {k: _short_wait(k, v) for k, v in body.items()}
    # ensure_ascii writes a lone surrogate as the escape a hostile client would send.
    return json.dumps(body).encode()


def snapshot(cast: Cast, jobs: list[str]) -> Any:
    """What a refused request must leave as it was: jobs, servers, users, endpoints, the
    Run's session (bar its activity times) and the log lines of every attempt."""
    world = cast.world
    store = world.store
    session = store.get_session(cast.run.session_id)
    listed = store.list_jobs(server_ids=None, state=None, limit=10_000)
    logs = {
        (job.id, attempt): world.platform.logs.read(job.id, attempt, -1)
        for job in listed
        for attempt in range(job.attempt + 1)
    }
    return (
        sorted(json.dumps(codec.job_to_row(job), sort_keys=True) for job in listed),
        sorted(repr(server) for server in store.list_servers()),
        sorted(repr(user) for user in store.list_users()),
        sorted(repr(endpoint) for endpoint in store.list_endpoints()),
        None if session is None else (session.id, session.generation, session.capacity),
        logs,
    )


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: f"{route.method} {route.path}")
def test_hostile_requests_to_every_route_get_typed_json_errors_and_change_nothing(
    cast: Cast, route: Route
) -> None:
    """No 5xx, only the JSON error envelope, no state change on a 4xx; other owners' jobs
    still run to success on their first attempt afterwards."""
    world, run = cast.world, cast.run.start()
    owner = cast.owner[1]
    jobs = [world.submit(cast.server_id, owner)["id"] for _ in range(3)]
    for granted in run.claim(2):
        assert run.ack(granted["job_id"], granted["attempt"]).status_code == 200
    others = [world.submit(cast.other_server_id, cast.stranger[1])["id"] for _ in range(5)]
    pools = Pools(cast, jobs)

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(hostile_request(route, pools))
    def probe(request: tuple[Route, str, bytes | None]) -> None:
        route, path, body = request
        before = snapshot(cast, jobs)
        if route.run:
            response = _signed(cast, route, path, body)
        else:
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            response = world.client.request(route.method, path, content=body, headers=headers)
        described = f"{route.method} {path[:200]} {body[:200] if body else body!r}"
        assert response.status_code < 500, (described, response.text[:500])
        assert response.headers.get("content-type", "").startswith("application/json"), described
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error["code"], str), described
            assert isinstance(error["message"], str), described
            assert snapshot(cast, jobs) == before, described
        elif route.path == "/run/v1/sessions" and response.status_code == 201:
            _adopt_session(cast, response.json())

    probe()

    other_run = cast.other_run.start(capacity=8)
    granted = other_run.claim(8)
    assert sorted(others) == sorted(job["job_id"] for job in granted)
    for job in granted:
        assert (job["attempt"], other_run.ack(job["job_id"], 1).status_code) == (1, 200)
        assert other_run.result(job["job_id"], 1).json()["state"] == "succeeded"


def _signed(cast: Cast, route: Route, path: str, body: bytes | None) -> Any:
    """The request signed as host-a's Run signs it (its endpoint key for /sessions)."""
    run, client = cast.run, cast.world.client
    data = body or b""
    bare, _, query = path.partition("?")
    options: dict[str, Any] = {}
    if route.path == "/run/v1/sessions":
        options = {"key_id": f"endpoint:{run.endpoint_id}", "key": run.identity}
    if route.auth is None:
        headers = {"Content-Type": "application/json"}
    else:
        headers = run.signed_headers(route.method, bare, data, query=query, **options)
    if route.raw_body:
        headers["Content-Type"] = "application/octet-stream"
        headers["Run-Lease"] = next(iter(run.leases.values()), "mrl_none")
    return client.request(route.method, path, content=data, headers=headers)


def _adopt_session(cast: Cast, answer: dict[str, Any]) -> None:
    """A fuzzed registration that succeeded replaced the Run's session: go on with the new
    one, reconciled, as Run would."""
    from moonrun.security import signing

    run = cast.run
    run.session_id = answer["session_id"]
    run.session_key = signing.b64url_decode(answer["session_key"])
    run.generation = answer["generation"]
    entries = [run.entry(job_id, attempt) for job_id, attempt in run.leases]
    run.reconcile(entries)


# -- request heads and stalled bodies, through the edge ------------------------------------------
#
# The hostile bytes here are below JSON: request heads (long lines, many headers, broken
# framing) and bodies that never finish. They need the edge (`http/edge.py`), so the world's app
# is served by uvicorn with the platform's own protocol, in a thread, on a free port, with
# deadlines short enough for a fuzz run. Every refusal must be the JSON envelope and close the
# connection; a stalled body must be answered or closed, never take a 5xx; and afterwards the
# platform serves as before, with no place left taken on any channel.

EDGE_LIMITS = EdgeLimits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=256)
REFUSALS = {400: "invalid_request", 414: "uri_too_long", 431: "headers_too_large"}
"""What the edge answers a head it will not take, before the app sees anything."""
SOCKET_GUARD_S = 10.0
"""Only a guard against a read that never ends; nothing asserts how long anything took."""


@dataclass
class EdgeServed:
    port: int
    server: uvicorn.Server


@contextmanager
def served_through_the_edge(app: Any) -> Iterator[EdgeServed]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    config = server_config(app, "127.0.0.1", 0, ServeSettings(limits=EDGE_LIMITS))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        guard = time.monotonic() + SOCKET_GUARD_S
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < guard, "uvicorn did not start in time"
            time.sleep(0.01)
        yield EdgeServed(listener.getsockname()[1], server)
    finally:
        server.should_exit = True
        thread.join(timeout=SOCKET_GUARD_S)
        listener.close()


class RawAnswer:
    """An HTTP answer read off a socket, and whether the platform closed the socket after it."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.complete = False
        self.closed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True

    def error_code(self) -> str | None:
        if not self.headers.get("content-type", "").startswith("application/json"):
            return None
        code = json.loads(self.body).get("error", {}).get("code")
        return code if isinstance(code, str) else None


def exchange(port: int, request: bytes) -> RawAnswer:
    """Send `request` and read one answer (or none: closed unanswered), then whether the
    connection is closed."""
    answer = RawAnswer()
    parser = httptools.HttpResponseParser(answer)
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_GUARD_S) as connection:
        with contextlib.suppress(OSError):  # the platform may close before it has read it all
            connection.sendall(request)
        try:
            while not answer.complete and (data := connection.recv(65536)):
                parser.feed_data(data)
            answer.status = parser.get_status_code() if answer.complete else 0
            if answer.status in REFUSALS:
                answer.closed = connection.recv(1) == b""
        except ConnectionResetError:
            answer.closed = True
    return answer


HEADER_NAME = st.from_regex(r"\AX-[A-Za-z0-9-]{1,20}\Z")
HEADER_VALUE = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40),
    # Around the 8 KiB line bound, but a few bytes either side of it never decide a case.
    st.one_of(st.integers(6_000, 8_100), st.integers(8_300, 12_000)).map(lambda n: "v" * n),
)
BAD_FRAMING = st.sampled_from(
    [
        b"Content-Length: -1\r\n",
        b"Content-Length: 1\r\nContent-Length: 2\r\n",
        b"Content-Length: 99999999999999999999999999\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
        b"Bad Header\r\n",
        b"X-Nul: a\x00b\r\n",
        b": no-name\r\n",
    ]
)


@st.composite
def hostile_head(draw: st.DrawFn) -> tuple[bytes, bool, bool]:
    """A request head (and a body where it announces one); whether it is within the
    head bounds as the edge counts them (the target, and each header's name and value with
    4 bytes of framing, every header counted, 100 of them at most); and whether its framing is
    well formed."""
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
    target = draw(st.sampled_from(["/healthz", "/api/v1/jobs", "/run/v1/heartbeat", "/login"]))
    target += "?" + "q" * draw(st.sampled_from([0, 10, 8_200, 20_000]))
    headers = [("Host", "p"), *draw(st.lists(st.tuples(HEADER_NAME, HEADER_VALUE), max_size=130))]
    # A body with no newline in it, as large as a log batch, follows a head that announces it.
    body = b'"' + b"x" * draw(st.sampled_from([0, 10_000, 40_000, 200_000])) + b'"'
    if method in ("POST", "PUT"):
        headers.append(("Content-Length", str(len(body))))
    lines = [f"{name}: {value}\r\n".encode() for name, value in headers]
    bad = draw(st.none() | BAD_FRAMING)
    if bad is not None:
        lines.insert(draw(st.integers(1, len(lines))), bad)
    limits = EDGE_LIMITS
    within = (
        len(target) <= limits.max_line_bytes
        and len(lines) + (bad or b"").count(b"\r\n") <= limits.max_headers
        and all(len(line) - 2 <= limits.max_line_bytes for line in lines)
        and len(target) + sum(len(line) + 1 for line in lines) <= limits.max_head_bytes
    )
    head = f"{method} {target} HTTP/1.1\r\n".encode() + b"".join(lines) + b"\r\n"
    return head + (body if method in ("POST", "PUT") else b""), within, bad is None


def test_hostile_request_heads_get_the_json_envelope_and_a_closed_connection(
    cast: Cast,
) -> None:
    """Lines past 8 KiB, past 100 headers, past 64 KiB in all, framing httptools refuses, in any
    mix: a head past a bound is never served (414/431, or 400 when its framing broke first); a
    head within the bounds but badly framed is 400; every one of those is `{"error": ...}` JSON
    with its code, and the connection closes. A head within the bounds and well framed is
    served (below 500). The platform serves throughout."""
    with served_through_the_edge(cast.world.app) as served:

        @hypothesis.settings(
            max_examples=EXAMPLES * 4,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        @hypothesis.given(hostile_head())
        def probe(case: tuple[bytes, bool, bool]) -> None:
            request, within, well_framed = case
            answer = exchange(served.port, request)
            described = (request[:120], len(request), within, well_framed, answer.status)
            assert 0 < answer.status < 500, described
            if not within:
                assert answer.status in REFUSALS, described
            elif not well_framed:
                assert answer.status == 400, described
            else:
                assert answer.status not in REFUSALS, described
            if answer.status in REFUSALS:
                assert (answer.error_code(), answer.closed) == (
                    REFUSALS[answer.status],
                    True,
                ), described
            health = exchange(served.port, b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n")
            assert health.status == 200, described

        probe()


STALLABLE_PATHS = [
    ("POST", "/run/v1/join"),
    ("POST", "/run/v1/heartbeat"),
    ("POST", "/run/v1/jobs/claim"),
    ("PUT", "/run/v1/artifacts/job_x/1/out/0"),
    ("POST", "/api/v1/servers"),
    ("POST", "/api/v1/endpoints"),
    ("POST", "/login"),
    ("POST", "/jobs/new"),
    ("POST", "/metrics"),
    ("GET", "/healthz"),
]


@st.composite
def stalled_body(draw: st.DrawFn, cast: Cast) -> bytes:
    """A request announcing more body than it sends: on any route, with no, made-up or real
    credentials, its Content-Length (or its chunks) never met."""
    method, path = draw(st.sampled_from(STALLABLE_PATHS))
    declared = draw(st.integers(1, 300_000))
    sent = draw(st.integers(0, min(declared - 1, 4096)))
    who = draw(st.sampled_from(["nobody", "made-up", "admin"]))
    headers = [f"{method} {path} HTTP/1.1", "Host: p"]
    if who != "nobody":
        token = ADMIN_TOKEN if who == "admin" else "mra_" + "made-up" * 6
        headers.append(f"Authorization: Bearer {token}")
    if draw(st.booleans()):
        headers.append(f"Content-Length: {declared}")
        body = b"{" * sent
    else:
        headers.append("Transfer-Encoding: chunked")
        body = f"{declared:x}\r\n".encode() + b"{" * sent
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def test_bodies_that_stall_are_answered_or_closed_and_hold_nothing_afterwards(
    cast: Cast,
) -> None:
    """Up to 12 at once, every route, bodies declared longer than sent: each is answered at once
    (401, 404, 405, 413, 429, in the JSON envelope on the APIs) or closed by the body deadline,
    never a 5xx; then /healthz, a user and a signed Run are served, and no place on any channel
    is still taken."""
    with served_through_the_edge(cast.world.app) as served:

        @hypothesis.settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        @hypothesis.given(st.lists(stalled_body(cast), min_size=1, max_size=12))
        def probe(requests: list[bytes]) -> None:
            with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
                answers = list(pool.map(lambda r: exchange(served.port, r), requests))
            for request, answer in zip(requests, answers, strict=True):
                described = (request[:200], answer.status)
                assert answer.status < 500, described
                api = request.split(b" ", 2)[1].startswith((b"/api/", b"/run/"))
                if answer.status and api:
                    assert answer.error_code() is not None, described
            health = exchange(served.port, b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n")
            assert health.status == 200

        probe()

    channels = cast.world.platform.channels
    taken = {
        name: getattr(channels, name).in_flight
        for name in ("control", "jobs", "logs", "artifacts", "user", "ops", "anonymous")
    }
    assert set(taken.values()) == {0}, taken
    run = cast.run.start()
    assert run.heartbeat().status_code == 200
    assert cast.world.api("GET", "/api/v1/servers").status_code == 200


# -- huge numbers ----------------------------------------------------------------------------------

HUGE = "9" * 5_000
"""More digits than Python's `int()` reads from text (4,300): it raises ValueError."""
PADDED = "0" * 5_000 + "7"
"""Seven, written with 5,001 digits."""


def asgi(
    app: Any, method: str, path: str, headers: dict[str, str], body: bytes = b"", query: str = ""
) -> tuple[int, dict[str, str], bytes]:
    """One request to the ASGI app exactly as given (no client fixes its headers up): the
    answer's status, headers and body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [
            (b"host", b"testserver"),
            *((name.lower().encode(), value.encode("latin-1")) for name, value in headers.items()),
        ],
        "client": ("198.51.100.30", 50000),
        "server": ("testserver", 80),
    }
    answer: dict[str, Any] = {"body": b""}
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            await asyncio.Event().wait()  # the client stays until the answer is sent
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return answer["status"], answer["headers"], answer["body"]


def _code(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, str | None]:
    status, headers, body = answer
    if not headers.get("content-type", "").startswith("application/json"):
        return status, None
    return status, json.loads(body).get("error", {}).get("code")


@pytest.fixture
def finished(cast: Cast) -> tuple[str, str]:
    """A job of the owner that ended with a complete 10-byte artifact `out`: (job id, the
    owner's API token)."""
    run, owner = cast.run.start(), cast.owner[1]
    job_id = cast.world.submit(cast.server_id, owner)["id"]
    attempt = run.run_to_running(job_id)
    assert run.put_chunk(job_id, attempt, "out", 0, b"0123456789", final=True).status_code == 202
    assert run.result(job_id, attempt).status_code == 200
    return job_id, owner


def test_a_huge_content_length_is_413_on_every_api_and_the_console(cast: Cast) -> None:
    """Content-Length of 5,000 digits, or of a digit that is not ASCII: a typed answer, never
    `int()`'s ValueError as a 500."""
    world, owner = cast.world, cast.owner[1]
    run = cast.run.start()
    bearer = {"Authorization": f"Bearer {owner}", "Content-Type": "application/json"}
    heartbeat = run.signed_headers("POST", "/run/v1/heartbeat", b"")
    answers = {
        length: [
            _code(
                asgi(
                    world.app,
                    "POST",
                    f"/api/v1/servers/{cast.server_id}/jobs",
                    {**bearer, "Content-Length": length},
                )
            ),
            _code(
                asgi(
                    world.app, "POST", "/run/v1/heartbeat", {**heartbeat, "Content-Length": length}
                )
            ),
            _code(asgi(world.app, "POST", "/login", {"Content-Length": length})),
        ]
        for length in (HUGE, "\u00b2")
    }
    assert answers[HUGE] == [(413, "too_large")] * 3
    assert all(status < 500 for status, _ in answers["\u00b2"]), answers["\u00b2"]


@pytest.mark.parametrize(
    ("header", "status", "content_range", "content"),
    [
        (f"bytes=0-{HUGE}", 206, "bytes 0-9/10", b"0123456789"),
        (f"bytes=-{HUGE}", 206, "bytes 0-9/10", b"0123456789"),
        (f"bytes={PADDED}-{PADDED}", 206, "bytes 7-7/10", b"7"),
        (f"bytes={HUGE}-", 200, None, b"0123456789"),
        (f"bytes={HUGE}-{HUGE}", 200, None, b"0123456789"),
    ],
    ids=["last past the end", "suffix longer", "padded", "first past the end", "both huge"],
)
def test_a_range_with_huge_numbers_is_read_as_rfc_9110_says(
    cast: Cast,
    finished: tuple[str, str],
    header: str,
    status: int,
    content_range: str | None,
    content: bytes,
) -> None:
    """A last position past the end means the end, a suffix longer than the artifact the whole
    of it, and a first position past the end cannot be met, so the header is ignored (200)."""
    job_id, owner = finished
    path = f"/api/v1/jobs/{job_id}/artifacts/out"
    headers = {"Authorization": f"Bearer {owner}", "Range": header}
    got_status, got_headers, body = asgi(cast.world.app, "GET", path, headers)
    assert (got_status, got_headers.get("content-range"), body) == (status, content_range, content)


def test_other_headers_with_huge_numbers_get_typed_answers(
    cast: Cast, finished: tuple[str, str]
) -> None:
    """A signature created at a 5,000-digit instant is 401; an entity tag of 5,000 digits
    simply does not match (the job or the artifact is answered)."""
    world, run = cast.world, cast.run
    job_id, owner = finished
    signed = run.signed_headers("POST", "/run/v1/heartbeat", b"")
    signed["Signature-Input"] = re.sub(r"created=\d+", f"created={HUGE}", signed["Signature-Input"])
    bearer = {"Authorization": f"Bearer {owner}", "If-None-Match": f'"{HUGE}"'}
    answers = [
        asgi(world.app, "POST", "/run/v1/heartbeat", signed)[0],
        _code(asgi(world.app, "GET", f"/api/v1/jobs/{job_id}", bearer, query="wait_s=1")),
        asgi(world.app, "GET", f"/api/v1/jobs/{job_id}/artifacts/out", bearer)[0],
    ]
    assert answers == [401, (200, None), 200]


@pytest.mark.parametrize(
    ("attempt", "index"),
    [(HUGE, "0"), ("1", HUGE), (f"-{HUGE}", "0"), ("1", str(2**63)), ("1", "--1")],
    ids=["huge attempt", "huge index", "huge negative", "past 64 bits", "two minus"],
)
def test_a_signed_artifact_chunk_with_a_huge_attempt_or_index_is_422(
    cast: Cast, attempt: str, index: str
) -> None:
    """Path integers of any length: 422 `invalid_request`, after the signature was checked."""
    run = cast.run.start()
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    run.run_to_running(job_id)
    path = f"/run/v1/artifacts/{job_id}/{attempt}/out/{index}"
    headers = run.signed_headers("PUT", path, b"data")
    headers |= {"Content-Type": "application/octet-stream", "Run-Lease": "mrl_any"}
    assert _code(asgi(cast.world.app, "PUT", path, headers, b"data")) == (422, "invalid_request")


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/api/v1/jobs/{job}/logs", f"after_seq={HUGE}"),
        ("/api/v1/jobs/{job}/logs", f"attempt={HUGE}"),
        ("/api/v1/jobs/{job}/artifacts/out", f"attempt={HUGE}"),
        ("/api/v1/jobs", f"limit={HUGE}"),
        ("/api/v1/jobs/{job}", f"wait_s={HUGE}&until=terminal"),
    ],
    ids=["after_seq", "logs attempt", "artifact attempt", "limit", "wait_s"],
)
def test_a_query_number_of_5000_digits_is_422(
    cast: Cast, finished: tuple[str, str], path: str, query: str
) -> None:
    job_id, owner = finished
    answer = asgi(
        cast.world.app,
        "GET",
        path.format(job=job_id),
        {"Authorization": f"Bearer {owner}"},
        query=query,
    )
    assert _code(answer) == (422, "invalid_request")
