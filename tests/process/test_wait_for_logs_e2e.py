"""A short job's logs are all there once `wait(logs=True)` returns, with a real platform and a
real Run (issue 28, point 4): Run's last batch of the attempt says it is the last, the job view
says `logs_complete`, and following a finished job's logs returns without a pause."""

from __future__ import annotations

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
