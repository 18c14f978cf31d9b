"""Labels in the console: the servers and endpoints pages show them, escaped like everything
else, and the servers page filters by a label selector (docs/protocol.md, "Console")."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console
from tests.support.stores import memory_factory

HOSTILE = '<script>alert("x")</script>&'


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def put_labels(con: Console, what: str, labels: dict[str, str], token: str | None = None) -> None:
    kwargs = {} if token is None else {"token": token}
    response = con.world.api("PUT", f"/api/v1/{what}/labels", json={"labels": labels}, **kwargs)
    assert response.status_code == 200, response.text


def shown_labels(page: str) -> list[str]:
    return re.findall(r'<li class="chip mono">([^<]*)</li>', page)


def test_the_servers_page_shows_each_servers_labels_escaped(con: Console) -> None:
    put_labels(con, f"servers/{con.server_id}", {"role": "web", "note": HOSTILE})
    page = con.client("olive").get("/servers").text
    assert shown_labels(page) == [
        "note=&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;",
        "role=web",
    ]
    assert HOSTILE not in page


def test_the_endpoints_page_shows_each_endpoints_labels_escaped(con: Console) -> None:
    put_labels(con, f"endpoints/{con.run.endpoint_id}", {"zone": HOSTILE})
    page = con.client("ada").get("/endpoints").text
    assert shown_labels(page) == ["zone=&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;"]
    assert HOSTILE not in page


def test_the_servers_page_filters_by_a_selector_and_says_where_a_bad_one_stops(
    con: Console,
) -> None:
    put_labels(con, f"endpoints/{con.run.endpoint_id}", {"zone": "eu"})
    put_labels(con, f"endpoints/{con.other_run.endpoint_id}", {"zone": "eu"})
    ada = con.client("ada")
    both = ada.get("/servers", params={"selector": "zone=eu"}).text
    assert ('aria-label="Server web-1"' in both, 'aria-label="Server db-1"' in both) == (True, True)
    put_labels(con, f"servers/{con.server_id}", {"zone": "us"})  # the server's own value wins
    one = ada.get("/servers", params={"selector": "zone=eu"}).text
    assert ('aria-label="Server web-1"' in one, 'aria-label="Server db-1"' in one) == (False, True)
    assert 'value="zone=eu"' in one
    bad = ada.get("/servers", params={"selector": "zone=eu,,"})
    assert bad.status_code == 422
    assert "at position 8" in bad.text
