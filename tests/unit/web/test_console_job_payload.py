"""The console's job page shows what the job ran: its payload as pretty JSON in a `<pre>`,
escaped (markup as text, control and bidi characters as visible escapes, as log lines are),
credential-looking members redacted, to whoever may read the job (docs/protocol.md,
"Payload")."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console_kit import Console, cheap_passwords, console
from tests.support.stores import memory_factory

HOSTILE = {
    "argv": ["sh", "-c", "<script>alert(1)</script>"],
    "note": "abc\u202edef\u2066x\x1b[31m\x9b\u2028end",
    "deploy_token": "tok-8e1f3a",
}
BLOCK = re.compile(r'<pre class="payload" data-testid="payload"><code>(.*?)</code></pre>', re.S)


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def payload_block(page: str) -> str:
    found = BLOCK.search(page)
    assert found is not None, "no payload block"
    return found.group(1)


def test_the_job_page_shows_the_payload_as_pretty_json(con: Console) -> None:
    job_id = con.submit(payload={"argv": ["echo", "hello"], "timeout_s": 60})
    page = con.client("olive").get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert '<a href="#payload-title">payload</a>' in page.text  # beside its kind, at the top
    block = payload_block(page.text)
    assert (
        html.unescape(block)
        == '{\n  "argv": [\n    "echo",\n    "hello"\n  ],\n  "timeout_s": 60\n}\n'
    )


def test_markup_controls_and_bidi_characters_in_a_payload_are_drawn_escaped(
    con: Console,
) -> None:
    job_id = con.submit(payload=HOSTILE)
    page = con.client("olive").get(f"/jobs/{job_id}").text
    block = payload_block(page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in block
    assert "<script>alert" not in page
    for raw in ("\u202e", "\u2066", "\x1b", "\x9b", "\u2028"):
        assert raw not in page
    escapes = re.findall(r'<span class="ctl">([^<]*)</span>', block)
    assert escapes == ["\\u202e", "\\u2066", "\\x9b\\u2028"]
    assert "\\u001b[31m" in block  # JSON's own escape of ESC
    assert "tok-8e1f3a" not in page
    assert "&#34;deploy_token&#34;: &#34;[redacted]&#34;" in block


def test_the_live_fragment_does_not_carry_the_payload_again(con: Console) -> None:
    """The page polls its live part every 2 s; a payload never changes, so it is drawn once."""
    job_id = con.submit(payload={"argv": ["echo", "only-once-7f3b"]})
    page = con.client("olive").get(f"/jobs/{job_id}")
    assert "only-once-7f3b" in payload_block(page.text)
    fragment = con.client("olive").get(f"/jobs/{job_id}", params={"fragment": "1"})
    assert fragment.status_code == 200
    assert "only-once-7f3b" not in fragment.text


def test_whoever_may_read_the_job_sees_its_payload_and_another_owner_gets_the_403_page(
    con: Console,
) -> None:
    job_id = con.submit(payload={"argv": ["echo", "for-readers-2c9d"]})
    for reader in ("olive", "hugo", "ada"):
        page = con.client(reader).get(f"/jobs/{job_id}")
        assert (page.status_code, "for-readers-2c9d" in payload_block(page.text)) == (200, True)
    refused = con.client("stella").get(f"/jobs/{job_id}")
    assert refused.status_code == 403
    assert "for-readers-2c9d" not in refused.text


def test_the_payload_block_keeps_to_the_pages_content_security_policy(con: Console) -> None:
    """No inline style or script: the block is styled by the one stylesheet."""
    job_id = con.submit(payload={"argv": ["true"]})
    page = con.client("olive").get(f"/jobs/{job_id}")
    policy = page.headers["Content-Security-Policy"]
    assert "style-src 'self'" in policy
    assert "unsafe-inline" not in policy
    block_start = page.text.index('<pre class="payload"')
    section = page.text[
        page.text.rindex("<section", 0, block_start) : page.text.index("</section>", block_start)
    ]
    assert "style=" not in section
    assert "<script" not in section
    stylesheet = con.client("olive").get("/static/moonlight.css").text
    assert "pre.payload" in stylesheet
