"""Priorities and concurrency keys in the console: the submit and fan-out forms offer both (the
priority 5 chosen unless told), a job's page shows its priority and its key, and a bad value
comes back as a 422 with what was typed (docs/protocol.md, "Priorities", "Concurrency keys")."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console, csrf_of
from tests.support.stores import memory_factory
from tests.unit.web.test_console_submit import BUILT_INS, submit


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        built.run.start(kinds=BUILT_INS)
        answer = built.world.api(
            "PUT", f"/api/v1/servers/{built.server_id}/labels", json={"labels": {"role": "web"}}
        )
        assert answer.status_code == 200, answer.text
        yield built


def test_the_submit_form_offers_priorities_with_5_chosen_and_a_concurrency_key(
    con: Console,
) -> None:
    page = con.client("olive").get("/jobs/new", params={"server_id": con.server_id}).text
    levels = re.findall(r'<option value="(\d)"( selected)?>', page)
    assert [level for level, _ in levels] == [str(n) for n in range(9, -1, -1)]
    assert [level for level, chosen in levels if chosen] == ["5"]
    assert 'name="concurrency_key"' in page
    assert 'name="concurrency_limit"' in page


def test_a_job_submitted_with_a_priority_and_a_key_shows_both_on_its_page(con: Console) -> None:
    browser = con.client("olive")
    made = submit(
        browser,
        con,
        kind="noop",
        payload="{}",
        priority="8",
        concurrency_key="nightly",
        concurrency_limit="2",
    )
    assert made.status_code == 303, made.text
    job_id = made.headers["location"].removeprefix("/jobs/")
    stored = con.world.stored(job_id)
    assert (stored.priority, stored.concurrency and stored.concurrency.limit) == (8, 2)
    page = browser.get(f"/jobs/{job_id}").text
    assert '<dd data-testid="priority">8</dd>' in page
    assert "<code>nightly</code>" in page


def test_a_limit_without_a_key_is_refused_with_what_was_typed(con: Console) -> None:
    browser = con.client("olive")
    refused = submit(browser, con, kind="noop", payload="{}", priority="2", concurrency_limit="3")
    assert refused.status_code == 422
    assert "concurrency.limit" in refused.text
    assert '<option value="2" selected>' in refused.text


def test_the_fan_out_form_carries_the_priority_to_every_job(con: Console) -> None:
    olive = con.client("olive")
    page = olive.get("/groups/new").text
    assert 'name="priority"' in page
    form = {
        "csrf_token": csrf_of(page),
        "selector": "role=web",
        "kind": "noop",
        "payload": "{}",
        "priority": "1",
    }
    made = olive.post("/groups/new", data=form)
    assert made.status_code == 303, made.text
    group = olive.get(made.headers["location"]).text
    job_id = re.findall(r'href="/jobs/(job_\w+)"', group)[0]
    assert con.world.stored(job_id).priority == 1
