"""Dependencies in the console: a job held on its dependencies says on its page what it waits
for, each linked; once released the line is gone (docs/protocol.md, "Dependencies")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console
from tests.support.stores import memory_factory


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def test_a_waiting_jobs_page_says_what_it_waits_for_until_released(con: Console) -> None:
    first = con.submit("olive")
    waiting = con.submit("olive", after=[first])
    page = con.client("olive").get(f"/jobs/{waiting}").text
    assert 'data-testid="waiting-for"' in page
    assert f'<a class="mono" href="/jobs/{first}">{first}</a>' in page
    run = con.run.start()
    attempt = run.run_to_running(first)
    run.result(first, attempt)
    page = con.client("olive").get(f"/jobs/{waiting}").text
    assert 'data-testid="waiting-for"' not in page
