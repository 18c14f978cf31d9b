"""Run's side of the wire: four channels, each with its own aiohttp session, and signing.

Each channel (control, jobs, logs, artifacts) has its own connection pool and timeouts, so a
stuck artifact upload can never hold a connection a heartbeat needs. Every request is signed
afresh when sent (a retry gets a new nonce and `created`). Error answers become the
`moonrun.errors` type their code names; a failure to get any answer is `Unreachable`. Every
answer is parsed into its declared shape (`moonrun.wire.run`) here: one in a foreign shape is
`ForeignAnswer` (a kind of `Unreachable`), so the agent only ever reads typed answers.

Acks and results travel in batches (`acks`, `results`): each entry is answered, or refused,
exactly as its single-message route would answer it. A claim may wait at the platform for work
(`wait_s`, a long poll); that request's timeout is then that much longer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun import __version__
from moonrun.backoff import Backoff
from moonrun.errors import (
    ERROR_TABLE,
    ChannelBusy,
    Contention,
    ForeignAnswer,
    JoinUnconfirmed,
    MoonrunError,
    Overloaded,
    PlatformUnreachable,
    ReconcileRequired,
    Replayed,
    SessionExpired,
    SessionRotated,
    SignatureExpired,
    SignatureInvalid,
    StoreUnavailable,
)
from moonrun.security import signing
from moonrun.wire.error_body import ErrorDetail
from moonrun.wire.parse import parse
from moonrun.wire.run import (
    AckAnswer,
    AckBatchAnswer,
    BatchEntry,
    CancelPollAnswer,
    CancelWatchAnswer,
    ChunkAnswer,
    ClaimAnswer,
    Grant,
    HeartbeatAnswer,
    JoinAnswer,
    LogBatchAnswer,
    LogBatchesAnswer,
    ProgressAnswer,
    ReconcileAnswer,
    RegisterAnswer,
    ResultAnswer,
    ResultBatchAnswer,
    SessionEndAnswer,
)

T = TypeVar("T")

_BY_CODE: dict[str, type[MoonrunError]] = {}
for _error, (_, _code) in ERROR_TABLE.items():
    if _code not in ("internal", "unreachable"):
        # The first type of a code is its base (400 `invalid_request` is a kind of the 422).
        _BY_CODE.setdefault(_code, _error)


Unreachable = PlatformUnreachable
"""Run's name for a platform that did not answer."""


SESSION_ERRORS: tuple[type[MoonrunError], ...] = (
    SessionRotated,
    SessionExpired,
    ReconcileRequired,
    SignatureInvalid,
)
"""Answers that mean: register again and reconcile, then try once more. (`signature_invalid`
on a session-signed request means the platform no longer knows the session's key: a new
platform secret, or a store restored from before the session.)"""

TRANSIENT: tuple[type[MoonrunError], ...] = (
    Unreachable,
    Overloaded,
    ChannelBusy,
    Contention,
    StoreUnavailable,
    SignatureExpired,
    Replayed,
)
"""Answers that mean: the same request may well succeed a little later."""


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    key: bytes
    generation: int
    heartbeat_interval_s: float
    session_ttl_s: float
    ack_timeout_s: float
    lease_ttl_s: float
    claims_with_results: bool = False
    """The platform grants jobs in a results batch's answer (`results_and_claim`)."""
    silent_results: bool = False
    """The platform takes a result's `silent`: an attempt that printed nothing needs no log
    batch to complete its logs."""
    log_batches: bool = False
    """The platform takes several attempts' log batches in one request (`send_log_batches`)."""


@dataclass(frozen=True)
class ChannelSettings:
    timeout_s: float
    connections: int


CHANNELS: Mapping[str, ChannelSettings] = {
    "control": ChannelSettings(timeout_s=5, connections=2),
    "jobs": ChannelSettings(timeout_s=10, connections=8),
    "logs": ChannelSettings(timeout_s=15, connections=2),
    "artifacts": ChannelSettings(timeout_s=60, connections=2),
}


BATCH_ITEMS = 1000
"""The most entries the platform takes in one batch."""
BATCH_BYTES = 192 * 1024
"""A batch's entries stay under this many bytes of JSON, well within the platform's body limit
for the jobs channel (256 KiB)."""


def error_from(status: int, body: Any, retry_after: str | None = None) -> MoonrunError:
    """The typed error an error answer names."""
    detail = body.get("error") if isinstance(body, dict) else None
    code = detail.get("code") if isinstance(detail, dict) else None
    message = detail.get("message") if isinstance(detail, dict) else None
    if status == 503 and code == "overloaded":
        return Overloaded(str(message or code), retry_after_s=_seconds(retry_after))
    if status >= 500 or code is None:
        return Unreachable(f"the platform answered {status}")
    error_type = _BY_CODE.get(code, MoonrunError)
    return error_type(str(message or code))


def pause_after(error: MoonrunError, delays: Iterator[float]) -> float:
    """How long to wait before trying again after `error`: the next backoff pause, and at
    least the `Retry-After` of an overloaded platform."""
    pause = next(delays)
    if isinstance(error, Overloaded):
        pause = max(pause, float(error.retry_after_s))
    return pause


def _seconds(retry_after: str | None) -> int:
    """A `Retry-After` in seconds (1 when absent or not a small number of seconds)."""
    try:
        seconds = int(retry_after or "")
    except ValueError:
        return 1
    return min(max(seconds, 0), 300)


def entry_answer(
    status: int, answer: T | None, error: ErrorDetail | None, where: str
) -> T | MoonrunError:
    """A batch entry's answer, or its typed error (as the single-message route gives it)."""
    if status != 200:
        return error_from(status, {"error": error})
    if answer is None:
        raise ForeignAnswer(f"the platform answered {where} in a foreign shape: 200 without answer")
    return answer


class PlatformClient:
    """Signed requests to one platform, over four independent channels."""

    def __init__(
        self,
        base_url: str,
        endpoint_id: str,
        identity: Ed25519PrivateKey,
        *,
        wall_clock: Callable[[], float] = time.time,
        channels: Mapping[str, ChannelSettings] = CHANNELS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.endpoint_id = endpoint_id
        self._identity = identity
        self._wall_clock = wall_clock
        self._channels = channels
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self.session: SessionInfo | None = None

    async def __aenter__(self) -> PlatformClient:
        for name, settings in self._channels.items():
            self._sessions[name] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=settings.connections),
                timeout=aiohttp.ClientTimeout(total=settings.timeout_s),
            )
        return self

    async def __aexit__(self, *_: object) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    # -- plumbing ------------------------------------------------------------------------------

    async def _send(
        self,
        channel: str,
        method: str,
        path: str,
        body: bytes,
        *,
        key_id: str | None = None,
        key: bytes | Ed25519PrivateKey | None = None,
        extra_headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> object:
        """The decoded answer (None for none, or for one that is not JSON): the caller parses
        it into its shape."""
        headers = {"Content-Type": content_type, **(extra_headers or {})}
        if key is not None and key_id is not None:
            headers.update(
                signing.sign(
                    method,
                    path,
                    "",
                    body,
                    key_id=key_id,
                    key=key,
                    created=int(self._wall_clock()),
                    nonce=signing.b64url(secrets.token_bytes(16)),
                )
            )
        # Always a timeout: aiohttp takes `timeout=None` for *no* timeout, not the session's.
        total = self._channels[channel].timeout_s if timeout_s is None else timeout_s
        timeout = aiohttp.ClientTimeout(total=total)
        try:
            async with self._sessions[channel].request(
                method, self.base_url + path, data=body, headers=headers, timeout=timeout
            ) as response:
                text = await response.text()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unreachable(f"{channel}: {type(error).__name__}: {error}") from None
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = None
        if status >= 400:
            raise error_from(status, answer, retry_after)
        return answer

    def _session(self) -> SessionInfo:
        if self.session is None:
            raise MoonrunError("no session: register first")
        return self.session

    async def _signed(
        self,
        channel: str,
        path: str,
        document: Any,
        shape: type[T],
        *,
        timeout_s: float | None = None,
    ) -> T:
        """POST `document`, signed with the session key; the answer, parsed as `shape`."""
        session = self._session()
        body = json.dumps(document).encode()
        answer = await self._send(
            channel,
            "POST",
            path,
            body,
            key_id=f"session:{session.session_id}",
            key=session.key,
            timeout_s=timeout_s,
        )
        return parse(shape, answer, f"POST {path}")

    # -- control channel -----------------------------------------------------------------------

    async def register(
        self, boot_id: str, capacity: int, kinds: dict[str, Any] | None = None
    ) -> SessionInfo:
        """A new session; `kinds` advertises the kinds this Run runs, with their schemas."""
        message: dict[str, Any] = {
            "boot_id": boot_id,
            "run_version": __version__,
            "capacity": capacity,
        }
        if kinds is not None:
            message["kinds"] = kinds
        body = json.dumps(message).encode()
        sent = await self._send(
            "control",
            "POST",
            "/run/v1/sessions",
            body,
            key_id=f"endpoint:{self.endpoint_id}",
            key=self._identity,
        )
        answer = parse(RegisterAnswer, sent, "POST /run/v1/sessions")
        self.session = SessionInfo(
            session_id=answer["session_id"],
            key=signing.b64url_decode(answer["session_key"]),
            generation=answer["generation"],
            heartbeat_interval_s=answer["heartbeat_interval_s"],
            session_ttl_s=answer["session_ttl_s"],
            ack_timeout_s=answer["ack_timeout_s"],
            lease_ttl_s=answer["lease_ttl_s"],
            claims_with_results=answer.get("claims_with_results") is True,
            silent_results=answer.get("silent_results") is True,
            log_batches=answer.get("log_batches") is True,
        )
        return self.session

    async def heartbeat(self) -> HeartbeatAnswer:
        """Keep the session alive; the session takes the interval the answer tells (the
        platform stretches it as its fleet grows; an older platform tells none)."""
        session = self.session
        answer = await self._signed("control", "/run/v1/heartbeat", {}, HeartbeatAnswer)
        interval = answer.get("heartbeat_interval_s")
        if (
            interval is not None
            and interval >= 1  # a foreign answer must not turn heartbeats into a busy loop
            and session is not None
            and self.session is session
            and interval != session.heartbeat_interval_s
        ):
            self.session = replace(session, heartbeat_interval_s=interval)
        return answer

    async def end_session(self, timeout_s: float) -> None:
        """End the session (a clean shutdown): the endpoint shows offline at once."""
        path = "/run/v1/sessions/end"
        await self._signed("control", path, {}, SessionEndAnswer, timeout_s=timeout_s)
        self.session = None

    # -- jobs channel --------------------------------------------------------------------------

    async def reconcile(self, entries: list[dict[str, Any]]) -> ReconcileAnswer:
        return await self._signed(
            "jobs", "/run/v1/reconcile", {"entries": entries}, ReconcileAnswer
        )

    async def claim(self, max_jobs: int, wait_s: float | None = None) -> list[Grant]:
        """Up to `max_jobs` jobs; with `wait_s`, the platform holds the request until one is
        claimable or that time is up (so this request's timeout is that much longer)."""
        body: dict[str, Any] = {"max_jobs": max_jobs}
        timeout_s = None
        if wait_s is not None:
            body["wait_s"] = wait_s
            timeout_s = wait_s + self._channels["jobs"].timeout_s
        path = "/run/v1/jobs/claim"
        answer = await self._signed("jobs", path, body, ClaimAnswer, timeout_s=timeout_s)
        return answer["jobs"]

    async def watch_cancels(
        self, known: list[tuple[str, int]], wait_s: float
    ) -> list[tuple[str, int]]:
        """The endpoint's held attempts a user asked to cancel, but those in `known`; the
        platform holds the request up to `wait_s` until there is one."""
        body = {"known": [list(key) for key in known], "wait_s": wait_s}
        timeout_s = wait_s + self._channels["jobs"].timeout_s
        path = "/run/v1/jobs/cancels"
        answer = await self._signed("jobs", path, body, CancelWatchAnswer, timeout_s=timeout_s)
        return [(c["job_id"], c["attempt"]) for c in answer["cancels"]]

    async def acks(self, acks: list[dict[str, Any]]) -> list[AckAnswer | MoonrunError]:
        """Several acks (`job_id`, `attempt`, `lease`) in one request: for each, in order, its
        answer or its error (an error of the whole request is raised)."""
        path = "/run/v1/jobs/acks"
        answer = await self._signed("jobs", path, {"acks": acks}, AckBatchAnswer)
        entries = _in_order(answer["answers"], acks, path)
        return [
            entry_answer(e["status"], e.get("answer"), e.get("error"), f"POST {path}")
            for e in entries
        ]

    async def results(self, results: list[dict[str, Any]]) -> list[ResultAnswer | MoonrunError]:
        """Several results (`job_id`, `attempt`, `lease` and the result's fields) in one
        request, answered as `acks` are."""
        answers, _ = await self.results_and_claim(results, None)
        return answers

    async def results_and_claim(
        self, results: list[dict[str, Any]], max_jobs: int | None
    ) -> tuple[list[ResultAnswer | MoonrunError], list[Grant]]:
        """`results`, and with `max_jobs` a claim of up to that many jobs once they are
        applied (a platform whose session says `claims_with_results`): the answers, and
        what the claim granted."""
        path = "/run/v1/jobs/results"
        body: dict[str, Any] = {"results": results}
        if max_jobs is not None:
            body["claim"] = {"max_jobs": max_jobs}
        answer = await self._signed("jobs", path, body, ResultBatchAnswer)
        entries = _in_order(answer["answers"], results, path)
        answers = [
            entry_answer(e["status"], e.get("answer"), e.get("error"), f"POST {path}")
            for e in entries
        ]
        return answers, answer.get("jobs", [])

    async def progress(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        seq: int,
        percent: float | None,
        message: str | None,
    ) -> ProgressAnswer:
        body: dict[str, Any] = {"attempt": attempt, "lease": lease, "seq": seq}
        if percent is not None:
            body["percent"] = percent
        if message is not None:
            body["message"] = message
        path = f"/run/v1/jobs/{job_id}/progress"
        return await self._signed("jobs", path, body, ProgressAnswer)

    async def cancel_poll(self, job_id: str, attempt: int, lease: str) -> CancelPollAnswer:
        evidence = {"attempt": attempt, "lease": lease}
        path = f"/run/v1/jobs/{job_id}/cancel-poll"
        return await self._signed("jobs", path, evidence, CancelPollAnswer)

    # -- logs and artifacts channels -----------------------------------------------------------

    async def send_logs(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        seq: int,
        lines: list[dict[str, str]],
        *,
        final: bool = False,
    ) -> LogBatchAnswer:
        """A batch of the attempt's lines; `final`: its last (an older platform ignores it)."""
        body = log_batch(job_id, attempt, lease, seq, lines, final=final)
        return await self._signed("logs", "/run/v1/logs", body, LogBatchAnswer)

    async def send_log_batches(
        self, batches: list[dict[str, Any]]
    ) -> list[LogBatchAnswer | MoonrunError]:
        """Several attempts' batches (each a `log_batch`) in one request, each answered as
        `send_logs` would be (a platform whose session says `log_batches`)."""
        path = "/run/v1/logs/batches"
        answer = await self._signed("logs", path, {"batches": batches}, LogBatchesAnswer)
        entries = _in_order(answer["answers"], batches, path)
        return [
            entry_answer(e["status"], e.get("answer"), e.get("error"), f"POST {path}")
            for e in entries
        ]

    async def put_chunk(
        self,
        job_id: str,
        attempt: int,
        lease: str,
        name: str,
        index: int,
        data: bytes,
        *,
        final: bool,
    ) -> ChunkAnswer:
        session = self._session()
        headers = {"Run-Lease": lease}
        if final:
            headers["Run-Final"] = "true"
        path = f"/run/v1/artifacts/{job_id}/{attempt}/{name}/{index}"
        answer = await self._send(
            "artifacts",
            "PUT",
            path,
            data,
            key_id=f"session:{session.session_id}",
            key=session.key,
            extra_headers=headers,
            content_type="application/octet-stream",
        )
        return parse(ChunkAnswer, answer, f"PUT {path}")


E = TypeVar("E", bound=BatchEntry)


def log_batch(
    job_id: str,
    attempt: int,
    lease: str,
    seq: int,
    lines: list[dict[str, str]],
    *,
    final: bool = False,
) -> dict[str, Any]:
    """One attempt's log batch as the platform takes it; `final`: its last."""
    body: dict[str, Any] = {
        "job_id": job_id,
        "attempt": attempt,
        "lease": lease,
        "seq": seq,
        "lines": lines,
    }
    if final:
        body["final"] = True
    return body


def _in_order(entries: list[E], items: list[dict[str, Any]], path: str) -> list[E]:
    """A batch's entries, once they answer the items sent, one each, in order."""
    if [entry["job_id"] for entry in entries] != [item["job_id"] for item in items]:
        raise ForeignAnswer(f"the platform answered POST {path} for other jobs than were sent")
    return entries


JOIN_TRIES = 8
JOIN_BACKOFF = Backoff(initial_s=0.5, max_s=5.0)
"""Pauses between tries of a join that got no answer (or 429/503): about 15 s in all."""


async def join(
    base_url: str,
    token: str,
    public_key: str,
    *,
    timeout_s: float = 10,
    tries: int = JOIN_TRIES,
    backoff: Backoff = JOIN_BACKOFF,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Burn a join token, proposing `labels` for the endpoint; returns the endpoint id.

    A try that got no answer is tried again with the same key: the platform takes the same
    token and key again as the same join (its answer may have been lost). When no try got an
    answer, `JoinUnconfirmed` if one may have reached the platform (the caller keeps the key
    for the next try), `Unreachable` if none did (nothing was ever connected).
    """
    fields: dict[str, object] = {"join_token": token, "identity_public_key": public_key}
    if labels:
        fields["labels"] = dict(labels)
    body = json.dumps(fields).encode()
    url = base_url.rstrip("/") + "/run/v1/join"
    delays = backoff.delays()
    delivered = False
    problem: MoonrunError = Unreachable(f"cannot reach the platform at {base_url}")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for tried in range(tries):
            if tried:
                await asyncio.sleep(pause_after(problem, delays))
            try:
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as response:
                    status = response.status
                    text = await response.text()
            except aiohttp.ClientConnectorError as error:  # never connected: nothing was sent
                problem = Unreachable(f"cannot reach the platform at {base_url}: {error}")
                continue
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
                delivered = True
                problem = Unreachable(f"cannot reach the platform at {base_url}: {error}")
                continue
            try:
                answer = json.loads(text) if text else None
            except ValueError:
                answer = None
            if status in (429, 503) or status >= 500:
                problem = error_from(status, answer)
                delivered = True
                continue
            if status >= 400:
                raise error_from(status, answer)
            return parse(JoinAnswer, answer, f"POST {url}")["endpoint_id"]
    if delivered:
        raise JoinUnconfirmed(
            f"{problem.message}; the join may have reached the platform: run the same command "
            "again (same token, same data directory) to finish it"
        )
    raise problem
