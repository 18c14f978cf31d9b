"""Channel independence, in-process: with the artifact store or the log store made to block,
heartbeat, claim, ack, progress, cancel-poll, result and reconcile all still complete.

The app is served on one event loop (httpx's ASGITransport), as uvicorn would serve it, so a
route that blocked the loop, or a channel that shared threads or limits with another, would
stall the lifecycle requests below. Blocked writes wait on a `threading.Event` the test opens;
every wait is bounded by HANG_GUARD_S only so that a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread
import httpx2 as httpx
import pytest

from moonrun.artifacts.file import FileArtifactStore
from moonrun.http.channels import Channel
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLine, LogPage
from tests.support.http_harness import Cast, SignedRun, http_world
from tests.support.stores import StoreFactory, file_factory, memory_factory

HANG_GUARD_S = 10.0
"""Only a guard against hanging forever; nothing below asserts how long anything took."""

Transfer = Literal["logs", "artifacts"]


class Gate:
    """Holds every caller until opened, and counts the callers that reached it."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._arrived = threading.Semaphore(0)
        self.overran = False
        """True if a caller gave up waiting: the test never opened the gate in time."""

    def pass_through(self) -> None:
        self._arrived.release()
        if not self._open.wait(HANG_GUARD_S):
            self.overran = True

    def open(self) -> None:
        self._open.set()

    def await_arrivals(self, count: int) -> bool:
        """Block until `count` callers reached the gate (False if they did not, in time)."""
        return all(self._arrived.acquire(timeout=HANG_GUARD_S) for _ in range(count))


class BlockingLogStore:
    """A MemoryLogStore whose appends wait at a gate; reads never wait."""

    on_threads = False

    def __init__(self) -> None:
        self.gate = Gate()
        self._inner = MemoryLogStore()

    def append(
        self, job_id: str, attempt: int, seq: int, lines: list[LogLine], *, final: bool = False
    ) -> int:
        self.gate.pass_through()
        return self._inner.append(job_id, attempt, seq, lines, final=final)

    def complete(self, job_id: str, attempt: int) -> bool:
        return self._inner.complete(job_id, attempt)

    def read(self, job_id: str, attempt: int, after_seq: int, limit: int = 1000) -> LogPage:
        return self._inner.read(job_id, attempt, after_seq, limit)

    def tail(self, job_id: str, attempt: int, count: int, after_seq: int = -1) -> LogPage:
        return self._inner.tail(job_id, attempt, count, after_seq)

    def attempts(self, job_id: str) -> list[int]:
        return self._inner.attempts(job_id)


class BlockingArtifactStore:
    """A FileArtifactStore whose chunk writes wait at a gate."""

    def __init__(self, root: Path) -> None:
        self.gate = Gate()
        self.root = root
        self._inner = FileArtifactStore(root)

    def put_chunk(
        self, job_id: str, attempt: int, name: str, index: int, data: bytes, final: bool
    ) -> None:
        self.gate.pass_through()
        self._inner.put_chunk(job_id, attempt, name, index, data, final)


@pytest.fixture(params=["memory", "file"])
def factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> StoreFactory:
    if request.param == "memory":
        return memory_factory()
    return file_factory(lambda: tmp_path_factory.mktemp("store"))


@dataclass
class Blocking:
    cast: Cast
    logs: BlockingLogStore
    artifacts: BlockingArtifactStore

    def gate(self, transfer: Transfer) -> Gate:
        return self.logs.gate if transfer == "logs" else self.artifacts.gate


@pytest.fixture
def blocking(factory: StoreFactory, tmp_path: Path) -> Iterator[Blocking]:
    logs, artifacts = BlockingLogStore(), BlockingArtifactStore(tmp_path / "artifacts")
    with http_world(factory, tmp_path, logs=logs, artifacts=artifacts) as cast:
        yield Blocking(cast, logs, artifacts)
    # However a test ended, let no request thread wait at a gate past it.
    logs.gate.open()
    artifacts.gate.open()


@dataclass
class Wire:
    """Run and a user over one AsyncClient, i.e. concurrent requests on the app's own loop."""

    run: SignedRun
    client: httpx.AsyncClient

    async def post(self, path: str, body: Any) -> httpx.Response:
        data = json.dumps(body).encode()
        headers = self.run.signed_headers("POST", path, data)
        return await self.client.post(path, content=data, headers=headers)

    async def job_message(
        self, job_id: str, message: str, attempt: int, **fields: Any
    ) -> httpx.Response:
        body = {**self.run.evidence(job_id, attempt), **fields}
        return await self.post(f"/run/v1/jobs/{job_id}/{message}", body)

    async def upload(self, transfer: Transfer, job_id: str, attempt: int, n: int) -> httpx.Response:
        """Log batch `n`, or artifact chunk `n`, of the attempt."""
        if transfer == "logs":
            line = {"ts": "2026-11-30T00:00:00.000Z", "stream": "stdout", "text": f"line {n}"}
            body = {"job_id": job_id, **self.run.evidence(job_id, attempt), "seq": n}
            return await self.post("/run/v1/logs", {**body, "lines": [line]})
        path = f"/run/v1/artifacts/{job_id}/{attempt}/out.bin/{n}"
        data = f"chunk {n}".encode()
        headers = self.run.signed_headers("PUT", path, data)
        headers["Content-Type"] = "application/octet-stream"
        headers["Run-Lease"] = self.run.leases[(job_id, attempt)]
        return await self.client.put(path, content=data, headers=headers)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert status == response.status_code, response.text
    return response.json()


def check_lifecycle_while_blocked(blocking: Blocking, blocked: Transfer) -> None:
    """Fill the `blocked` channel with uploads stuck in storage; the control and jobs channels,
    the user API and the other transfer channel still answer; the stuck uploads then finish."""
    cast = blocking.cast
    world, run = cast.world, cast.run.start(capacity=4)
    uploading = world.submit(cast.server_id, cast.owner[1])["id"]
    waiting = world.submit(cast.server_id, cast.owner[1])["id"]
    attempt = run.run_to_running(uploading)
    free: Transfer = "artifacts" if blocked == "logs" else "logs"
    gate = blocking.gate(blocked)
    blocking.gate(free).open()
    channel = getattr(world.platform.channels, blocked)
    stuck: dict[int, httpx.Response] = {}

    async def lifecycle(wire: Wire) -> None:
        ok(await wire.post("/run/v1/heartbeat", {}))
        report = ok(
            await wire.post("/run/v1/reconcile", {"entries": [run.entry(uploading, attempt)]})
        )
        assert [(uploading, "running")] == [(c["job_id"], c["state"]) for c in report["confirmed"]]
        (granted,) = ok(await wire.post("/run/v1/jobs/claim", {"max_jobs": 1}))["jobs"]
        assert (waiting, 1) == (granted["job_id"], granted["attempt"])
        run.leases[(waiting, 1)] = granted["lease"]
        assert ok(await wire.job_message(waiting, "ack", 1))["state"] == "running"
        ok(await wire.job_message(waiting, "progress", 1, seq=1, percent=10))
        cancel = await wire.client.post(
            f"/api/v1/jobs/{waiting}/cancel", headers={"Authorization": f"Bearer {cast.owner[1]}"}
        )
        assert ok(cancel, 202)["cancel"]["requested"] is True
        assert ok(await wire.job_message(waiting, "cancel-poll", 1))["cancel_requested"] is True
        outcome = {"outcome": "cancelled", "retryable": False}
        assert ok(await wire.job_message(waiting, "result", 1, **outcome))["state"] == "cancelled"
        ok(await wire.job_message(uploading, "progress", attempt, seq=1, percent=50))

        busy = await wire.upload(blocked, uploading, attempt, channel.limit)
        assert (
            busy.status_code,
            busy.json()["error"]["code"],
            busy.headers["Retry-After"],
        ) == (429, "channel_busy", "1")
        ok(await wire.upload(free, uploading, attempt, 0), 202)
        outcome = {"outcome": "succeeded", "retryable": False}
        done = ok(await wire.job_message(uploading, "result", attempt, **outcome))
        assert done["state"] == "succeeded"

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=world.app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://testserver") as client,
            anyio.create_task_group() as uploads,
        ):
            wire = Wire(run, client)

            async def upload(n: int) -> None:
                stuck[n] = await wire.upload(blocked, uploading, attempt, n)

            for n in range(channel.limit):
                uploads.start_soon(upload, n)
            try:
                arrived = await anyio.to_thread.run_sync(gate.await_arrivals, channel.limit)
                assert arrived, f"uploads answered instead of blocking: {stuck}"
                assert channel.limit == channel.in_flight
                with anyio.fail_after(HANG_GUARD_S):
                    await lifecycle(wire)
                assert channel.limit == channel.in_flight
                assert stuck == {}
            finally:
                gate.open()

    anyio.run(scenario)

    assert gate.overran is False
    assert [202] * channel.limit == [stuck[n].status_code for n in range(channel.limit)]
    assert channel.in_flight == 0
    if blocked == "logs":
        logs = ok(world.api("GET", f"/api/v1/jobs/{uploading}/logs", token=cast.owner[1]))
        assert {f"line {n}" for n in range(channel.limit)} == {
            line["text"] for line in logs["lines"]
        }
    else:
        stored = blocking.artifacts.root / uploading / str(attempt) / "out.bin"
        assert [f"{n:06d}.chunk" for n in range(channel.limit)] == sorted(
            path.name for path in stored.glob("*.chunk")
        )


def test_artifact_transfer_blocks(blocking: Blocking) -> None:
    """With every artifact upload stuck in storage, control and job traffic still complete."""
    check_lifecycle_while_blocked(blocking, "artifacts")


def test_log_ingest_blocks(blocking: Blocking) -> None:
    """With every log upload stuck in storage, control and job traffic still complete."""
    check_lifecycle_while_blocked(blocking, "logs")


def test_work_that_raises_stop_iteration_on_a_channel_thread_still_answers() -> None:
    """A future refuses StopIteration; the channel hands it on as a RuntimeError instead of
    leaving its request waiting forever."""
    channel = Channel("jobs", 1)

    def exhausted() -> None:
        next(iter(()))

    async def call() -> str:
        try:
            await channel.run(exhausted)
        except RuntimeError as error:
            return type(error.__cause__ or error).__name__
        return "answered"

    try:
        assert anyio.run(call) == "RuntimeError"
    finally:
        channel.close()


def test_a_heartbeat_that_finds_the_control_channel_full_is_answered_once_a_place_frees(
    tmp_path: Path,
) -> None:
    """The control channel's places all held (a store stall, say): a Run's heartbeat waits in
    the channel's line instead of being refused 429, and is answered once a place frees."""
    with http_world(memory_factory(), tmp_path) as cast:
        run, channel = cast.run.start(), cast.world.platform.channels.control

        async def scenario() -> tuple[bool, int]:
            transport = httpx.ASGITransport(app=cast.world.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                held = [channel.admit() for _ in range(channel.limit)]
                for admission in held:
                    admission.enter()
                async with anyio.create_task_group() as tasks:
                    answers: list[httpx.Response] = []

                    async def heartbeat() -> None:
                        answers.append(await Wire(run, client).post("/run/v1/heartbeat", {}))

                    tasks.start_soon(heartbeat)
                    with anyio.fail_after(HANG_GUARD_S):
                        while not channel.waiting:
                            await anyio.sleep(0.001)
                    in_line = answers == []
                    held[0].leave()
                (answer,) = answers
                for admission in held[1:]:
                    admission.leave()
                return in_line, answer.status_code

        assert anyio.run(scenario) == (True, 200)
        assert (channel.in_flight, len(channel.waiting)) == (0, 0)
