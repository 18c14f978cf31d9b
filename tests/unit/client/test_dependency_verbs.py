"""Dependencies from a terminal and from Python (docs/cli.md, "job submit"): `job submit
--after JOB_ID` (repeatable) and `--after-group`, `job show`'s `waiting_for` line, and
`Client.submit(after=, after_group=)` with `Job.waiting_for`. The CLI runs in-process against a
platform served on loopback; a signed Run stands in for the host."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.client.library import Client
from moonrun.errors import InvalidRequest
from tests.support.console_kit import serve
from tests.support.http_harness import http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def test_job_submit_after_waits_on_each_job_named_and_job_show_says_so(
    terminal: Terminal,
) -> None:
    server = terminal.cast.server_id
    first = json.loads(terminal("job", "submit", server, "noop", "--json").stdout)["id"]
    second = json.loads(terminal("job", "submit", server, "noop", "--json").stdout)["id"]
    made = terminal("job", "submit", server, "noop", "--after", first, "--after", second, "--json")
    assert made.exit_code == 0, made.output
    waiting = json.loads(made.stdout)
    assert waiting["waiting_for"] == {"jobs": [first, second], "group": None}
    shown = terminal("job", "show", waiting["id"])
    assert shown.exit_code == 0, shown.output
    assert f"waiting_for       {first}, {second}" in shown.stdout
    refused = terminal("job", "submit", server, "noop", "--after", "job_nosuchjob")
    assert refused.exit_code == 1
    assert "after[0]: no such job" in refused.output
    bad = terminal("job", "submit", "--selector", "role=web", "noop", "--after", first)
    assert bad.exit_code == 2


def test_the_python_client_submits_after_jobs_and_a_group(terminal: Terminal) -> None:
    cast = terminal.cast
    with Client(terminal.url, cast.owner[1]) as owner:
        first = owner.submit(cast.server_id, "noop")
        waiting = owner.submit(cast.server_id, "noop", after=[first.id])
        assert waiting.waiting_for == {"jobs": [first.id], "group": None}
        run = cast.run.start()
        attempt = run.run_to_running(first.id)
        run.result(first.id, attempt)
        assert owner.job(waiting.id).waiting_for is None
        with pytest.raises(InvalidRequest):
            owner.submit(cast.server_id, "noop", after_group="grp_nosuchgroup")
