"""What the HTTP service is given (`HttpPlatform`, its limits) and the plumbing every route
shares: error bodies, body limits, anonymous bodies, the request log."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect, cookie_parser

from moonrun.artifacts.protocol import ArtifactStore
from moonrun.clock import Clock
from moonrun.errors import ClientGone, MoonrunError, TooLarge
from moonrun.http.channels import Admission, Channels
from moonrun.http.edge import edge_of
from moonrun.http.load import LoopLag
from moonrun.http.metrics import Metrics
from moonrun.logs.protocol import LogStore
from moonrun.security.keys import NonceCache
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.websessions import SESSION_COOKIE, WebSessions

log = logging.getLogger("moonrun.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpSettings:
    """Limits of the HTTP service (body sizes in bytes) and its waiting requests."""

    job_body_limit: int = 256 * 1024
    log_body_limit: int = 1024 * 1024
    artifact_chunk_limit: int = 4 * 1024 * 1024
    user_body_limit: int = 1024 * 1024
    sweep_interval_s: float = 1.0
    max_claim_wait_s: float = 60.0
    """The longest a claim's `wait_s` is honoured (Run's default timeouts are longer), as
    long as a user's blocking read (load balancers must let a request take 90 s)."""
    max_read_wait_s: float = 60.0
    """The longest a blocking job read's `wait_s` is honoured (how many may wait, and how
    often they look again: the service's `WaitLimits`)."""
    overload_lag_s: float = 0.5
    """While the event loop lags more than this, Run routes that bring new work answer 503
    `overloaded` and claims an empty grant (`http/load.py`)."""
    overload_retry_after_s: int = 2
    """The `Retry-After` of an `overloaded` answer."""

    def limit_for(self, channel: str) -> int:
        """The body limit of a channel (`channel_of`)."""
        return {
            "logs": self.log_body_limit,
            "artifacts": self.artifact_chunk_limit,
            "jobs": self.job_body_limit,
            "control": self.job_body_limit,
            "sessions": self.job_body_limit,
        }.get(channel, self.user_body_limit)


class HttpPlatform(Protocol):
    """What the HTTP service is given: the use cases (never the store: the HTTP room reaches it
    only through them), the log and artifact stores, and its own channels, limits, metrics and
    nonces. The wiring builds one (`wiring/platform.py`'s `Platform`) and passes it in; nothing
    here chooses an implementation or reads the environment."""

    service: SchedulingService
    directory: Directory
    web: WebSessions
    clock: Clock
    secret: bytes
    logs: LogStore
    artifacts: ArtifactStore
    channels: Channels
    http: HttpSettings
    metrics: Metrics
    lag: LoopLag
    nonces: NonceCache
    started_at_s: float


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def channel_of(path: str) -> str:
    """Which channel a path belongs to, for metrics and logs."""
    if path.startswith("/run/v1/logs"):
        return "logs"
    if path.startswith("/run/v1/artifacts"):
        return "artifacts"
    if path.startswith(("/run/v1/jobs", "/run/v1/reconcile")):
        return "jobs"
    if path == "/run/v1/sessions":
        return "sessions"
    if path.startswith("/run/v1/"):
        return "control"
    if path.startswith("/api/"):
        return "user"
    return "ops"


def declared_over(declared: str | None, limit: int) -> bool:
    """Whether a Content-Length says more than `limit` bytes, however many digits it has (one
    that is not a number is the HTTP server's to refuse)."""
    if declared is None or not (declared.isascii() and declared.isdigit()):
        return False
    digits = declared.lstrip("0")
    return len(digits) > len(str(limit)) or int(digits or "0") > limit


class BodyLimit:
    """Refuse bodies over the limit with 413 before they are read into memory."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        declared = dict(scope["headers"]).get(b"content-length")
        if declared_over(None if declared is None else declared.decode("latin-1"), limit):
            await _send_error(send, TooLarge(f"the body is over the limit of {limit} bytes"))
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _Overflow()
            return message

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watch)
        except _Overflow:
            if not started:
                await _send_error(send, TooLarge(f"the body is over the limit of {limit} bytes"))


class _Overflow(Exception):
    pass


async def _send_error(send: Send, error: MoonrunError) -> None:
    body = json.dumps({"error": {"code": error.code, "message": error.message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class AnonymousBodies:
    """A console or operations request whose body has not arrived when it starts reading it
    reads it on a place of the anonymous channel (429 `channel_busy` when full), unless its
    cookie names a live console session (then the edge keeps its connection while the body
    arrives). So stalled sign-in forms hold a bounded number of places, none a signed-in
    user needs. (`Api` does the same for the APIs.)"""

    def __init__(self, app: ASGIApp, platform_of: Callable[[], HttpPlatform]) -> None:
        self.app = app
        self.platform_of = platform_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        edge = edge_of(scope) if scope["type"] == "http" else None
        if edge is None or edge.arrived:
            await self.app(scope, receive, send)
            return
        platform = self.platform_of()
        admission: Admission | None = None

        async def guarded() -> Message:
            nonlocal admission
            if admission is None:
                admission = platform.channels.anonymous.admit()
                if await _signed_in(platform, scope):
                    edge.trust()
                else:
                    admission.enter()
            message = await receive()
            if not message.get("more_body", False):
                admission.leave()
            return message

        try:
            await self.app(scope, guarded, send)
        finally:
            if admission is not None:
                admission.leave()


async def _signed_in(platform: HttpPlatform, scope: Scope) -> bool:
    """Whether the request's cookie names a live console session."""
    cookies = dict(scope["headers"]).get(b"cookie")
    token = cookie_parser(cookies.decode("latin-1")).get(SESSION_COOKIE) if cookies else None
    if not token:
        return False
    return await platform.channels.user.run(platform.web.user, token) is not None


class RequestLog:
    """One JSON log line and one latency sample per request; no bodies, no headers."""

    def __init__(self, app: ASGIApp, metrics_of: Callable[[], Metrics]) -> None:
        self.app = app
        self.metrics_of = metrics_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        except (ClientDisconnect, ClientGone):
            # The client left before its body arrived: nobody to answer, nothing wrong here.
            status = ClientGone().status
        finally:
            elapsed = time.perf_counter() - started
            channel = channel_of(scope["path"])
            self.metrics_of().latency_of(channel).observe(elapsed)
            route = scope.get("route")
            log.info(
                "request",
                extra={
                    "fields": {
                        "method": scope["method"],
                        "route": getattr(route, "path", "unmatched"),
                        "status": status,
                        "channel": channel,
                        "ms": round(elapsed * 1000, 3),
                    }
                },
            )
