"""The user API without I/O: each operation as a `Call`, and what an answer means.

A `Call` is one request (method, path, query, body, headers, how long the platform may hold
it) with `parse`, which turns the answer's JSON into records. `answer` reads an answer: the
parsed value, or the typed error its envelope names, or `TryAgain` for a 429 or 503. `Client`
and `AsyncClient` send the same calls, each over its own httpx transport, so a request is
built and an answer read in one place only.
"""

from __future__ import annotations

import json as jsonlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

from moonrun.client.records import (
    Artifact,
    Endpoint,
    FanOut,
    Group,
    Job,
    Kinds,
    Schedule,
    Server,
    User,
)
from moonrun.errors import (
    ERROR_TABLE,
    AlreadyExists,
    InvalidRequest,
    MoonrunError,
    NotFound,
    Unreachable,
)

T = TypeVar("T")

RETRY_STATUSES: Final = frozenset({429, 503})

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


class TryAgain(Exception):
    """An answer worth trying again after a pause (429, 503): `error` is raised if none is."""

    def __init__(self, error: MoonrunError, after_s: float) -> None:
        super().__init__(error.message)
        self.error = error
        self.after_s = after_s


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the user API and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] = field(default_factory=dict)
    """The query, without the parameters that are None."""
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    wait_s: float = 0.0
    """How long the platform may hold the answer (a blocking read): added to the timeout."""


def _call(
    method: str,
    path: str,
    parse: Callable[[Any], T],
    *,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    headers: dict[str, str] | None = None,
    wait_s: float = 0.0,
) -> Call[T]:
    query = {k: v for k, v in (params or {}).items() if v is not None}
    return Call(method, path, parse, query, json, headers or {}, wait_s)


def _nothing(_: Any) -> None:
    return None


def _keyed(idempotency_key: str | None) -> dict[str, str]:
    """A write that may be retried always carries a key: a fresh random one unless given."""
    key = idempotency_key if idempotency_key is not None else secrets.token_urlsafe(24)
    return {"Idempotency-Key": key}


def headers(token: str) -> dict[str, str]:
    """What every request of a client carries."""
    return {"Authorization": f"Bearer {token}", "Accept": "application/json"}


# -- answers -----------------------------------------------------------------------------------


def answer(
    call: Call[T],
    status: int,
    content: bytes,
    answer_headers: Mapping[str, str],
    *,
    retried: bool,
    platform: str,
) -> T:
    """What `call` answered: the parsed value; else raises the typed error its envelope names
    (`TryAgain` for a 429 or 503)."""
    if status < 400:
        return call.parse(decoded(content, platform))
    raise refusal(call.method, status, content, answer_headers, retried=retried)


def decoded(content: bytes, platform: str) -> Any:
    """An answer's JSON (None for no body); a body that is not JSON is `Unreachable`."""
    if not content:
        return None
    try:
        return jsonlib.loads(content)
    except ValueError:
        raise Unreachable(f"{platform} did not answer like a moonrun platform") from None


def refusal(
    method: str,
    status: int,
    content: bytes,
    answer_headers: Mapping[str, str],
    *,
    retried: bool,
) -> Exception:
    """What an error answer raises: `TryAgain` for 429 and 503, else the typed error, which
    says so when a retry may have met what its lost first try did."""
    problem = error_of(status, content)
    if status in RETRY_STATUSES:
        return TryAgain(problem, _retry_after(answer_headers))
    if retried and isinstance(problem, AlreadyExists):
        return AlreadyExists(
            f"{problem.message} (this request was sent again after a lost "
            "answer: the first try may have created it)"
        )
    if retried and method == "DELETE" and isinstance(problem, NotFound):
        return NotFound(
            f"{problem.message} (this request was sent again after a lost "
            "answer: the first try may have deleted it)"
        )
    return problem


def error_of(status: int, content: bytes) -> MoonrunError:
    """The error an error answer names; a foreign 5xx (a proxy's page) is `Unreachable`."""
    try:
        error = jsonlib.loads(content)["error"]
    except (ValueError, TypeError, KeyError):
        error = None
    return error_named(status, error)


def error_named(status: int, error: Any) -> MoonrunError:
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


def _retry_after(answer_headers: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(answer_headers.get("retry-after", "0")))
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


def _concurrency(body: dict[str, Any], key: str | None, limit: int | None) -> None:
    """A request's `concurrency` from a key and a limit (a limit needs a key)."""
    if key is None:
        if limit is not None:
            raise ValueError("a concurrency limit needs a concurrency key")
        return
    body["concurrency"] = {"key": key} if limit is None else {"key": key, "limit": limit}


def _user_and_token(answer: Any) -> tuple[User, str]:
    return User.of(answer["user"]), answer["api_token"]


def _list_of(key: str, of: Callable[[dict[str, Any]], T]) -> Callable[[Any], list[T]]:
    return lambda answer: [of(item) for item in answer[key]]


# -- users -------------------------------------------------------------------------------------


def whoami() -> Call[User]:
    return _call("GET", "/api/v1/me", User.of)


def users() -> Call[list[User]]:
    return _call("GET", "/api/v1/users", _list_of("users", User.of))


def create_user(
    name: str, *, password: str | None = None, platform_admin: bool = False
) -> Call[tuple[User, str]]:
    body: dict[str, Any] = {"name": name, "platform_admin": platform_admin}
    if password is not None:
        body["password"] = password
    return _call("POST", "/api/v1/users", _user_and_token, json=body)


def disable_user(user_id: str) -> Call[User]:
    return _call("POST", f"/api/v1/users/{user_id}/disable", User.of)


def enable_user(user_id: str) -> Call[User]:
    return _call("POST", f"/api/v1/users/{user_id}/enable", User.of)


def rotate_token(user_id: str) -> Call[tuple[User, str]]:
    return _call("POST", f"/api/v1/users/{user_id}/token", _user_and_token)


def set_password(password: str, user_id: str) -> Call[User]:
    path = f"/api/v1/users/{user_id}/password"
    return _call("PUT", path, User.of, json={"password": password})


# -- endpoints ---------------------------------------------------------------------------------


def endpoints() -> Call[list[Endpoint]]:
    return _call("GET", "/api/v1/endpoints", _list_of("endpoints", Endpoint.of))


def create_endpoint(name: str) -> Call[tuple[Endpoint, str]]:
    def parse(answer: Any) -> tuple[Endpoint, str]:
        return Endpoint.of(answer["endpoint"]), answer["join_token"]

    return _call("POST", "/api/v1/endpoints", parse, json={"name": name})


def drain_endpoint(endpoint_id: str) -> Call[Endpoint]:
    return _call("POST", f"/api/v1/endpoints/{endpoint_id}/drain", Endpoint.of)


def undrain_endpoint(endpoint_id: str) -> Call[Endpoint]:
    return _call("POST", f"/api/v1/endpoints/{endpoint_id}/undrain", Endpoint.of)


def set_endpoint_labels(endpoint_id: str, labels: Mapping[str, str]) -> Call[Endpoint]:
    path = f"/api/v1/endpoints/{endpoint_id}/labels"
    return _call("PUT", path, Endpoint.of, json={"labels": dict(labels)})


def remove_endpoint(endpoint_id: str) -> Call[Endpoint]:
    return _call("DELETE", f"/api/v1/endpoints/{endpoint_id}", Endpoint.of)


# -- servers -----------------------------------------------------------------------------------


def servers(selector: str | None = None) -> Call[list[Server]]:
    params = {"selector": selector}
    return _call("GET", "/api/v1/servers", _list_of("servers", Server.of), params=params)


def server(server_id: str) -> Call[Server]:
    return _call("GET", f"/api/v1/servers/{server_id}", Server.of)


def create_server(
    name: str,
    endpoint_id: str,
    owner_id: str,
    labels: Mapping[str, str] | None = None,
) -> Call[Server]:
    body: dict[str, Any] = {"name": name, "endpoint_id": endpoint_id, "owner_id": owner_id}
    if labels is not None:
        body["labels"] = dict(labels)
    return _call("POST", "/api/v1/servers", Server.of, json=body)


def set_server_labels(server_id: str, labels: Mapping[str, str]) -> Call[Server]:
    path = f"/api/v1/servers/{server_id}/labels"
    return _call("PUT", path, Server.of, json={"labels": dict(labels)})


def add_server_admin(server_id: str, user_id: str) -> Call[None]:
    path = f"/api/v1/servers/{server_id}/admins"
    return _call("POST", path, _nothing, json={"user_id": user_id})


def remove_server_admin(server_id: str, user_id: str) -> Call[None]:
    return _call("DELETE", f"/api/v1/servers/{server_id}/admins/{user_id}", _nothing)


def remove_server(server_id: str) -> Call[Server]:
    return _call("DELETE", f"/api/v1/servers/{server_id}", Server.of)


# -- schedules ---------------------------------------------------------------------------------


def create_schedule(
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
) -> Call[Schedule]:
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
        return _call("POST", f"/api/v1/servers/{server_id}/schedules", Schedule.of, json=body)
    # A selector schedule (the platform answers 422 unless exactly one is given).
    body |= {"server_id": server_id, "selector": selector, "stop_on_failure": stop_on_failure}
    if max_parallel is not None:
        body["max_parallel"] = max_parallel
    return _call("POST", "/api/v1/schedules", Schedule.of, json=body)


def schedules(server_id: str | None = None) -> Call[list[Schedule]]:
    parse = _list_of("schedules", Schedule.of)
    return _call("GET", "/api/v1/schedules", parse, params={"server": server_id})


def schedule(schedule_id: str) -> Call[Schedule]:
    return _call("GET", f"/api/v1/schedules/{schedule_id}", Schedule.of)


def change_schedule(schedule_id: str, changes: dict[str, Any]) -> Call[Schedule]:
    return _call("PATCH", f"/api/v1/schedules/{schedule_id}", Schedule.of, json=changes)


def pause_schedule(schedule_id: str) -> Call[Schedule]:
    return _call("POST", f"/api/v1/schedules/{schedule_id}/pause", Schedule.of)


def resume_schedule(schedule_id: str) -> Call[Schedule]:
    return _call("POST", f"/api/v1/schedules/{schedule_id}/resume", Schedule.of)


def trigger_schedule(schedule_id: str) -> Call[tuple[Schedule, str | None]]:
    def parse(answer: Any) -> tuple[Schedule, str | None]:
        made: str | None = answer["job_id"] or answer.get("group_id")
        return Schedule.of(answer["schedule"]), made

    return _call("POST", f"/api/v1/schedules/{schedule_id}/trigger", parse)


def delete_schedule(schedule_id: str) -> Call[Schedule]:
    return _call("DELETE", f"/api/v1/schedules/{schedule_id}", Schedule.of)


# -- jobs --------------------------------------------------------------------------------------


def submit(
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
) -> Call[Job]:
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
    path = f"/api/v1/servers/{server_id}/jobs"
    return _call("POST", path, Job.of, json=body, headers=_keyed(idempotency_key))


def submit_batch(
    server_id: str, jobs: Sequence[Mapping[str, Any]], *, idempotency_key: str | None = None
) -> Call[list[Job]]:
    return _call(
        "POST",
        f"/api/v1/servers/{server_id}/jobs/batch",
        _list_of("jobs", Job.of),
        json={"jobs": [dict(job) for job in jobs]},
        headers=_keyed(idempotency_key),
    )


def rerun(job_id: str, *, idempotency_key: str | None = None) -> Call[Job]:
    path = f"/api/v1/jobs/{job_id}/rerun"
    return _call("POST", path, Job.of, headers=_keyed(idempotency_key))


def kinds(server_id: str) -> Call[Kinds]:
    return _call("GET", f"/api/v1/servers/{server_id}/kinds", Kinds.of)


def job(job_id: str, *, include_payload: bool = False) -> Call[Job]:
    """A read of the job; with `include_payload`, with its payload (redacted by the platform:
    docs/protocol.md, "Payload")."""
    params = {"include": "payload"} if include_payload else None
    return _call("GET", f"/api/v1/jobs/{job_id}", Job.of, params=params)


def job_when(job_id: str, until: str, wait_s: float) -> Call[Job]:
    """A blocking read: the job once it is `until` (`terminal`, `logs_complete`), or as it is
    after `wait_s`."""
    params = {"wait_s": round(wait_s, 3), "until": until}
    return _call("GET", f"/api/v1/jobs/{job_id}", Job.of, params=params, wait_s=wait_s)


def jobs_page(
    *,
    server_id: str | None,
    state: str | None,
    kind: str | None,
    id_prefix: str | None,
    group: str | None,
    page_size: int,
    cursor: str | None,
    include_payload: bool = False,
) -> Call[tuple[list[Job], str | None]]:
    """One page of `jobs()`, and the cursor of the next (None after the last)."""

    def parse(page: Any) -> tuple[list[Job], str | None]:
        return [Job.of(j) for j in page["jobs"]], page.get("next_cursor") or None

    params = {
        "include": "payload" if include_payload else None,
        "group": group,
        "server_id": server_id,
        "state": state,
        "kind": kind,
        "id_prefix": id_prefix,
        "limit": page_size,
        "cursor": cursor,
    }
    return _call("GET", "/api/v1/jobs", parse, params=params)


def cancel(job_id: str) -> Call[Job]:
    return _call("POST", f"/api/v1/jobs/{job_id}/cancel", Job.of)


def cancel_many(job_ids: Sequence[str]) -> Call[list[Job | MoonrunError]]:
    def parse(body: Any) -> list[Job | MoonrunError]:
        return [
            Job.of(entry["answer"])
            if entry.get("answer") is not None
            else error_named(_int(entry.get("status")), entry.get("error"))
            for entry in body["answers"]
        ]

    return _call("POST", "/api/v1/jobs/cancel", parse, json={"job_ids": list(job_ids)})


def delete(job_id: str) -> Call[Job]:
    return _call("DELETE", f"/api/v1/jobs/{job_id}", Job.of)


def logs_page(
    job_id: str, *, after_seq: int, attempt: int | None, page_size: int | None
) -> Call[dict[str, Any]]:
    """One page of an attempt's log (the answer as it is: `policy.LogFollow` reads it)."""
    params = {"after_seq": after_seq, "attempt": attempt, "limit": page_size}
    return _call("GET", f"/api/v1/jobs/{job_id}/logs", dict, params=params)


def artifacts(job_id: str) -> Call[list[Artifact]]:
    return _call("GET", f"/api/v1/jobs/{job_id}/artifacts", _list_of("artifacts", Artifact.of))


def download(job_id: str, name: str, attempt: int | None) -> Call[None]:
    """A streamed GET: the clients read its body a chunk at a time, not through `parse`."""
    path = f"/api/v1/jobs/{job_id}/artifacts/{name}"
    return _call("GET", path, _nothing, params={"attempt": attempt})


# -- fan-out groups ----------------------------------------------------------------------------


def fanout(
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
) -> Call[FanOut]:
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

    def parse(answer: Any) -> FanOut:
        return FanOut(Group.of(answer["group"]), [Job.of(job) for job in answer["jobs"]])

    return _call("POST", "/api/v1/jobs/fanout", parse, json=body, headers=_keyed(idempotency_key))


def groups(limit: int = 50) -> Call[list[Group]]:
    return _call("GET", "/api/v1/groups", _list_of("groups", Group.of), params={"limit": limit})


def group(group_id: str) -> Call[Group]:
    return _call("GET", f"/api/v1/groups/{group_id}", Group.of)


def group_when_done(group_id: str, wait_s: float) -> Call[Group]:
    """A blocking read: the group once every job of it has ended, or as it is after
    `wait_s`."""
    params = {"wait_s": round(wait_s, 3), "until": "terminal"}
    return _call("GET", f"/api/v1/groups/{group_id}", Group.of, params=params, wait_s=wait_s)


def cancel_group(group_id: str) -> Call[Group]:
    return _call("POST", f"/api/v1/groups/{group_id}/cancel", Group.of)
