"""`--retain-finished` (env MOONRUN_RETAIN_FINISHED): a duration with a unit, a bare number of
seconds, or 0 to keep finished jobs forever; anything else is a usage error naming the flag."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from moonrun.cli import app
from moonrun.wiring.settings import parse_retention


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400.0),
        ("12h", 43200.0),
        ("90m", 5400.0),
        ("45s", 45.0),
        ("3600", 3600.0),
        ("0", 0.0),
        ("1.5d", 129600.0),
        (" 2D ", 172800.0),
    ],
)
def test_retain_finished_reads_a_duration_with_its_unit(text: str, seconds: float) -> None:
    assert parse_retention(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "-1d", "30 days", "nan", "inf", "1e999d", "30w"])
def test_retain_finished_refuses_what_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError, match="--retain-finished must be a duration"):
        parse_retention(text)


def test_serve_with_a_bad_retain_finished_is_a_usage_error_before_anything_opens() -> None:
    result = CliRunner().invoke(
        app,
        ["platform", "serve", "--store", "memory://", "--retain-finished", "a month"],
        env={"MOONRUN_BOOTSTRAP_ADMIN_TOKEN": ""},
    )

    assert result.exit_code == 2
    assert result.output.strip() == (
        "moonrun: error: --retain-finished must be a duration such as 30d, 12h, 90m or 45s "
        "(0 keeps finished jobs forever), not 'a month'"
    )
