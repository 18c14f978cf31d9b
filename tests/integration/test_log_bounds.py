"""Logs from Run to platform to user, bounded and safe: lines cut to a byte cap, attempts and
the whole store capped with counted drops, pages and tails, strict `seq` and `ts`, and no
stored text that can break a page or pose as another line (issue 10: findings 3, 4, 11)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLimits, LogLine, LogStore
from moonrun.wiring.settings import PlatformConfig, build_platform
from tests.support.console_kit import Console, cheap_passwords, console
from tests.support.http_harness import Cast, SignedRun, http_world
from tests.support.stores import memory_factory

TS = "2026-11-30T00:00:00.000Z"


def lines(seq: int, *texts: str) -> list[LogLine]:
    return [LogLine(seq, TS, "stdout", text) for text in texts]


def texts(store: LogStore, job_id: str = "job", attempt: int = 1) -> list[str]:
    return [line.text for line in store.read(job_id, attempt, -1).lines]


MakeStore = Callable[..., LogStore]


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    """Each store-level test runs against both log stores: they keep the same bounds."""
    if request.param == "memory":
        return MemoryLogStore
    return lambda **limits: FileLogStore(tmp_path / "logs", **limits)


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


@pytest.fixture
def con(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    cheap_passwords(monkeypatch)
    with console(memory_factory(), tmp_path) as built:
        yield built


def running(cast: Cast) -> tuple[SignedRun, str, int]:
    run = cast.run.start()
    job = cast.world.submit(cast.server_id, cast.owner[1])
    return run, job["id"], run.run_to_running(job["id"])


def log_batch(run: SignedRun, job_id: str, attempt: int, seq: Any, **line: Any) -> Any:
    sent = {"ts": TS, "stream": "stdout", "text": "x", **line}
    body = {"job_id": job_id, **run.evidence(job_id, attempt), "seq": seq, "lines": [sent]}
    return run.post("/run/v1/logs", body)


# -- the store's bounds ------------------------------------------------------------------------


def test_a_line_over_the_line_cap_is_cut_with_a_marker_naming_the_bytes_cut(
    make_store: MakeStore,
) -> None:
    """Beyond `line_bytes` a line keeps its head (never half a character) and says how much
    went; shorter lines are kept whole."""
    store = make_store(line_bytes=10)
    store.append("job", 1, 1, lines(1, "0123456789", "0123456789abc", "ééééééé"))
    assert texts(store) == [
        "0123456789",
        "0123456789… [truncated 3 bytes]",
        "ééééé… [truncated 4 bytes]",
    ]


def test_an_attempt_over_its_byte_cap_drops_its_oldest_lines_and_counts_them(
    make_store: MakeStore,
) -> None:
    """An attempt keeps its newest lines within `attempt_bytes`; the reader learns how many
    lines and bytes went."""
    store = make_store(attempt_bytes=10)
    store.append("job", 1, 1, lines(1, "aaaa", "bbbb"))
    store.append("job", 1, 2, lines(2, "cccc"))
    page = store.read("job", 1, -1)
    assert (
        [line.text for line in page.lines],
        page.dropped_lines,
        page.dropped_bytes,
    ) == (["bbbb", "cccc"], 1, 4)


def test_an_attempt_over_its_line_cap_drops_its_oldest_lines_and_counts_them(
    make_store: MakeStore,
) -> None:
    """`attempt_lines` bounds an attempt of many small lines the same way."""
    store = make_store(attempt_lines=2)
    store.append("job", 1, 1, lines(1, "a", "b", "c"))
    page = store.read("job", 1, -1)
    assert (
        [ln.text for ln in page.lines],
        page.dropped_lines,
        page.dropped_bytes,
    ) == (["b", "c"], 1, 1)


def test_a_batch_already_dropped_is_not_stored_again_when_resent(make_store: MakeStore) -> None:
    """Idempotency per seq outlives the lines: a resent old batch does not come back."""
    store = make_store(attempt_lines=1)
    store.append("job", 1, 1, lines(1, "old"))
    store.append("job", 1, 2, lines(2, "new"))
    assert store.append("job", 1, 1, lines(1, "old")) == 2
    assert texts(store) == ["new"]


def test_the_store_wide_cap_evicts_the_least_recently_written_attempts_first(
    make_store: MakeStore,
) -> None:
    """Over `total_bytes`, the oldest lines of the attempt written longest ago go first, and
    that attempt counts them."""
    store = make_store(total_bytes=3 * (100 + 4))  # three 4-byte lines and their records
    store.append("old", 1, 1, lines(1, "o1..", "o2.."))
    store.append("new", 1, 1, lines(1, "n1..", "n2.."))
    old = store.read("old", 1, -1)
    assert ([ln.text for ln in old.lines], old.dropped_lines, old.dropped_bytes) == (["o2.."], 1, 4)
    assert texts(store, "new") == ["n1..", "n2.."]


def test_a_lone_surrogate_reaching_the_store_is_kept_as_a_replacement_character(
    make_store: MakeStore,
) -> None:
    """The store never holds text that cannot be encoded, whoever calls it."""
    store = make_store()
    store.append("job", 1, 1, lines(1, "a\ud800b", "\udc00"))
    assert texts(store) == ["a\ufffdb", "\ufffd"]


def test_pages_follow_batch_seq_and_end_on_a_batch(make_store: MakeStore) -> None:
    """A page holds whole batches in seq order (whatever order they came in) up to `limit`
    lines, at least one batch; `next_after_seq` continues it."""
    store = make_store()
    store.append("job", 1, 3, lines(3, "c1"))
    store.append("job", 1, 1, lines(1, "a1", "a2"))
    store.append("job", 1, 2, lines(2, "b1", "b2", "b3"))
    first = store.read("job", 1, -1, limit=4)
    second = store.read("job", 1, first.next_after_seq, limit=3)
    last = store.read("job", 1, second.next_after_seq, limit=1)
    seen = [([ln.text for ln in p.lines], p.next_after_seq, p.more) for p in (first, second, last)]
    assert seen == [(["a1", "a2"], 1, True), (["b1", "b2", "b3"], 2, True), (["c1"], 3, False)]


def test_a_tail_answers_the_last_lines_and_where_to_follow_from(make_store: MakeStore) -> None:
    """`tail` is the newest lines, across batches, with the seq to follow after."""
    store = make_store()
    store.append("job", 1, 1, lines(1, "a1", "a2"))
    store.append("job", 1, 2, lines(2, "b1", "b2"))
    tail = store.tail("job", 1, 3)
    assert ([ln.text for ln in tail.lines], tail.next_after_seq) == (["a2", "b1", "b2"], 2)


def test_the_platforms_log_store_takes_its_bounds_from_the_configuration(tmp_path: Path) -> None:
    """`LogLimits` (the `--log-*` settings) reach the log store the platform is built with."""
    config = PlatformConfig(
        store_url="memory://",
        secret_file=tmp_path / "platform.secret",
        data_dir=tmp_path,
        logs=LogLimits(line_bytes=4, attempt_bytes=8),
    )
    platform = build_platform(config)
    try:
        platform.logs.append("job", 1, 1, lines(1, "abcdef", "gh", "ij"))
        page = platform.logs.read("job", 1, -1)
    finally:
        platform.close()
        platform.release()
    assert ([ln.text for ln in page.lines], page.dropped_lines) == (["gh", "ij"], 1)


# -- on disk ---------------------------------------------------------------------------------


def pages(store: LogStore, job_id: str = "job", attempt: int = 1) -> tuple[Any, ...]:
    page, tail = store.read(job_id, attempt, -1), store.tail(job_id, attempt, 2)
    return (page.lines, page.dropped_lines, page.dropped_bytes, tail.lines, tail.next_after_seq)


def test_a_file_log_store_opened_again_holds_every_line_seq_and_dropped_count(
    tmp_path: Path,
) -> None:
    """What a FileLogStore acknowledged is all there when it is opened again on its directory:
    the same lines under the same seqs, the same dropped counts and the same seq-once."""
    first = FileLogStore(tmp_path, attempt_lines=3, total_bytes=5 * (100 + 2))
    first.append("job", 1, 2, lines(2, "b1", "b2"))
    first.append("job", 1, 1, lines(1, "a1", "a2"))
    first.append("job", 1, 3, lines(3, "c1", "c2"))
    first.append("job", 1, 4, [])
    first.append("other", 2, 1, lines(1, *[f"o{n}" for n in range(8)]))
    again = FileLogStore(tmp_path, attempt_lines=3, total_bytes=5 * (100 + 2))
    assert [pages(again), pages(again, "other", 2)] == [pages(first), pages(first, "other", 2)]
    assert (again.attempts("job"), again.append("job", 1, 1, lines(1, "again"))) == ([1], 4)
    assert pages(again) == pages(first)


def test_a_file_log_store_rewrites_a_growing_file_to_its_kept_lines(tmp_path: Path) -> None:
    """An attempt's file stays near what the attempt keeps, and reads back the same."""
    store = FileLogStore(tmp_path, attempt_lines=10)
    for seq in range(1, 2001):
        store.append("job", 1, seq, lines(seq, f"line {seq:04d} " + "x" * 100))
    again = FileLogStore(tmp_path, attempt_lines=10)
    assert (tmp_path / "job" / "1.jsonl").stat().st_size < 200_000
    assert pages(again) == pages(store)
    assert pages(again)[1] == 1990


def test_a_file_log_store_written_from_many_threads_reads_back_the_same(tmp_path: Path) -> None:
    """Appends to several attempts at once (as the logs channel's threads make them) are all
    on disk, each attempt's in seq order, with the same drops."""
    store = FileLogStore(tmp_path, attempt_lines=50)

    def write(attempt: int) -> None:
        for seq in range(1, 41):
            store.append(
                "job", attempt, seq, lines(seq, f"{attempt}.{seq}.a", f"{attempt}.{seq}.b")
            )

    threads = [threading.Thread(target=write, args=(attempt,)) for attempt in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    again = FileLogStore(tmp_path, attempt_lines=50)
    assert [pages(again, "job", n) for n in range(1, 9)] == [
        pages(store, "job", n) for n in range(1, 9)
    ]
    assert (pages(again, "job", 8)[1], texts(again, "job", 8)[-1]) == (30, "8.40.b")


def test_a_record_cut_short_by_a_crash_is_cut_off_and_the_file_goes_on(tmp_path: Path) -> None:
    """A half-written last record (never acknowledged) is ignored and the next batch is kept."""
    FileLogStore(tmp_path).append("job", 1, 1, lines(1, "whole"))
    with open(tmp_path / "job" / "1.jsonl", "ab") as handle:
        handle.write(b'{"seq":2,"lines":[["2026')
    store = FileLogStore(tmp_path)
    store.append("job", 1, 3, lines(3, "after"))
    assert texts(FileLogStore(tmp_path)) == ["whole", "after"]


def test_log_files_are_0600_in_0700_directories(tmp_path: Path) -> None:
    """Job output is nobody else's to read, whatever the umask."""
    FileLogStore(tmp_path / "logs").append("job", 1, 1, lines(1, "secret"))
    modes = [
        (tmp_path / "logs").stat().st_mode & 0o777,
        (tmp_path / "logs" / "job").stat().st_mode & 0o777,
        (tmp_path / "logs" / "job" / "1.jsonl").stat().st_mode & 0o777,
    ]
    assert modes == [0o700, 0o700, 0o600]


def test_a_platform_with_a_durable_store_keeps_its_logs_under_its_data_dir(
    tmp_path: Path,
) -> None:
    """Beside a file store the platform's logs are a FileLogStore under `<data dir>/logs`."""
    config = PlatformConfig(
        store_url=f"file://{tmp_path / 'store.db'}",
        secret_file=tmp_path / "platform.secret",
        data_dir=tmp_path / "data",
    )
    platform = build_platform(config)
    try:
        platform.logs.append("job", 1, 1, lines(1, "kept"))
    finally:
        platform.close()
        platform.release()
    assert texts(FileLogStore(tmp_path / "data" / "logs")) == ["kept"]


# -- over HTTP ---------------------------------------------------------------------------------


def test_a_million_character_line_is_accepted_cut_and_its_batch_kept(cast: Cast) -> None:
    """A 1,000,000-character line is 202; it is stored cut to 16 KiB with its marker, and the
    batch's other lines are kept whole."""
    run, job_id, attempt = running(cast)
    assert run.send_logs(job_id, attempt, 1, "x" * 1_000_000, "after").status_code == 202
    answer = cast.world.api("GET", f"/api/v1/jobs/{job_id}/logs", token=cast.owner[1]).json()
    cut, after = (line["text"] for line in answer["lines"])
    assert (cut, after) == ("x" * 16_384 + "… [truncated 983616 bytes]", "after")


def test_the_logs_api_answers_pages_tails_and_dropped_counts(cast: Cast) -> None:
    """`limit` pages by batch with `next_after_seq`, `tail=N` answers the last N lines, and
    both say what the attempt dropped."""
    run, job_id, attempt = running(cast)
    for seq in (1, 2, 3):
        assert run.send_logs(job_id, attempt, seq, f"line {seq}").status_code == 202
    path, token = f"/api/v1/jobs/{job_id}/logs", cast.owner[1]
    page = cast.world.api("GET", f"{path}?limit=2", token=token).json()
    rest = cast.world.api("GET", f"{path}?after_seq={page['next_after_seq']}", token=token).json()
    tail = cast.world.api("GET", f"{path}?tail=1", token=token).json()
    summary = [
        ([ln["text"] for ln in a["lines"]], a["next_after_seq"], a["more"], a["dropped_lines"])
        for a in (page, rest, tail)
    ]
    assert summary == [
        (["line 1", "line 2"], 2, True, 0),
        (["line 3"], 3, False, 0),
        (["line 3"], 3, False, 0),
    ]


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "tail=0", "tail=x", "after_seq=-2"])
def test_a_logs_query_out_of_range_is_invalid_request(cast: Cast, query: str) -> None:
    """Page sizes are 1-1000 lines; anything else is 422, never a crash."""
    _, job_id, _ = running(cast)
    path = f"/api/v1/jobs/{job_id}/logs?{query}"
    answer = cast.world.api("GET", path, token=cast.owner[1])
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")


@pytest.mark.parametrize("seq", [-1, 2**63, 2**64, -(2**63)])
def test_a_log_seq_outside_0_to_2_63_minus_1_is_invalid_request(cast: Cast, seq: int) -> None:
    """A batch seq must fit 0..2^63-1; nothing is stored otherwise."""
    run, job_id, attempt = running(cast)
    answer = log_batch(run, job_id, attempt, seq)
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")
    assert cast.world.platform.logs.attempts(job_id) == []


def test_the_largest_log_seq_is_accepted(cast: Cast) -> None:
    """2^63-1 is a batch seq like any other."""
    run, job_id, attempt = running(cast)
    answer = log_batch(run, job_id, attempt, 2**63 - 1)
    assert (answer.status_code, answer.json()["accepted_through_seq"]) == (202, 2**63 - 1)


@pytest.mark.parametrize(
    "ts",
    [
        "yesterday",
        "",
        "2026-11-30",
        "2026-11-30 00:00:00Z",
        "2026-13-30T00:00:00Z",
        "٢٠٢٦-11-30T00:00:00Z",
    ],
)
def test_a_log_ts_that_is_not_rfc_3339_is_invalid_request(cast: Cast, ts: str) -> None:
    """A line's `ts` is an RFC 3339 timestamp; anything else refuses the batch."""
    run, job_id, attempt = running(cast)
    answer = log_batch(run, job_id, attempt, 1, ts=ts)
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")
    assert "ts" in answer.json()["error"]["message"]


# -- the console -------------------------------------------------------------------------------


def test_a_stored_lone_surrogate_breaks_neither_the_api_nor_the_console(con: Console) -> None:
    """Whatever reached the log store, the logs API and the job page answer 200."""
    job_id = con.submit()
    con.world.platform.logs.append(job_id, 1, 1, lines(1, "bad \ud800 byte"))
    api = con.world.api("GET", f"/api/v1/jobs/{job_id}/logs", token=con.token("olive"))
    page = con.client("olive").get(f"/jobs/{job_id}")
    assert (
        api.status_code,
        api.json()["lines"][0]["text"],
        page.status_code,
    ) == (200, "bad \ufffd byte", 200)


def test_the_job_page_stays_small_when_a_run_sends_huge_logs(con: Console) -> None:
    """Megabytes of log lines give a job page (and its live fragment) of bounded size, which
    shows the newest line and leads to the rest."""
    job_id = con.submit()
    run = con.run.start()
    attempt = run.run_to_running(job_id)
    for seq in range(1, 11):
        line = f"{seq:04d}" + "<" * 999_000
        assert run.send_logs(job_id, attempt, seq, line).status_code == 202
    assert (
        run.send_logs(job_id, attempt, 11, *[f"short {n}" for n in range(500)]).status_code == 202
    )
    client = con.client("olive")
    page, fragment = client.get(f"/jobs/{job_id}"), client.get(f"/jobs/{job_id}?fragment=1")
    assert (page.status_code, fragment.status_code) == (200, 200)
    assert len(page.text) < 400_000
    assert len(fragment.text) < 400_000
    assert "short 499" in fragment.text
    assert f"/api/v1/jobs/{job_id}/logs?attempt={attempt}" in fragment.text


def test_controls_and_bidi_overrides_show_escaped_in_the_console_and_intact_in_the_api(
    con: Console,
) -> None:
    """ESC, CR/LF, C1 controls and bidi overrides are drawn as visible escapes, so one line
    cannot pose as another; the API returns the stored text as sent."""
    hostile = "ok\x1b[31mred\u202eevil\r\nfake line\x85\u2066x\x7f\tend"
    job_id = con.submit()
    run = con.run.start()
    attempt = run.run_to_running(job_id)
    assert run.send_logs(job_id, attempt, 1, hostile).status_code == 202
    page = con.client("olive").get(f"/jobs/{job_id}").text
    logs = page[page.index('<pre class="logs">') : page.index("</pre>", page.index('class="logs"'))]
    raw = [c for c in "\x1b\u202e\r\x85\u2066\x7f" if c in logs]
    assert raw == []
    assert "\n" not in logs.removesuffix("\n")
    shown = ["ok", "\\x1b", "[31mred", "\\u202e", "evil", "\\r\\n", "fake line", "\\x85", "\\u2066"]
    assert [text for text in shown if text not in logs] == []
    assert 'class="ctl"' in logs
    api = con.world.api("GET", f"/api/v1/jobs/{job_id}/logs", token=con.token("olive")).json()
    assert api["lines"][0]["text"] == hostile
