"""The Run API (PROTOCOL.md sections 2-4): enrollment and sessions (control), and jobs.

Every route but join verifies the request signature before anything else, in the event loop
(it is CPU only); store work then runs on the route's channel. A route answers exactly what
the service answers, with instants as RFC 3339 strings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request

from moonrun.errors import SignatureInvalid
from moonrun.platform.channels import Channel
from moonrun.platform.http import ERROR_RESPONSES, Platform, platform_of
from moonrun.platform.schemas import (
    AckAnswerModel,
    CancelPollAnswerModel,
    ClaimAnswer,
    ClaimRequest,
    EvidenceRequest,
    HeartbeatAnswer,
    JoinAnswer,
    JoinRequest,
    ProgressAnswerModel,
    ProgressRequest,
    ReconcileAnswer,
    ReconcileRequest,
    RegisterAnswer,
    RegisterRequest,
    ResultAnswerModel,
    ResultRequest,
)
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.time import format_instant, format_optional
from moonrun.security import signing
from moonrun.security.keys import session_key
from moonrun.security.tokens import b64url

router = APIRouter(prefix="/run/v1", tags=["run"], responses=ERROR_RESPONSES)

KeyKind = Literal["endpoint", "session"]


async def verify_signature(
    request: Request, platform: Platform, channel: Channel, kind: KeyKind
) -> signing.Signed:
    """Check a signed request: shape, time window, digest, key, then its nonce (once per
    request: the answer is kept on the request)."""
    verified: signing.Signed | None = getattr(request.state, "signed", None)
    if verified is not None:
        return verified
    body = await request.body()
    raw_path = request.scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else request.url.path
    query = request.scope.get("query_string", b"").decode("latin-1")
    signed = signing.parse(request.method, path, query, request.headers, body)
    if signed.key_kind != kind:
        raise SignatureInvalid(f"this route needs a keyid of the form {kind}:<id>")
    now_s = platform.clock.now() / 1000
    signing.check_created(signed, now_s=now_s, started_s=platform.started_at_s)
    if kind == "session":
        signing.verify_hmac(signed, session_key(platform.secret, signed.key_subject))
    else:
        public_key = await channel.run(platform.service.identity_key, signed.key_subject)
        signing.verify_ed25519(signed, public_key)
    platform.nonces.remember(signed.key_id, signed.nonce, signed.created, now_s)
    request.state.signed = signed
    return signed


def signed_by(kind: KeyKind, channel: str) -> Callable[[Request], AsyncIterator[str]]:
    """A dependency: admit the request to `channel`, verify it, and give the key's subject."""

    async def dependency(request: Request) -> AsyncIterator[str]:
        platform = platform_of(request)
        lane: Channel = getattr(platform.channels, channel)
        async with lane.admit():
            signed = await verify_signature(request, platform, lane, kind)
            yield signed.key_subject

    return dependency


async def admitted_to_control(request: Request) -> AsyncIterator[None]:
    async with platform_of(request).channels.control.admit():
        yield


control_session = Depends(signed_by("session", "control"))
jobs_session = Depends(signed_by("session", "jobs"))
endpoint_identity = Depends(signed_by("endpoint", "control"))


# -- control channel ---------------------------------------------------------------------------


@router.post("/join", response_model=JoinAnswer, dependencies=[Depends(admitted_to_control)])
async def join(body: JoinRequest, request: Request) -> dict[str, Any]:
    """Burn a one-time join token and record the endpoint's Ed25519 public key (unsigned)."""
    platform = platform_of(request)
    endpoint = await platform.channels.control.run(
        platform.service.join_endpoint, body.join_token, body.identity_public_key
    )
    return {"endpoint_id": endpoint.id}


@router.post("/sessions", response_model=RegisterAnswer, status_code=201)
async def register(
    body: RegisterRequest, request: Request, endpoint_id: str = endpoint_identity
) -> dict[str, Any]:
    """Register a new session (generation + 1), signed with the endpoint's identity key."""
    platform = platform_of(request)
    registration = await platform.channels.control.run(
        platform.service.register_session,
        endpoint_id,
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


@router.post("/heartbeat", response_model=HeartbeatAnswer)
async def heartbeat(request: Request, session_id: str = control_session) -> dict[str, Any]:
    """Keep the session alive; answers its new expiry and the platform's time."""
    platform = platform_of(request)
    beat = await platform.channels.control.run(platform.service.heartbeat, session_id)
    return {
        "session_expires_at": format_instant(beat.session_expires_at),
        "server_time": format_instant(beat.server_time),
    }


# -- jobs channel ------------------------------------------------------------------------------


@router.post("/reconcile", response_model=ReconcileAnswer)
async def reconcile(
    body: ReconcileRequest, request: Request, session_id: str = jobs_session
) -> dict[str, Any]:
    """Confirm, discard and lose: Run's journal against the store (after every registration)."""
    platform = platform_of(request)
    entries = [ReconcileEntry(e.job_id, e.attempt, e.lease) for e in body.entries]
    report = await platform.channels.jobs.run(platform.service.reconcile, session_id, entries)
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


@router.post("/jobs/claim", response_model=ClaimAnswer)
async def claim(body: ClaimRequest, request: Request, session_id: str = jobs_session) -> Any:
    """Grant up to `max_jobs` eligible jobs, each under a new attempt and lease."""
    platform = platform_of(request)
    granted = await platform.channels.jobs.run(platform.service.claim, session_id, body.max_jobs)
    platform.metrics.claims.inc(len(granted))
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
            for job in granted
        ]
    }


@router.post("/jobs/{job_id}/ack", response_model=AckAnswerModel)
async def ack(
    job_id: str, body: EvidenceRequest, request: Request, session_id: str = jobs_session
) -> dict[str, Any]:
    """accepted -> running, before the ack deadline."""
    platform = platform_of(request)
    answer = await platform.channels.jobs.run(
        platform.service.ack, session_id, job_id, Evidence(body.attempt, body.lease)
    )
    return {
        "state": answer.state.value,
        "lease_expires_at": format_instant(answer.lease_expires_at),
    }


@router.post("/jobs/{job_id}/progress", response_model=ProgressAnswerModel)
async def progress(
    job_id: str, body: ProgressRequest, request: Request, session_id: str = jobs_session
) -> dict[str, Any]:
    """Report progress; renews the execution lease. `seq` strictly increases per attempt."""
    platform = platform_of(request)
    answer = await platform.channels.jobs.run(
        platform.service.progress,
        session_id,
        job_id,
        Evidence(body.attempt, body.lease),
        seq=body.seq,
        percent=body.percent,
        message=body.message,
    )
    return {
        "lease_expires_at": format_instant(answer.lease_expires_at),
        "cancel_requested": answer.cancel_requested,
    }


@router.post("/jobs/{job_id}/cancel-poll", response_model=CancelPollAnswerModel)
async def cancel_poll(
    job_id: str, body: EvidenceRequest, request: Request, session_id: str = jobs_session
) -> dict[str, Any]:
    """Whether a user asked to cancel this attempt's job."""
    platform = platform_of(request)
    answer = await platform.channels.jobs.run(
        platform.service.cancel_poll, session_id, job_id, Evidence(body.attempt, body.lease)
    )
    return {
        "cancel_requested": answer.cancel_requested,
        "requested_at": format_optional(answer.requested_at),
    }


@router.post("/jobs/{job_id}/result", response_model=ResultAnswerModel)
async def result(
    job_id: str, body: ResultRequest, request: Request, session_id: str = jobs_session
) -> dict[str, Any]:
    """Record the attempt's result; replaying the recorded one answers it again."""
    platform = platform_of(request)
    answer = await platform.channels.jobs.run(
        platform.service.result,
        session_id,
        job_id,
        Evidence(body.attempt, body.lease),
        outcome=body.outcome,
        retryable=body.retryable,
        error=None if body.error is None else body.error.model_dump(),
        output=body.output,
    )
    return {
        "state": answer.state.value,
        "attempt": answer.attempt,
        "fingerprint": answer.fingerprint,
        "next_eligible_at": format_optional(answer.next_eligible_at),
        "replayed": answer.replayed,
    }
