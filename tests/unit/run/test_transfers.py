"""Run's transfers on their own (run/transfers.py): the log shipper's buffers, batches, seqs and
errors, and the artifact uploader's queue and chunks, against a fake platform client
(tests/support/run_kit.py; docs/protocol.md, "Logs", "Artifacts")."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from moonrun.errors import (
    ChannelBusy,
    InvalidRequest,
    LeaseExpired,
    MoonrunError,
    NotActive,
    SessionExpired,
    SessionRotated,
    StaleAttempt,
    WrongEndpoint,
)
from moonrun.http.platform import HttpSettings
from moonrun.run import transfers
from moonrun.run.client import Unreachable
from moonrun.run.transfers import CHUNK_BYTES, ArtifactUploader, Attempt, LogShipper
from tests.support.run_kit import (
    HANG_GUARD_S,
    FakeRunClient,
)

T0_MS = 1_795_000_000_000
LEASE = "mrl_" + "l" * 43


# -- transfers: logs ----------------------------------------------------------------------------

ATTEMPT = Attempt("job_1", 1, LEASE)
OTHER_ATTEMPT = Attempt("job_2", 3, LEASE)


def shipper(client: Any, **options: Any) -> LogShipper:
    """A shipper whose clock stands still: its seqs count 1, 2, 3... over all attempts."""
    return LogShipper(client, **{"clock_us": lambda: 0, **options})


def add_lines(logs: LogShipper, attempt: Attempt, *texts: str) -> None:
    for text in texts:
        logs.add(attempt, "stdout", text)


@pytest.mark.anyio
async def test_a_full_log_buffer_drops_its_oldest_lines_and_counts_them() -> None:
    """Capacity 3, five lines added: the two oldest are dropped, counted and said in the logs,
    never blocking."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client, capacity=3)
    add_lines(logs, ATTEMPT, "l1", "l2", "l3", "l4", "l5")

    await logs.flush()

    assert logs.dropped == 2
    note = "[moonrun: 2 earlier line(s) dropped: output outran log shipping]"
    assert client.log_calls == [("job_1", 1, 1, [note, "l3", "l4", "l5"])]
    assert logs.shipped == 4


@pytest.mark.anyio
async def test_a_loud_attempt_never_pushes_out_a_quiet_attempts_lines() -> None:
    """Buffers full of one attempt's flood: lines go from that attempt, never from another's."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client, capacity=10)
    logs.add(OTHER_ATTEMPT, "stdout", "quiet")
    add_lines(logs, ATTEMPT, *[f"loud-{n}" for n in range(100)])

    await logs.flush()

    delivered = {job: texts for job, _, _, texts in client.log_calls}
    assert delivered["job_2"] == ["quiet"]
    assert delivered["job_1"][1:] == [f"loud-{n}" for n in range(91, 100)]
    assert logs.dropped == 91


@pytest.mark.anyio
async def test_every_attempt_gets_a_batch_in_each_flush_however_much_another_has() -> None:
    """An attempt with thousands of lines waiting does not hold back another's one line."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client, batch_lines=500)
    add_lines(logs, ATTEMPT, *[f"loud-{n}" for n in range(1_500)])
    logs.add(OTHER_ATTEMPT, "stdout", "quiet")

    await logs.flush()

    sent = [(job, len(texts)) for job, _, _, texts in client.log_calls]
    assert sent == [("job_1", 500), ("job_2", 1)]


@pytest.mark.anyio
async def test_one_attempts_buffer_is_bounded_in_bytes_as_well_as_lines() -> None:
    """Long lines fill an attempt's byte bound before its line bound: the oldest go."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client, attempt_capacity_bytes=100_000)
    add_lines(logs, ATTEMPT, *[f"{n:02d}" + "x" * 9_998 for n in range(20)])

    await logs.flush()

    (*_, texts), *_ = client.log_calls
    assert [text[:2] for text in texts[1:]] == [f"{n:02d}" for n in range(11, 20)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error", [Unreachable(), ChannelBusy(), SessionRotated(), SessionExpired()], ids=repr
)
async def test_a_transient_log_error_keeps_the_lines_in_order(error: MoonrunError) -> None:
    """The platform unreachable (or busy, or a session renewing): lines stay, and go next time."""
    client = FakeRunClient(lease=LEASE)
    client.errors = [error]
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a", "b", "c")

    await logs.flush()
    assert (logs.shipped, logs.dropped) == (0, 0)
    await logs.flush()

    assert [texts for *_, texts in client.log_calls] == [["a", "b", "c"], ["a", "b", "c"]]
    assert (logs.shipped, logs.dropped) == (3, 0)


@pytest.mark.anyio
async def test_a_transient_log_error_keeps_each_attempts_lines_in_order() -> None:
    """Lines of two attempts put back after a failure keep their order per attempt."""
    client = FakeRunClient(lease=LEASE)
    client.errors = [Unreachable(), Unreachable()]
    logs = shipper(client)
    logs.add(ATTEMPT, "stdout", "a1")
    logs.add(OTHER_ATTEMPT, "stderr", "b1")
    logs.add(ATTEMPT, "stdout", "a2")
    logs.add(OTHER_ATTEMPT, "stderr", "b2")

    await logs.flush()
    await logs.flush()

    delivered = {job: texts for job, _, _, texts in client.log_calls[2:]}
    assert delivered == {"job_1": ["a1", "a2"], "job_2": ["b1", "b2"]}


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error", [NotActive(), LeaseExpired(), StaleAttempt(), WrongEndpoint()], ids=repr
)
async def test_a_permanent_log_error_drops_the_attempts_lines(error: MoonrunError) -> None:
    """The attempt is over for good: its lines are dropped (counted), not retried forever."""
    client = FakeRunClient(lease=LEASE)
    client.errors = [error]
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a", "b", "c")

    await logs.flush()
    await logs.flush()

    assert len(client.log_calls) == 1
    assert (logs.shipped, logs.dropped) == (0, 3)


@pytest.mark.anyio
async def test_log_batches_stay_below_the_platforms_log_body_limit() -> None:
    """Long lines go in several batches, each well below the 1 MiB the platform accepts, and
    every line is shipped once."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client, attempt_capacity_bytes=64 * 1024 * 1024)
    add_lines(logs, ATTEMPT, *[f"{n:03d}" + "\x01" * 20_000 for n in range(100)])

    while logs.shipped < 100 and len(client.log_calls) < 100:
        await logs.flush()

    sizes = [len(json.dumps(texts)) for *_, texts in client.log_calls]
    assert [size for size in sizes if size > 800 * 1024] == []
    shipped = [text[:3] for *_, texts in client.log_calls for text in texts]
    assert shipped == [f"{n:03d}" for n in range(100)]


@pytest.mark.anyio
async def test_log_batch_seqs_increase_per_attempt() -> None:
    """Each attempt's batches have increasing seqs, from one count over every attempt (so
    the shipper keeps nothing per attempt once its lines are sent)."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client)

    add_lines(logs, ATTEMPT, "a")
    await logs.flush()
    add_lines(logs, ATTEMPT, "b")
    add_lines(logs, OTHER_ATTEMPT, "x")
    await logs.flush()
    add_lines(logs, ATTEMPT, "c")
    await logs.flush()

    seqs = [(job, seq, texts) for job, _, seq, texts in client.log_calls]
    assert seqs == [
        ("job_1", 1, ["a"]),
        ("job_1", 2, ["b"]),
        ("job_2", 1, ["x"]),
        ("job_1", 4, ["c"]),
    ]
    assert (logs._buffers, logs._pending) == ({}, {})


@pytest.mark.anyio
async def test_a_log_batch_holds_at_most_batch_lines() -> None:
    """batch_lines=2 and five lines: three batches of 2, 2, 1, in order."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client, batch_lines=2)
    add_lines(logs, ATTEMPT, "1", "2", "3", "4", "5")

    for _ in range(3):
        await logs.flush()

    assert [(seq, texts) for *_, seq, texts in client.log_calls] == [
        (1, ["1", "2"]),
        (2, ["3", "4"]),
        (3, ["5"]),
    ]


@pytest.mark.anyio
async def test_a_log_batch_of_long_lines_fits_the_platforms_logs_body_limit() -> None:
    """200 lines of 16 KiB (3 MiB): batches stay within the logs channel's body limit, and
    every line goes, in order."""
    client = FakeRunClient(lease=LEASE)
    logs = shipper(client)
    texts = [f"{number:03d}" + "x" * (16 * 1024 - 3) for number in range(200)]
    add_lines(logs, ATTEMPT, *texts)

    for _ in range(len(texts)):
        await logs.flush()

    batches = [batch for *_, batch in client.log_calls]
    limit = HttpSettings().log_body_limit
    assert [len(json.dumps(batch)) < limit for batch in batches] == [True] * len(batches)
    assert [text for batch in batches for text in batch] == texts


@pytest.mark.anyio
async def test_logs_wait_for_a_session() -> None:
    """Before the first registration nothing is sent and nothing is lost."""
    client = FakeRunClient(lease=LEASE)
    client.session = None
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a")

    await logs.flush()
    client.session = object()
    await logs.flush()

    assert [texts for *_, texts in client.log_calls] == [["a"]]


class IdempotentLogs(FakeRunClient):
    """Stores batches like the platform (once per attempt and seq, later repeats ignored); the
    first answer is lost on the way back, as when a response times out."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: dict[tuple[str, int], dict[int, list[str]]] = {}
        self.lose_answers = 1

    async def send_logs(
        self, job_id: str, attempt: int, lease: str, seq: int, lines: list[dict[str, str]]
    ) -> Any:
        batches = self.stored.setdefault((job_id, attempt), {})
        batches.setdefault(seq, [line["text"] for line in lines])
        if self.lose_answers:
            self.lose_answers -= 1
            raise Unreachable("logs: TimeoutError")
        return {"accepted_through_seq": max(batches)}

    def lines_of(self, job_id: str, attempt: int) -> list[str]:
        batches = self.stored.get((job_id, attempt), {})
        return [text for seq in sorted(batches) for text in batches[seq]]


@pytest.mark.anyio
async def test_log_lines_survive_a_lost_answer_to_a_delivered_batch() -> None:
    """A batch stored but answered with a timeout is retried; lines added meanwhile still land.

    The platform keeps the first batch per (job, attempt, seq) and answers repeats as before
    (docs/protocol.md, "Sending logs"), so a retry under the same seq must carry the same lines.
    """
    client = IdempotentLogs()
    logs = shipper(client)
    add_lines(logs, ATTEMPT, "a", "b")
    await logs.flush()  # stored by the platform, but Run sees Unreachable

    add_lines(logs, ATTEMPT, "c")
    await logs.flush()
    await logs.flush()

    assert client.lines_of("job_1", 1) == ["a", "b", "c"]


# -- transfers: artifacts -------------------------------------------------------------------


def test_adding_an_artifact_never_blocks_and_drops_beyond_the_queue() -> None:
    """queue_size=2 and three files: the third is dropped and counted at once."""
    uploader = ArtifactUploader(FakeRunClient(lease=LEASE), queue_size=2)

    for name in ("a", "b", "c"):
        uploader.add(ATTEMPT, f"/tmp/{name}", name)

    assert uploader.dropped == 1


async def run_uploader(uploader: ArtifactUploader, done: Callable[[], bool]) -> None:
    """Run the uploader until `done()`, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(uploader.run(stop))
    deadline = time.monotonic() + HANG_GUARD_S
    while not done():
        assert time.monotonic() < deadline, "the uploader did not finish"
        assert not task.done(), "the uploader stopped on its own"
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD_S)


@pytest.mark.anyio
async def test_a_large_artifact_uploads_in_ordered_chunks_final_last(tmp_path: Path) -> None:
    """A file of two chunks and a bit: chunks 0, 1, 2 in order, final only on the last."""
    data = os.urandom(2 * CHUNK_BYTES + 10)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    client = FakeRunClient(lease=LEASE)
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "big.bin")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped > 0)

    assert [
        (job, attempt, name, index, final)
        for job, attempt, name, index, _, final in client.chunk_calls
    ] == [
        ("job_1", 1, "big.bin", 0, False),
        ("job_1", 1, "big.bin", 1, False),
        ("job_1", 1, "big.bin", 2, True),
    ]
    assert [len(call[4]) for call in client.chunk_calls] == [CHUNK_BYTES, CHUNK_BYTES, 10]
    assert b"".join(call[4] for call in client.chunk_calls) == data
    assert (uploader.uploaded, uploader.dropped) == (1, 0)


@pytest.mark.anyio
async def test_an_empty_artifact_is_one_final_chunk(tmp_path: Path) -> None:
    """An empty file still arrives: one empty chunk 0 marked final."""
    path = tmp_path / "empty"
    path.write_bytes(b"")
    client = FakeRunClient(lease=LEASE)
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "empty")
    await run_uploader(uploader, lambda: uploader.uploaded > 0)

    assert [call[3:] for call in client.chunk_calls] == [(0, b"", True)]


@pytest.mark.anyio
async def test_an_artifact_chunk_is_retried_after_a_transient_error(tmp_path: Path) -> None:
    """Unreachable on a chunk: the same chunk is sent again, and the upload completes."""
    path = tmp_path / "small"
    path.write_bytes(b"hello")
    client = FakeRunClient(lease=LEASE)
    client.errors = [Unreachable()]
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "small")
    await run_uploader(uploader, lambda: uploader.uploaded > 0)

    assert [call[3:] for call in client.chunk_calls] == [(0, b"hello", True), (0, b"hello", True)]


@pytest.mark.anyio
async def test_an_artifact_refused_for_good_or_unreadable_is_dropped(tmp_path: Path) -> None:
    """not_active for a chunk, or a file that cannot be read: dropped and counted; Run goes on."""
    path = tmp_path / "small"
    path.write_bytes(b"hello")
    client = FakeRunClient(lease=LEASE)
    client.errors = [NotActive()]
    uploader = ArtifactUploader(client)

    uploader.add(ATTEMPT, str(path), "refused")
    uploader.add(ATTEMPT, str(tmp_path / "missing"), "missing")
    uploader.add(ATTEMPT, str(path), "fine")
    await run_uploader(uploader, lambda: uploader.uploaded + uploader.dropped == 3)

    assert (uploader.uploaded, uploader.dropped) == (1, 2)
    assert [call[2] for call in client.chunk_calls] == ["refused", "fine"]


@pytest.mark.anyio
async def test_an_artifact_whose_name_the_platform_refuses_says_so_in_its_jobs_logs(
    tmp_path: Path,
) -> None:
    """A name the platform refuses (422: a Run whose payload was never checked at submit):
    the artifact is dropped with a line in its job's stderr log saying why, not silently."""
    path = tmp_path / "out"
    path.write_bytes(b"hello")
    client = FakeRunClient(lease=LEASE)
    client.errors = [InvalidRequest("artifact name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    said: list[tuple[Attempt, str, str]] = []
    uploader = ArtifactUploader(client, job_log=lambda *line: said.append(line))

    uploader.add(ATTEMPT, str(path), "../evil")
    await run_uploader(uploader, lambda: uploader.dropped == 1)

    assert said == [
        (
            ATTEMPT,
            "stderr",
            "artifact ../evil not uploaded: artifact name must match "
            "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        )
    ]


@pytest.mark.anyio
async def test_a_restarted_log_shipper_never_reuses_a_seq() -> None:
    """Seqs start from the wall clock, so Run's successor sends above what was sent before."""
    sent: list[int] = []

    class Recorder(FakeRunClient):
        async def send_logs(
            self, job_id: str, attempt: int, lease: str, seq: int, lines: Any
        ) -> Any:
            sent.append(seq)
            return {"accepted_through_seq": seq}

    for started in (T0_MS * 1000, T0_MS * 1000 + 2_000_000):  # two Runs, 2 s apart, one attempt
        shipper = LogShipper(Recorder(), clock_us=lambda started=started: started)  # type: ignore[arg-type]
        for n in range(3):
            shipper.add(ATTEMPT, "stdout", f"line {n}")
            await shipper.flush()
    assert sorted(sent) == sent
    assert len(set(sent)) == len(sent)


@hypothesis.given(st.text())
def test_a_log_lines_size_is_the_length_of_its_json(text: str) -> None:
    """What the shipper counts for a line's text is exactly what JSON makes of it."""
    assert transfers._json_len(text) == len(json.dumps(text))
