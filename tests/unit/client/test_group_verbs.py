"""Fan-out groups from a terminal and from Python (docs/cli.md): `job submit --selector`,
`--follow` with a line per server and its exit status, `group show|wait|cancel`, `job list
--group`, and `Client.fanout`, `group`, `wait_group`, `cancel_group`. The CLI runs in-process
against a platform served on loopback; a signed Run stands in for the hosts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.client.library import Client
from moonrun.errors import NoMatch
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, Cast, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        with Client(served.url, ADMIN_TOKEN) as admin:
            admin.create_server("web-2", cast.other_run.endpoint_id, cast.owner[0], {"role": "web"})
            admin.set_server_labels(cast.server_id, {"role": "web"})
        yield Terminal(cast, served.url, tmp_path)


def run_everything(cast: Cast, group_id: str, failing: str | None = None) -> None:
    """Both hosts' Runs claim and finish the group's jobs (`failing`'s server's fails) until
    every one ended: a job released by another's end is claimed in a later round, and a
    refused ack or result fails here rather than leave a `--follow` waiting for ever."""
    runs = (cast.run.start(), cast.other_run.start())
    for _ in range(20):
        counts = cast.world.store.group_counts(group_id)
        if counts and all(state.is_terminal for state, n in counts.items() if n):
            return
        for run in runs:
            for grant in run.claim(8):
                job_id, attempt = grant["job_id"], grant["attempt"]
                assert run.ack(job_id, attempt).status_code == 200
                failed = cast.world.stored(job_id).server_id == failing
                outcome = "failed" if failed else "succeeded"
                assert run.result(job_id, attempt, outcome).status_code == 200
        time.sleep(0.05)  # whatever the served app does between two answers, it has done
    raise AssertionError(f"group {group_id} did not end: {counts}")


def test_submit_with_a_selector_follows_a_line_per_server_and_exits_3_if_one_failed(
    terminal: Terminal,
) -> None:
    key = "--idempotency-key=rollout-1"
    made = terminal("job", "submit", "--selector", "role=web", "noop", key, "--max-parallel", "2")
    assert made.exit_code == 0, made.output
    assert made.output.startswith("group grp_")
    run_everything(terminal.cast, made.output.split()[1].rstrip(":"), terminal.cast.server_id)
    # The same key answers the same group, now ended: a line per server, then the counts.
    again = ("job", "submit", "--selector", "role=web", "noop", key, "--max-parallel", "2")
    followed = terminal(*again, "--follow")
    assert followed.exit_code == 3, followed.output
    lines = followed.stdout.splitlines()
    assert lines[0].startswith("web-1  job_")
    assert lines[0].endswith("failed")
    assert lines[1].startswith("web-2  job_")
    assert lines[1].endswith("succeeded")
    assert lines[2].endswith("1 succeeded, 1 failed")


def test_submit_with_a_selector_and_a_command_runs_it_everywhere_and_says_json(
    terminal: Terminal,
) -> None:
    made = terminal("job", "submit", "--selector", "role=web", "--json", "--", "uptime")
    assert made.exit_code == 0, made.output
    answer = json.loads(made.output)
    assert answer["group"]["job_count"] == 2
    assert {job["kind"] for job in answer["jobs"]} == {"command"}
    assert terminal("job", "submit", "--selector", "role=db", "noop").exit_code == 1
    both = terminal("job", "submit", terminal.cast.server_id, "noop", "--selector", "role=web")
    assert both.exit_code != 0


def test_group_show_wait_cancel_and_job_list_by_group(terminal: Terminal) -> None:
    made = json.loads(terminal("job", "submit", "--selector", "role=web", "noop", "--json").output)
    group_id = made["group"]["id"]
    shown = terminal("group", "show", group_id)
    assert "2 queued" in shown.output
    listed = json.loads(terminal("job", "list", "--group", group_id, "--json").output)
    assert sorted(job["id"] for job in listed) == sorted(job["id"] for job in made["jobs"])
    timed_out = terminal("group", "wait", group_id, "--timeout", "0")
    assert timed_out.exit_code == 5
    cancelled = json.loads(terminal("group", "cancel", group_id, "--json").output)
    assert cancelled["counts"]["cancelled"] == 2
    assert terminal("group", "wait", group_id).exit_code == 4
    assert terminal("group", "show", group_id, token=terminal.cast.stranger[1]).exit_code == 1


def test_the_python_client_fans_out_reads_waits_and_cancels_groups(terminal: Terminal) -> None:
    with terminal.client() as owner:
        made = owner.fanout("role=web", "noop", {"n": 1}, max_parallel=1, stop_on_failure=True)
        assert made.group.max_parallel == 1
        assert made.group.stop_on_failure
        assert len(made.jobs) == 2
        assert owner.group(made.group.id).counts["queued"] == 2
        run_everything(terminal.cast, made.group.id)  # the held one once the first ended
        ended = owner.wait_group(made.group.id, timeout_s=5)
        assert (ended.done, ended.counts["succeeded"]) == (True, 2)
        assert len(list(owner.jobs(group=made.group.id))) == 2
        assert owner.cancel_group(made.group.id).counts["succeeded"] == 2
        with pytest.raises(NoMatch):
            owner.fanout("role=nothing", "noop")


def test_a_server_id_beside_a_selector_is_a_usage_error_saying_so(terminal: Terminal) -> None:
    for args in (
        ("job", "submit", terminal.cast.server_id, "--selector", "role=web", "--", "echo", "hi"),
        ("job", "submit", "--selector", "role=web", terminal.cast.server_id),
    ):
        done = terminal(*args)

        assert done.exit_code == 2, done.output
        assert "give a SERVER or --selector, not both" in done.output
