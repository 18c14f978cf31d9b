"""Following a job rides through a platform that stops answering (a restart, a deploy) for up
to the client's outage grace, and resumes where it was (docs/cli.md, "Exit codes"): with
`Client` and with `AsyncClient` alike."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from moonrun.client.library import Unreachable
from tests.support.both_clients import FLAVOURS, Flavour, connect
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

LINE_TS = "2026-12-03T12:00:00.000Z"


class Restartable:
    """The platform's app served by uvicorn on one port of 127.0.0.1, stopped and served again
    on the same port: what a client sees of a platform restart."""

    def __init__(self, cast: Cast) -> None:
        self.cast = cast
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        config = uvicorn.Config(
            self.cast.world.app, lifespan="on", ws="none", log_config=None, access_log=False
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped while starting"
            time.sleep(0.01)
        self._server, self._thread = server, thread

    def stop(self) -> None:
        assert self._server is not None
        assert self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Restartable]:
    with http_world(memory_factory(), tmp_path) as cast:
        platform = Restartable(cast)
        platform.start()
        try:
            yield platform
        finally:
            platform.stop()


# The clients below retry a request once (about 0.2 s): far less than the outage, so only the
# outage grace can carry them through it.


@contextmanager
def down_for(platform: Restartable, seconds: float) -> Iterator[None]:
    """The platform stops now and serves again `seconds` later, on a thread."""
    platform.stop()
    again = threading.Timer(seconds, platform.start)
    again.start()
    try:
        yield
    finally:
        again.join()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_wait_rides_through_a_platform_restart_and_returns_the_jobs_outcome(
    served: Restartable, flavour: Flavour
) -> None:
    cast = served.cast
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    run = cast.run.start()
    client = connect(flavour, served.url, cast.owner[1], retries=1, outage_grace_s=30)
    with client, down_for(served, 1.5):
        attempt = run.run_to_running(job_id)  # in-process: the job goes on while it is down
        assert run.result(job_id, attempt, "succeeded").status_code == 200
        ended = client.wait(job_id)
    assert ended.state == "succeeded"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_followed_log_resumes_after_its_last_line_once_the_platform_is_back(
    served: Restartable, flavour: Flavour
) -> None:
    cast = served.cast
    job_id = cast.world.submit(cast.server_id, cast.owner[1])["id"]
    run = cast.run.start()
    attempt = run.run_to_running(job_id)

    def send(seq: int, *texts: str, final: bool = False) -> None:
        lines = [{"ts": LINE_TS, "stream": "stdout", "text": text} for text in texts]
        body = {**run.evidence(job_id, attempt), "job_id": job_id, "seq": seq, "lines": lines}
        assert run.post("/run/v1/logs", {**body, "final": final}).status_code == 202

    send(1, "one", "two")
    seen: list[str] = []
    with connect(flavour, served.url, cast.owner[1], retries=1, outage_grace_s=30) as client:
        followed = client.logs(job_id, follow=True, settle_s=0.2)
        seen += [next(followed).text, next(followed).text]
        with down_for(served, 1.5):
            send(2, "three", "four", final=True)  # the attempt's last: it is ending
            assert run.result(job_id, attempt, "succeeded").status_code == 200
            seen += [line.text for line in followed]
    assert seen == ["one", "two", "three", "four"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_past_the_outage_grace_following_gives_up_as_unreachable(flavour: Flavour) -> None:
    now = [0.0]

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def sleep(seconds: float) -> None:
        now[0] += seconds

    client = connect(
        flavour,
        "http://127.0.0.1:9",
        "token",
        retries=0,
        transport=httpx.MockTransport(refuse),
        sleep=sleep,
        clock=lambda: now[0],
        outage_grace_s=20,
    )
    with client, pytest.raises(Unreachable):
        client.wait("job_1")
    assert 20 <= now[0] < 26  # kept trying for the grace, then gave up
