"""`moonrun store check` says what the store holds, as counts, and with `--json` as one
document (docs/cli.md, "store check"); `store compact --json` too. In process."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from moonrun.cli import app
from moonrun.clock import SystemClock
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.directory import Directory
from moonrun.store.file import FileStore

ADMIN_TOKEN = "mra_" + "a" * 40


def store_with_an_admin(tmp_path: Path) -> str:
    store = FileStore(tmp_path / "platform.db")
    try:
        Directory(store, SystemClock(), SystemTokenSource()).bootstrap_admin(ADMIN_TOKEN)
    finally:
        store.close()
    return f"file:{tmp_path / 'platform.db'}"


def test_store_check_json_is_one_document_of_counts_and_jobs_by_state(tmp_path: Path) -> None:
    url = store_with_an_admin(tmp_path)
    checked = CliRunner().invoke(app, ["store", "check", "--store", url, "--json"])
    assert checked.exit_code == 0, checked.output
    document = json.loads(checked.output)
    assert document["store"] == url
    assert isinstance(document["schema_version"], int)
    assert document["counts"] == {
        "users": 1,
        "endpoints": 0,
        "servers": 0,
        "schedules": 0,
        "jobs": 0,
    }
    assert document["jobs"] == dict.fromkeys(
        ["queued", "accepted", "running", "retrying", "succeeded", "failed", "cancelled"], 0
    )


def test_store_check_prints_the_counts(tmp_path: Path) -> None:
    url = store_with_an_admin(tmp_path)
    checked = CliRunner().invoke(app, ["store", "check", "--store", url])
    assert checked.exit_code == 0, checked.output
    lines = checked.output.splitlines()
    assert lines[1:] == [
        "users 1  endpoints 0  servers 0  schedules 0  jobs 0",
        "jobs by state: none",
    ]


def test_store_compact_json_gives_the_sizes(tmp_path: Path) -> None:
    url = store_with_an_admin(tmp_path)
    compacted = CliRunner().invoke(app, ["store", "compact", "--store", url, "--json"])
    assert compacted.exit_code == 0, compacted.output
    document = json.loads(compacted.output)
    assert sorted(document) == ["after_bytes", "before_bytes", "store"]
    assert document["after_bytes"] <= document["before_bytes"]
