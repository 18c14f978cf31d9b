"""One fake terminal for the CLI tests: `moonrun` in-process (every user verb group
registered, as `moonrun`'s main() registers them), signed in as the cast's owner against a
platform served on loopback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner, Result

from moonrun.cli import app
from moonrun.client import group_verbs, schedule_verbs, verbs
from moonrun.client.library import Client
from tests.support.http_harness import Cast

if not any(group.name == "job" for group in app.registered_groups):
    verbs.register(app)
if not any(group.name == "group" for group in app.registered_groups):
    app.add_typer(group_verbs.group_app, name="group")
if not any(group.name == "schedule" for group in app.registered_groups):
    app.add_typer(schedule_verbs.schedule_app, name="schedule")


@dataclass
class Terminal:
    """`terminal("job", "list")` runs `moonrun job list` as the cast's owner;
    `terminal(..., token=ADMIN_TOKEN)` runs that one command as someone else."""

    cast: Cast
    url: str
    home: Path
    token: str | None = None
    """Who is signed in: the cast's owner unless a test names another (e.g. ADMIN_TOKEN)."""
    width: int | None = None
    """The terminal's columns: click's default unless a test needs a wide table."""

    def __call__(self, *args: str, stdin: str | None = None, token: str | None = None) -> Result:
        signed_in = token or self.token or self.cast.owner[1]
        environment = verbs.Environment(self.home, self.url, signed_in)
        return CliRunner().invoke(
            app, list(args), obj=environment, input=stdin, terminal_width=self.width
        )

    def client(self, token: str | None = None) -> Client:
        """The Python client against the same platform, as whoever the terminal signs in as
        (or `token`'s user)."""
        return Client(self.url, token or self.token or self.cast.owner[1])
