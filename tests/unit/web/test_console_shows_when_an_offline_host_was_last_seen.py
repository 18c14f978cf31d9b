"""The console's endpoints page shows a host offline 15 s after its Run's last heartbeat (the
heartbeat interval plus 5 s), and offline still shows when it was last seen, its capacity and
its Run version (docs/protocol.md, "Liveness"). In process, on a manual clock."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.scheduling.time import format_instant
from tests.support.console_kit import Console, cheap_passwords, console
from tests.support.stores import memory_factory

ROW = re.compile(r"<tr>\s*<td data-label=\"Name\">(?P<name>[\w-]+) .*?</tr>", re.S)
CELL = re.compile(r'<td data-label="(?P<label>[^"]+)"[^>]*>(?P<content>.*?)</td>', re.S)
TAG = re.compile(r"<[^>]+>")


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def host_row(html: str, name: str) -> dict[str, str]:
    """The endpoints page's row of host `name`: each cell's text by its label."""
    for row in ROW.finditer(html):
        if row["name"] == name:
            return {
                cell["label"]: " ".join(TAG.sub(" ", cell["content"]).split())
                for cell in CELL.finditer(row.group(0))
                if cell["label"] in ("Online", "Last seen", "Capacity", "Run version")
            }
    raise AssertionError(f"no row for {name}")


def test_a_silent_host_shows_offline_with_when_it_was_last_seen_and_its_capacity(
    con: Console,
) -> None:
    ada = con.client("ada")
    con.run.start(capacity=7)
    con.world.clock.advance(4_000)
    assert con.run.heartbeat().status_code == 200
    beat = format_instant(con.world.clock.now())
    con.world.clock.advance(15_000)
    at_bound = host_row(ada.get("/endpoints").text, "host-a")
    con.world.clock.advance(1)
    past = host_row(ada.get("/endpoints").text, "host-a")

    assert at_bound["Online"] == "online"
    assert past == {
        "Online": "offline",
        "Last seen": beat,
        "Capacity": "7",
        "Run version": past["Run version"],
    }
    assert past["Run version"] not in ("", "—")
