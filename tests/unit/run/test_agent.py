"""Run's agent against a real platform served in-process: long-poll claims and batched acks.

The platform is the real ASGI app over a memory store, served by uvicorn on a local port in
the test's event loop; the agent is the real one, with a client that records what it sends
(and, where a test says so, spoils one entry or fails one whole request before it is sent).
Waits are on the platform's own change events; nothing is timed against the wall clock.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.artifacts.file import FileArtifactStore
from moonrun.backoff import Backoff
from moonrun.clock import SystemClock
from moonrun.errors import InvalidPayload, MoonrunError, SessionRotated
from moonrun.http.channels import Channels
from moonrun.logs.memory import MemoryLogStore
from moonrun.run.agent import Agent, RunConfig
from moonrun.run.client import PlatformClient, SessionInfo, Unreachable
from moonrun.run.handlers import Handler, HandlerResult, JobContext, load_handlers
from moonrun.run.identity import Identity
from moonrun.run.journal import Assignment, Journal
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.records import User
from moonrun.security import signing
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.websessions import WebSessions
from moonrun.store.memory import MemoryStore
from moonrun.store.protocol import Store
from moonrun.wiring.app import create_app
from moonrun.wiring.platform import Platform

HANG_GUARD_S = 10.0
"""Only a guard against a hang; every wait below is expected to end well before it."""
ADMIN_TOKEN = "mra_run-agent-test-admin-token-0000000000000"
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class World:
    """One platform, one endpoint with one server, and what happened, in order."""

    platform: Platform
    store: Store
    url: str
    admin: User
    identity: Identity
    server_id: str
    timeline: list[tuple[str, Any]] = field(default_factory=list)

    def submit(self, kind: str = "noop", payload: Any = None) -> str:
        job = self.platform.service.create_job(
            self.admin, self.server_id, kind=kind, payload=payload
        )
        self.timeline.append(("job created", job.id))
        return job.id

    def state(self, job_id: str) -> str:
        job = self.store.get_job(job_id)
        assert job is not None
        return str(job.state.value)

    async def wait_state(self, job_id: str, *states: str) -> str:
        """Wait (on the platform's change events) until the job is in one of `states`."""
        async with asyncio.timeout(HANG_GUARD_S):
            with self.platform.watch.job(job_id) as changed:
                while True:
                    changed.event.clear()  # before reading: a change from now on sets it again
                    if (state := self.state(job_id)) in states:
                        return state
                    await changed.event.wait()


@asynccontextmanager
async def served_platform(tmp_path: Path) -> AsyncIterator[World]:
    clock, tokens, store = SystemClock(), SystemTokenSource(), MemoryStore()
    service = SchedulingService(store, clock, tokens, SchedulingSettings())
    directory = Directory(store, clock, tokens)
    admin = directory.ensure_bootstrap_admin(ADMIN_TOKEN)
    platform = Platform(
        service=service,
        directory=directory,
        web=WebSessions(store, clock, bytes(range(32))),
        clock=clock,
        secret=bytes(range(32)),
        logs=MemoryLogStore(),
        artifacts=FileArtifactStore(tmp_path / "artifacts"),
        channels=Channels.with_limits(inline=True),
    )
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    enrolled = service.create_endpoint(admin, "host-1")
    endpoint = service.join_endpoint(enrolled.join_token, signing.b64url(public))
    server = directory.create_server(admin, "web-1", endpoint_id=endpoint.id, owner_id=admin.id)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        create_app(platform, sweep=False),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    http = uvicorn.Server(config)
    serving = asyncio.create_task(http.serve(sockets=[listener]))
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            while not http.started:
                await asyncio.sleep(0.01)
        yield World(
            platform,
            store,
            f"http://127.0.0.1:{port}",
            admin,
            Identity(endpoint.id, key),
            server.id,
        )
    finally:
        # A claim that a stopped Run left waiting would hold the server's shutdown until its
        # wait is over: a job for it ends that wait at once.
        if platform.watch.waiting:
            service.create_job(admin, server.id, kind="noop")
        http.should_exit = True
        await serving
        listener.close()
        platform.close()


class RecordingClient(PlatformClient):
    """The real client; notes each claim and ack batch in the world's timeline, and can spoil
    the lease of chosen jobs' acks or fail whole ack requests before they are sent."""

    def __init__(self, world: World) -> None:
        super().__init__(world.url, world.identity.endpoint_id, world.identity.key)
        self.timeline = world.timeline
        self.spoiled: set[str] = set()
        self.ack_failures: list[MoonrunError] = []
        self.answers_lost: list[MoonrunError] = []
        """Errors raised *after* an ack request was delivered and applied (its answer lost)."""
        self.first_ack_sent: float | None = None
        self.left_out: set[str] = set()
        """Jobs whose entries this client leaves out of every reconciliation it sends."""

    async def claim(self, max_jobs: int, wait_s: float | None = None) -> list[dict[str, Any]]:
        self.timeline.append(("claim sent", wait_s))
        jobs = await super().claim(max_jobs, wait_s)
        self.timeline.append(("claim answered", [job["job_id"] for job in jobs]))
        return jobs

    async def results_and_claim(
        self, results: list[dict[str, Any]], max_jobs: int | None
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        if max_jobs is not None:
            self.timeline.append(("results sent, claiming", max_jobs))
        answers, jobs = await super().results_and_claim(results, max_jobs)
        if max_jobs is not None:
            self.timeline.append(("claim answered", [job["job_id"] for job in jobs]))
        return answers, jobs

    async def cancel_poll(self, job_id: str, attempt: int, lease: str) -> Any:
        self.timeline.append(("cancel poll sent", job_id))
        return await super().cancel_poll(job_id, attempt, lease)

    async def reconcile(self, entries: list[dict[str, Any]]) -> Any:
        kept = [entry for entry in entries if entry["job_id"] not in self.left_out]
        self.timeline.append(("reconcile sent", sorted(entry["job_id"] for entry in kept)))
        return await super().reconcile(kept)

    async def acks(self, acks: list[dict[str, Any]]) -> list[Any]:
        if self.first_ack_sent is None:
            self.first_ack_sent = time.monotonic()
        self.timeline.append(("acks sent", sorted(ack["job_id"] for ack in acks)))
        if self.ack_failures:
            raise self.ack_failures.pop(0)
        if self.answers_lost:
            await super().acks(acks)
            raise self.answers_lost.pop(0)
        sent = [
            {**ack, "lease": "mrl_" + "x" * 43} if ack["job_id"] in self.spoiled else ack
            for ack in acks
        ]
        answers = await super().acks(sent)
        self.timeline.append(
            ("acks answered", sorted(type(a).__name__ for a in answers if isinstance(a, Exception)))
        )
        return answers


@asynccontextmanager
async def running_agent(
    world: World,
    tmp_path: Path,
    capacity: int,
    prepare: Callable[[RecordingClient], None] = lambda client: None,
    handlers: dict[str, Handler] | None = None,
    data_dir: Path | None = None,
) -> AsyncIterator[Agent]:
    if data_dir is None:
        data_dir = tmp_path / "run-data"
        data_dir.mkdir()
    config = RunConfig(
        world.url,
        data_dir,
        capacity,
        claim_interval_s=3600,  # a Run that polled would not see a new job during a test
        backoff=Backoff(initial_s=0.01, max_s=10.0),
        draw=lambda: 0.5,  # the middle of every jitter: claims wait exactly claim_wait_s
    )
    client = RecordingClient(world)
    prepare(client)
    handlers = load_handlers() if handlers is None else handlers
    agent = Agent(config, world.identity, Journal.open(data_dir), handlers, client=client)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        async with asyncio.timeout(HANG_GUARD_S):
            await running


async def until(condition: Callable[[], bool]) -> None:
    """Wait for a condition nothing signals (the platform holding a claim)."""
    async with asyncio.timeout(HANG_GUARD_S):
        while not condition():
            await asyncio.sleep(0.005)


def events(timeline: list[tuple[str, Any]], *names: str) -> list[tuple[str, Any]]:
    return [event for event in timeline if event[0] in names]


# -- kinds: advertised at registration, checked before a handler runs ---------------------------


class Gated:
    """A handler that runs until its gate opens."""

    resumable = True

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def run(self, context: JobContext) -> HandlerResult:
        await self.gate.wait()
        return HandlerResult("succeeded")


class Greet:
    """A plugin handler with its own payload schema, which notes every payload it is given."""

    resumable = True
    payload_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}},
    }

    def __init__(self) -> None:
        self.given: list[Any] = []

    async def run(self, context: JobContext) -> HandlerResult:
        self.given.append(context.payload)
        return HandlerResult("succeeded")


@pytest.mark.anyio
async def test_run_advertises_a_plugins_schema_and_never_hands_it_a_misfit(tmp_path: Path) -> None:
    """A job queued before Run advertised, whose payload does not fit the plugin's schema,
    fails bad_payload without the plugin running; once Run registered, the platform refuses
    such a job at submit with the plugin's own schema, and a fitting one runs."""
    async with served_platform(tmp_path) as world:
        misfit = world.submit("greet", {"name": 5})
        greet = Greet()
        handlers = {**load_handlers(), "greet": greet}
        async with running_agent(world, tmp_path, capacity=4, handlers=handlers):
            await world.wait_state(misfit, *TERMINAL)
            with pytest.raises(InvalidPayload) as refused:
                world.submit("greet", {"name": 5})
            fits = world.submit("greet", {"name": "ada"})
            await world.wait_state(fits, *TERMINAL)
        stored = world.store.get_job(misfit)

    assert stored is not None
    assert stored.terminal is not None
    assert (stored.state.value, stored.terminal.error.code) == ("failed", "bad_payload")
    assert refused.value.fields == (("name", "must be a string, not an integer"),)
    assert greet.given == [{"name": "ada"}]


class Owned:
    """A handler that keeps the owner each attempt was given."""

    resumable = False

    def __init__(self) -> None:
        self.owners: list[str | None] = []

    async def run(self, context: JobContext) -> HandlerResult:
        self.owners.append(context.owner_id)
        return HandlerResult("succeeded")


@pytest.mark.anyio
async def test_a_jobs_owner_reaches_its_handler_from_the_claim(tmp_path: Path) -> None:
    """The claim's `owner_id` (the server's owner) is kept with the attempt and handed to the
    handler, which is how `--run-as-range` picks the uid."""
    async with served_platform(tmp_path) as world:
        owned = Owned()
        async with running_agent(world, tmp_path, capacity=1, handlers={"owned": owned}):
            job_id = world.submit("owned", {})
            await world.wait_state(job_id, *TERMINAL)

    assert owned.owners == [world.admin.id]


@pytest.mark.anyio
async def test_an_artifact_name_like_a_path_is_refused_at_submit_and_said_in_the_logs_on_run(
    tmp_path: Path,
) -> None:
    """`../evil` and `a/b` as artifact names: once Run advertised `command`, the platform
    refuses such a job at submit naming `artifacts[0].name`; one queued before that reaches
    Run, which refuses it (bad_payload) without running it and says why in the job's log."""
    evil = {"argv": ["true"], "artifacts": [{"path": "out", "name": "../evil"}]}
    async with served_platform(tmp_path) as world:
        queued_earlier = world.submit("command", evil)
        async with running_agent(world, tmp_path, capacity=2):
            await world.wait_state(queued_earlier, *TERMINAL)
            refusals = []
            for name in ("../evil", "a/b"):
                with pytest.raises(InvalidPayload) as refused:
                    world.submit("command", {**evil, "artifacts": [{"path": "o", "name": name}]})
                refusals.append(refused.value.fields)

            def logged() -> list[str]:
                page = world.platform.logs.read(queued_earlier, 1, -1)
                return [line.text for line in page.lines]

            async with asyncio.timeout(HANG_GUARD_S):
                while not logged():
                    await asyncio.sleep(0.02)
            said = logged()
        stored = world.store.get_job(queued_earlier)

    rule = "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
    assert refusals == [(("artifacts[0].name", rule),)] * 2
    assert stored is not None
    assert stored.terminal is not None
    assert (stored.state.value, stored.terminal.error.code) == ("failed", "bad_payload")
    assert said == [f"moonrun: payload refused: payload.artifacts[0].name {rule}"]


# -- leases as Run believes them (found by the simulation, docs/simulation.md) -------------------


@pytest.mark.anyio
async def test_after_a_lost_ack_answer_the_lease_runs_from_the_first_ack_sent(
    tmp_path: Path,
) -> None:
    """The platform applied the first ack and its answer was lost; the ack sent again renews
    nothing, so Run counts its lease from the first send, never from the repeat."""
    async with served_platform(tmp_path) as world:
        gate = asyncio.Event()
        job_id = world.submit("gated", {})
        handlers = {**load_handlers(), "gated": Gated(gate)}
        lost = Unreachable("jobs: connection reset after the request was sent")
        async with running_agent(
            world,
            tmp_path,
            capacity=1,
            prepare=lambda client: client.answers_lost.append(lost),
            handlers=handlers,
        ) as agent:
            await world.wait_state(job_id, "running")
            await until(lambda: (job_id, 1) in agent._renewed_until)
            believed = agent._renewed_until[(job_id, 1)]
            client = agent.client
            assert isinstance(client, RecordingClient)
            first = client.first_ack_sent
            gate.set()
            await world.wait_state(job_id, *TERMINAL)

    assert first is not None
    lease_ttl_s = SchedulingSettings().lease_ttl_s
    assert believed <= first + lease_ttl_s
    acks = events(world.timeline, "acks sent")
    assert [("acks sent", [job_id]), ("acks sent", [job_id])] == acks


@pytest.mark.anyio
async def test_a_reconciliation_that_says_running_is_not_followed_by_an_ack(
    tmp_path: Path,
) -> None:
    """A journal that lost its `running` state after a crash says accepted; the platform's
    reconciliation says running. Run acks no more (a repeated ack would renew nothing) and
    goes on with the lease the reconciliation renewed."""
    async with served_platform(tmp_path) as world:
        job_id = world.submit()
        service = world.platform.service
        session = service.register_session(
            world.identity.endpoint_id, boot_id="before-crash", run_version="0.1.0", capacity=1
        ).session.id
        service.reconcile(session, [])
        (granted,) = service.claim(session, 1)
        service.ack(session, job_id, Evidence(granted.attempt, granted.lease))
        data_dir = tmp_path / "run-data"
        data_dir.mkdir()
        journal = Journal.open(data_dir)
        await journal.put(
            Assignment(job_id, granted.attempt, granted.lease, "noop", {}, "srv", "accepted")
        )
        async with running_agent(world, tmp_path, capacity=1, data_dir=data_dir):
            ended = await world.wait_state(job_id, *TERMINAL)

    assert ended == "succeeded"
    assert events(world.timeline, "acks sent") == []


@pytest.mark.anyio
async def test_a_session_renewal_that_drops_the_renewing_attempt_still_lets_run_claim(
    tmp_path: Path,
) -> None:
    """An ack meets a session error; the supervisor renews the session, and the
    reconciliation drops that very attempt (its report leaves it out). The renewal still
    completes, so Run claims again: the next job runs."""
    async with served_platform(tmp_path) as world:
        dropped = world.submit()

        def prepare(client: RecordingClient) -> None:
            client.ack_failures.append(SessionRotated("a newer registration exists"))
            client.left_out.add(dropped)

        async with running_agent(world, tmp_path, capacity=1, prepare=prepare) as agent:
            await until(lambda: dropped not in agent.journal.entries and agent._session_ok.is_set())
            after = world.submit()
            ended = await world.wait_state(after, *TERMINAL)

    assert ended == "succeeded"


class Noted:
    """A handler that notes each attempt it was started for."""

    resumable = True

    def __init__(self) -> None:
        self.started: list[int] = []

    async def run(self, context: JobContext) -> HandlerResult:
        self.started.append(context.attempt)
        return HandlerResult("succeeded")


def idle_agent(tmp_path: Path, handler: Noted) -> Agent:
    """An agent that never connects, its session a fixed one with a 40 s lease."""
    client = PlatformClient("http://127.0.0.1:9", "ep_idle", Ed25519PrivateKey.generate())
    client.session = SessionInfo("ses_idle", b"k" * 32, 1, 10.0, 50.0, 30.0, 40.0)
    config = RunConfig("http://127.0.0.1:9", tmp_path, 1)
    identity = Identity("ep_idle", Ed25519PrivateKey.generate())
    return Agent(config, identity, Journal.open(tmp_path), {"noted": handler}, client=client)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "renewed",
    ["lapsing", "another attempt's"],
)
async def test_a_handler_never_starts_on_a_lease_that_may_lapse_before_its_first_renewal(
    tmp_path: Path, renewed: str
) -> None:
    """Its lease about to lapse (a slow ack or cancel poll before it), or renewed only for
    another attempt of the same job: the handler does not start; Run self-fences at once."""
    handler = Noted()
    agent = idle_agent(tmp_path, handler)
    entry = Assignment("job_1", 2, "mrl_x", "noted", {}, "srv", "running")
    await agent.journal.put(entry)
    agent._cancel_known[("job_1", 2)] = False  # the ack said: no cancel
    if renewed == "lapsing":
        # less than a tick (lease/4) plus the margin (lease/8) is left: it may lapse first
        agent._renewed_until[("job_1", 2)] = time.monotonic() + 40.0 * 3 / 8 - 0.01
    else:
        agent._renewed_until[("job_1", 1)] = time.monotonic() + 40.0
    result = await agent._execute(entry, resumed=False)
    await agent.journal.close()

    assert (result, handler.started, entry.state) == (None, [], "self_fenced")


# -- answers in a foreign shape ------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_claim_answered_in_a_foreign_shape_is_tried_again_and_nothing_is_journaled(
    tmp_path: Path,
) -> None:
    """The platform grants a job without its attempt, lease or kind (another version, a proxy
    that rewrote it): Run takes it as no answer and claims again a little later; the jobs loop
    never fails on a missing key, and nothing of the foreign grant reaches the journal."""
    claims: list[str] = []

    def foreign_claims(client: RecordingClient) -> None:
        send = client._send

        async def sending(channel: str, method: str, path: str, body: bytes, **options: Any) -> Any:
            if path == "/run/v1/jobs/claim":
                claims.append(path)
                return {"jobs": [{"job_id": "job_foreign"}]}
            return await send(channel, method, path, body, **options)

        client._send = sending  # type: ignore[method-assign]

    async with (
        served_platform(tmp_path) as world,
        running_agent(world, tmp_path, capacity=1, prepare=foreign_claims) as agent,
    ):
        await until(lambda: len(claims) >= 3)
        journaled = dict(agent.journal.entries)

    assert journaled == {}


# -- long-poll claims ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_idle_run_starts_a_new_job_from_its_waiting_claim(tmp_path: Path) -> None:
    """With nothing to do, Run's claim waits at the platform (wait_s), and that very claim
    gets the job created meanwhile: no poll interval (an hour here) passes first."""
    async with served_platform(tmp_path) as world, running_agent(world, tmp_path, capacity=4):
        await until(lambda: world.platform.watch.waiting == 1)
        job_id = world.submit()
        ended = await world.wait_state(job_id, *TERMINAL)

    expected = [
        ("claim sent", RunConfig(world.url, tmp_path, 1).claim_wait_s),
        ("job created", job_id),
        ("claim answered", [job_id]),
    ]
    assert expected == events(world.timeline, "claim sent", "claim answered", "job created")[:3]
    succeeded = "succeeded"
    assert succeeded == ended


@pytest.mark.anyio
async def test_the_cancel_watch_is_given_up_when_the_last_handler_ends(tmp_path: Path) -> None:
    """While a handler runs, Run keeps a cancel watch waiting beside its claim; once no handler
    has run for a moment (WATCH_IDLE_S), the watch is abandoned rather than left to the end of
    its wait (a connection and a place among the platform's waiting claims for up to a
    minute)."""
    async with served_platform(tmp_path) as world:
        gate = asyncio.Event()
        job_id = world.submit("gated", {})
        handlers = {**load_handlers(), "gated": Gated(gate)}
        async with running_agent(world, tmp_path, capacity=2, handlers=handlers):
            await world.wait_state(job_id, "running")
            await until(lambda: world.platform.watch.waiting == 2)  # its claim, its watch
            gate.set()
            await world.wait_state(job_id, *TERMINAL)
            await until(lambda: world.platform.watch.waiting == 1)  # its claim alone


@pytest.mark.anyio
async def test_an_acked_attempt_learns_its_cancel_intent_from_the_ack(tmp_path: Path) -> None:
    """The ack answer says whether a cancel was requested: Run starts the handler without a
    cancel poll, and a job cancelled before its ack ends cancelled from that answer alone."""
    async with served_platform(tmp_path) as world:
        plain = world.submit()
        doomed = world.submit("sleep", {"seconds": 30})
        claimed = world.platform.service.claim_now  # the cancel lands between claim and ack

        def claim_then_cancel(session_id: str, max_jobs: int) -> Any:
            outcome = claimed(session_id, max_jobs)
            if any(job.job_id == doomed for job in outcome.jobs):
                world.platform.service.cancel_job(world.admin, doomed)
            return outcome

        world.platform.service.claim_now = claim_then_cancel  # type: ignore[method-assign]
        async with running_agent(world, tmp_path, capacity=4):
            ended = [await world.wait_state(job_id, *TERMINAL) for job_id in (plain, doomed)]

    assert (ended, events(world.timeline, "cancel poll sent")) == (["succeeded", "cancelled"], [])


@pytest.mark.anyio
async def test_a_full_run_claims_the_slot_a_result_frees_with_that_result(tmp_path: Path) -> None:
    """A Run at capacity sends no claim; the slot its job frees is claimed with the job's
    result (docs/protocol.md, "Claims with results"), and that claim gets the job created
    meanwhile."""
    gate = tmp_path / "gate"
    wait_for_gate = ["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.01; done']
    async with served_platform(tmp_path) as world:
        first = world.submit("command", {"argv": wait_for_gate})
        async with running_agent(world, tmp_path, capacity=1):
            await world.wait_state(first, "running")
            second = world.submit()
            gate.touch()
            ended = await world.wait_state(second, *TERMINAL)

    expected = [
        ("claim sent", RunConfig(world.url, tmp_path, 1).claim_wait_s),
        ("claim answered", [first]),
        ("job created", second),
        ("results sent, claiming", 1),
        ("claim answered", [second]),
    ]
    seen = events(
        world.timeline, "claim sent", "claim answered", "job created", "results sent, claiming"
    )
    assert expected == seen[1:6]
    succeeded = "succeeded"
    assert succeeded == ended


# -- batched acks ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_acks_of_jobs_claimed_together_travel_in_one_request(tmp_path: Path) -> None:
    """Three jobs granted by one claim are acked by one request of three entries."""
    async with served_platform(tmp_path) as world:
        job_ids = sorted(world.submit() for _ in range(3))
        async with running_agent(world, tmp_path, capacity=3):
            ended = [await world.wait_state(job_id, *TERMINAL) for job_id in job_ids]

    one_request = [("acks sent", job_ids)]
    assert one_request == events(world.timeline, "acks sent")
    all_succeeded = ["succeeded"] * 3
    assert all_succeeded == ended


@pytest.mark.anyio
async def test_one_refused_ack_leaves_the_others_in_its_request_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry the platform refuses (a wrong lease: lease_mismatch) ends that attempt in Run;
    the other two entries of the same request are accepted and their jobs succeed."""
    caplog.set_level(logging.INFO, logger="moonrun.run")
    async with served_platform(tmp_path) as world:
        job_ids = sorted(world.submit() for _ in range(3))
        refused = job_ids[1]
        async with running_agent(
            world, tmp_path, 3, lambda client: client.spoiled.add(refused)
        ) as agent:
            ended = [await world.wait_state(job_ids[n], *TERMINAL) for n in (0, 2)]
            await until(lambda: not agent.journal.entries)

    refusals = [
        (record.fields["job_id"], record.fields["code"])  # type: ignore[attr-defined]
        for record in caplog.records
        if record.getMessage() == "ack refused"
    ]
    one_request = [("acks sent", job_ids)]
    one_refusal = [("acks answered", ["LeaseMismatch"])]
    assert one_request == events(world.timeline, "acks sent")
    assert one_refusal == events(world.timeline, "acks answered")
    forgotten_by_run = [(refused, "lease_mismatch")]
    assert forgotten_by_run == refusals
    others_succeeded = (["succeeded", "succeeded"], "accepted")
    assert others_succeeded == (ended, world.state(refused))


@pytest.mark.anyio
async def test_a_whole_ack_request_that_failed_is_retried_by_each_supervisor(
    tmp_path: Path,
) -> None:
    """No answer to the request at all: every attempt in it is acked again, and succeeds."""
    async with served_platform(tmp_path) as world:
        job_ids = sorted(world.submit() for _ in range(3))
        failure = Unreachable("jobs: connection reset")
        async with running_agent(
            world, tmp_path, 3, lambda client: client.ack_failures.append(failure)
        ):
            ended = [await world.wait_state(job_id, *TERMINAL) for job_id in job_ids]

    batches = [job_ids for _, job_ids in events(world.timeline, "acks sent")]
    assert job_ids == batches[0]
    assert job_ids == sorted(job_id for batch in batches[1:] for job_id in batch)
    all_succeeded = ["succeeded"] * 3
    assert all_succeeded == ended


@pytest.mark.anyio
async def test_a_session_error_on_a_whole_ack_request_renews_the_session_once(
    tmp_path: Path,
) -> None:
    """Every supervisor in the request sees the session error; Run registers again only once,
    and each attempt, confirmed by the reconciliation, is acked under the new session."""
    async with served_platform(tmp_path) as world:
        job_ids = sorted(world.submit() for _ in range(3))
        rotated = SessionRotated("a newer registration exists")
        async with running_agent(
            world, tmp_path, 3, lambda client: client.ack_failures.append(rotated)
        ):
            ended = [await world.wait_state(job_id, *TERMINAL) for job_id in job_ids]
            endpoint = world.store.get_endpoint(world.identity.endpoint_id)

    assert endpoint is not None
    registered_once_more = (2, ["succeeded"] * 3)
    assert registered_once_more == (endpoint.generation, ended)


@pytest.mark.anyio
async def test_a_waiting_claim_whose_run_went_away_grants_nothing(tmp_path: Path) -> None:
    """A long poll whose connection closes stops waiting, and a job created afterwards stays
    queued for the next Run instead of going to a connection nobody reads."""
    async with served_platform(tmp_path) as world:
        client = PlatformClient(world.url, world.identity.endpoint_id, world.identity.key)
        async with client:
            session = await client.register("boot-gone", 4)
            await client.reconcile([])
            body = b'{"max_jobs": 1, "wait_s": 30}'
            headers = signing.sign(
                "POST",
                "/run/v1/jobs/claim",
                "",
                body,
                key_id=f"session:{session.session_id}",
                key=session.key,
                created=int(SystemClock().now() / 1000),
                nonce=signing.b64url(b"gone-nonce-0123456789"),
            )
            head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            host, port = world.url.removeprefix("http://").split(":")
            _, writer = await asyncio.open_connection(host, int(port))
            request = (
                f"POST /run/v1/jobs/claim HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{head}\r\n"
            )
            writer.write(request.encode() + body)
            await writer.drain()
            async with asyncio.timeout(HANG_GUARD_S):
                while world.platform.watch.waiting == 0:
                    await asyncio.sleep(0.005)
                writer.close()
                await writer.wait_closed()
                while world.platform.watch.waiting:
                    await asyncio.sleep(0.005)
            job_id = world.submit()
            assert world.state(job_id) == "queued"
