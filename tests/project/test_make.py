"""The Makefile's installs: `make venv` is what running needs, `make dev` adds the tools, and a
failed optional driver build is one line, not pip's traceback.

A stand-in `python` in a temporary venv records each pip install it is asked for (and fails the
one for mysqlclient when told to), so these run in a moment without touching the network.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../pip-calls"
case "$*" in
  *mysql-c*) if [ -n "$FAIL_MYSQLCLIENT" ]; then
      echo 'Traceback (most recent call last):' >&2
      echo 'Exception: Can not find valid pkg-config name.' >&2
      exit 1
    fi ;;
esac
exit 0
"""


def make(venv: Path, target: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`make TARGET` with VENV=`venv`, whose python is the stand-in."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=True,
    )


def pip_installs(venv: Path) -> list[str]:
    calls = (venv / "pip-calls").read_text().splitlines()
    return [call.split(" -e ", 1)[1] for call in calls if " -e " in call]


def test_make_venv_installs_what_running_needs_and_none_of_the_test_tools(
    tmp_path: Path,
) -> None:
    make(tmp_path / "venv", "venv")

    assert pip_installs(tmp_path / "venv") == [".[mysql]", ".[mysql-c]"]


def test_make_dev_adds_the_test_and_lint_tools(tmp_path: Path) -> None:
    make(tmp_path / "venv", "dev")

    assert pip_installs(tmp_path / "venv")[-1] == ".[test]"


def test_a_mysqlclient_that_does_not_build_is_one_line_saying_what_was_skipped(
    tmp_path: Path,
) -> None:
    done = make(tmp_path / "venv", "venv", FAIL_MYSQLCLIENT="1")

    said = [line for line in done.stdout.splitlines() if line.startswith("make:")]
    assert len(said) == 1
    assert said[0].startswith("make: skipped mysqlclient")
    assert "apt-get install libmariadb-dev pkg-config gcc" in said[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert "pkg-config name" in (tmp_path / "venv" / "mysqlclient-build.log").read_text()
