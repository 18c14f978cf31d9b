"""Fan-out groups in the console: the fan-out form makes a group and lands on its page; the page
shows the counts and the jobs (escaped, live until every job ended), cancels the group, and is
the creator's only; a job's page links its group (docs/protocol.md, "Console")."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console, csrf_of
from tests.support.stores import memory_factory


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        answer = built.world.api(
            "PUT", f"/api/v1/servers/{built.server_id}/labels", json={"labels": {"role": "web"}}
        )
        assert answer.status_code == 200, answer.text
        web2 = built.world.create_server("web-2", built.run.endpoint_id, built.users["olive"][0])
        answer = built.world.api(
            "PUT", f"/api/v1/servers/{web2}/labels", json={"labels": {"role": "web"}}
        )
        assert answer.status_code == 200, answer.text
        yield built


def fan_out(con: Console, **fields: str) -> tuple[int, str]:
    olive = con.client("olive")
    page = olive.get("/groups/new").text
    form = {
        "csrf_token": csrf_of(page),
        "selector": "role=web",
        "kind": "noop",
        "payload": "{}",
        "max_parallel": "1",
    } | fields
    made = olive.post("/groups/new", data=form)
    if made.status_code != 303:
        return made.status_code, made.text
    return made.status_code, made.headers["location"]


def test_the_form_fans_out_and_the_group_page_shows_its_counts_and_jobs(con: Console) -> None:
    status, where = fan_out(con)
    assert status == 303
    assert re.fullmatch(r"/groups/grp_\w+", where)
    page = con.client("olive").get(where).text
    assert '<span class="chip chip-queued">2 queued</span>' in page
    assert page.count('href="/jobs/job_') == 2
    assert "waiting its turn" in page  # max_parallel 1: the second job is held
    assert 'data-final="false"' in page
    assert "web-1" in page
    assert "web-2" in page
    fragment = con.client("olive").get(where, params={"fragment": "1"}).text
    assert fragment.startswith('<div id="live"')
    job_id = re.findall(r'href="/jobs/(job_\w+)"', page)[0]
    job_page = con.client("olive").get(f"/jobs/{job_id}").text
    assert f'href="{where}"' in job_page


def test_a_refused_fan_out_says_why_and_keeps_what_was_typed(con: Console) -> None:
    status, page = fan_out(con, selector="role=db", kind="kept.kind")
    assert status == 422
    assert "no_match" in page
    assert 'value="kept.kind"' in page
    status, page = fan_out(con, selector="role=web,,")
    assert (status, "invalid_selector" in page) == (422, True)


def test_the_group_page_cancels_the_group_and_is_its_creators_only(con: Console) -> None:
    _, where = fan_out(con)
    olive = con.client("olive")
    page = olive.get(where).text
    cancelled = olive.post(f"{where}/cancel", data={"csrf_token": csrf_of(page)})
    assert cancelled.status_code == 303
    after = olive.get(where).text
    assert '<span class="chip chip-cancelled">2 cancelled</span>' in after
    assert 'data-final="true"' in after
    assert "Cancel the group" not in after
    assert con.client("stella").get(where).status_code == 403
    assert con.client("hugo").get(where).status_code == 403
    assert con.client("olive").get("/groups/grp_missing0000").status_code == 404
    forged = olive.post(f"{where}/cancel", data={"csrf_token": "forged"})
    assert forged.status_code == 403
