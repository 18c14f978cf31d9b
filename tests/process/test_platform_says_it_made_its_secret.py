"""`moonrun platform serve` says, once, that it made the platform secret and where (by default
`.moonrun/platform.secret` in the working directory), so that it is kept and copied rather
than lost (docs/operations.md, "User, directories, secret")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import launcher

pytestmark = pytest.mark.processes


class DefaultSecretPlatform(launcher.PlatformProcess):
    """A platform started as a new user starts it: no --secret-file."""

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--secret-file")
        return command[:at] + command[at + 2 :]


def notes(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("moonrun: note:")]


def test_the_start_that_makes_the_secret_says_where_once_and_later_starts_say_nothing(
    tmp_path: Path,
) -> None:
    platform = DefaultSecretPlatform(tmp_path, "memory://")
    try:
        platform.start()
        platform.restart()
        platform.restart()
    finally:
        platform.close()
    made = tmp_path / ".moonrun" / "platform.secret"
    assert made.is_file()
    assert notes(platform.log) == [
        f"moonrun: note: created the platform secret {made} (mode 0600) (choose with "
        "--secret-file); keep it with the store: if it changes, every Run must be restarted"
    ]
    logged = [event for event in platform.events() if "created the platform secret" in event["msg"]]
    assert [event["level"] for event in logged] == ["info"]
