"""The Run API (PROTOCOL.md sections 2-5) as a small ASGI app of its own.

Run's messages are the platform's hottest path, so they skip the web framework's per-request
machinery: one table of routes (`ROUTES`), and for each request, in this order: the route
(404/405), the declared body size (413), admission to the route's channel (429 at once when
full), the body (413 past the channel's limit), the signature (401: credentials come before
any check of the body), the body's shape (422, pydantic in strict mode), then the handler on
the channel. Answers and errors have PROTOCOL.md's shapes; every route is described in the
served OpenAPI document (`openapi_paths`). Handlers answer exactly what the service answers,
with instants as RFC 3339 strings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ValidationError

from moonrun.errors import (
    InvalidRequest,
    MethodNotAllowed,
    MoonrunError,
    NotFound,
    SignatureInvalid,
    TooLarge,
)
from moonrun.platform.channels import Admission, Channel
from moonrun.platform.http import Platform, channel_of
from moonrun.platform.logstore import LogLine
from moonrun.platform.schemas import (
    AckAnswerModel,
    AckBatchRequest,
    BatchAnswer,
    CancelPollAnswerModel,
    ChunkAnswer,
    ClaimAnswer,
    ClaimRequest,
    EvidenceRequest,
    HeartbeatAnswer,
    JoinAnswer,
    JoinRequest,
    LogBatchAnswer,
    LogBatchRequest,
    ProgressAnswerModel,
    ProgressRequest,
    ReconcileAnswer,
    ReconcileRequest,
    RegisterAnswer,
    RegisterRequest,
    ResultAnswerModel,
    ResultBatchRequest,
    ResultRequest,
)
from moonrun.platform.watch import wait_for
from moonrun.scheduling.messages import (
    AckAnswer,
    CancelPollAnswer,
    Evidence,
    ProgressAnswer,
    ResultAnswer,
)
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.time import format_instant, format_optional
from moonrun.security import signing
from moonrun.security.keys import session_key
from moonrun.security.tokens import b64url

log = logging.getLogger("moonrun.http")

KeyKind = Literal["endpoint", "session"]
Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Call:
    """One Run request as a handler sees it: verified, admitted, its body parsed."""

    platform: Platform
    lane: Channel
    admission: Admission
    subject: str
    """The session id (or, for registration, the endpoint id) the request was signed for."""
    params: dict[str, Any]
    body: Any
    headers: dict[str, str]
    receive: Receive
    """The request's ASGI receive: once the body is read, it returns only on disconnect."""


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One Run API route: where, on which channel, signed how, with which bodies."""

    method: str
    path: str
    channel: str
    key: KeyKind | None
    """Which key must sign it (None: unsigned)."""
    body: type[BaseModel] | None
    """The JSON body's model; None for a body that is ignored or raw bytes."""
    answer: type[BaseModel]
    status: int
    handler: Handler
    ints: frozenset[str] = frozenset()
    """Path parameters that must be integers."""
    segments: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.path.split("/")))

    def match(self, parts: Sequence[str]) -> dict[str, Any] | None:
        if len(parts) != len(self.segments):
            return None
        params: dict[str, Any] = {}
        for template, part in zip(self.segments, parts, strict=True):
            if template.startswith("{"):
                if not part:
                    return None
                params[template[1:-1]] = part
            elif template != part:
                return None
        return params


# -- answers -------------------------------------------------------------------------------------


def ack_answer(answer: AckAnswer) -> dict[str, Any]:
    return {
        "state": answer.state.value,
        "lease_expires_at": format_instant(answer.lease_expires_at),
        "cancel_requested": answer.cancel_requested,
    }


def progress_answer(answer: ProgressAnswer) -> dict[str, Any]:
    return {
        "lease_expires_at": format_instant(answer.lease_expires_at),
        "cancel_requested": answer.cancel_requested,
    }


def cancel_poll_answer(answer: CancelPollAnswer) -> dict[str, Any]:
    return {
        "cancel_requested": answer.cancel_requested,
        "requested_at": format_optional(answer.requested_at),
    }


def result_answer(answer: ResultAnswer) -> dict[str, Any]:
    return {
        "state": answer.state.value,
        "attempt": answer.attempt,
        "fingerprint": answer.fingerprint,
        "next_eligible_at": format_optional(answer.next_eligible_at),
        "replayed": answer.replayed,
    }


def error_body(error: MoonrunError) -> dict[str, Any]:
    return {"error": {"code": error.code, "message": error.message}}


# -- control channel -----------------------------------------------------------------------------


async def join(call: Call) -> dict[str, Any]:
    """Burn a one-time join token and record the endpoint's Ed25519 public key (unsigned)."""
    service = call.platform.service
    body: JoinRequest = call.body
    endpoint = await call.lane.run(service.join_endpoint, body.join_token, body.identity_public_key)
    return {"endpoint_id": endpoint.id}


async def register(call: Call) -> dict[str, Any]:
    """Register a new session (generation + 1), signed with the endpoint's identity key."""
    platform, body = call.platform, call.body
    registration = await call.lane.run(
        platform.service.register_session,
        call.subject,
        boot_id=body.boot_id,
        run_version=body.run_version,
        capacity=body.capacity,
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
    }


async def heartbeat(call: Call) -> dict[str, Any]:
    """Keep the session alive; answers its new expiry and the platform's time."""
    beat = await call.lane.run(call.platform.service.heartbeat, call.subject)
    return {
        "session_expires_at": format_instant(beat.session_expires_at),
        "server_time": format_instant(beat.server_time),
    }


# -- jobs channel --------------------------------------------------------------------------------


async def reconcile(call: Call) -> dict[str, Any]:
    """Confirm, discard and lose: Run's journal against the store (after every registration)."""
    body: ReconcileRequest = call.body
    entries = [ReconcileEntry(e.job_id, e.attempt, e.lease) for e in body.entries]
    report = await call.lane.run(call.platform.service.reconcile, call.subject, entries)
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


async def claim(call: Call) -> dict[str, Any]:
    """Grant up to `max_jobs` eligible jobs, each under a new attempt and lease; with `wait_s`,
    wait up to that long for one to become claimable (the place on the channel is given up
    while waiting)."""
    platform, body = call.platform, call.body
    service, watch = platform.service, platform.watch
    outcome = await call.lane.run(service.claim_or_wait, call.subject, body.max_jobs)
    wait_s = min(body.wait_s or 0.0, platform.http.max_claim_wait_s)
    if not outcome.jobs and wait_s > 0 and watch.has_room():
        deadline = time.monotonic() + wait_s
        gone = asyncio.Event()
        with watch.claims(outcome.endpoint_id) as waiter:
            woken = waiter.event
            # A Run that went away (killed, or stopping) must not be granted what it can never
            # receive: its attempts would only come back through reconciliation, as lost.
            listener = asyncio.create_task(_until_disconnected(call.receive, gone, woken))
            try:
                while not gone.is_set():
                    # Registered first, claimed again second: no wake-up can fall in between.
                    woken.clear()
                    outcome = await call.lane.run(
                        service.claim_or_wait, call.subject, body.max_jobs
                    )
                    remaining = deadline - time.monotonic()
                    if outcome.jobs or remaining <= 0:
                        break
                    pause = min(remaining, watch.recheck_s)
                    if outcome.next_claimable_at is not None:
                        due_s = (outcome.next_claimable_at - platform.clock.now()) / 1000
                        pause = min(pause, max(0.001, due_s))
                    call.admission.leave()
                    await wait_for(woken, pause)
                    call.admission.enter()
            finally:
                listener.cancel()
    platform.metrics.claims.inc(len(outcome.jobs))
    return {
        "jobs": [
            {
                "job_id": job.job_id,
                "server_id": job.server_id,
                "kind": job.kind,
                "payload": job.payload,
                "attempt": job.attempt,
                "lease": job.lease,
                "ack_deadline": format_instant(job.ack_deadline),
                "lease_ttl_s": job.lease_ttl_s,
                "max_attempts": job.max_attempts,
            }
            for job in outcome.jobs
        ]
    }


async def _until_disconnected(receive: Receive, gone: asyncio.Event, woken: asyncio.Event) -> None:
    """Set `gone` (and wake the waiter) when the client disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()
    woken.set()


async def ack(call: Call) -> dict[str, Any]:
    """accepted -> running, before the ack deadline."""
    body: EvidenceRequest = call.body
    evidence = Evidence(body.attempt, body.lease)
    service = call.platform.service
    answer = await call.lane.run(service.ack, call.subject, call.params["job_id"], evidence)
    return ack_answer(answer)


async def progress(call: Call) -> dict[str, Any]:
    """Report progress; renews the execution lease. `seq` strictly increases per attempt."""
    body: ProgressRequest = call.body
    answer = await call.lane.run(
        call.platform.service.progress,
        call.subject,
        call.params["job_id"],
        Evidence(body.attempt, body.lease),
        seq=body.seq,
        percent=body.percent,
        message=body.message,
    )
    return progress_answer(answer)


async def cancel_poll(call: Call) -> dict[str, Any]:
    """Whether a user asked to cancel this attempt's job."""
    body: EvidenceRequest = call.body
    evidence = Evidence(body.attempt, body.lease)
    service = call.platform.service
    answer = await call.lane.run(service.cancel_poll, call.subject, call.params["job_id"], evidence)
    return cancel_poll_answer(answer)


async def result(call: Call) -> dict[str, Any]:
    """Record the attempt's result; replaying the recorded one answers it again."""
    body: ResultRequest = call.body
    answer = await call.lane.run(
        call.platform.service.result,
        call.subject,
        call.params["job_id"],
        Evidence(body.attempt, body.lease),
        outcome=body.outcome,
        retryable=body.retryable,
        error=None if body.error is None else body.error.model_dump(),
        output=body.output,
    )
    return result_answer(answer)


def _batch(
    call: Call, job_ids: Sequence[str], answers: Sequence[Any], render: Callable[[Any], Any]
) -> dict[str, Any]:
    """One entry per message, in order: the status and answer (or error) it would get alone."""
    entries = []
    for job_id, answer in zip(job_ids, answers, strict=True):
        if isinstance(answer, MoonrunError):
            call.platform.metrics.count_rejection(answer)
            entries.append({"job_id": job_id, "status": answer.status, **error_body(answer)})
        else:
            entries.append({"job_id": job_id, "status": 200, "answer": render(answer)})
    return {"answers": entries}


async def ack_batch(call: Call) -> dict[str, Any]:
    """Several acks in one request and one commit; each answered as its own ack would be."""
    body: AckBatchRequest = call.body
    acks = [(a.job_id, Evidence(a.attempt, a.lease)) for a in body.acks]
    answers = await call.lane.run(call.platform.service.ack_many, call.subject, acks)
    return _batch(call, [job_id for job_id, _ in acks], answers, ack_answer)


async def result_batch(call: Call) -> dict[str, Any]:
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
            },
        )
        for r in body.results
    ]
    answers = await call.lane.run(call.platform.service.result_many, call.subject, results)
    return _batch(call, [job_id for job_id, _, _ in results], answers, result_answer)


# -- logs and artifacts channels -----------------------------------------------------------------


async def append_logs(call: Call) -> dict[str, Any]:
    """Store a batch of log lines, once per (job, attempt, seq)."""
    platform, body = call.platform, call.body
    evidence = Evidence(body.attempt, body.lease)
    await call.lane.run(platform.service.check_transfer, call.subject, body.job_id, evidence)
    lines = [LogLine(body.seq, line.ts, line.stream, line.text) for line in body.lines]
    through = await call.lane.run(platform.logs.append, body.job_id, body.attempt, body.seq, lines)
    return {"accepted_through_seq": through}


async def put_artifact_chunk(call: Call) -> dict[str, Any]:
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
    await call.lane.run(
        platform.service.check_transfer, call.subject, job_id, Evidence(attempt, lease)
    )
    final = call.headers.get("run-final", "").lower() == "true"
    await call.lane.run(
        platform.artifacts.put_chunk, job_id, attempt, name, index, call.body, final
    )
    return {"chunk_index": index, "final": final}


ROUTES: tuple[Route, ...] = (
    # control channel
    Route("POST", "/run/v1/join", "control", None, JoinRequest, JoinAnswer, 200, join),
    Route(
        "POST", "/run/v1/sessions", "control", "endpoint",
        RegisterRequest, RegisterAnswer, 201, register,
    ),
    Route("POST", "/run/v1/heartbeat", "control", "session", None, HeartbeatAnswer, 200, heartbeat),
    # jobs channel
    Route(
        "POST", "/run/v1/reconcile", "jobs", "session",
        ReconcileRequest, ReconcileAnswer, 200, reconcile,
    ),
    Route("POST", "/run/v1/jobs/claim", "jobs", "session", ClaimRequest, ClaimAnswer, 200, claim),
    Route(
        "POST", "/run/v1/jobs/acks", "jobs", "session",
        AckBatchRequest, BatchAnswer, 200, ack_batch,
    ),
    Route(
        "POST", "/run/v1/jobs/results", "jobs", "session",
        ResultBatchRequest, BatchAnswer, 200, result_batch,
    ),
    Route(
        "POST", "/run/v1/jobs/{job_id}/ack", "jobs", "session",
        EvidenceRequest, AckAnswerModel, 200, ack,
    ),
    Route(
        "POST", "/run/v1/jobs/{job_id}/progress", "jobs", "session",
        ProgressRequest, ProgressAnswerModel, 200, progress,
    ),
    Route(
        "POST", "/run/v1/jobs/{job_id}/cancel-poll", "jobs", "session",
        EvidenceRequest, CancelPollAnswerModel, 200, cancel_poll,
    ),
    Route(
        "POST", "/run/v1/jobs/{job_id}/result", "jobs", "session",
        ResultRequest, ResultAnswerModel, 200, result,
    ),
    # logs and artifacts channels
    Route(
        "POST", "/run/v1/logs", "logs", "session",
        LogBatchRequest, LogBatchAnswer, 202, append_logs,
    ),
    Route(
        "PUT", "/run/v1/artifacts/{job_id}/{attempt}/{name}/{chunk_index}", "artifacts", "session",
        None, ChunkAnswer, 202, put_artifact_chunk, ints=frozenset({"attempt", "chunk_index"}),
    ),
)  # fmt: skip
"""Every Run route, in matching order (literal paths before templated ones)."""


# -- the app -------------------------------------------------------------------------------------


class _Overflow(Exception):
    pass


class RunApi:
    """The ASGI app that serves `ROUTES` for one platform."""

    def __init__(self, platform: Platform, routes: Sequence[Route] = ROUTES) -> None:
        self.platform = platform
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        platform = self.platform
        path = scope["path"]
        status, template = 500, "unmatched"
        try:
            route, params = self._route(scope["method"], path)
            template = route.path
            status, answer = await self._serve(route, params, scope, receive)
        except MoonrunError as error:
            platform.metrics.count_rejection(error)
            status, answer = error.status, error_body(error)
        except Exception:
            log.exception("unexpected error", extra={"fields": {"route": template}})
            status, answer = 500, {"error": {"code": "internal", "message": "internal error"}}
        body = orjson.dumps(answer)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if status in (429, 503):
            headers.append((b"retry-after", b"1"))
        elif status == 405:
            allowed = sorted({r.method for r in self.routes if r.match(path.split("/"))})
            headers.append((b"allow", ", ".join(allowed).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        elapsed = time.perf_counter() - started
        channel = channel_of(path)
        platform.metrics.latency.labels(channel=channel).observe(elapsed)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "request",
                extra={
                    "fields": {
                        "method": scope["method"],
                        "route": template,
                        "status": status,
                        "channel": channel,
                        "ms": round(elapsed * 1000, 3),
                    }
                },
            )

    def _route(self, method: str, path: str) -> tuple[Route, dict[str, Any]]:
        parts = path.split("/")
        allowed = False
        for route in self.routes:
            params = route.match(parts)
            if params is None:
                continue
            if route.method == method:
                return route, params
            allowed = True
        if allowed:
            raise MethodNotAllowed("Method Not Allowed")
        raise NotFound("Not Found")

    async def _serve(
        self, route: Route, params: dict[str, Any], scope: Scope, receive: Receive
    ) -> tuple[int, Any]:
        platform = self.platform
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
        }
        limit = platform.http.limit_for(route.channel)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise TooLarge(f"the body is over the limit of {limit} bytes")
        lane: Channel = getattr(platform.channels, route.channel)
        async with lane.admit() as admission:
            data = await _read_body(receive, limit)
            subject = ""
            if route.key is not None:
                subject = await self._verify(route.key, lane, scope, headers, data)
            for name in route.ints:
                params[name] = _int_param(name, params[name])
            body: Any = data
            if route.body is not None:
                body = _parse(route.body, data)
            call = Call(platform, lane, admission, subject, params, body, headers, receive)
            return route.status, await route.handler(call)

    async def _verify(
        self,
        kind: KeyKind,
        lane: Channel,
        scope: Scope,
        headers: dict[str, str],
        data: bytes,
    ) -> str:
        """Check a signed request (shape, time window, digest, key), then its nonce once."""
        platform = self.platform
        raw_path = scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path else scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        signed = signing.parse(scope["method"], path, query, headers, data)
        if signed.key_kind != kind:
            raise SignatureInvalid(f"this route needs a keyid of the form {kind}:<id>")
        now_s = platform.clock.now() / 1000
        signing.check_created(signed, now_s=now_s, started_s=platform.started_at_s)
        if kind == "session":
            signing.verify_hmac(signed, session_key(platform.secret, signed.key_subject))
        else:
            public_key = await lane.run(platform.service.identity_key, signed.key_subject)
            signing.verify_ed25519(signed, public_key)
        platform.nonces.remember(signed.key_id, signed.nonce, signed.created, now_s)
        return signed.key_subject


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            raise TooLarge(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _parse(model: type[BaseModel], data: bytes) -> BaseModel:
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        problems = []
        for problem in error.errors(include_url=False, include_input=False)[:5]:
            if problem["type"] == "json_invalid":
                raise InvalidRequest("the body is not valid JSON") from None
            where = ".".join(str(part) for part in problem["loc"])
            problems.append(f"{where}: {problem['msg']}" if where else problem["msg"])
        raise InvalidRequest("; ".join(problems) or "invalid request") from None


def _int_param(name: str, text: str) -> int:
    if not text.lstrip("-").isdigit():
        raise InvalidRequest(f"{name}: Input should be a valid integer")
    return int(text)


def openapi_paths(routes: Sequence[Route], error_ref: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The OpenAPI path items of `routes` and the component schemas they refer to."""
    from pydantic.json_schema import models_json_schema

    models = {m for r in routes for m in (r.body, r.answer) if m is not None}
    refs, document = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    schema_of = {model: refs[(model, "validation")] for model in models}
    paths: dict[str, Any] = {}
    errors = {
        str(status): {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": error_ref}}},
        }
        for status, description in (
            (401, "Not authenticated"),
            (403, "Forbidden"),
            (404, "Not found"),
            (409, "Conflict"),
            (413, "Too large"),
            (422, "Invalid request"),
            (429, "Channel busy"),
            (503, "Store unavailable"),
        )
    }
    for route in routes:
        operation: dict[str, Any] = {
            "tags": ["run"],
            "summary": route.handler.__name__.replace("_", " ").capitalize(),
            "description": (route.handler.__doc__ or "").strip(),
            "operationId": f"run_{route.handler.__name__}",
            "responses": {
                str(route.status): {
                    "description": "Answer",
                    "content": {"application/json": {"schema": schema_of[route.answer]}},
                },
                **errors,
            },
        }
        parameters = [
            {
                "name": segment[1:-1],
                "in": "path",
                "required": True,
                "schema": {"type": "integer" if segment[1:-1] in route.ints else "string"},
            }
            for segment in route.segments
            if segment.startswith("{")
        ]
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_of[route.body]}},
            }
        elif route.method == "PUT":
            operation["requestBody"] = {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return paths, document.get("$defs", {})
