"""The Run API (docs/protocol.md, "Joining and sessions" to "Artifacts"): routes and signatures.

Served by `http/api.py` like the user API. Every route but join is signed (RFC 9421
subset): the signature is verified from the head before the body is read (it covers the
`Content-Digest` header), and the body is checked against that digest once it has arrived.
Handlers answer exactly what the service answers, with instants as RFC 3339 strings, in the
shapes `moonrun.wire.run` declares (the same Run parses).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from moonrun.errors import InvalidRequest, MoonrunError, SignatureInvalid
from moonrun.http.api import Auth, Call, Route, Signatures, error_body
from moonrun.http.channels import Channel
from moonrun.http.load import overloaded
from moonrun.http.platform import HttpPlatform
from moonrun.http.schemas import (
    AckBatchRequest,
    CancelWatchRequest,
    ClaimRequest,
    EvidenceRequest,
    JoinRequest,
    LogBatchesRequest,
    LogBatchRequest,
    ProgressRequest,
    ReconcileRequest,
    RegisterRequest,
    ResultBatchRequest,
    ResultRequest,
)
from moonrun.logs.protocol import LogLine
from moonrun.scheduling import messages
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.time import format_instant, format_optional
from moonrun.security import signing
from moonrun.security.keys import session_key
from moonrun.security.tokens import b64url
from moonrun.service.answers import ClaimedJob
from moonrun.wire.error_body import ErrorDetail
from moonrun.wire.run import (
    AckAnswer,
    AckBatchAnswer,
    AckEntry,
    CancelPollAnswer,
    CancelWatchAnswer,
    ChunkAnswer,
    ClaimAnswer,
    Grant,
    HeartbeatAnswer,
    JoinAnswer,
    LogBatchAnswer,
    LogBatchesAnswer,
    LogEntry,
    ProgressAnswer,
    ReconcileAnswer,
    RegisterAnswer,
    ResultAnswer,
    ResultBatchAnswer,
    ResultEntry,
    SessionEndAnswer,
)

# -- answers -------------------------------------------------------------------------------------


def ack_answer(answer: messages.AckAnswer) -> AckAnswer:
    return {
        "state": answer.state.value,
        "lease_expires_at": format_instant(answer.lease_expires_at),
        "cancel_requested": answer.cancel_requested,
    }


def progress_answer(answer: messages.ProgressAnswer) -> ProgressAnswer:
    return {
        "lease_expires_at": format_instant(answer.lease_expires_at),
        "cancel_requested": answer.cancel_requested,
    }


def cancel_poll_answer(answer: messages.CancelPollAnswer) -> CancelPollAnswer:
    return {
        "cancel_requested": answer.cancel_requested,
        "requested_at": format_optional(answer.requested_at),
    }


def result_answer(answer: messages.ResultAnswer) -> ResultAnswer:
    return {
        "state": answer.state.value,
        "attempt": answer.attempt,
        "fingerprint": answer.fingerprint,
        "next_eligible_at": format_optional(answer.next_eligible_at),
        "replayed": answer.replayed,
    }


# -- control channel -----------------------------------------------------------------------------


async def join(call: Call) -> JoinAnswer:
    """Burn a one-time join token and record the endpoint's Ed25519 public key (unsigned)."""
    service = call.platform.service
    body: JoinRequest = call.body
    endpoint = await call.channel.run(
        service.join_endpoint, body.join_token, body.identity_public_key, body.labels
    )
    return {"endpoint_id": endpoint.id}


async def register(call: Call) -> RegisterAnswer:
    """Register a new session (generation + 1), signed with the endpoint's identity key."""
    platform, body = call.platform, call.body
    # On the channel's threads, never inline: a registration is several writes, and a fleet
    # that starts together sends thousands at once; on threads their fsyncs are shared (the
    # store's group commit) and the loop goes on serving heartbeats meanwhile.
    # Asked when its head arrived, before any wait (its key's read, a thread): a registration
    # that waited longer than its Run did, which asked again meanwhile, must not replace the
    # later one's session.
    registration = await call.channel.thread(
        platform.service.register_session,
        call.subject,
        boot_id=body.boot_id,
        run_version=body.run_version,
        capacity=body.capacity,
        kinds=body.kinds,
        asked_at=call.received_at,
    )
    session = registration.session
    return {
        "session_id": session.id,
        "session_key": b64url(session_key(platform.secret, session.id)),
        "generation": session.generation,
        "expires_at": format_instant(session.expires_at),
        "heartbeat_interval_s": registration.heartbeat_interval_s,
        "session_ttl_s": registration.session_ttl_s,
        "ack_timeout_s": registration.ack_timeout_s,
        "lease_ttl_s": registration.lease_ttl_s,
        "claims_with_results": True,
        "silent_results": True,
        "log_batches": True,
    }


async def heartbeat(call: Call) -> HeartbeatAnswer:
    """Keep the session alive; answers its new expiry and the platform's time."""
    channel = call.channel
    beat = await call.platform.service.heartbeat_shared(
        # The shared commit runs on the channel's thread: its fsync never holds up the loop.
        call.subject,
        channel.run,
        flush=channel.thread,
        place=call.admission,
    )
    return {
        "session_expires_at": format_instant(beat.session_expires_at),
        "server_time": format_instant(beat.server_time),
        "heartbeat_interval_s": beat.heartbeat_interval_s,
    }


async def end_session(call: Call) -> SessionEndAnswer:
    """End the session: Run is shutting down cleanly, its endpoint shows offline at once."""
    session = await call.channel.run(call.platform.service.end_session, call.subject)
    return {"session_id": session.id, "generation": session.generation}


# -- jobs channel --------------------------------------------------------------------------------


async def reconcile(call: Call) -> ReconcileAnswer:
    """Confirm, discard and lose: Run's journal against the store (after every registration)."""
    body: ReconcileRequest = call.body
    entries = [ReconcileEntry(e.job_id, e.attempt, e.lease) for e in body.entries]
    # On the channel's threads, as registrations (above): one commit, however many entries.
    report = await call.channel.thread(call.platform.service.reconcile, call.subject, entries)
    return {
        "confirmed": [
            {
                "job_id": c.job_id,
                "attempt": c.attempt,
                "state": c.state.value,
                "cancel_requested": c.cancel_requested,
                "deadline": format_instant(c.deadline),
            }
            for c in report.confirmed
        ],
        "discard": [
            {"job_id": d.job_id, "attempt": d.attempt, "reason": d.reason.value}
            for d in report.discard
        ],
        "lost": [
            {"job_id": lost.job_id, "attempt": lost.attempt, "state": lost.state.value}
            for lost in report.lost
        ],
    }


async def claim(call: Call) -> ClaimAnswer:
    """Grant up to `max_jobs` eligible jobs, each under a new attempt and lease; with `wait_s`,
    wait up to that long for one to become claimable (the place on the channel is given up
    while waiting)."""
    platform, body = call.platform, call.body
    if overloaded(platform.lag, platform.http.overload_lag_s):
        return {"jobs": []}  # an empty grant at once: Run claims again a moment later
    outcome = await platform.service.wait_for_claim(
        call.subject,
        body.max_jobs,
        wait_s=min(body.wait_s or 0.0, platform.http.max_claim_wait_s),
        waiting=call.waiting(),
    )
    return {"jobs": _grants(call, outcome.jobs)}


def _grants(call: Call, granted: Sequence[ClaimedJob]) -> list[Grant]:
    """What a claim granted, as Run reads it (counted in the claims metric)."""
    call.platform.metrics.claims.inc(len(granted))
    return [
        {
            "job_id": job.job_id,
            "server_id": job.server_id,
            "owner_id": job.owner_id,
            "kind": job.kind,
            "payload": orjson.Fragment(job.payload_json),
            "attempt": job.attempt,
            "lease": job.lease,
            "ack_deadline": format_instant(job.ack_deadline),
            "lease_ttl_s": job.lease_ttl_s,
            "max_attempts": job.max_attempts,
        }
        for job in granted
    ]


async def ack(call: Call) -> AckAnswer:
    """accepted -> running, before the ack deadline."""
    body: EvidenceRequest = call.body
    evidence = Evidence(body.attempt, body.lease)
    service = call.platform.service
    answer = await call.channel.run(service.ack, call.subject, call.params["job_id"], evidence)
    return ack_answer(answer)


async def progress(call: Call) -> ProgressAnswer:
    """Report progress; renews the execution lease. `seq` strictly increases per attempt."""
    body: ProgressRequest = call.body
    answer = await call.channel.run(
        call.platform.service.progress,
        call.subject,
        call.params["job_id"],
        Evidence(body.attempt, body.lease),
        seq=body.seq,
        percent=body.percent,
        message=body.message,
    )
    return progress_answer(answer)


async def watch_cancels(call: Call) -> CancelWatchAnswer:
    """The endpoint's active attempts that users asked to cancel; with `wait_s`, waits up to
    that long for one (the place on the channel is given up while waiting)."""
    platform, body = call.platform, call.body
    cancels = await platform.service.wait_for_cancels(
        call.subject,
        [(job_id, attempt) for job_id, attempt in body.known],
        wait_s=min(body.wait_s or 0.0, platform.http.max_claim_wait_s),
        waiting=call.waiting(),
    )
    return {"cancels": [{"job_id": job_id, "attempt": attempt} for job_id, attempt in cancels]}


async def cancel_poll(call: Call) -> CancelPollAnswer:
    """Whether a user asked to cancel this attempt's job."""
    body: EvidenceRequest = call.body
    evidence = Evidence(body.attempt, body.lease)
    service = call.platform.service
    answer = await call.channel.run(
        service.cancel_poll, call.subject, call.params["job_id"], evidence
    )
    return cancel_poll_answer(answer)


async def result(call: Call) -> ResultAnswer:
    """Record the attempt's result; replaying the recorded one answers it again."""
    body: ResultRequest = call.body
    answer = await call.channel.run(
        call.platform.service.result,
        call.subject,
        call.params["job_id"],
        Evidence(body.attempt, body.lease),
        outcome=body.outcome,
        retryable=body.retryable,
        error=None if body.error is None else body.error.model_dump(),
        output=body.output,
        silent=body.silent,
    )
    return result_answer(answer)


def _refusal(call: Call, error: MoonrunError) -> ErrorDetail:
    """A batch entry's error (counted as the single message's refusal would be)."""
    call.platform.metrics.count_rejection(error)
    return error_body(error)["error"]


async def ack_batch(call: Call) -> AckBatchAnswer:
    """Several acks in one request and one commit; each answered as its own ack would be."""
    body: AckBatchRequest = call.body
    acks = [(a.job_id, Evidence(a.attempt, a.lease)) for a in body.acks]
    answers = await call.channel.run(call.platform.service.ack_many, call.subject, acks)
    # One entry per ack, in order: the status and answer (or error) it would get alone.
    entries: list[AckEntry] = [
        {"job_id": job_id, "status": answer.status, "error": _refusal(call, answer)}
        if isinstance(answer, MoonrunError)
        else {"job_id": job_id, "status": 200, "answer": ack_answer(answer)}
        for (job_id, _), answer in zip(acks, answers, strict=True)
    ]
    return {"answers": entries}


async def result_batch(call: Call) -> ResultBatchAnswer:
    """Several results in one request and one commit; each answered as its own result would."""
    body: ResultBatchRequest = call.body
    results = [
        (
            r.job_id,
            Evidence(r.attempt, r.lease),
            {
                "outcome": r.outcome,
                "retryable": r.retryable,
                "error": None if r.error is None else r.error.model_dump(),
                "output": r.output,
                "silent": r.silent,
            },
        )
        for r in body.results
    ]
    platform = call.platform
    service, claim = platform.service, None
    if body.claim is None or overloaded(platform.lag, platform.http.overload_lag_s):
        answers = await call.channel.run(service.result_many, call.subject, results)
    else:
        answers, claim = await call.channel.run(
            service.result_many_then_claim, call.subject, results, body.claim.max_jobs
        )
    entries: list[ResultEntry] = [
        {"job_id": job_id, "status": answer.status, "error": _refusal(call, answer)}
        if isinstance(answer, MoonrunError)
        else {"job_id": job_id, "status": 200, "answer": result_answer(answer)}
        for (job_id, _, _), answer in zip(results, answers, strict=True)
    ]
    if body.claim is None:
        return {"answers": entries}
    return {"answers": entries, "jobs": _grants(call, claim.jobs if claim else [])}


# -- logs and artifacts channels -----------------------------------------------------------------


async def append_logs(call: Call) -> LogBatchAnswer:
    """Store a batch of log lines, once per (job, attempt, seq). A `final` batch completes the
    attempt's logs: the job's readers waiting for that are woken."""
    (outcome,) = await _store_log_batches(call, [call.body])
    if isinstance(outcome, MoonrunError):
        raise outcome
    return {"accepted_through_seq": outcome}


async def append_log_batches(call: Call) -> LogBatchesAnswer:
    """Several attempts' batches in one request, each checked, stored and answered as its own
    `POST /run/v1/logs` would be: one refused does not refuse the others."""
    batches = call.body.batches
    if len({(batch.job_id, batch.attempt) for batch in batches}) != len(batches):
        raise InvalidRequest("each attempt may appear only once in a request")
    stored = await _store_log_batches(call, batches)
    entries: list[LogEntry] = [
        {
            "job_id": batch.job_id,
            "attempt": batch.attempt,
            "status": outcome.status,
            "error": _refusal(call, outcome),
        }
        if isinstance(outcome, MoonrunError)
        else {
            "job_id": batch.job_id,
            "attempt": batch.attempt,
            "status": 200,
            "answer": {"accepted_through_seq": outcome},
        }
        for batch, outcome in zip(batches, stored, strict=True)
    ]
    return {"answers": entries}


async def _store_log_batches(
    call: Call, batches: Sequence[LogBatchRequest]
) -> list[int | MoonrunError]:
    """Each batch checked (its attempt's evidence) and stored: the highest seq accepted of its
    attempt, or why not. A `final` batch stored completes its attempt's logs."""
    service, logs = call.platform.service, call.platform.logs
    transfers = [(batch.job_id, Evidence(batch.attempt, batch.lease)) for batch in batches]
    checked = await call.channel.run(service.check_transfers, call.subject, transfers)

    def append_each() -> list[int | MoonrunError]:
        stored: list[int | MoonrunError] = []
        for batch, check in zip(batches, checked, strict=True):
            if isinstance(check, MoonrunError):
                stored.append(check)
                continue
            lines = [LogLine(batch.seq, ln.ts, ln.stream, ln.text) for ln in batch.lines]
            try:
                through = logs.append(
                    batch.job_id, batch.attempt, batch.seq, lines, final=batch.final
                )
            except MoonrunError as error:
                stored.append(error)
            else:
                stored.append(through)
        return stored

    # A durable log store waits for an fsync: on the logs channel's threads, not the event loop.
    stored = await (call.channel.thread if logs.on_threads else call.channel.run)(append_each)
    for batch, outcome in zip(batches, stored, strict=True):
        if batch.final and not isinstance(outcome, MoonrunError):
            service.logs_completed(batch.job_id)
    return stored


async def put_artifact_chunk(call: Call) -> ChunkAnswer:
    """Store one chunk of an artifact (idempotent per chunk index); `Run-Final` ends it."""
    platform, params = call.platform, call.params
    lease = call.headers.get("run-lease")
    if lease is None:
        raise InvalidRequest("header Run-Lease: Field required")
    job_id, attempt, name, index = (
        params["job_id"],
        params["attempt"],
        params["name"],
        params["chunk_index"],
    )
    await call.channel.run(
        platform.service.check_transfer, call.subject, job_id, Evidence(attempt, lease)
    )
    final = call.headers.get("run-final", "").lower() == "true"
    await call.channel.run(
        platform.artifacts.put_chunk, job_id, attempt, name, index, call.body, final
    )
    return {"chunk_index": index, "final": final}


ROUTES: tuple[Route, ...] = (
    # control channel
    Route(
        method="POST", path="/run/v1/join", channel="control", auth=None,
        body=JoinRequest, answer=JoinAnswer, status=200, handler=join,
        sheds=True,
    ),
    Route(
        method="POST", path="/run/v1/sessions", channel="sessions", auth="endpoint",
        body=RegisterRequest, answer=RegisterAnswer, status=201, handler=register, no_store=True,
        sheds=True,
    ),
    Route(
        method="POST", path="/run/v1/heartbeat", channel="control", auth="session",
        answer=HeartbeatAnswer, status=200, handler=heartbeat,
    ),
    Route(
        method="POST", path="/run/v1/sessions/end", channel="control", auth="session",
        answer=SessionEndAnswer, status=200, handler=end_session,
    ),
    # jobs channel
    Route(
        method="POST", path="/run/v1/reconcile", channel="jobs", auth="session",
        body=ReconcileRequest, answer=ReconcileAnswer, status=200, handler=reconcile,
        sheds=True,
    ),
    Route(
        method="POST", path="/run/v1/jobs/claim", channel="jobs", auth="session",
        body=ClaimRequest, answer=ClaimAnswer, status=200, handler=claim,
    ),
    Route(
        method="POST", path="/run/v1/jobs/acks", channel="jobs", auth="session",
        body=AckBatchRequest, answer=AckBatchAnswer, status=200, handler=ack_batch,
    ),
    Route(
        method="POST", path="/run/v1/jobs/results", channel="jobs", auth="session",
        body=ResultBatchRequest, answer=ResultBatchAnswer, status=200, handler=result_batch,
    ),
    Route(
        method="POST", path="/run/v1/jobs/{job_id}/ack", channel="jobs", auth="session",
        body=EvidenceRequest, answer=AckAnswer, status=200, handler=ack,
    ),
    Route(
        method="POST", path="/run/v1/jobs/{job_id}/progress", channel="jobs", auth="session",
        body=ProgressRequest, answer=ProgressAnswer, status=200, handler=progress,
    ),
    Route(
        method="POST", path="/run/v1/jobs/cancels", channel="jobs", auth="session",
        body=CancelWatchRequest, answer=CancelWatchAnswer, status=200, handler=watch_cancels,
    ),
    Route(
        method="POST", path="/run/v1/jobs/{job_id}/cancel-poll", channel="jobs", auth="session",
        body=EvidenceRequest, answer=CancelPollAnswer, status=200, handler=cancel_poll,
    ),
    Route(
        method="POST", path="/run/v1/jobs/{job_id}/result", channel="jobs", auth="session",
        body=ResultRequest, answer=ResultAnswer, status=200, handler=result,
    ),
    # logs and artifacts channels
    Route(
        method="POST", path="/run/v1/logs", channel="logs", auth="session",
        body=LogBatchRequest, answer=LogBatchAnswer, status=202, handler=append_logs,
        sheds=True,
    ),
    Route(
        method="POST", path="/run/v1/logs/batches", channel="logs", auth="session",
        body=LogBatchesRequest, answer=LogBatchesAnswer, status=200,
        handler=append_log_batches, sheds=True,
    ),
    Route(
        method="PUT", path="/run/v1/artifacts/{job_id}/{attempt}/{name}/{chunk_index}",
        channel="artifacts", auth="session", answer=ChunkAnswer, status=202,
        handler=put_artifact_chunk, ints=frozenset({"attempt", "chunk_index"}),
        headers=("Run-Lease", "Run-Final"), raw_body=True,
        sheds=True,
    ),
)  # fmt: skip
"""Every Run route, in matching order (literal paths before templated ones)."""


# -- signatures ---------------------------------------------------------------------------------


async def verify_head(
    platform: HttpPlatform,
    channel: Channel,
    kind: Auth,
    scope: Mapping[str, Any],
    headers: dict[str, str],
) -> signing.Signed:
    """Check a signed request's head (shape, key kind, time window, key): the signature covers
    the `Content-Digest` header, so nobody without the key gets to send a body. The body is
    tied to that header afterwards (`verify_body`)."""
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else scope["path"]
    query = scope.get("query_string", b"").decode("latin-1")
    signed = signing.parse_head(scope["method"], path, query, headers)
    if signed.key_kind != kind:
        raise SignatureInvalid(f"this route needs a keyid of the form {kind}:<id>")
    now_s = platform.clock.now() / 1000
    signing.check_created(signed, now_s=now_s, started_s=platform.started_at_s)
    if kind == "session":
        signing.verify_hmac(signed, session_key(platform.secret, signed.key_subject))
    else:
        public_key = await channel.run(platform.service.identity_key, signed.key_subject)
        signing.verify_ed25519(signed, public_key)
    return signed


def verify_body(platform: HttpPlatform, signed: signing.Signed, data: bytes) -> str:
    """Check the body against the signed digest, then record the nonce; the key's subject
    (session or endpoint id)."""
    signing.check_digest(signed, data)
    now_s = platform.clock.now() / 1000
    platform.nonces.remember(signed.key_id, signed.nonce, signed.created, now_s)
    return signed.key_subject


SIGNATURES = Signatures(verify_head, verify_body)
"""How `Api` checks the Run API's signed requests."""
