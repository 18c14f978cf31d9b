"""A label a command line refuses is one line with the error's code, naming the label as it was
typed (`label 'Role'`), not the API's place for it (`labels[0]`): `run join --label`, `server
create --label` and `server label` (docs/cli.md, "Labels" and "Exit codes")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from moonrun.cli import app
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal

KEY_RULE = "a key must match [a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?"


def run_join(data_dir: Path, *labels: str, platform: str = "http://127.0.0.1:9") -> Result:
    arguments = ["run", "join", "--platform", platform, "--token", "mrj_x", "--data-dir"]
    label_options = [part for label in labels for part in ("--label", label)]
    return CliRunner().invoke(app, [*arguments, str(data_dir), *label_options])


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


def test_run_join_names_a_bad_label_key_as_typed_with_the_code(data_dir: Path) -> None:
    result = run_join(data_dir, "role=web", "Role=db")
    assert (result.exit_code, result.output) == (
        1,
        f"moonrun: error: invalid_labels: label 'Role': {KEY_RULE}\n",
    )
    assert list(data_dir.iterdir()) == []  # said before a key is made or a token is sent


def test_run_join_names_a_too_long_value_by_its_key_with_the_code(data_dir: Path) -> None:
    result = run_join(data_dir, "zone=" + "x" * 129)
    assert (result.exit_code, result.output) == (
        1,
        "moonrun: error: invalid_labels: label 'zone': a value is at most 128 characters, "
        "not 129\n",
    )


def test_run_join_says_a_label_that_is_not_a_pair_with_the_code(data_dir: Path) -> None:
    result = run_join(data_dir, "gpu")
    assert (result.exit_code, result.output) == (
        1,
        "moonrun: error: invalid_request: --label is KEY=VALUE, not 'gpu'\n",
    )


def test_run_join_errors_carry_their_code(data_dir: Path) -> None:
    bad_url = run_join(data_dir, platform="ftp://example.invalid")
    assert (bad_url.exit_code, bad_url.output) == (
        1,
        "moonrun: error: invalid_request: --platform must be an http:// or https:// URL, "
        "not 'ftp://example.invalid'\n",
    )
    missing = run_join(data_dir / "missing")
    assert missing.exit_code == 1
    assert missing.output.startswith("moonrun: error: data_dir: data directory ")
    assert len(missing.output.splitlines()) == 1


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path, token=ADMIN_TOKEN)


def test_server_create_and_server_label_name_a_refused_label_as_typed(
    terminal: Terminal,
) -> None:
    cast = terminal.cast
    created = terminal(
        "server",
        "create",
        "web-9",
        "--endpoint",
        cast.run.endpoint_id,
        "--owner",
        cast.owner[0],
        "--label",
        "role=web",
        "--label",
        "Tier=1",
    )
    assert (created.exit_code, created.output) == (
        1,
        f"moonrun: error: invalid_labels: label 'Tier': {KEY_RULE}\n",
    )
    labelled = terminal("server", "label", cast.server_id, "ok=1", "Bad=2")
    assert (labelled.exit_code, labelled.output) == (
        1,
        f"moonrun: error: invalid_labels: label 'Bad': {KEY_RULE}\n",
    )
