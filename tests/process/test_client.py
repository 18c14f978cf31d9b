"""`moonrun.client` against a real `moonrun platform serve` and a real Run (tests/support/e2e.py),
each test twice: with `Client`, and with `AsyncClient` (driven by tests/support/both_clients.py).

Jobs end every way (succeeded, failed, cancelled, or not yet when a wait times out), lists and
logs are read page after page, the admin calls make and read users, endpoints and servers, and
error answers become typed errors. The wire faults use httpx transports: a closed port, and a
connection that drops after the platform has taken a submit (so its answer is lost).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from moonrun.backoff import Backoff
from moonrun.client import Client, Job, LogLine, PlatformError
from moonrun.errors import (
    AlreadyExists,
    ChannelBusy,
    Forbidden,
    InvalidPayload,
    InvalidRequest,
    MoonrunError,
    NotFound,
    Unauthenticated,
    UnknownKind,
    Unreachable,
    WaitTimedOut,
)
from tests.support.both_clients import FLAVOURS, Flavour, Recording, connect
from tests.support.e2e import Cluster, Server, cluster
from tests.support.launcher import ADMIN_TOKEN, free_port

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes

FAR_FUTURE = datetime.now(UTC) + timedelta(days=365)
"""A not_before that keeps a job queued for the whole test."""


class LosesFirstSubmitAnswer(Recording):
    """Delivers the first job submit to the platform, then drops the connection: the job is
    made but its answer never reaches the client."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.drops(request):
            response.read()
            response.close()
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if self.drops(request):
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response

    def drops(self, request: httpx.Request) -> bool:
        if request.method == "POST" and request.url.path.endswith("/jobs") and not self.dropped:
            self.dropped = True
            return True
        return False


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Server]]:
    with cluster(tmp_path_factory.mktemp("client")) as cl:
        run = cl.add_run()
        yield cl, cl.create_server("web-1", run.endpoint_id)


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """Which client a test drives: `Client`, or `AsyncClient`."""
    flavour: Flavour = request.param
    return flavour


@pytest.fixture
def client(shared: tuple[Cluster, Server], flavour: Flavour) -> Iterator[Client]:
    with connect(flavour, shared[0].platform.url, ADMIN_TOKEN) as admin:
        yield admin


def fresh_server(cl: Cluster, server: Server) -> Server:
    """Another server on the same endpoint, so that a test sees only its own jobs."""
    return cl.create_server(f"srv-{secrets.token_hex(4)}", server.endpoint_id)


def ending(job: Job) -> tuple[str, int, str | None]:
    """State, terminal attempt and terminal error code."""
    terminal = job.terminal or {}
    error = terminal.get("error") or {}
    return job.state, terminal.get("attempt", 0), error.get("code")


# -- jobs --------------------------------------------------------------------------------------


def test_wait_answers_a_job_that_succeeded(shared: tuple[Cluster, Server], client: Client) -> None:
    """submit, then wait, answers the job once it has succeeded; job() reads the same."""
    cl, server = shared
    with cl.explained():
        queued = client.submit(server.id, "noop")
        # With its logs: a view read after that is the same (logs_complete settles too).
        done = client.wait(queued.id, timeout_s=30, logs=True)
        read = client.job(queued.id)
    assert (queued.state, queued.server_id, queued.kind) == ("queued", server.id, "noop")
    assert ending(done) == ("succeeded", 1, None)
    assert (read.data, read.ended) == (done.data, True)


def test_wait_answers_a_job_that_failed(shared: tuple[Cluster, Server], client: Client) -> None:
    """A job whose only attempt fails for good is answered failed, with its error code."""
    cl, server = shared
    with cl.explained():
        job = client.submit(server.id, "sleep", {"seconds": 0, "fail": "fatal"}, max_attempts=1)
        done = client.wait(job.id, timeout_s=30)
    assert (done.state, done.max_attempts, done.terminal is not None) == ("failed", 1, True)


def test_wait_answers_a_job_that_was_cancelled(
    shared: tuple[Cluster, Server], client: Client
) -> None:
    """Cancelling a running job records a cancel intent; wait answers the job cancelled."""
    cl, server = shared
    with cl.explained():
        job = client.submit(server.id, "sleep", {"seconds": 60})
        cl.wait_state(job.id, "running")
        intent = client.cancel(job.id)
        done = client.wait(job.id, timeout_s=30)
    assert intent.data["cancel"]["requested"] is True
    assert done.state == "cancelled"


def test_cancel_of_a_queued_job_ends_it_at_once(
    shared: tuple[Cluster, Server], client: Client
) -> None:
    """A job still waiting for its not_before is cancelled by the answer itself."""
    cl, server = shared
    with cl.explained():
        job = client.submit(server.id, "noop", not_before=FAR_FUTURE)
        cancelled = client.cancel(job.id)
    assert (job.state, cancelled.state) == ("queued", "cancelled")


def test_cancel_many_answers_each_job_or_the_error_its_own_cancel_raises(
    shared: tuple[Cluster, Server], client: Client, flavour: Flavour
) -> None:
    """One request: the caller's queued jobs come back cancelled; for a user who may not
    manage them, each job is the `Forbidden` (and a missing one the `NotFound`) a cancel of it
    alone raises, returned in its place, not raised; nothing at all is `InvalidRequest`."""
    cl, server = shared
    with cl.explained():
        jobs = [client.submit(server.id, "noop", not_before=FAR_FUTURE) for _ in range(2)]
        _, token = client.create_user(f"nobody-{secrets.token_hex(4)}")
        with connect(flavour, cl.platform.url, token) as nobody:
            refused = nobody.cancel_many([jobs[0].id, "job_doesnotexist0000"])
            with pytest.raises(InvalidRequest):
                nobody.cancel_many([])
        cancelled = client.cancel_many([job.id for job in jobs])
    assert [(Forbidden, "forbidden"), (NotFound, "not_found")] == [
        (type(error), error.code) for error in refused if isinstance(error, MoonrunError)
    ]
    assert [(job.id, "cancelled") for job in jobs] == [
        (job.id, job.state) for job in cancelled if isinstance(job, Job)
    ]


def test_wait_raises_wait_timed_out_while_the_job_has_not_ended(
    shared: tuple[Cluster, Server], client: Client
) -> None:
    """A wait whose timeout passes before the job ends raises WaitTimedOut (a MoonrunError)."""
    cl, server = shared
    with cl.explained():
        job = client.submit(server.id, "noop", not_before=FAR_FUTURE)
        with pytest.raises(WaitTimedOut) as raised:
            client.wait(job.id, timeout_s=0.2)
        after = client.job(job.id)
    assert (raised.value.code, after.state) == ("wait_timed_out", "queued")


def test_jobs_follows_the_cursor_through_every_page(
    shared: tuple[Cluster, Server], flavour: Flavour
) -> None:
    """jobs() reads page after page: every job of the server, newest first, once each."""
    cl, server = shared
    recording = Recording()
    with (
        cl.explained(),
        connect(flavour, cl.platform.url, ADMIN_TOKEN, transport=recording) as client,
    ):
        own = fresh_server(cl, server)
        submitted = [client.submit(own.id, "noop", not_before=FAR_FUTURE).id for _ in range(5)]
        listed = [job.id for job in client.jobs(server_id=own.id, page_size=2)]
        queued = [job.id for job in client.jobs(server_id=own.id, state="queued")]
        succeeded = list(client.jobs(server_id=own.id, state="succeeded"))
    assert listed == submitted[::-1]
    assert len(recording.paths("/api/v1/jobs")) >= 3 + 2
    assert (queued, succeeded) == (submitted[::-1], [])


def test_submit_with_the_same_idempotency_key_answers_the_same_job(
    shared: tuple[Cluster, Server], client: Client
) -> None:
    """A caller's own Idempotency-Key makes a second submit answer the first job."""
    _, server = shared
    first = client.submit(server.id, "noop", not_before=FAR_FUTURE, idempotency_key="deploy-7")
    second = client.submit(server.id, "noop", not_before=FAR_FUTURE, idempotency_key="deploy-7")
    assert second.id == first.id


def test_a_submit_retried_after_a_lost_answer_makes_exactly_one_job(
    shared: tuple[Cluster, Server], flavour: Flavour
) -> None:
    """The connection drops after the platform took the submit; the retry (same
    Idempotency-Key) answers the job the first try made, and the server has one job."""
    cl, server = shared
    lossy = LosesFirstSubmitAnswer()
    with cl.explained(), connect(flavour, cl.platform.url, ADMIN_TOKEN, transport=lossy) as client:
        own = fresh_server(cl, server)
        job = client.submit(own.id, "noop", not_before=FAR_FUTURE)
        listed = [j.id for j in client.jobs(server_id=own.id)]
    posts = [r for r in lossy.sent if r.method == "POST"]
    keys = {r.headers["idempotency-key"] for r in posts}
    assert (lossy.dropped, len(posts), len(keys)) == (True, 2, 1)
    assert listed == [job.id]


# -- logs --------------------------------------------------------------------------------------


def test_logs_reads_every_page_of_an_attempt(
    shared: tuple[Cluster, Server], flavour: Flavour
) -> None:
    """1,200 lines in two batches (more than the 1,000 of one page) are read in order."""
    cl, server = shared
    recording = Recording()
    with (
        cl.explained(),
        connect(flavour, cl.platform.url, ADMIN_TOKEN, transport=recording) as client,
    ):
        script = "seq 1 600; sleep 1.5; seq 601 1200"  # Run ships a batch about every second
        job = client.submit(server.id, "command", {"argv": ["sh", "-c", script]})
        done = client.wait(job.id, timeout_s=30)
        lines = list(client.logs(job.id, follow=True))
        again = list(client.logs(job.id, attempt=1))
    expected = [str(n) for n in range(1, 1201)]
    assert done.state == "succeeded"
    assert [line.text for line in lines] == expected
    assert [line.data for line in again] == [line.data for line in lines]
    assert {(line.attempt, line.stream) for line in lines} == {(1, "stdout")}
    assert len(recording.paths("/logs")) >= 2 * 2


def test_logs_follow_yields_lines_while_the_job_runs(
    shared: tuple[Cluster, Server], client: Client, tmp_path: Path
) -> None:
    """follow=True hands over a line while the job still runs, and ends once the job has
    ended and its last lines are read."""
    cl, server = shared
    gate = tmp_path / "gate"
    script = f'echo first; while [ ! -e "{gate}" ]; do sleep 0.1; done; echo last'
    with cl.explained():
        job = client.submit(server.id, "command", {"argv": ["sh", "-c", script], "timeout_s": 60})
        following = client.logs(job.id, follow=True)
        first = next(following)
        while_first = client.job(job.id).state
        gate.touch()
        rest: list[LogLine] = list(following)
        ended = client.job(job.id).state
    assert (first.text, while_first) == ("first", "running")
    assert ([line.text for line in rest], ended) == (["last"], "succeeded")


# -- users, endpoints, servers -----------------------------------------------------------------


def test_admin_calls_make_and_read_users_endpoints_and_servers(
    shared: tuple[Cluster, Server], client: Client, flavour: Flavour
) -> None:
    """A platform admin creates a user, an endpoint and a server, and manages its admins."""
    cl, _ = shared
    name = f"u-{secrets.token_hex(4)}"
    with cl.explained():
        me = client.whoami()
        user, token = client.create_user(name, password="correct horse battery")
        endpoint, join_token = client.create_endpoint(f"host-{name}")
        server = client.create_server(f"srv-{name}", endpoint.id, user.id)
        client.add_server_admin(server.id, me.id)
        with_admin = client.server(server.id)
        client.remove_server_admin(server.id, me.id)
        without_admin = client.server(server.id)
        with connect(flavour, cl.platform.url, token) as as_user:
            they = as_user.whoami()
            their_servers = [s.id for s in as_user.servers()]
        users = {u.id for u in client.users()}
        endpoints = {e.id: e for e in client.endpoints()}
        servers = {s.id for s in client.servers()}
    assert (me.platform_admin, they.name, they.platform_admin) == (True, name, False)
    assert (token.startswith("mra_"), join_token != "") == (True, True)
    assert (user.id in users, me.id in users, server.id in servers) == (True, True, True)
    assert (endpoints[endpoint.id].online, endpoints[endpoint.id].data) == (False, endpoint.data)
    assert (server.owner_id, server.endpoint_id) == (user.id, endpoint.id)
    assert (with_admin.admin_ids, without_admin.admin_ids) == ((me.id,), ())
    assert their_servers == [server.id]


def test_creating_a_taken_name_raises_already_exists(client: Client) -> None:
    """A second user of the same name is 409 already_exists, raised as AlreadyExists."""
    name = f"twice-{secrets.token_hex(4)}"
    client.create_user(name)
    with pytest.raises(AlreadyExists) as raised:
        client.create_user(name)
    assert (raised.value.code, raised.value.status) == ("already_exists", 409)


# -- errors ------------------------------------------------------------------------------------


def test_a_bad_token_raises_unauthenticated(
    shared: tuple[Cluster, Server], flavour: Flavour
) -> None:
    """A token nobody holds is 401 unauthenticated, raised as Unauthenticated."""
    with (
        connect(flavour, shared[0].platform.url, "mra_" + "x" * 43) as stranger,
        pytest.raises(Unauthenticated) as raised,
    ):
        stranger.whoami()
    assert raised.value.code == "unauthenticated"


def test_an_unknown_job_raises_not_found(client: Client) -> None:
    """Reading, waiting on, cancelling or reading the logs of no such job raise NotFound."""
    missing = "job_doesnotexist0000"
    calls = [
        lambda: client.job(missing),
        lambda: client.wait(missing, timeout_s=1),
        lambda: client.cancel(missing),
        lambda: list(client.logs(missing)),
    ]
    raised = []
    for call in calls:
        with pytest.raises(NotFound) as error:
            call()
        raised.append(error.value.code)
    assert raised == ["not_found"] * 4


CEILINGS = Backoff(initial_s=0.2, max_s=5.0, draw=lambda: 1.0)
"""The client's backoff without its jitter: every pause is its retry's ceiling."""


def test_an_unreachable_platform_raises_unreachable_after_retries(flavour: Flavour) -> None:
    """Nobody listens: each try fails to connect; after `retries` retries with doubling
    backoff the call raises Unreachable."""
    pauses: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    with (
        connect(
            flavour, url, ADMIN_TOKEN, retries=3, backoff=CEILINGS, sleep=pauses.append
        ) as client,
        pytest.raises(Unreachable) as raised,
    ):
        client.whoami()
    assert (pauses, raised.value.code) == ([0.2, 0.4, 0.8], "unreachable")


# -- answers no platform of ours gives (a stand-in transport) ----------------------------------


def answering(*answers: httpx.Response) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport that gives `answers` in turn, and the requests it was sent."""
    sent: list[httpx.Request] = []
    queue = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return queue.pop(0)

    return httpx.MockTransport(handle), sent


def error(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"error": {"code": code, "message": f"{code} happened"}}
    return httpx.Response(status, json=body, headers=headers)


USER = {"id": "usr_1", "name": "ada", "platform_admin": False, "created_at": "2026-01-01T00:00:00Z"}


def test_busy_and_unavailable_answers_are_retried_after_retry_after(flavour: Flavour) -> None:
    """429 and 503 are tried again, after at least the answer's Retry-After."""
    transport, sent = answering(
        error(429, "channel_busy", {"Retry-After": "1"}),
        error(503, "contention"),
        httpx.Response(200, json=USER),
    )
    pauses: list[float] = []
    with connect(
        flavour, "http://platform", "t", backoff=CEILINGS, transport=transport, sleep=pauses.append
    ) as client:
        user = client.whoami()
    assert (user.name, len(sent), pauses) == ("ada", 3, [1.0, 0.4])


def test_a_busy_platform_raises_its_error_once_the_retries_are_spent(flavour: Flavour) -> None:
    """The last 429 is raised as the error its code names."""
    transport, _ = answering(*(error(429, "channel_busy") for _ in range(3)))
    pauses: list[float] = []
    with (
        connect(
            flavour,
            "http://platform",
            "t",
            retries=2,
            backoff=CEILINGS,
            transport=transport,
            sleep=pauses.append,
        ) as c,
        pytest.raises(ChannelBusy),
    ):
        c.whoami()
    assert pauses == [0.2, 0.4]


def test_an_unknown_error_code_raises_platform_error_with_its_code(flavour: Flavour) -> None:
    """A code this client does not know is a PlatformError carrying code, status, message."""
    transport, _ = answering(error(418, "teapot"))
    with (
        connect(flavour, "http://platform", "t", transport=transport) as client,
        pytest.raises(PlatformError) as raised,
    ):
        client.whoami()
    found = (raised.value.code, raised.value.status, raised.value.message)
    assert found == ("teapot", 418, "teapot happened")


def test_a_create_retried_after_a_lost_answer_says_so_when_the_name_is_taken(
    flavour: Flavour,
) -> None:
    """A 409 already_exists to a retried create is raised, saying the first try may have
    made it (its one-time token is then lost)."""
    transport, _ = answering(error(503, "store_unavailable"), error(409, "already_exists"))
    with (
        connect(
            flavour, "http://platform", "t", transport=transport, sleep=lambda _: None
        ) as client,
        pytest.raises(AlreadyExists) as raised,
    ):
        client.create_endpoint("host-1")
    assert "the first try may have created it" in raised.value.message


def test_not_before_is_sent_as_rfc3339_utc(flavour: Flavour) -> None:
    """A datetime not_before goes on the wire as RFC 3339 with a Z, in milliseconds."""
    job = {
        "id": "job_1",
        "server_id": "srv_1",
        "kind": "noop",
        "state": "queued",
        "attempt": 0,
        "max_attempts": 3,
        "created_at": "2026-01-01T00:00:00.000Z",
        "progress": None,
        "terminal": None,
    }
    transport, sent = answering(httpx.Response(201, json=job))
    moment = datetime(2026, 11, 30, 5, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    with connect(flavour, "http://platform", "t", transport=transport) as client:
        answered = client.submit("srv_1", "noop", not_before=moment)
    body = json.loads(sent[0].content)
    assert body["not_before"] == "2026-11-30T04:00:00.123Z"
    assert (answered.data, sent[0].headers["idempotency-key"] != "") == (job, True)


def test_an_answer_that_is_not_json_raises_unreachable(flavour: Flavour) -> None:
    """A 200 that is no JSON (say, a captive portal's page) is Unreachable, not a crash."""
    transport, _ = answering(httpx.Response(200, text="<html>hello</html>"))
    with (
        connect(flavour, "http://platform", "t", transport=transport) as client,
        pytest.raises(Unreachable),
    ):
        client.whoami()


def test_a_platform_url_without_a_scheme_raises_unreachable_at_once(flavour: Flavour) -> None:
    """`platform.example` (no http://) is Unreachable on the first try, without retries."""
    pauses: list[float] = []
    with (
        connect(flavour, "platform.example", "t", sleep=pauses.append) as client,
        pytest.raises(Unreachable) as raised,
    ):
        client.whoami()
    assert (pauses, "http://" in raised.value.message) == ([], True)


# -- kinds, validation, search and rerun ------------------------------------------------------


def test_a_misfit_raises_invalid_payload_with_its_fields(
    shared: tuple[Cluster, Server], client: Client
) -> None:
    """The real Run advertised its kinds: a bad argv raises InvalidPayload naming `argv`, a
    misspelt kind UnknownKind; kinds() shows what the Run runs."""
    _, server = shared
    with pytest.raises(InvalidPayload) as invalid:
        client.submit(server.id, "command", {"argv": "echo hi"})
    with pytest.raises(UnknownKind):
        client.submit(server.id, "comand", {})
    kinds = client.kinds(server.id)
    assert invalid.value.fields == (("argv", "must be an array, not a string"),)
    assert (kinds.advertised, sorted(kinds.schemas)) == (True, ["command", "noop", "sleep"])


def test_rerun_queues_a_finished_job_again_and_jobs_finds_it_by_kind_and_prefix(
    shared: tuple[Cluster, Server], client: Client
) -> None:
    """rerun() of a finished job answers a new job of its kind, which jobs() finds by kind
    and by its id's prefix, and which runs to its end like the first."""
    cl, server = shared
    mine = fresh_server(cl, server)
    with cl.explained():
        first = client.wait(client.submit(mine.id, "sleep", {"seconds": 0}).id, timeout_s=30)
        again = client.rerun(first.id)
        done = client.wait(again.id, timeout_s=30)
    by_kind = [job.id for job in client.jobs(server_id=mine.id, kind="sleep")]
    by_prefix = [job.id for job in client.jobs(id_prefix=again.id[:10], kind="sleep")]
    assert (again.kind, again.server_id, done.state) == ("sleep", mine.id, "succeeded")
    assert by_kind == [again.id, first.id]
    assert again.id in by_prefix
