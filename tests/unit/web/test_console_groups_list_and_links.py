"""Finding one's way in the console (docs/guide.md, "The console"): `/jobs?group=ID` lists
only that group's jobs, `/groups` lists the groups one made (newest first, with counts) and
the nav links it, and a job a schedule made links to its schedule. In process."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.console_kit import Console, cheap_passwords, console
from tests.support.stores import memory_factory


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        for server_id in (built.server_id, built.other_server_id):
            answer = built.world.api(
                "PUT", f"/api/v1/servers/{server_id}/labels", json={"labels": {"role": "web"}}
            )
            assert answer.status_code == 200, answer.text
        yield built


def fan_out(con: Console, who: str = "olive", kind: str = "noop") -> dict[str, Any]:
    made = con.world.api(
        "POST",
        "/api/v1/jobs/fanout",
        token=con.token(who),
        json={"selector": "role=web", "kind": kind},
    )
    assert made.status_code == 201, made.text
    con.world.clock.advance(1_000)  # the next group is newer
    answer: dict[str, Any] = made.json()
    return answer


def job_ids(page: str) -> set[str]:
    return set(re.findall(r'href="/jobs/(job_\w+)"', page))


def test_the_jobs_page_with_a_group_lists_only_that_groups_jobs(con: Console) -> None:
    alone = con.submit()
    made = fan_out(con)
    group_id, fanned = made["group"]["id"], {job["id"] for job in made["jobs"]}
    olive = con.client("olive")
    assert job_ids(olive.get("/jobs").text) == fanned | {alone}
    page = olive.get("/jobs", params={"group": group_id}).text
    assert job_ids(page) == fanned
    assert f'<a class="mono" href="/groups/{group_id}">{group_id}</a>' in page
    assert f'<input type="hidden" name="group" value="{group_id}">' in page
    fragment = olive.get("/jobs", params={"group": group_id, "fragment": "1"}).text
    assert job_ids(fragment) == fanned
    group_page = olive.get(f"/groups/{group_id}").text
    assert f'href="/jobs?group={group_id}"' in group_page


def test_a_group_one_may_not_see_is_not_listed_by_the_jobs_page(con: Console) -> None:
    theirs = fan_out(con, who="stella")["group"]["id"]
    assert con.client("olive").get("/jobs", params={"group": theirs}).status_code == 403


def test_the_groups_page_lists_ones_own_groups_newest_first_with_counts(con: Console) -> None:
    first = fan_out(con, kind="noop")["group"]["id"]
    second = fan_out(con, kind="sleep")["group"]["id"]
    theirs = fan_out(con, who="stella")["group"]["id"]
    olive = con.client("olive")
    jobs = olive.get("/jobs").text
    assert '<li><a href="/groups" >Groups</a></li>' in jobs  # in the nav
    answer = olive.get("/groups")
    assert answer.status_code == 200
    page = answer.text
    listed = re.findall(r'<a class="mono" href="/groups/(grp_\w+)">', page)
    assert listed == [second, first]
    assert theirs not in page
    assert page.count('<span class="chip chip-queued">1 queued</span>') == 2
    assert f'href="/jobs?group={first}"' in page
    assert 'aria-current="page">Groups</a>' in page


def test_the_groups_page_says_so_when_there_are_none(con: Console) -> None:
    page = con.client("olive").get("/groups").text
    assert "No groups yet." in page
    assert 'href="/groups/new"' in page


def test_a_job_a_schedule_made_links_to_its_schedule(con: Console) -> None:
    token = con.token("olive")
    made = con.world.api(
        "POST",
        f"/api/v1/servers/{con.server_id}/schedules",
        token=token,
        json={"name": "nightly backup", "cron": "0 3 * * *", "job": {"kind": "noop"}},
    )
    assert made.status_code == 201, made.text
    schedule_id = made.json()["id"]
    fired = con.world.api("POST", f"/api/v1/schedules/{schedule_id}/trigger", token=token)
    assert fired.status_code == 200, fired.text
    job_id = fired.json()["job_id"]
    olive = con.client("olive")
    page = olive.get(f"/jobs/{job_id}").text
    link = f'<a href="/servers/{con.server_id}/schedules#{schedule_id}">nightly backup</a>'
    assert link in page
    schedules = olive.get(f"/servers/{con.server_id}/schedules").text
    assert f'<tr id="{schedule_id}">' in schedules
    assert con.world.api("DELETE", f"/api/v1/schedules/{schedule_id}", token=token).is_success
    gone = olive.get(f"/jobs/{job_id}").text
    assert f'<span class="mono">{schedule_id}</span> <span class="muted">(deleted)</span>' in gone
