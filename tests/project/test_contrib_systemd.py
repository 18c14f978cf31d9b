"""contrib/systemd/: the unit files docs/operations.md shows, byte for byte, and valid units."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ("moonrun-platform.service", "moonrun-run.service")


def _shown_in_operations(unit: str) -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    heading = f"### `/etc/systemd/system/{unit}`"
    assert heading in text, heading
    return text[text.index(heading) :].split("```\n", 2)[1]


@pytest.mark.parametrize("unit", UNITS)
def test_a_shipped_unit_is_the_one_operations_md_shows(unit: str) -> None:
    assert (ROOT / "contrib" / "systemd" / unit).read_text() == _shown_in_operations(unit)


@pytest.mark.parametrize("unit", UNITS)
def test_a_shipped_unit_passes_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    # verify checks that ExecStart's program exists: point it at this venv's moonrun.
    moonrun = Path(sys.executable).parent / "moonrun"
    text = (ROOT / "contrib" / "systemd" / unit).read_text()
    (tmp_path / unit).write_text(text.replace("/opt/moonrun/bin/moonrun", str(moonrun)))
    verified = subprocess.run(
        [analyze, "verify", str(tmp_path / unit)], capture_output=True, text=True, timeout=60
    )
    assert (verified.returncode, verified.stderr) == (0, "")
