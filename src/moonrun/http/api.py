"""The APIs' front door: one small ASGI app over a table of routes (the Run and user APIs).

Run's messages and users' jobs are the platform's hot paths, so they skip a web framework's
per-request machinery (routing over every route, dependency solving, response models, a
stack of middleware), which cost more than the work itself. For each request, in this order:
the route (404, or 405 with `Allow`); the declared body size (413); what the head alone can
prove (401: a Run request's signature is verified against its `Content-Digest` header, a user
request must present credentials, and when its body has not arrived yet they are checked now);
the body, under the edge's deadline (`http/edge.py`), read on a place of the anonymous channel
(429 when it is full) when nothing in the head vouched for it and it has not arrived yet (413
past the limit as read); the body against the signed digest, then the nonce (401); admission
to the route's channel (429 at once when it is full); the query's and the body's shapes (422;
bodies strictly), then the handler. So a request takes no place on its channel while its body
is on the way, and what callers without credentials hold while their bodies arrive is bounded
apart from Runs and signed-in users. A user request whose shape is wrong has its credentials
checked first, so that bad credentials are 401 whatever the body. Answers and errors have
docs/protocol.md's shapes, are serialised once (orjson), and every route is described in the served
OpenAPI document (`openapi_paths`). FastAPI serves the rest: the console, `/healthz`,
`/metrics`, `/docs`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import parse_qsl

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema
from starlette.requests import cookie_parser

from moonrun.errors import (
    ClientGone,
    Forbidden,
    InvalidRequest,
    MethodNotAllowed,
    MoonrunError,
    NotFound,
    Overloaded,
    TooLarge,
    Unauthenticated,
)
from moonrun.http.channels import Admission, Channel
from moonrun.http.edge import RequestEdge, edge_of
from moonrun.http.load import check_load
from moonrun.http.platform import HttpPlatform, channel_of, declared_over
from moonrun.scheduling.records import User
from moonrun.scheduling.time import Instant
from moonrun.service.waiting import Waiting
from moonrun.service.websessions import SESSION_COOKIE
from moonrun.wire import error_body as envelope
from moonrun.wire.error_body import ErrorBody

log = logging.getLogger("moonrun.http")

Auth = Literal["session", "endpoint", "user"] | None
"""Who may call a route: Run signing with its session key or its identity key, a user with an
API token or the console's cookie, or anyone (None)."""
Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Content = TypeVar("Content")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a user request presents, not checked yet: an API token, or the console's cookie
    (then a write also needs the session's X-CSRF-Token header)."""

    token: str | None
    cookie: str | None
    write: bool
    csrf: str | None

    @classmethod
    def of(cls, method: str, headers: Mapping[str, str]) -> Credentials:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        cookie = None
        if bearer is None and "cookie" in headers:
            cookie = cookie_parser(headers["cookie"]).get(SESSION_COOKIE)
        return cls(bearer, cookie, method not in ("GET", "HEAD"), headers.get("x-csrf-token"))

    @property
    def present(self) -> bool:
        return self.token is not None or self.cookie is not None

    def check(self, platform: HttpPlatform) -> User:
        """The user these credentials belong to (blocking: it reads the store)."""
        if self.token is not None:
            return platform.directory.authenticate(self.token)
        found = platform.web.user(self.cookie) if self.cookie else None
        if found is None:
            raise Unauthenticated("send Authorization: Bearer <api token>")
        if self.write and not platform.web.csrf_ok(self.cookie, self.csrf):
            raise Forbidden("a cookie-authenticated write needs the X-CSRF-Token header")
        return found


@dataclass
class Call:
    """One request as a handler sees it: admitted, its credentials verified or present, its
    query and body parsed."""

    platform: HttpPlatform
    channel: Channel
    """The route's channel: its admission, and its threads or inline work (`run`)."""
    admission: Admission
    subject: str
    """The session id (or, for registration, the endpoint id) a Run request was signed for."""
    credentials: Credentials | None
    """A user request's credentials, checked with the work they authorise (`user_api`)."""
    params: dict[str, Any]
    query: Any
    body: Any
    headers: dict[str, str]
    receive: Receive
    """The request's ASGI receive: once the body is read, it returns only on disconnect."""
    address: str = ""
    """The client's address (the connection's peer, or what a trusted proxy named)."""
    received_at: Instant = 0
    """When its head had arrived, by the platform's clock (before its signature was checked,
    its body read or its place taken: each may wait)."""

    def waiting(self) -> Waiting:
        """What this request lends the service to wait (claims, blocking reads): its
        channel's threads, its place on the channel, and its client's disconnect."""
        return Waiting(self.channel.run, self.admission, self._disconnected, self.address)

    async def _disconnected(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass


@dataclass(frozen=True)
class JsonReply(Generic[Content]):
    """What a handler answers when it is more than the route's status with `content` as the
    JSON body: another status, headers, or no body."""

    status: int
    content: Content
    """The JSON body, or None for none."""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stream:
    """A handler's answer of raw bytes, sent a part at a time as `parts` yields them (an
    artifact a chunk at a time: never the whole of it in memory)."""

    status: int
    length: int
    parts: AsyncGenerator[bytes, None]
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/octet-stream"


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Signatures:
    """How `Api` checks a signed Run request: its head before the body is read, then its body.

    `head(platform, channel, auth, scope, headers)` verifies what the headers prove (the MAC or
    Ed25519 signature over the method, path, query and `Content-Digest` header) and returns
    what `body(platform, signed, data)` needs to tie the body to that digest and record the
    nonce; `body` returns the key's subject (session or endpoint id)."""

    head: Callable[[HttpPlatform, Channel, Auth, Scope, dict[str, str]], Awaitable[Any]]
    body: Callable[[HttpPlatform, Any, bytes], str]


@dataclass(frozen=True, kw_only=True)
class Route:
    """One route: where, on which channel, called by whom, with which query and bodies."""

    method: str
    path: str
    channel: str
    auth: Auth
    body: type[BaseModel] | None = None
    """The JSON body's model; None for a body that is ignored, or raw bytes (`raw_body`)."""
    answer: type[Any] | None
    """The answer's shape (a TypedDict of `moonrun.wire`), which the handler returns (in a
    `JsonReply` when it sets more than the body); None for no JSON body."""
    status: int
    handler: Handler
    ints: frozenset[str] = frozenset()
    """Path parameters that must be integers."""
    query: type[BaseModel] | None = None
    headers: tuple[str, ...] = ()
    """Optional request headers the route reads (for the document)."""
    also: Mapping[int, tuple[type[Any] | None, str]] = field(default_factory=dict)
    """Other successful answers: status -> (shape or None, description)."""
    raw_body: bool = False
    no_store: bool = False
    """The answer carries a secret (a token, a session key): `Cache-Control: no-store`."""
    sheds: bool = False
    """Brings new work: refused with 503 `overloaded` while the platform lags (`http/load.py`)."""
    segments: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.path.split("/")))

    @property
    def run(self) -> bool:
        return self.path.startswith("/run/")

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


def _dumps(content: Any) -> bytes:
    """JSON bytes: orjson, or the standard library for what orjson refuses (an integer beyond
    64 bits that a request carried in, say)."""
    try:
        return orjson.dumps(content)
    except TypeError:
        return json.dumps(content, separators=(",", ":"), default=_unfragment).encode()


def _unfragment(value: Any) -> Any:
    """A verbatim JSON text (`orjson.Fragment`, a stored payload) as the standard library
    needs it: decoded again."""
    if isinstance(value, orjson.Fragment):
        return json.loads(value.contents)
    raise TypeError(f"{type(value).__name__} is not JSON")


def error_body(error: MoonrunError) -> ErrorBody:
    return envelope.error_body(error.code, error.message, error.fields)


class Api:
    """The ASGI app serving one table of routes for one platform."""

    def __init__(self, platform: HttpPlatform, routes: Sequence[Route], verify: Signatures) -> None:
        self.platform = platform
        self.routes = tuple(routes)
        self._verify = verify
        self._exact = {
            (route.method, route.path): route for route in self.routes if "{" not in route.path
        }
        self._templated: dict[int, list[Route]] = {}
        for route in self.routes:
            if "{" in route.path:
                self._templated.setdefault(len(route.segments), []).append(route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        platform = self.platform
        path, method = scope["path"], scope["method"]
        status, template, route = 500, "unmatched", None
        headers: list[tuple[bytes, bytes]] = []
        stream: Stream | None = None
        try:
            route, params = self._route("GET" if method == "HEAD" else method, path)
            template = route.path
            answer = await self._serve(route, params, scope, receive)
            if isinstance(answer, Stream):
                stream = answer
            elif not isinstance(answer, JsonReply):
                answer = JsonReply(route.status, answer)
        except ClientGone:
            # Nobody is left to answer: one line, no error.
            self._observe(started, path, method, template, ClientGone().status)
            return
        except MoonrunError as error:
            if path.startswith("/run/"):
                platform.metrics.count_rejection(error)
            answer = JsonReply(error.status, error_body(error), _error_headers(error, path, self))
        except Exception:
            log.exception("unexpected error", extra={"fields": {"route": template}})
            answer = JsonReply(500, envelope.error_body("internal", "internal error"))
        if stream is not None:
            # Past its first byte an answer cannot become an error: a failure ends the stream.
            await self._stream(stream, method, send)
            self._observe(started, path, method, template, stream.status)
            return
        status = answer.status
        body = b"" if answer.content is None else _dumps(answer.content)
        headers = [
            (name.lower().encode(), value.encode()) for name, value in answer.headers.items()
        ]
        if answer.content is not None:
            headers.append((b"content-type", b"application/json"))
        if route is not None and route.no_store:
            headers.append((b"cache-control", b"no-store"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
        self._observe(started, path, method, template, status)

    async def _stream(self, answer: Stream, method: str, send: Send) -> None:
        """Send a Stream: its headers, then each part as it comes (none for HEAD)."""
        headers = [
            (name.lower().encode(), value.encode()) for name, value in answer.headers.items()
        ]
        headers.append((b"content-type", answer.content_type.encode()))
        headers.append((b"content-length", str(answer.length).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        try:
            if method != "HEAD":
                async for part in answer.parts:
                    await send({"type": "http.response.body", "body": part, "more_body": True})
        finally:
            await answer.parts.aclose()
        await send({"type": "http.response.body", "body": b""})

    def _observe(self, started: float, path: str, method: str, template: str, status: int) -> None:
        platform = self.platform
        elapsed = time.perf_counter() - started
        channel = channel_of(path)
        platform.metrics.latency_of(channel).observe(elapsed)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "request",
                extra={
                    "fields": {
                        "method": method,
                        "route": template,
                        "status": status,
                        "channel": channel,
                        "ms": round(elapsed * 1000, 3),
                    }
                },
            )

    def _route(self, method: str, path: str) -> tuple[Route, dict[str, Any]]:
        exact = self._exact.get((method, path))
        if exact is not None:
            return exact, {}
        parts = path.split("/")
        allowed = False
        for route in self._templated.get(len(parts), ()):
            params = route.match(parts)
            if params is None:
                continue
            if route.method == method:
                return route, params
            allowed = True
        if allowed or any(route.path == path for route in self._exact.values()):
            raise MethodNotAllowed("Method Not Allowed")
        raise NotFound("Not Found")

    def allowed(self, path: str) -> list[str]:
        """The methods some route takes at `path`."""
        parts = path.split("/")
        return sorted({r.method for r in self.routes if r.match(parts) is not None})

    async def _serve(
        self, route: Route, params: dict[str, Any], scope: Scope, receive: Receive
    ) -> Any:
        platform = self.platform
        received_at = platform.clock.now()
        if route.sheds:  # before any work: a refusal must cost next to nothing
            settings = platform.http
            check_load(platform.lag, settings.overload_lag_s, settings.overload_retry_after_s)
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
        }
        limit = platform.http.limit_for(route.channel)
        if declared_over(headers.get("content-length"), limit):
            raise TooLarge(f"the body is over the limit of {limit} bytes")
        channel: Channel = getattr(platform.channels, route.channel)
        edge = edge_of(scope)
        signed: Any = None
        credentials = None
        vouched = False
        if route.auth == "user":
            credentials = Credentials.of(scope["method"], headers)
            if not credentials.present:
                raise Unauthenticated("send Authorization: Bearer <api token>")
            if edge is not None and not edge.arrived:
                # Checked now rather than with the work: a caller without valid credentials
                # then waits for no body.
                await channel.run(credentials.check, platform)
                vouched = True
        elif route.auth is not None:
            signed = await self._verify.head(platform, channel, route.auth, scope, headers)
            vouched = True
        data = await self._body(edge, vouched, receive, limit)
        subject = "" if signed is None else self._verify.body(platform, signed, data)
        admission = channel.admit()
        await admission.enter_in_line()
        try:
            call = Call(
                platform,
                channel,
                admission,
                subject,
                credentials,
                params,
                None,
                data,
                headers,
                receive,
                _address(scope),
                received_at,
            )
            try:
                for name in route.ints:
                    params[name] = _int_param(name, params[name])
                if route.query is not None:
                    call.query = _parse_query(route.query, scope.get("query_string", b""))
                elif not route.run:
                    _refuse_query(scope.get("query_string", b""))
                if route.body is not None:
                    call.body = _parse_body(route.body, data)
            except InvalidRequest:
                if credentials is not None:  # bad credentials are 401 whatever the request
                    await channel.run(credentials.check, platform)
                raise
            return await route.handler(call)
        finally:
            admission.leave()

    async def _body(
        self, edge: RequestEdge | None, vouched: bool, receive: Receive, limit: int
    ) -> bytes:
        """The request's body. One still on its way is read on a place of the anonymous
        channel unless the head vouched for it (then the edge keeps its connection)."""
        if edge is None or edge.arrived:
            return await _read_body(receive, limit)
        if vouched:
            edge.trust()
            return await _read_body(receive, limit)
        with self.platform.channels.anonymous.admit():
            return await _read_body(receive, limit)


def _address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _error_headers(error: MoonrunError, path: str, api: Api) -> dict[str, str]:
    if isinstance(error, Overloaded):
        return {"Retry-After": str(error.retry_after_s)}
    if error.status in (429, 503):
        return {"Retry-After": "1"}
    if isinstance(error, MethodNotAllowed):
        return {"Allow": ", ".join(api.allowed(path))}
    return {}


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            raise TooLarge(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


FIELD_NAME_ECHO = 100
"""At most this much of a field's path is said back in a 422."""


def _problems(error: ValidationError, prefix: str = "") -> str:
    """The fields and what is wrong with them, never the values (they may be secrets)."""
    problems = []
    for problem in error.errors(include_url=False, include_input=False)[:5]:
        if problem["type"] == "json_invalid":
            # The parser's reason names a place, never the input (a lone surrogate, a depth
            # beyond its recursion limit, a bad escape).
            reason = str(problem.get("ctx", {}).get("error", ""))
            if reason.startswith("recursion limit exceeded"):
                return "the body nests deeper than JSON's depth limit (200 levels)"
            return (
                f"the body is not valid JSON: {reason}" if reason else "the body is not valid JSON"
            )
        # A name the caller chose (an unknown field) is echoed back cut short.
        where = (prefix + ".".join(str(part) for part in problem["loc"]))[:FIELD_NAME_ECHO]
        message = "unknown field" if problem["type"] == "extra_forbidden" else problem["msg"]
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems) or "invalid request"


def _parse_body(model: type[BaseModel], data: bytes) -> BaseModel:
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise InvalidRequest(_problems(error)) from None


def _parse_query(model: type[BaseModel], query_string: bytes) -> BaseModel:
    values = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise InvalidRequest(_problems(error, "query.")) from None


def _refuse_query(query_string: bytes) -> None:
    """A user route without query parameters refuses any, rather than ignore them."""
    names = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
    if names:
        # Names only (never values), cut short: they are echoed back.
        problems = [f"query.{name[:100]}: Extra inputs are not permitted" for name in names]
        raise InvalidRequest("; ".join(problems[:5]))


def _int_param(name: str, text: str) -> int:
    """A path integer: ASCII digits, an optional minus, within 64 bits (checked on the digits
    first: `int()` refuses more than 4,300 of them with an error of its own)."""
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidRequest(f"{name}: Input should be a valid integer")
    value = int(text) if len(digits.lstrip("0")) <= 19 else 1 << 64
    if not -(2**63) <= value < 2**63:
        raise InvalidRequest(f"{name}: Input should be an integer within 64 bits")
    return value


ERRORS: Mapping[int, str] = {
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    413: "Too large",
    422: "Invalid request",
    429: "Channel busy",
    503: "Store unavailable",
}
"""Every route may answer these, each with the one error body."""


class _ClosedAnswers(GenerateJsonSchema):
    """pydantic's JSON Schema, each answer's object closed (`additionalProperties: false`): the
    platform sends no key its TypedDict does not name."""

    def typed_dict_schema(self, schema: core_schema.TypedDictSchema) -> JsonSchemaValue:
        generated = super().typed_dict_schema(schema)
        generated["additionalProperties"] = False
        return generated


def _key(shape: type[Any]) -> str:
    return f"{shape.__module__}.{shape.__qualname__}"


def openapi_paths(
    routes: Sequence[Route], error: type[Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The OpenAPI path items of `routes` and the component schemas they refer to (`error` is
    the one error body). Requests are pydantic models, answers the TypedDicts of
    `moonrun.wire`: the document is generated from the very declarations the handlers build
    and Run parses, so it cannot drift from what is sent."""
    shapes = {
        shape
        for r in routes
        for shape in (r.body, r.answer, r.query, *(m for m, _ in r.also.values()))
        if shape is not None
    } | {error}
    ordered = sorted(shapes, key=lambda shape: shape.__name__)
    refs, document = TypeAdapter.json_schemas(
        [(_key(shape), "validation", TypeAdapter(shape)) for shape in ordered],
        ref_template="#/components/schemas/{model}",
        schema_generator=_ClosedAnswers,
    )
    schema_of = {shape: refs[(_key(shape), "validation")] for shape in shapes}
    definitions: dict[str, Any] = document.get("$defs", {})
    errors = {
        str(status): {
            "description": description,
            "content": {"application/json": {"schema": schema_of[error]}},
        }
        for status, description in ERRORS.items()
    }
    paths: dict[str, Any] = {}
    for route in routes:
        answers: dict[str, Any] = {}
        for status, (model, description) in {
            route.status: (route.answer, "Answer"),
            **route.also,
        }.items():
            answer: dict[str, Any] = {"description": description}
            if model is not None:
                answer["content"] = {"application/json": {"schema": schema_of[model]}}
            answers[str(status)] = answer
        operation: dict[str, Any] = {
            "tags": ["run" if route.run else "users"],
            "summary": route.handler.__name__.replace("_", " ").capitalize(),
            "description": (route.handler.__doc__ or "").strip(),
            "operationId": f"{'run' if route.run else 'api'}_{route.handler.__name__}",
            "responses": {**answers, **errors},
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
        if route.query is not None:
            schema = definitions.get(route.query.__name__) or route.query.model_json_schema()
            required = set(schema.get("required", ()))
            parameters.extend(
                {"name": name, "in": "query", "required": name in required, "schema": field}
                for name, field in schema.get("properties", {}).items()
            )
        parameters.extend(
            {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
            for name in route.headers
        )
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_of[route.body]}},
            }
        elif route.raw_body:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return paths, definitions
