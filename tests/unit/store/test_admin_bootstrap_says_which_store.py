"""`moonrun admin bootstrap` says which store it wrote, and warns when it had to create that
store: a forgotten `--store` (the default is ./.moonrun/platform.db) must not hand out a token
for a store no platform serves without a word (docs/operations.md, "The bootstrap admin")."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from moonrun.cli import app


def test_bootstrap_warns_once_when_it_created_the_store_and_names_it_each_time(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new" / "platform.db"
    first = CliRunner().invoke(app, ["admin", "bootstrap", "--store", f"file:{path}"])
    second = CliRunner().invoke(app, ["admin", "bootstrap", "--store", f"file:{path}"])
    assert (first.exit_code, second.exit_code) == (0, 0), first.output + second.output
    warned, said = first.stderr.splitlines()
    assert warned == (
        f"moonrun: warning: there was no store at {path}: this command created it; a platform "
        "serving another store does not know this admin (give --store)"
    )
    assert said.startswith("platform admin admin (usr_")
    assert said.endswith(f") created in file:{path}")
    assert second.stderr.splitlines() == [
        said.replace("created", "has a new API token"),
    ]
    assert first.stdout.startswith("mra_")
