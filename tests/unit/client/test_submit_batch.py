"""`moonrun job submit SERVER --batch FILE` queues the jobs of a JSON-lines file through the batch
route (each line one create's body; more than 1,000 go as several batches), and
`Client.submit_batch` does so from Python; a line that is not a JSON object is bad usage (exit
2) naming its number, and nothing is queued (docs/cli.md)."""

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


def jobs_of(terminal: Terminal) -> list[dict[str, object]]:
    with Client(terminal.url, terminal.cast.owner[1]) as client:
        return [job.data for job in client.jobs()]


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def test_a_json_lines_file_is_queued_in_order_through_the_batch_route(
    terminal: Terminal, tmp_path: Path
) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        '{"kind": "noop"}\n\n{"kind": "noop", "priority": 9}\n{"kind": "noop", "max_attempts": 1}\n'
    )
    made = terminal("job", "submit", terminal.cast.server_id, "--batch", str(lines), "--json")
    assert made.exit_code == 0, made.output
    jobs = json.loads(made.stdout)
    assert [(job["priority"], job["max_attempts"]) for job in jobs] == [(5, 3), (9, 3), (5, 1)]
    table = terminal(
        "job", "submit", terminal.cast.server_id, "--batch", "-", stdin='{"kind": "noop"}\n'
    )
    assert table.exit_code == 0, table.output
    assert "queued" in table.stdout


def test_a_line_that_is_not_a_json_object_is_bad_usage_and_queues_nothing(
    terminal: Terminal, tmp_path: Path
) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"kind": "noop"}\n[1, 2]\n')
    refused = terminal("job", "submit", terminal.cast.server_id, "--batch", str(lines))
    assert refused.exit_code == 2, refused.output
    assert "line 2" in refused.output
    assert jobs_of(terminal) == []
    both = terminal("job", "submit", terminal.cast.server_id, "noop", "--batch", str(lines))
    assert both.exit_code == 2, both.output


def test_the_python_client_submits_a_batch_all_or_none(terminal: Terminal) -> None:
    with Client(terminal.url, terminal.cast.owner[1]) as client:
        made = client.submit_batch(
            terminal.cast.server_id, [{"kind": "noop"}, {"kind": "noop", "priority": 1}]
        )
        assert [job.priority for job in made] == [5, 1]
        with pytest.raises(InvalidRequest, match=r"jobs\.1\.kind"):
            client.submit_batch(terminal.cast.server_id, [{"kind": "noop"}, {"kind": "BAD"}])
    assert len(jobs_of(terminal)) == 2
