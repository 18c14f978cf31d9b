"""One fake terminal for the CLI tests: `moonrun` in-process (every user verb group
registered, as `moonrun`'s main() registers them), signed in as the cast's owner against a
platform served on loopback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner, Result

from moonrun.cli import app
from moonrun.client import group_verbs, schedule_verbs, verbs
from tests.support.http_harness import Cast

if not any(group.name == "job" for group in app.registered_groups):
    verbs.register(app)
if not any(group.name == "group" for group in app.registered_groups):
    app.add_typer(group_verbs.group_app, name="group")
if not any(group.name == "schedule" for group in app.registered_groups):
    app.add_typer(schedule_verbs.schedule_app, name="schedule")


@dataclass
class Terminal:
    """`terminal("job", "list")` runs `moonrun job list` as the cast's owner."""

    cast: Cast
    url: str
    home: Path

    def __call__(self, *args: str, stdin: str | None = None) -> Result:
        environment = verbs.Environment(self.home, self.url, self.cast.owner[1])
        return CliRunner().invoke(app, list(args), obj=environment, input=stdin)
