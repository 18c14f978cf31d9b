"""The user client: the platform's user API (docs/protocol.md, "User API") for Python and the CLI.

One synchronous implementation on httpx. Every request is retried with capped exponential
backoff (`moonrun.backoff`: full jitter under a ceiling doubling from 0.2 s to 5 s, `retries`
times) when it gets no answer, or a 429 or 503: this is safe for every request, because reads
are idempotent, `submit` always carries an Idempotency-Key, a cancel of a cancelled job
changes nothing, and creating a named thing twice is 409 `already_exists` (which, after a
retry, the caller sees: the first try may have made it).

An error answer raises the `moonrun.errors` class its code names (`PlatformError` for a code
this client does not know); no answer at all, after the retries, raises `Unreachable`.
Records keep the API's JSON object exactly as answered in `data`.
"""

from __future__ import annotations

import functools
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, TypeVar

import httpx

from moonrun.backoff import Backoff
from moonrun.client import profiles
from moonrun.errors import (
    ERROR_TABLE,
    AlreadyExists,
    InvalidRequest,
    MoonrunError,
    NotFound,
    Unauthenticated,
    Unreachable,
    WaitTimedOut,
)

__all__ = [
    "Artifact",
    "Client",
    "Endpoint",
    "FanOut",
    "Group",
    "Job",
    "JobState",
    "Kinds",
    "LogLine",
    "PlatformError",
    "Server",
    "Unreachable",
    "User",
    "WaitTimedOut",
]

TERMINAL_STATES: Final = frozenset({"succeeded", "failed", "cancelled"})
RETRY_STATUSES: Final = frozenset({429, 503})
RETRY_BACKOFF: Final = Backoff(initial_s=0.2, max_s=5.0)
"""Pauses between tries of one request: full jitter under a ceiling doubling 0.2 s to 5 s."""
FOLLOW_POLL: Final = Backoff(initial_s=0.2, max_s=2.0)
"""Pauses between reads of a followed log while no line comes (again from 0.2 s once one does)."""
WAIT_CHUNK_S: Final = 60.0
"""The longest one blocking read asks the platform to wait (it caps waits at 60 s itself)."""
LOG_SETTLE_S: Final = 3.0
"""How long `logs(follow=True)` keeps reading after the job has ended: Run ships log lines
about once a second, so the last ones may arrive just after the result."""
OUTAGE_GRACE_S: Final = 60.0
"""How long `wait` and a followed log keep trying a platform that does not answer (a restart,
a deploy) before they give up with `Unreachable`."""
PAGE_SIZE: Final = 100
T = TypeVar("T")

_BY_CODE: Final[dict[str, type[MoonrunError]]] = {}
for _error, (_, _code) in ERROR_TABLE.items():
    _BY_CODE.setdefault(_code, _error)  # "internal" stays MoonrunError, its first entry


class PlatformError(MoonrunError):
    """The platform answered an error this client does not know."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self._status = status
        self._code = code

    @property
    def code(self) -> str:
        return self._code

    @property
    def status(self) -> int:
        return self._status


# -- records -----------------------------------------------------------------------------------


def _instant(text: Any) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00").replace("z", "+00:00"))


def _optional_instant(text: Any) -> datetime | None:
    return None if text is None else _instant(text)


class JobState(StrEnum):
    """A job's state (docs/protocol.md, "Jobs"); each equals its name as a string too."""

    QUEUED = "queued"
    ACCEPTED = "accepted"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Job:
    """A job as the user API shows it (JobView); `data` is that object as answered."""

    id: str
    server_id: str
    kind: str
    state: JobState
    attempt: int
    max_attempts: int
    created_at: datetime
    progress: dict[str, Any] | None
    terminal: dict[str, Any] | None
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=data["id"],
            server_id=data["server_id"],
            kind=data["kind"],
            state=JobState(data["state"]),
            attempt=data["attempt"],
            max_attempts=data["max_attempts"],
            created_at=_instant(data["created_at"]),
            progress=data.get("progress"),
            terminal=data.get("terminal"),
            data=data,
        )

    @property
    def ended(self) -> bool:
        """Whether the job is in a terminal state (succeeded, failed or cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def result(self) -> Any:
        """What the ending attempt's handler returned (docs/kinds.md); None until it ends."""
        return None if self.terminal is None else self.terminal.get("result")

    @property
    def logs_complete(self) -> bool:
        """Whether its latest attempt's log lines are all in (a platform older than that
        says nothing: then whether the job has ended)."""
        complete = self.data.get("logs_complete")
        return self.ended if complete is None else bool(complete)

    @property
    def priority(self) -> int:
        """0 to 9: among its endpoint's claimable jobs a higher one goes first (5 from a
        platform older than priorities)."""
        return int(self.data.get("priority", 5))

    @property
    def waiting_for(self) -> dict[str, Any] | None:
        """While it waits on its dependencies, `{"jobs": [...], "group": ...}`; else None."""
        found = self.data.get("waiting_for")
        return None if found is None else dict(found)


@dataclass(frozen=True)
class Group:
    """A fan-out group as the user API shows it (GroupView); `data` is that object."""

    id: str
    selector: str
    kind: str
    job_count: int
    max_parallel: int | None
    stop_on_failure: bool
    counts: dict[str, int]
    done: bool
    created_at: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Group:
        return cls(
            id=data["id"],
            selector=data["selector"],
            kind=data["kind"],
            job_count=data["job_count"],
            max_parallel=data.get("max_parallel"),
            stop_on_failure=bool(data.get("stop_on_failure")),
            counts=dict(data["counts"]),
            done=bool(data["done"]),
            created_at=_instant(data["created_at"]),
            data=data,
        )


@dataclass(frozen=True)
class FanOut:
    """What a fan-out made: its group and its jobs, one per matching server."""

    group: Group
    jobs: list[Job]


@dataclass(frozen=True)
class User:
    id: str
    name: str
    platform_admin: bool
    created_at: datetime
    data: dict[str, Any]
    disabled: bool = False

    @classmethod
    def of(cls, data: dict[str, Any]) -> User:
        return cls(
            data["id"],
            data["name"],
            data["platform_admin"],
            _instant(data["created_at"]),
            data,
            bool(data.get("disabled", False)),
        )


@dataclass(frozen=True)
class Endpoint:
    id: str
    name: str
    online: bool
    generation: int
    last_seen_at: datetime | None
    capacity: int | None
    run_version: str | None
    data: dict[str, Any]
    draining: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Endpoint:
        return cls(
            id=data["id"],
            name=data["name"],
            online=data["online"],
            generation=data["generation"],
            last_seen_at=_optional_instant(data.get("last_seen_at")),
            capacity=data.get("capacity"),
            run_version=data.get("run_version"),
            data=data,
            draining=bool(data.get("draining", False)),
            labels=dict(data.get("labels") or {}),  # an older platform sends none
        )


@dataclass(frozen=True)
class Server:
    id: str
    name: str
    endpoint_id: str
    owner_id: str
    admin_ids: tuple[str, ...]
    created_at: datetime
    endpoint_online: bool
    data: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    """The server's own labels (selectors match them over its endpoint's)."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> Server:
        return cls(
            id=data["id"],
            name=data["name"],
            endpoint_id=data["endpoint_id"],
            owner_id=data["owner_id"],
            admin_ids=tuple(data["admin_ids"]),
            created_at=_instant(data["created_at"]),
            endpoint_online=data["endpoint_online"],
            data=data,
            labels=dict(data.get("labels") or {}),  # an older platform sends none
        )


@dataclass(frozen=True)
class Schedule:
    """A server's recurring job (or, with a `selector`, a recurring fan-out): its calendar,
    what each firing creates, and how it went."""

    id: str
    server_id: str | None
    """None for a selector schedule."""
    name: str
    cron: str
    timezone: str
    kind: str
    overlap: str
    paused: bool
    next_times: tuple[datetime, ...]
    skipped: int
    missed: int
    last_job_id: str | None
    data: dict[str, Any]
    selector: str | None = None
    """The label selector each firing fans out over (a group per firing)."""
    last_group_id: str | None = None
    """The group the last selector firing made."""
    unmatched: int = 0
    """Selector firings that matched no server."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> Schedule:
        last = data.get("last_firing")
        return cls(
            id=data["id"],
            server_id=data["server_id"],
            name=data["name"],
            cron=data["cron"],
            timezone=data["timezone"],
            kind=data["job"]["kind"],
            overlap=data["overlap"],
            paused=data["paused"],
            next_times=tuple(_instant(t) for t in data["next_times"]),
            skipped=data["skipped"],
            missed=data["missed"],
            last_job_id=last["job_id"] if last else None,
            data=data,
            # An older platform sends none of these.
            selector=data.get("selector"),
            last_group_id=last.get("group_id") if last else None,
            unmatched=data.get("unmatched", 0),
        )


@dataclass(frozen=True)
class LogLine:
    """One line of an attempt's log; `ts` is the RFC 3339 text Run wrote."""

    attempt: int
    seq: int
    ts: str
    stream: str
    text: str
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> LogLine:
        return cls(data["attempt"], data["seq"], data["ts"], data["stream"], data["text"], data)


@dataclass(frozen=True)
class Artifact:
    """One artifact of one attempt; only a `complete` one can be downloaded."""

    attempt: int
    name: str
    size: int
    complete: bool
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Artifact:
        return cls(data["attempt"], data["name"], data["size"], data["complete"], data)


@dataclass(frozen=True)
class Kinds:
    """What a server's Run advertised it runs: each kind's payload JSON Schema. Not
    `advertised` (an older Run, or none registered yet): every kind is accepted at submit."""

    advertised: bool
    schemas: dict[str, Any]
    data: dict[str, Any]

    @classmethod
    def of(cls, data: dict[str, Any]) -> Kinds:
        schemas = {kind["kind"]: kind["payload_schema"] for kind in data["kinds"]}
        return cls(data["advertised"], schemas, data)


# -- the client --------------------------------------------------------------------------------


def _error_of(response: httpx.Response) -> MoonrunError:
    """The error an error answer names; a foreign 5xx (a proxy's page) is `Unreachable`."""
    try:
        error = response.json()["error"]
    except (ValueError, TypeError, KeyError):
        error = None
    return _error_named(response.status_code, error)


def _error_named(status: int, error: Any) -> MoonrunError:
    """The error an answer's `{"code", "message"}` names (an answer's, or a batch entry's)."""
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(code, str) or not isinstance(message, str):
        if status >= 500:
            return Unreachable(f"the platform answered {status}")
        return PlatformError(
            status, f"http_{status}", f"the platform answered {status} without an error body"
        )
    known = _BY_CODE.get(code)
    if known is None:
        return PlatformError(status, code, message)
    if issubclass(known, InvalidRequest):
        return known(message, fields=_fields_of(error))
    return known(message)


def _fields_of(error: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The (field, message) pairs of a 422 answer (`invalid_payload`, `invalid_labels`,
    `invalid_selector`), those that are well formed."""
    fields = error.get("fields")
    if not isinstance(fields, list):
        return ()
    return tuple(
        (item["field"], item["message"])
        for item in fields
        if isinstance(item, dict)
        and isinstance(item.get("field"), str)
        and isinstance(item.get("message"), str)
    )


class _TryAgain(Exception):
    """An answer worth trying again after a pause (429, 503): `error` is raised if none is."""

    def __init__(self, error: MoonrunError, after_s: float) -> None:
        super().__init__(error.message)
        self.error = error
        self.after_s = after_s


def _answered(response: httpx.Response, problem: MoonrunError) -> Exception:
    """What an error answer raises in the retry loop: `problem`, or try again for 429/503."""
    if response.status_code in RETRY_STATUSES:
        return _TryAgain(problem, _retry_after(response))
    return problem


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", "0")))
    except ValueError:
        return 0.0


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _instant_text(moment: datetime | str) -> str:
    if isinstance(moment, str):
        return moment
    # A naive datetime is local time, as datetime.astimezone takes it.
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


class Client:
    """A user of one platform, by API token. Close it (or use it as a context manager)."""

    def __init__(
        self,
        platform: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff: Backoff = RETRY_BACKOFF,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        outage_grace_s: float = OUTAGE_GRACE_S,
    ) -> None:
        self.platform = platform.rstrip("/")
        self.timeout_s = timeout_s
        self.outage_grace_s = outage_grace_s
        self.retries = retries
        self.backoff = backoff
        self._sleep = sleep
        self._clock = clock
        self._http = httpx.Client(
            base_url=self.platform,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:  # never the token
        return f"Client({self.platform!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **options: Any) -> Client:
        """A client of MOONRUN_PLATFORM with MOONRUN_TOKEN, as the CLI reads them:
        `Client.from_env(os.environ)` (the script, not the library, reads its environment);
        `options` as the constructor takes them."""
        platform, token = environ.get("MOONRUN_PLATFORM"), environ.get("MOONRUN_TOKEN")
        if not platform or not token:
            raise Unauthenticated("MOONRUN_PLATFORM and MOONRUN_TOKEN must both be set")
        return cls(platform, token, **options)

    @classmethod
    def from_profile(
        cls,
        name: str = profiles.DEFAULT_PROFILE,
        *,
        environ: Mapping[str, str],
        **options: Any,
    ) -> Client:
        """A client of a profile `moonrun login` saved: `Client.from_profile("ci",
        environ=os.environ)` reads `~/.config/moonrun/config.toml` (under `$XDG_CONFIG_HOME`
        when that is set), as the CLI does."""
        path = profiles.config_path(profiles.config_home(environ))
        saved = profiles.load(path).get(name)
        if saved is None:
            raise Unauthenticated(
                f"no profile {name!r} in {path}: run `moonrun login --platform URL`"
            )
        return cls(saved.platform, saved.token, **options)

    # -- the wire ------------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        wait_s: float = 0.0,
    ) -> Any:
        """The answer's JSON; retried on no answer, 429 and 503; errors raised as typed."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        timeout = self.timeout_s + wait_s

        def send(retried: bool) -> Any:
            response = self._http.request(
                method, path, json=json, params=query, headers=headers, timeout=timeout
            )
            if response.status_code < 400:
                return self._json(response)
            problem = _error_of(response)
            if retried and isinstance(problem, AlreadyExists):
                raise AlreadyExists(
                    f"{problem.message} (this request was sent again after a lost "
                    "answer: the first try may have created it)"
                )
            if retried and method == "DELETE" and isinstance(problem, NotFound):
                raise NotFound(
                    f"{problem.message} (this request was sent again after a lost "
                    "answer: the first try may have deleted it)"
                )
            raise _answered(response, problem)

        return self._retrying(send)

    def _send(
        self, path: str, params: dict[str, Any], write: Callable[[httpx.Response], None]
    ) -> None:
        """A streamed GET: `write` reads the answer's body; retried as `_request` retries while
        no body has been read."""
        query = {k: v for k, v in params.items() if v is not None}

        def send(retried: bool) -> None:
            with self._http.stream("GET", path, params=query) as response:
                if response.status_code < 400:
                    write(response)
                    return
                response.read()
                raise _answered(response, _error_of(response))

        self._retrying(send)

    def _retrying(self, send: Callable[[bool], T]) -> T:
        """`send(retried)` until it returns: the one retry loop of every request. No answer
        (a transport error) and 429 or 503 (`_TryAgain`) are tried again after a pause from
        `self.backoff` (at least the answer's Retry-After), `retries` times; then the last
        error is raised, no answer as `Unreachable`."""
        delays = self.backoff.delays()
        for tried in range(self.retries + 1):
            last = tried == self.retries
            try:
                return send(tried > 0)
            except httpx.UnsupportedProtocol:
                raise Unreachable(
                    f"{self.platform!r} is no platform URL (it needs http:// or https://)"
                ) from None
            except httpx.TransportError as error:
                if last:
                    raise Unreachable(
                        f"cannot reach the platform at {self.platform}: {type(error).__name__}"
                    ) from None
                pause = next(delays)
            except _TryAgain as busy:
                if last:
                    raise busy.error from None
                pause = max(next(delays), busy.after_s)
            self._sleep(min(pause, self.backoff.max_s))
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _through_outages(self, read: Callable[[], T]) -> T:
        """`read()`, tried again while the platform does not answer (a restart, an outage),
        for up to `outage_grace_s` from the first failure: what follows a job (`wait`, `logs`
        with `follow`) fails on the job's own outcome, not on a platform that comes back."""
        failed_at: float | None = None
        delays = self.backoff.delays()
        while True:
            try:
                return read()
            except Unreachable:
                now = self._clock()
                failed_at = now if failed_at is None else failed_at
                if now - failed_at >= self.outage_grace_s:
                    raise
                left = self.outage_grace_s - (now - failed_at)
                self._sleep(min(next(delays), self.backoff.max_s, left))

    def _json(self, response: httpx.Response) -> Any:
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise Unreachable(f"{self.platform} did not answer like a moonrun platform") from None

    # -- users ---------------------------------------------------------------------------------

    def whoami(self) -> User:
        """The user this client's token belongs to."""
        return User.of(self._request("GET", "/api/v1/me"))

    def users(self) -> list[User]:
        """Every user (platform admins)."""
        return [User.of(u) for u in self._request("GET", "/api/v1/users")["users"]]

    def create_user(
        self, name: str, *, password: str | None = None, platform_admin: bool = False
    ) -> tuple[User, str]:
        """Create a user (platform admins): the user and its API token, shown only now."""
        body: dict[str, Any] = {"name": name, "platform_admin": platform_admin}
        if password is not None:
            body["password"] = password
        answer = self._request("POST", "/api/v1/users", json=body)
        return User.of(answer["user"]), answer["api_token"]

    def disable_user(self, user_id: str) -> User:
        """Disable a user (platform admins): their tokens and console sessions stop working."""
        return User.of(self._request("POST", f"/api/v1/users/{user_id}/disable"))

    def enable_user(self, user_id: str) -> User:
        """Enable a disabled user again (platform admins)."""
        return User.of(self._request("POST", f"/api/v1/users/{user_id}/enable"))

    def rotate_token(self, user_id: str | None = None) -> tuple[User, str]:
        """A new API token for the user (yourself unless given), shown only now; the old ones
        stop working."""
        user_id = user_id if user_id is not None else self.whoami().id
        answer = self._request("POST", f"/api/v1/users/{user_id}/token")
        return User.of(answer["user"]), answer["api_token"]

    def set_password(self, password: str, user_id: str | None = None) -> User:
        """Set the user's console password (yourself unless given)."""
        user_id = user_id if user_id is not None else self.whoami().id
        path = f"/api/v1/users/{user_id}/password"
        return User.of(self._request("PUT", path, json={"password": password}))

    # -- endpoints -----------------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint with its current session's state (platform admins)."""
        return [Endpoint.of(e) for e in self._request("GET", "/api/v1/endpoints")["endpoints"]]

    def create_endpoint(self, name: str) -> tuple[Endpoint, str]:
        """Create an endpoint (platform admins): it and its one-time join token."""
        answer = self._request("POST", "/api/v1/endpoints", json={"name": name})
        return Endpoint.of(answer["endpoint"]), answer["join_token"]

    def drain_endpoint(self, endpoint_id: str) -> Endpoint:
        """Grant the endpoint no new claims; its running attempts finish (platform admins)."""
        return Endpoint.of(self._request("POST", f"/api/v1/endpoints/{endpoint_id}/drain"))

    def undrain_endpoint(self, endpoint_id: str) -> Endpoint:
        """Grant the endpoint claims again (platform admins)."""
        return Endpoint.of(self._request("POST", f"/api/v1/endpoints/{endpoint_id}/undrain"))

    def set_endpoint_labels(self, endpoint_id: str, labels: Mapping[str, str]) -> Endpoint:
        """Replace the endpoint's labels with `labels` (platform admins); `InvalidLabels` names
        each bad entry."""
        path = f"/api/v1/endpoints/{endpoint_id}/labels"
        return Endpoint.of(self._request("PUT", path, json={"labels": dict(labels)}))

    def remove_endpoint(self, endpoint_id: str) -> Endpoint:
        """Remove an endpoint no server points at (platform admins); its Run is refused from
        then on. `EndpointInUse` while servers point at it."""
        return Endpoint.of(self._request("DELETE", f"/api/v1/endpoints/{endpoint_id}"))

    # -- servers -------------------------------------------------------------------------------

    def servers(self, selector: str | None = None) -> list[Server]:
        """The servers the caller owns or administers (all of them for platform admins); with a
        label `selector` (`role=web,env in (prod,staging)`), those whose labels over their
        endpoint's match it. `InvalidSelector` says where a selector stops parsing."""
        params = {} if selector is None else {"selector": selector}
        answer = self._request("GET", "/api/v1/servers", params=params)
        return [Server.of(s) for s in answer["servers"]]

    def server(self, server_id: str) -> Server:
        return Server.of(self._request("GET", f"/api/v1/servers/{server_id}"))

    def create_server(
        self,
        name: str,
        endpoint_id: str,
        owner_id: str,
        labels: Mapping[str, str] | None = None,
    ) -> Server:
        """Create a server on an endpoint, owned by a user, with labels (platform admins)."""
        body: dict[str, Any] = {"name": name, "endpoint_id": endpoint_id, "owner_id": owner_id}
        if labels is not None:
            body["labels"] = dict(labels)
        return Server.of(self._request("POST", "/api/v1/servers", json=body))

    def set_server_labels(self, server_id: str, labels: Mapping[str, str]) -> Server:
        """Replace the server's labels with `labels` (its owner, its administrators or a
        platform admin); `InvalidLabels` names each bad entry."""
        path = f"/api/v1/servers/{server_id}/labels"
        return Server.of(self._request("PUT", path, json={"labels": dict(labels)}))

    def add_server_admin(self, server_id: str, user_id: str) -> None:
        path = f"/api/v1/servers/{server_id}/admins"
        self._request("POST", path, json={"user_id": user_id})

    def remove_server_admin(self, server_id: str, user_id: str) -> None:
        self._request("DELETE", f"/api/v1/servers/{server_id}/admins/{user_id}")

    def remove_server(self, server_id: str) -> Server:
        """Remove a server (its owner or a platform admin); `ServerBusy` while any of its jobs
        has not ended: cancel them first."""
        return Server.of(self._request("DELETE", f"/api/v1/servers/{server_id}"))

    # -- schedules -----------------------------------------------------------------------------

    def create_schedule(
        self,
        server_id: str | None,
        name: str,
        cron: str,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        timezone: str = "UTC",
        overlap: str = "skip",
        catchup_window_s: int | None = None,
        paused: bool = False,
        max_attempts: int | None = None,
        backoff: dict[str, float] | None = None,
        priority: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        selector: str | None = None,
        max_parallel: int | None = None,
        stop_on_failure: bool = False,
    ) -> Schedule:
        """A schedule that creates a `kind` job at every time of `cron` (5 fields or a macro
        such as `@daily`) in `timezone`; `overlap` is `skip`, `allow` or `cancel_previous`;
        `catchup_window_s` None is the platform's default (60); its jobs of `priority` (0 to
        9, 5 when None).

        With `selector` (and `server_id` None) each firing is a group instead: one job on each
        server you may submit to whose labels match at that time, at most `max_parallel` of
        them at once, the queued ones cancelled once one fails with `stop_on_failure`."""
        job: dict[str, Any] = {"kind": kind}
        for name_, value in (
            ("payload", payload),
            ("max_attempts", max_attempts),
            ("priority", priority),
        ):
            if value is not None:
                job[name_] = value
        if backoff is not None:
            job["backoff"] = backoff
        _concurrency(job, concurrency_key, concurrency_limit)
        body = {
            "name": name,
            "cron": cron,
            "timezone": timezone,
            "job": job,
            "overlap": overlap,
            "paused": paused,
        }
        if catchup_window_s is not None:
            body["catchup_window_s"] = catchup_window_s
        if selector is None and server_id is not None:
            path = f"/api/v1/servers/{server_id}/schedules"
            return Schedule.of(self._request("POST", path, json=body))
        # A selector schedule (the platform answers 422 unless exactly one is given).
        body |= {"server_id": server_id, "selector": selector, "stop_on_failure": stop_on_failure}
        if max_parallel is not None:
            body["max_parallel"] = max_parallel
        return Schedule.of(self._request("POST", "/api/v1/schedules", json=body))

    def schedules(self, server_id: str | None = None) -> list[Schedule]:
        """The schedules of the servers whose jobs you manage (or of one server)."""
        params = {} if server_id is None else {"server": server_id}
        answer = self._request("GET", "/api/v1/schedules", params=params)
        return [Schedule.of(s) for s in answer["schedules"]]

    def schedule(self, schedule_id: str) -> Schedule:
        return Schedule.of(self._request("GET", f"/api/v1/schedules/{schedule_id}"))

    def change_schedule(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change some of `name`, `cron`, `timezone`, `job`, `overlap`, `catchup_window_s`,
        `paused` (and a selector schedule's `selector`, `max_parallel`, `stop_on_failure`); a
        new calendar starts after now."""
        path = f"/api/v1/schedules/{schedule_id}"
        return Schedule.of(self._request("PATCH", path, json=changes))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return Schedule.of(self._request("POST", f"/api/v1/schedules/{schedule_id}/pause"))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Fire again: at most one catch-up firing, for the latest time missed while paused
        if it lies within the catch-up window."""
        return Schedule.of(self._request("POST", f"/api/v1/schedules/{schedule_id}/resume"))

    def trigger_schedule(self, schedule_id: str) -> tuple[Schedule, str | None]:
        """Fire now, outside the calendar, under the overlap policy: the schedule and the job
        made, or for a selector schedule the group (`grp_...`); None when the policy skipped
        it (or a selector matched nothing)."""
        answer = self._request("POST", f"/api/v1/schedules/{schedule_id}/trigger")
        made: str | None = answer["job_id"] or answer.get("group_id")
        return Schedule.of(answer["schedule"]), made

    def delete_schedule(self, schedule_id: str) -> Schedule:
        """Delete a schedule; its jobs stay."""
        return Schedule.of(self._request("DELETE", f"/api/v1/schedules/{schedule_id}"))

    # -- jobs ----------------------------------------------------------------------------------

    def submit(
        self,
        server_id: str,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        max_attempts: int | None = None,
        not_before: datetime | str | None = None,
        backoff: dict[str, float] | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        after: Sequence[str] | None = None,
        after_group: str | None = None,
        priority: int | None = None,
    ) -> Job:
        """Queue a job. It always carries an Idempotency-Key (a fresh random one unless given),
        so a retry after a lost answer answers the same job instead of making a second. With a
        `concurrency_key`, at most `concurrency_limit` (default 1) of your jobs with that key
        are claimed or running at once; the others wait their turn, oldest first.

        With `after` (job ids, at most 100) or `after_group` (a group id), the job waits until
        each of them succeeded (its `waiting_for` says what it waits on), and ends cancelled
        with `dependency_failed` once one of them did not.

        `priority` (0 to 9, 5 when None): among its endpoint's claimable jobs a higher one is
        granted first."""
        body: dict[str, Any] = {"kind": kind}
        _concurrency(body, concurrency_key, concurrency_limit)
        if priority is not None:
            body["priority"] = priority
        if after:
            body["after"] = list(after)
        if after_group is not None:
            body["after_group"] = after_group
        if payload is not None:
            body["payload"] = payload
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        if not_before is not None:
            body["not_before"] = _instant_text(not_before)
        if backoff is not None:
            body["backoff"] = backoff
        key = idempotency_key if idempotency_key is not None else secrets.token_urlsafe(24)
        answer = self._request(
            "POST", f"/api/v1/servers/{server_id}/jobs", json=body, headers={"Idempotency-Key": key}
        )
        return Job.of(answer)

    def submit_batch(
        self,
        server_id: str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> list[Job]:
        """Queue 1 to 1,000 jobs on one server in one request, all or none, in order: each is
        the body of a single create (`{"kind", "payload"?, "priority"?, ...}`). Like `submit`,
        it always carries an Idempotency-Key, so a retry answers the same jobs."""
        key = idempotency_key if idempotency_key is not None else secrets.token_urlsafe(24)
        answer = self._request(
            "POST",
            f"/api/v1/servers/{server_id}/jobs/batch",
            json={"jobs": [dict(job) for job in jobs]},
            headers={"Idempotency-Key": key},
        )
        return [Job.of(job) for job in answer["jobs"]]

    def rerun(self, job_id: str, *, idempotency_key: str | None = None) -> Job:
        """Queue a new job like a finished one (same server, kind, payload and retry policy);
        like `submit`, always with an Idempotency-Key."""
        key = idempotency_key if idempotency_key is not None else secrets.token_urlsafe(24)
        answer = self._request(
            "POST", f"/api/v1/jobs/{job_id}/rerun", headers={"Idempotency-Key": key}
        )
        return Job.of(answer)

    def kinds(self, server_id: str) -> Kinds:
        """The kinds the server's Run advertised, with their payload schemas."""
        return Kinds.of(self._request("GET", f"/api/v1/servers/{server_id}/kinds"))

    def job(self, job_id: str) -> Job:
        return Job.of(self._request("GET", f"/api/v1/jobs/{job_id}"))

    def jobs(
        self,
        *,
        server_id: str | None = None,
        state: str | None = None,
        kind: str | None = None,
        id_prefix: str | None = None,
        group: str | None = None,
        page_size: int = PAGE_SIZE,
    ) -> Iterator[Job]:
        """The jobs the caller may see, newest first, fetched a page at a time; by server,
        state, kind, id prefix (`job_` and at least three more characters) or fan-out group."""
        cursor: str | None = None
        while True:
            params = {
                "group": group,
                "server_id": server_id,
                "state": state,
                "kind": kind,
                "id_prefix": id_prefix,
                "limit": page_size,
                "cursor": cursor,
            }
            page = self._request("GET", "/api/v1/jobs", params=params)
            yield from (Job.of(j) for j in page["jobs"])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def cancel(self, job_id: str) -> Job:
        """Cancel: a waiting job ends at once; a running one gets a cancel intent (the answer
        then shows the job still running with `cancel.requested`)."""
        return Job.of(self._request("POST", f"/api/v1/jobs/{job_id}/cancel"))

    def cancel_many(self, job_ids: Sequence[str]) -> list[Job | MoonrunError]:
        """Cancel 1 to 1,000 jobs (each at most once) in one request, each as `cancel` would:
        per job, in order, the job as the cancel left it, or the error a cancel of it alone
        raises (`NotFound`, `Forbidden`, ...), returned rather than raised. A request refused
        whole (no jobs, too many, a job named twice) raises `InvalidRequest`."""
        body = self._request("POST", "/api/v1/jobs/cancel", json={"job_ids": list(job_ids)})
        return [
            Job.of(entry["answer"])
            if entry.get("answer") is not None
            else _error_named(_int(entry.get("status")), entry.get("error"))
            for entry in body["answers"]
        ]

    def delete(self, job_id: str) -> Job:
        """Delete a finished job now, with its attempts, logs, artifacts and Idempotency-Key;
        answers the job as it was. `JobNotFinished` while it has not ended; `NotFound` for a
        job the caller may not manage, as for one that does not exist."""
        return Job.of(self._request("DELETE", f"/api/v1/jobs/{job_id}"))

    def wait(self, job_id: str, timeout_s: float | None = None, *, logs: bool = False) -> Job:
        """The job once it has ended, by blocking reads; `WaitTimedOut` after `timeout_s`.
        With `logs`, also until its last attempt's log lines are all in (`logs_complete`), so
        that `logs()` then gives every line. A platform that stops answering for up to
        `outage_grace_s` is waited out."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        job = self._through_outages(lambda: self.job(job_id))
        while not (job.ended and (job.logs_complete or not logs)):
            left = WAIT_CHUNK_S if deadline is None else deadline - self._clock()
            if left <= 0:
                still = job.state if not job.ended else f"{job.state}, its logs not all in,"
                raise WaitTimedOut(f"job {job_id} is still {still} after {timeout_s} s")
            wait_s = max(0.001, min(left, WAIT_CHUNK_S))
            until = "logs_complete" if logs else "terminal"
            params = {"wait_s": round(wait_s, 3), "until": until}
            path = f"/api/v1/jobs/{job_id}"
            read = functools.partial(self._request, "GET", path, params=params, wait_s=wait_s)
            job = Job.of(self._through_outages(read))
        return job

    # -- fan-out groups -------------------------------------------------------------------------

    def fanout(
        self,
        selector: str,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        max_parallel: int | None = None,
        stop_on_failure: bool = False,
        max_attempts: int | None = None,
        not_before: datetime | str | None = None,
        backoff: dict[str, float] | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> FanOut:
        """Queue one job on each server you may submit to whose labels match `selector`, as
        one group (`NoMatch` when none does). Like `submit`, it always carries an
        Idempotency-Key, so a retry after a lost answer answers the same group; its jobs
        carry the concurrency key and the priority as `submit`'s do."""
        body: dict[str, Any] = {"selector": selector, "kind": kind}
        _concurrency(body, concurrency_key, concurrency_limit)
        if priority is not None:
            body["priority"] = priority
        if payload is not None:
            body["payload"] = payload
        if max_parallel is not None:
            body["max_parallel"] = max_parallel
        if stop_on_failure:
            body["stop_on_failure"] = True
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        if not_before is not None:
            body["not_before"] = _instant_text(not_before)
        if backoff is not None:
            body["backoff"] = backoff
        key = idempotency_key if idempotency_key is not None else secrets.token_urlsafe(24)
        answer = self._request(
            "POST", "/api/v1/jobs/fanout", json=body, headers={"Idempotency-Key": key}
        )
        return FanOut(Group.of(answer["group"]), [Job.of(job) for job in answer["jobs"]])

    def groups(self, limit: int = 50) -> list[Group]:
        """The groups you made, newest first (the newest `limit`, at most 200)."""
        answer = self._request("GET", "/api/v1/groups", params={"limit": limit})
        return [Group.of(group) for group in answer["groups"]]

    def group(self, group_id: str) -> Group:
        """A group you made (any, for platform admins), with its jobs' counts by state."""
        return Group.of(self._request("GET", f"/api/v1/groups/{group_id}"))

    def wait_group(self, group_id: str, timeout_s: float | None = None) -> Group:
        """The group once every job of it has ended, by blocking reads; `WaitTimedOut` after
        `timeout_s`. A platform that stops answering for up to `outage_grace_s` is waited out."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        group = self._through_outages(lambda: self.group(group_id))
        while not group.done:
            left = WAIT_CHUNK_S if deadline is None else deadline - self._clock()
            if left <= 0:
                raise WaitTimedOut(f"group {group_id} has not ended after {timeout_s} s")
            wait_s = max(0.001, min(left, WAIT_CHUNK_S))
            params = {"wait_s": round(wait_s, 3), "until": "terminal"}
            path = f"/api/v1/groups/{group_id}"
            read = functools.partial(self._request, "GET", path, params=params, wait_s=wait_s)
            group = Group.of(self._through_outages(read))
        return group

    def cancel_group(self, group_id: str) -> Group:
        """Ask every job of the group that has not ended to cancel; the group after it."""
        return Group.of(self._request("POST", f"/api/v1/groups/{group_id}/cancel"))

    def artifacts(self, job_id: str) -> list[Artifact]:
        """The job's artifacts, every attempt's, by attempt then name."""
        answer = self._request("GET", f"/api/v1/jobs/{job_id}/artifacts")
        return [Artifact.of(a) for a in answer["artifacts"]]

    def download(
        self, job_id: str, name: str, dest: Path | BinaryIO, *, attempt: int | None = None
    ) -> int:
        """Stream an artifact (of the latest attempt that has it unless given) into `dest`, a
        chunk at a time; the bytes written. A path is written beside itself and renamed into
        place once whole, so it never holds part of an artifact."""
        path = f"/api/v1/jobs/{job_id}/artifacts/{name}"
        written = 0

        def copy(response: httpx.Response, into: BinaryIO) -> None:
            nonlocal written
            for part in response.iter_bytes():
                into.write(part)
                written += len(part)

        if not isinstance(dest, Path):
            # A retry after bytes arrived would write them twice; `_send` only retries before.
            self._send(path, {"attempt": attempt}, lambda response: copy(response, dest))
            return written
        partial = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")

        def to_file(response: httpx.Response) -> None:
            with partial.open("wb") as handle:
                copy(response, handle)

        try:
            self._send(path, {"attempt": attempt}, to_file)
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
        return written

    def logs(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        follow: bool = False,
        settle_s: float = LOG_SETTLE_S,
        page_size: int | None = None,
    ) -> Iterator[LogLine]:
        """The log lines of one attempt (the latest that has logs unless given), page after
        page. With `follow`, keep reading (about every 0.2 s, slowing to 2 s while nothing comes)
        until the attempt's lines are all in (`logs_complete`: at once for a finished job)
        and, without `attempt`, it is the job's last; from a platform that does not say
        so, until the job has ended and no line came for `settle_s`. Without `attempt`, follow
        moves on to each new attempt, and rides through a platform that stops answering for up
        to `outage_grace_s`, resuming after the last line it printed."""
        patient: Callable[[Callable[[], Any]], Any] = (
            self._through_outages if follow else (lambda read: read())
        )
        after_seq = -1
        current = attempt
        pauses = FOLLOW_POLL.delays()
        ended_at: float | None = None
        while True:
            params = {"after_seq": after_seq, "attempt": current, "limit": page_size}
            path = f"/api/v1/jobs/{job_id}/logs"
            page = patient(functools.partial(self._request, "GET", path, params=params))
            lines = page["lines"]
            yield from (LogLine.of(line) for line in lines)
            if page["attempt"] is not None and current is None:
                current = page["attempt"]
            after_seq = page["next_after_seq"]
            if page["more"]:
                continue
            if not follow:
                return
            if lines:
                pauses = FOLLOW_POLL.delays()
            complete = page.get("logs_complete")  # None: a platform that does not say
            if complete and attempt is not None:
                return  # the attempt asked for has all its lines in
            if ended_at is None or complete:
                job = patient(lambda: self.job(job_id))
                if attempt is None and current is not None and job.attempt > current:
                    current, after_seq = job.attempt, -1  # a retry: follow its attempt
                    continue
                if complete and job.ended:
                    return  # the job's last attempt, and its lines are all in
                if job.ended:
                    ended_at = self._clock()
            settled = ended_at is not None and self._clock() - ended_at >= settle_s
            if complete is None and settled and not lines:
                return
            self._sleep(next(pauses))


def _concurrency(body: dict[str, Any], key: str | None, limit: int | None) -> None:
    """A request's `concurrency` from a key and a limit (a limit needs a key)."""
    if key is None:
        if limit is not None:
            raise ValueError("a concurrency limit needs a concurrency key")
        return
    body["concurrency"] = {"key": key} if limit is None else {"key": key, "limit": limit}
