"""A short job's logs are all there once `wait(logs=True)` returns, with a real platform and a
real Run (issue 28, point 4): Run's last batch of the attempt says it is the last, the job view
says `logs_complete`, and following a finished job's logs returns without a pause; a job that
printed nothing has its logs complete with its result, no log batch sent."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from moonrun.client import Client
from tests.support.e2e import Cluster, Server, cluster
from tests.support.launcher import ADMIN_TOKEN

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Server]]:
    with cluster(tmp_path_factory.mktemp("logs-complete")) as cl:
        run = cl.add_run()
        yield cl, cl.create_server("web-1", run.endpoint_id)


def test_wait_for_logs_then_logs_gives_every_line_of_a_short_job(
    shared: tuple[Cluster, Server],
) -> None:
    cl, server = shared
    pauses: list[float] = []
    with cl.explained(), Client(cl.platform.url, ADMIN_TOKEN, sleep=pauses.append) as client:
        script = "for n in 1 2 3; do echo line $n; done; echo to stderr >&2"
        job = client.submit(server.id, "command", {"argv": ["sh", "-c", script]})
        ended = client.wait(job.id, timeout_s=60, logs=True)
        lines = [line.text for line in client.logs(job.id)]
        followed = [line.text for line in client.logs(job.id, follow=True)]
    assert (ended.state, ended.logs_complete) == ("succeeded", True)
    assert sorted(lines) == ["line 1", "line 2", "line 3", "to stderr"]
    assert (followed, pauses) == (lines, [])


def log_batches(cl: Cluster) -> float:
    """Log batches the platform has answered so far (its metrics)."""
    assert cl.platform.client is not None
    metrics = cl.platform.client.get("/metrics").text
    found = re.search(r'^moonrun_request_seconds_count{channel="logs"} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_job_that_printed_nothing_has_its_logs_complete_without_a_log_batch(
    shared: tuple[Cluster, Server],
) -> None:
    """Its Run says so with the result (docs/protocol.md, "Silent attempts")."""
    cl, server = shared
    with cl.explained(), Client(cl.platform.url, ADMIN_TOKEN) as client:
        before = log_batches(cl)
        job = client.submit(server.id, "noop", {})
        ended = client.wait(job.id, timeout_s=60, logs=True)
        lines = list(client.logs(job.id))
        after = log_batches(cl)
    assert (ended.state, ended.logs_complete, lines) == ("succeeded", True, [])
    assert after == before
