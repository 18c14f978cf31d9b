"""`moonrun job show` prints what the job was given (its payload, credential-looking members
redacted) as indented JSON with no raw control or bidi character; `--json` carries it,
`--no-payload` leaves it out; `Client.job(id, include_payload=True)` fills `Job.payload`
(docs/cli.md, docs/protocol.md "Payload")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.client.drawn import safe_json
from moonrun.client.library import Client
from moonrun.errors import Forbidden
from tests.support.both_clients import FLAVOURS, Flavour, connect
from tests.support.console_kit import serve
from tests.support.http_harness import ADMIN_TOKEN, http_world
from tests.support.stores import memory_factory
from tests.support.terminal import Terminal

PAYLOAD = {
    "argv": ["env", "API_TOKEN=tok-3f9a1c", "deploy", "web"],
    "timeout_s": 60,
    "password": "pw-6b2e0d",
}
SHOWN = {
    "argv": ["env", "API_TOKEN=[redacted]", "deploy", "web"],
    "timeout_s": 60,
    "password": "[redacted]",
}
UNSAFE = "\x1b]0;owned\x07 \x9b31m \u202eevil \u2066 \u2028 \x7f"
RAW = "\x1b\x07\x9b\u202e\u2066\u2028\x7f"
"""The characters of UNSAFE no terminal may be given raw."""


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    with http_world(memory_factory(), tmp_path) as cast, serve(cast.world.app) as served:
        yield Terminal(cast, served.url, tmp_path)


def submitted(terminal: Terminal, payload: dict[str, object]) -> str:
    cast = terminal.cast
    job = cast.world.submit(cast.server_id, cast.owner[1], payload=payload)
    job_id: str = job["id"]
    return job_id


def test_job_show_prints_the_payload_redacted_as_indented_json(terminal: Terminal) -> None:
    job_id = submitted(terminal, PAYLOAD)
    shown = terminal("job", "show", job_id)
    assert shown.exit_code == 0, shown.output
    _, after = shown.stdout.split("\npayload\n")
    assert json.loads(after) == SHOWN
    assert after.splitlines()[:3] == ["  {", '    "argv": [', '      "env",']
    assert "tok-3f9a1c" not in shown.stdout
    assert "pw-6b2e0d" not in shown.stdout


def test_job_show_json_carries_the_payload_and_no_payload_leaves_it_out(
    terminal: Terminal,
) -> None:
    job_id = submitted(terminal, PAYLOAD)
    as_json = terminal("job", "show", job_id, "--json")
    assert json.loads(as_json.stdout)["payload"] == SHOWN
    without = terminal("job", "show", job_id, "--no-payload", "--json")
    assert "payload" not in json.loads(without.stdout)
    plain = terminal("job", "show", job_id, "--no-payload")
    assert "payload" not in plain.stdout
    assert "deploy" not in plain.stdout


def test_job_show_draws_control_and_bidi_characters_as_escapes(terminal: Terminal) -> None:
    """Nothing a submitter typed can move the cursor, retitle the terminal or reorder a line;
    the JSON still reads back as what was given."""
    job_id = submitted(terminal, {"note": UNSAFE})
    for args in ((), ("--json",)):
        shown = terminal("job", "show", job_id, *args)
        assert shown.exit_code == 0, shown.output
        assert [c for c in shown.stdout if c in RAW] == []
        document = shown.stdout.split("\npayload\n")[-1]
        payload = json.loads(document)["payload"] if args else json.loads(document)
        assert payload == {"note": UNSAFE}


def test_safe_json_reads_back_as_the_same_value() -> None:
    document = {"k\u202e": [UNSAFE, "é ✓ 漢", 1.5, None]}
    for compact in (False, True):
        text = safe_json(document, compact=compact)
        assert json.loads(text) == document
        assert "\u202e" not in text
        assert "é ✓ 漢" in text


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_python_client_reads_the_payload_when_asked(
    terminal: Terminal, flavour: Flavour
) -> None:
    """`Client` and `AsyncClient` alike."""
    job_id = submitted(terminal, PAYLOAD)
    with connect(flavour, terminal.url, terminal.cast.owner[1]) as client:
        asked = client.job(job_id, include_payload=True)
        plain = client.job(job_id)
        listed = [job.payload for job in client.jobs(include_payload=True)]
        unlisted = [job.payload for job in client.jobs()]
    assert (asked.payload, plain.payload) == (SHOWN, None)
    assert (listed, unlisted) == ([SHOWN], [None])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_another_owner_gets_no_payload_from_the_client(
    terminal: Terminal, flavour: Flavour
) -> None:
    """The refusal a plain read gets (403 `forbidden`), nothing of the payload."""
    job_id = submitted(terminal, PAYLOAD)
    stranger = terminal.cast.stranger[1]
    with connect(flavour, terminal.url, stranger) as client, pytest.raises(Forbidden) as refused:
        client.job(job_id, include_payload=True)
    assert "deploy" not in str(refused.value)
    with Client(terminal.url, ADMIN_TOKEN) as admin:
        assert admin.job(job_id, include_payload=True).payload == SHOWN
