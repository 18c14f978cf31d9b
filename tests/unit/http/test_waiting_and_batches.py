"""Long-poll claims, blocking reads and batches (docs/protocol.md, "Claims", "Acks", "Results",
"Jobs", "Blocking reads"), over HTTP.

Waiting requests are driven from threads against one TestClient (one event loop), so that a
second request can change what the first one waits for. Nothing here asserts a duration: a
wait that is woken is recognised by the watch's wake-up count and by its answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from moonrun.http.channels import Channels
from moonrun.service.config import WaitLimits
from moonrun.store.file import FileStore
from tests.support.http_harness import ADMIN_TOKEN, Cast, HttpWorld, http_world
from tests.support.stores import StoreFactory, file_factory, memory_factory

LONG_S = 30.0
"""Far longer than any of these tests should take: a wait that runs out has failed."""


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        cast.world.platform.watch.recheck_s = LONG_S  # only a wake-up can end a wait early
        yield cast


@pytest.fixture
def any_cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


@pytest.fixture
def client(cast: Cast) -> Iterator[TestClient]:
    """One event loop for every request of a test (the waiting one and the waking one)."""
    with TestClient(cast.world.app) as client:
        cast.world.client = client
        yield client


def in_background(work: Callable[[], Any]) -> Future[Any]:
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(work)
    pool.shutdown(wait=False)
    return future


def until_waiting(world: HttpWorld, count: int = 1) -> None:
    """Until `count` requests wait on the platform's watch."""
    for _ in range(10_000):
        if world.platform.watch.waiting >= count:
            return
        time.sleep(0.001)
    raise AssertionError("the request never started waiting")


def submit(cast: Cast, **body: Any) -> dict[str, Any]:
    return cast.world.submit(cast.server_id, cast.owner[1], **body)


# -- long-poll claims ----------------------------------------------------------------------------


def test_a_waiting_claim_is_answered_when_a_job_is_created(cast: Cast, client: TestClient) -> None:
    """An idle Run's long poll gets the job the moment it is created, not after its wait."""
    run = cast.run.start()
    waiting = in_background(lambda: run.post("/run/v1/jobs/claim", {"max_jobs": 1, "wait_s": 30}))
    until_waiting(cast.world)
    job = submit(cast)
    answer = waiting.result(timeout=LONG_S)
    assert (200, [job["id"]]) == (answer.status_code, [j["job_id"] for j in answer.json()["jobs"]])
    assert cast.world.platform.watch.wakeups >= 1


def test_a_waiting_claim_ends_empty_when_its_wait_runs_out(cast: Cast) -> None:
    """With nothing to claim, a long poll answers an empty list when `wait_s` has passed."""
    run = cast.run.start()
    answer = run.post("/run/v1/jobs/claim", {"max_jobs": 1, "wait_s": 0.05})
    assert (answer.status_code, answer.json()) == (200, {"jobs": []})


def test_a_claim_without_wait_answers_at_once(cast: Cast) -> None:
    """A Run that never long-polls is answered at once, as before (no request waits)."""
    run = cast.run.start()
    answer = run.post("/run/v1/jobs/claim", {"max_jobs": 1})
    assert (answer.json(), cast.world.platform.watch.waiting) == ({"jobs": []}, 0)


def test_a_waiting_claim_holds_no_place_on_the_jobs_channel(tmp_path: Path) -> None:
    """While a claim waits, the jobs channel's one place serves other messages."""
    with (
        http_world(memory_factory(), tmp_path, channels=Channels.with_limits(jobs=1)) as cast,
        TestClient(cast.world.app) as client,
    ):
        cast.world.client = client
        cast.world.platform.watch.recheck_s = LONG_S
        run = cast.run.start()
        job = submit(cast)
        (granted,) = run.claim(1)
        waiting = in_background(
            lambda: run.post("/run/v1/jobs/claim", {"max_jobs": 1, "wait_s": 30})
        )
        until_waiting(cast.world)
        # Registered as waiting a moment before it gives up its place: wait for that too.
        jobs_channel = cast.world.platform.channels.jobs
        for _ in range(10_000):
            if jobs_channel.in_flight == 0:
                break
            time.sleep(0.001)
        acked = run.ack(job["id"], granted["attempt"])
        submit(cast)
        assert (acked.status_code, len(waiting.result(timeout=LONG_S).json()["jobs"])) == (200, 1)


def test_a_waiting_claim_is_woken_when_capacity_frees(cast: Cast, client: TestClient) -> None:
    """At full capacity a long poll waits; a result that frees a place lets it claim."""
    run = cast.run.start(capacity=1)
    first, second = submit(cast), submit(cast)
    attempt = run.run_to_running(first["id"])
    waiting = in_background(lambda: run.post("/run/v1/jobs/claim", {"max_jobs": 1, "wait_s": 30}))
    until_waiting(cast.world)
    assert run.result(first["id"], attempt).status_code == 200
    claimed = [j["job_id"] for j in waiting.result(timeout=LONG_S).json()["jobs"]]
    assert [second["id"]] == claimed


# -- blocking reads ------------------------------------------------------------------------------


def test_a_job_read_carries_an_etag_that_changes_with_the_job(cast: Cast) -> None:
    """The tag stays while the job does not change and changes when it does."""
    run, world, token = cast.run.start(), cast.world, cast.owner[1]
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}"
    before, again = world.api("GET", path, token=token), world.api("GET", path, token=token)
    run.claim(1)
    after = world.api("GET", path, token=token)
    assert before.headers["ETag"] == again.headers["ETag"] != after.headers["ETag"]


def test_a_blocking_read_answers_when_the_job_changes(cast: Cast, client: TestClient) -> None:
    """With If-None-Match and wait_s, the read returns the changed job as soon as it changes."""
    run, world, token = cast.run.start(), cast.world, cast.owner[1]
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}"
    tag = world.api("GET", path, token=token).headers["ETag"]
    waiting = in_background(
        lambda: world.api("GET", f"{path}?wait_s=30", token=token, headers={"If-None-Match": tag})
    )
    until_waiting(world)
    run.claim(1)
    answer = waiting.result(timeout=LONG_S)
    assert (answer.status_code, answer.json()["state"]) == (200, "accepted")
    assert answer.headers["ETag"] != tag


def test_a_blocking_read_that_sees_no_change_is_not_modified(cast: Cast) -> None:
    """When the wait ends and the job still has the tag, the answer is 304 without a body."""
    world, token = cast.world, cast.owner[1]
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}"
    tag = world.api("GET", path, token=token).headers["ETag"]
    answer = world.api("GET", f"{path}?wait_s=0.05", token=token, headers={"If-None-Match": tag})
    assert (304, b"", tag) == (answer.status_code, answer.content, answer.headers["ETag"])


def test_a_blocking_read_until_terminal_skips_the_steps_between(
    cast: Cast, client: TestClient
) -> None:
    """`until=terminal` answers once, with the ended job, however many changes come first."""
    run, world, token = cast.run.start(), cast.world, cast.owner[1]
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}?wait_s=30&until=terminal"
    waiting = in_background(lambda: world.api("GET", path, token=token))
    until_waiting(world)
    attempt = run.run_to_running(job["id"])
    assert not waiting.done()
    run.result(job["id"], attempt)
    answer = waiting.result(timeout=LONG_S)
    assert (answer.status_code, answer.json()["state"]) == (200, "succeeded")


def test_a_blocking_read_needs_a_tag_or_until(cast: Cast) -> None:
    """`wait_s` alone does not say what to wait for: 422."""
    job = submit(cast)
    answer = cast.world.api("GET", f"/api/v1/jobs/{job['id']}?wait_s=1", token=cast.owner[1])
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")


def test_a_blocking_read_of_another_owners_job_is_forbidden(cast: Cast) -> None:
    """Waiting changes nothing about who may read: a stranger gets 403 at once."""
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}?wait_s=30&until=terminal"
    answer = cast.world.api("GET", path, token=cast.stranger[1])
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")


def test_a_waiting_read_is_dropped_the_moment_its_client_disconnects(cast: Cast) -> None:
    """A blocking read whose connection closed stops waiting at once: nothing waits for it
    and no room holds its place (4,200 reads sent and closed once held every place)."""
    world, token = cast.world, cast.owner[1]
    job = submit(cast)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/api/v1/jobs/{job['id']}",
        "raw_path": f"/api/v1/jobs/{job['id']}".encode(),
        "query_string": b"wait_s=60&until=terminal",
        "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("198.51.100.4", 50000),
        "server": ("testserver", 80),
    }

    async def scenario() -> tuple[int, int]:
        closed = asyncio.Event()
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await closed.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        answering = asyncio.ensure_future(world.app(scope, receive, send))
        for _ in range(10_000):
            if world.platform.watch.waiting:
                break
            await asyncio.sleep(0.001)
        waited = world.platform.watch.waiting
        closed.set()
        # Turns of the event loop, no timer: enough for a channel thread the request may be
        # on to finish on a loaded machine, far too few for the wait's recheck to come.
        for _ in range(10_000):
            if answering.done():
                break
            await asyncio.sleep(0)
        left = world.platform.watch.waiting
        answering.cancel()
        return waited, left

    assert asyncio.run(scenario()) == (1, 0)


def test_one_users_waiting_reads_are_bounded_apart_from_other_users_and_runs(
    cast: Cast, client: TestClient
) -> None:
    """Past a user's bound, that user's next blocking read is 429 `too_many_waiting` at once;
    another user's read and a Run's claim still wait, and are answered."""
    world, owner, helper = cast.world, cast.owner[1], cast.helper[1]
    world.platform.watch.limits = WaitLimits(reads_per_user=2)
    run, other_run = cast.run.start(), cast.other_run.start()
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}?wait_s=30&until=terminal"
    waits = [in_background(lambda: world.api("GET", path, token=owner)) for _ in range(2)]
    until_waiting(world, 2)
    refused = world.api("GET", path.replace("wait_s=30", "wait_s=5"), token=owner)
    assert (
        refused.status_code,
        refused.json()["error"]["code"],
        refused.headers["Retry-After"],
    ) == (429, "too_many_waiting", "1")
    waits.append(in_background(lambda: world.api("GET", path, token=helper)))
    claim = in_background(
        lambda: other_run.post("/run/v1/jobs/claim", {"max_jobs": 1, "wait_s": 30})
    )
    until_waiting(world, 4)
    attempt = run.run_to_running(job["id"])
    run.result(job["id"], attempt)
    assert [w.result(timeout=LONG_S).json()["state"] for w in waits] == ["succeeded"] * 3
    created = world.submit(cast.other_server_id, cast.stranger[1])
    assert [j["job_id"] for j in claim.result(timeout=LONG_S).json()["jobs"]] == [created["id"]]


def test_a_reader_who_loses_access_while_waiting_is_refused_when_the_job_ends(
    cast: Cast, client: TestClient
) -> None:
    """The change that ends a wait is read again as the reader, with access checked: a
    server administrator removed meanwhile gets 403, not the job."""
    world, owner, helper = cast.world, cast.owner, cast.helper
    run = cast.run.start()
    job = submit(cast)
    path = f"/api/v1/jobs/{job['id']}?wait_s=30&until=terminal"
    waiting = in_background(lambda: world.api("GET", path, token=helper[1]))
    until_waiting(world)
    removed = world.api(
        "DELETE", f"/api/v1/servers/{cast.server_id}/admins/{helper[0]}", token=owner[1]
    )
    assert removed.status_code == 200
    attempt = run.run_to_running(job["id"])
    run.result(job["id"], attempt)
    answer = waiting.result(timeout=LONG_S)
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")


# -- batches -------------------------------------------------------------------------------------


def test_batched_acks_answer_each_entry_as_its_single_ack_would(any_cast: Cast) -> None:
    """Every entry gets its own status and answer; a refused entry changes nothing else."""
    run = any_cast.run.start(capacity=8)
    jobs = [submit(any_cast) for _ in range(3)]
    granted = run.claim(3)
    entries = [run.entry(g["job_id"], g["attempt"]) for g in granted]
    entries[1] = {**entries[1], "lease": "mrl_wrong"}
    answers = run.post("/run/v1/jobs/acks", {"acks": entries}).json()["answers"]
    statuses = [(a["job_id"], a["status"], a.get("error", {}).get("code")) for a in answers]
    expected = [(e["job_id"], 200, None) for e in entries]
    expected[1] = (entries[1]["job_id"], 409, "lease_mismatch")
    assert expected == statuses
    states = [any_cast.world.stored(e["job_id"]).state.value for e in entries]
    assert states == ["running", "accepted", "running"]
    assert len(jobs) == len(answers)


def test_batched_results_answer_each_entry_as_its_single_result_would(any_cast: Cast) -> None:
    """Results in one request: each recorded (or refused) on its own, replays answered again."""
    run = any_cast.run.start(capacity=8)
    for _ in range(2):
        submit(any_cast)
    granted = run.claim(2)
    for g in granted:
        run.ack(g["job_id"], g["attempt"])
    results = [
        {**run.entry(g["job_id"], g["attempt"]), "outcome": "succeeded", "retryable": False}
        for g in granted
    ]
    results[1]["outcome"] = "exploded"
    first = run.post("/run/v1/jobs/results", {"results": results}).json()["answers"]
    again = run.post("/run/v1/jobs/results", {"results": results[:1]}).json()["answers"]
    assert [
        (a["status"], a["answer"]["state"] if a["status"] == 200 else a["error"]["code"])
        for a in first
    ] == [(200, "succeeded"), (422, "invalid_request")]
    assert (True, first[0]["answer"]["fingerprint"]) == (
        again[0]["answer"]["replayed"],
        again[0]["answer"]["fingerprint"],
    )


@pytest.mark.parametrize("copies", [0, 2, 1001], ids=["empty", "a job twice", "over 1000"])
@pytest.mark.parametrize("kind", ["acks", "results"])
def test_a_malformed_batch_is_refused_whole(cast: Cast, copies: int, kind: str) -> None:
    """Empty, a job listed twice, or more than 1,000 entries, of acks or of results: 422 and
    nothing changes."""
    run = cast.run.start()
    submit(cast)
    (granted,) = run.claim(1)
    entry = run.entry(granted["job_id"], granted["attempt"])
    if kind == "results":
        entry |= {"outcome": "succeeded", "retryable": False}
    answer = run.post(f"/run/v1/jobs/{kind}", {kind: [entry] * copies})
    assert (
        answer.status_code,
        cast.world.stored(granted["job_id"]).state.value,
    ) == (422, "accepted")


def test_a_batch_is_one_commit_on_the_file_store(tmp_path: Path) -> None:
    """Acking eight jobs in one batch is one write transaction of the SQLite store."""
    with http_world(file_factory(lambda: tmp_path), tmp_path) as cast:
        run = cast.run.start(capacity=8)
        for _ in range(8):
            submit(cast)
        granted = run.claim(8)
        store = cast.world.store
        assert isinstance(store, FileStore)
        before = store.groups_committed
        entries = [run.entry(g["job_id"], g["attempt"]) for g in granted]
        answers = run.post("/run/v1/jobs/acks", {"acks": entries}).json()["answers"]
        assert (
            [a["status"] for a in answers],
            store.groups_committed - before,
        ) == ([200] * 8, 1)


def test_a_batch_creates_every_job_in_order(any_cast: Cast) -> None:
    """One request, several JobViews, in the order asked, all queued."""
    world = any_cast.world
    path = f"/api/v1/servers/{any_cast.server_id}/jobs/batch"
    body = {"jobs": [{"kind": "noop"}, {"kind": "sleep", "payload": {"seconds": 1}}]}
    answer = world.api("POST", path, token=any_cast.owner[1], json=body)
    kinds = [(job["kind"], job["state"]) for job in answer.json()["jobs"]]
    assert (answer.status_code, kinds) == (201, [("noop", "queued"), ("sleep", "queued")])


def test_a_batch_with_one_bad_job_creates_none(cast: Cast) -> None:
    """All or none: a payload the domain refuses fails the whole batch, nothing is stored."""
    world = cast.world
    path = f"/api/v1/servers/{cast.server_id}/jobs/batch"
    body = {"jobs": [{"kind": "noop"}, {"kind": "noop", "max_attempts": 0}]}
    answer = world.api("POST", path, token=cast.owner[1], json=body)
    listed = world.api("GET", "/api/v1/jobs", token=ADMIN_TOKEN).json()["jobs"]
    assert (answer.status_code, listed) == (422, [])


def test_a_batch_with_an_idempotency_key_is_created_once(cast: Cast) -> None:
    """The same key and batch give the same jobs again; another batch is a conflict."""
    world = cast.world
    path = f"/api/v1/servers/{cast.server_id}/jobs/batch"
    headers = {"Idempotency-Key": "nightly-2026-12-01"}
    body = {"jobs": [{"kind": "noop"}, {"kind": "noop"}]}
    first = world.api("POST", path, token=cast.owner[1], json=body, headers=headers)
    again = world.api("POST", path, token=cast.owner[1], json=body, headers=headers)
    other = world.api(
        "POST", path, token=cast.owner[1], json={"jobs": [{"kind": "noop"}]}, headers=headers
    )
    ids = [job["id"] for job in first.json()["jobs"]]
    assert (201, ids) == (again.status_code, [job["id"] for job in again.json()["jobs"]])
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_conflict")
    listed = world.api("GET", "/api/v1/jobs", token=ADMIN_TOKEN).json()["jobs"]
    assert sorted(ids) == sorted(job["id"] for job in listed)


def test_a_batch_for_another_owners_server_is_forbidden(cast: Cast) -> None:
    """Batches follow the single route's authorization."""
    path = f"/api/v1/servers/{cast.server_id}/jobs/batch"
    answer = cast.world.api("POST", path, token=cast.stranger[1], json={"jobs": [{"kind": "noop"}]})
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")


def cancel_many(cast: Cast, token: str, job_ids: list[str]) -> Any:
    return cast.world.api("POST", "/api/v1/jobs/cancel", token=token, json={"job_ids": job_ids})


def test_cancelling_several_jobs_answers_each_as_its_own_cancel_would(any_cast: Cast) -> None:
    """One request: a queued job's entry is 200 and its JobView cancelled, a running one's 202
    with the intent, another owner's job's entry the 403 and a missing one's the 404 that a
    cancel of it alone answers (so no entry says more); the other owner's job is untouched."""
    world, token = any_cast.world, any_cast.owner[1]
    running = submit(any_cast)["id"]
    any_cast.run.start().run_to_running(running)
    queued = submit(any_cast)["id"]
    theirs = world.submit(any_cast.other_server_id, any_cast.stranger[1])["id"]
    asked = [queued, running, theirs, "job_missing"]

    answer = cancel_many(any_cast, token, asked)

    entries = answer.json()["answers"]
    alone = [world.api("POST", f"/api/v1/jobs/{job_id}/cancel", token=token) for job_id in asked]
    assert (200, asked) == (answer.status_code, [entry["job_id"] for entry in entries])
    assert [
        (entry["status"], entry["answer"]["state"], entry["answer"]["cancel"]["requested"])
        for entry in entries[:2]
    ] == [(200, "cancelled", True), (202, "running", True)]
    assert [(entry["status"], entry["error"]["code"]) for entry in entries[2:]] == [
        (403, "forbidden"),
        (404, "not_found"),
    ]
    assert [(a.status_code, a.json()) for a in alone] == [
        (200, entries[0]["answer"]),
        (202, entries[1]["answer"]),
        *((entry["status"], {"error": entry["error"]}) for entry in entries[2:]),
    ]
    assert (
        world.stored(theirs).state.value,
        world.stored(theirs).cancel,
    ) == ("queued", None)


@pytest.mark.parametrize(
    "ids", [[], ["{job}", "{job}"], ["{job}"] + [f"job_{n}" for n in range(1000)]],
    ids=["empty", "a job twice", "over 1000"],
)  # fmt: skip
def test_cancelling_several_jobs_takes_1_to_1000_jobs_each_once(cast: Cast, ids: list[str]) -> None:
    """Else the whole request is 422 `invalid_request` and no job is cancelled."""
    job = submit(cast)["id"]
    answer = cancel_many(cast, cast.owner[1], [job_id.format(job=job) for job_id in ids])
    assert (
        answer.status_code,
        answer.json()["error"]["code"],
        cast.world.stored(job).state.value,
    ) == (422, "invalid_request", "queued")


def test_cancelling_several_jobs_is_in_the_openapi_document(cast: Cast) -> None:
    """The route, its body (1 to 1,000 job ids) and its per-job answers."""
    document = cast.world.client.get("/openapi.json").json()
    operation = document["paths"]["/api/v1/jobs/cancel"]["post"]
    schemas = document["components"]["schemas"]
    body = schemas["CancelJobsRequest"]["properties"]["job_ids"]
    entry = schemas["CancelEntry"]["properties"]
    assert (body["minItems"], body["maxItems"]) == (1, 1000)
    assert {"job_id", "status", "answer", "error"} == set(entry)
    assert "200" in operation["responses"]


def test_many_waiting_reads_each_see_their_own_job(cast: Cast, client: TestClient) -> None:
    """Waiters on different jobs are woken by their own job only."""
    run, world, token = cast.run.start(capacity=4), cast.world, cast.owner[1]
    jobs = [submit(cast) for _ in range(3)]
    barrier = threading.Barrier(3)

    def wait(job_id: str) -> str:
        barrier.wait()
        path = f"/api/v1/jobs/{job_id}?wait_s=30&until=terminal"
        state: str = world.api("GET", path, token=token).json()["state"]
        return state

    waits = [in_background(lambda job_id=job["id"]: wait(job_id)) for job in jobs]
    until_waiting(world, 3)
    granted = run.claim(3)
    for g in granted:
        run.ack(g["job_id"], g["attempt"])
        run.result(g["job_id"], g["attempt"])
    assert [w.result(timeout=LONG_S) for w in waits] == ["succeeded"] * 3
