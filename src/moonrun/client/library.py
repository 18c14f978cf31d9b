"""The user client: the platform's user API (docs/protocol.md, "User API") for Python and the CLI.

`Client` sends the requests of `calls.py` over httpx, one at a time, blocking;
`async_library.AsyncClient` is the same client on asyncio. Every request is retried with capped
exponential backoff (`moonrun.backoff`: full jitter under a ceiling doubling from 0.2 s to 5 s,
`retries` times) when it gets no answer, or a 429 or 503: this is safe for every request,
because reads are idempotent, `submit` always carries an Idempotency-Key, a cancel of a
cancelled job changes nothing, and creating a named thing twice is 409 `already_exists`
(which, after a retry, the caller sees: the first try may have made it). The decisions of
these loops are `policy.py`'s.

An error answer raises the `moonrun.errors` class its code names (`PlatformError` for a code
this client does not know); no answer at all, after the retries, raises `Unreachable`.
Records (`records.py`) keep the API's JSON object exactly as answered in `data`.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self, TypeVar

import httpx

from moonrun.backoff import Backoff
from moonrun.client import calls, policy, profiles
from moonrun.client.calls import RETRY_STATUSES, PlatformError
from moonrun.client.policy import (
    FOLLOW_POLL,
    LOG_SETTLE_S,
    OUTAGE_GRACE_S,
    PAGE_SIZE,
    RETRY_BACKOFF,
    WAIT_CHUNK_S,
)
from moonrun.client.records import (
    TERMINAL_STATES,
    Artifact,
    Endpoint,
    FanOut,
    Group,
    Job,
    JobState,
    Kinds,
    LogLine,
    Schedule,
    Server,
    User,
)

# Some of these only so that what callers imported from here before calls.py still imports.
from moonrun.errors import (
    AlreadyExists,
    InvalidRequest,
    MoonrunError,
    NotFound,
    Unauthenticated,
    Unreachable,
    WaitTimedOut,
)

__all__ = [
    "FOLLOW_POLL",
    "LOG_SETTLE_S",
    "OUTAGE_GRACE_S",
    "PAGE_SIZE",
    "RETRY_BACKOFF",
    "RETRY_STATUSES",
    "TERMINAL_STATES",
    "WAIT_CHUNK_S",
    "AlreadyExists",
    "Artifact",
    "Client",
    "Endpoint",
    "FanOut",
    "Group",
    "InvalidRequest",
    "Job",
    "JobState",
    "Kinds",
    "LogLine",
    "NotFound",
    "PlatformError",
    "Schedule",
    "Server",
    "Unauthenticated",
    "Unreachable",
    "User",
    "WaitTimedOut",
]

T = TypeVar("T")


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
            headers=calls.headers(token),
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}({self.platform!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **options: Any) -> Self:
        """A client of MOONRUN_PLATFORM with MOONRUN_TOKEN, as the CLI reads them:
        `Client.from_env(os.environ)` (the script, not the library, reads its environment);
        `options` as the constructor takes them."""
        found = profiles.from_env(environ)
        return cls(found.platform, found.token, **options)

    @classmethod
    def from_profile(
        cls,
        name: str = profiles.DEFAULT_PROFILE,
        *,
        environ: Mapping[str, str],
        **options: Any,
    ) -> Self:
        """A client of a profile `moonrun login` saved: `Client.from_profile("ci",
        environ=os.environ)` reads `~/.config/moonrun/config.toml` (under `$XDG_CONFIG_HOME`
        when that is set), as the CLI does."""
        found = profiles.saved(name, environ)
        return cls(found.platform, found.token, **options)

    # -- the wire ------------------------------------------------------------------------------

    def _do(self, call: calls.Call[T]) -> T:
        """What `call` answers, tried again as `policy.Retry` decides; errors raised typed."""
        retry = policy.Retry(self.platform, self.retries, self.backoff)
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    json=call.json,
                    params=call.params,
                    headers=call.headers,
                    timeout=self.timeout_s + call.wait_s,
                )
                return calls.answer(
                    call,
                    response.status_code,
                    response.content,
                    response.headers,
                    retried=retry.retried,
                    platform=self.platform,
                )
            except policy.RETRIED as error:
                pause = retry.pause(error)
            self._sleep(pause)

    def _stream(self, call: calls.Call[None], write: Callable[[httpx.Response], None]) -> None:
        """A streamed GET: `write` reads the answer's body; tried again as `_do` is until the
        body begins (a retry after some of it was written would write that part twice)."""
        retry = policy.Retry(self.platform, self.retries, self.backoff)
        while True:
            try:
                with self._http.stream(call.method, call.path, params=call.params) as response:
                    if response.status_code < 400:
                        try:
                            write(response)
                        except httpx.TransportError as error:
                            raise policy.broken_off(self.platform, error) from None
                        return
                    content = response.read()
                    raise calls.refusal(
                        call.method,
                        response.status_code,
                        content,
                        response.headers,
                        retried=retry.retried,
                    )
            except policy.RETRIED as error:
                pause = retry.pause(error)
            self._sleep(pause)

    def _through_outages(self, call: calls.Call[T]) -> T:
        """`call`, tried again while the platform does not answer for up to `outage_grace_s`
        (`policy.Outage`)."""
        outage = policy.Outage(self.outage_grace_s, self.backoff, self._clock)
        while True:
            try:
                return self._do(call)
            except Unreachable as error:
                pause = outage.pause(error)
            self._sleep(pause)

    # -- users ---------------------------------------------------------------------------------

    def whoami(self) -> User:
        """The user this client's token belongs to."""
        return self._do(calls.whoami())

    def users(self) -> list[User]:
        """Every user (platform admins)."""
        return self._do(calls.users())

    def create_user(
        self, name: str, *, password: str | None = None, platform_admin: bool = False
    ) -> tuple[User, str]:
        """Create a user (platform admins): the user and its API token, shown only now."""
        return self._do(calls.create_user(name, password=password, platform_admin=platform_admin))

    def disable_user(self, user_id: str) -> User:
        """Disable a user (platform admins): their tokens and console sessions stop working."""
        return self._do(calls.disable_user(user_id))

    def enable_user(self, user_id: str) -> User:
        """Enable a disabled user again (platform admins)."""
        return self._do(calls.enable_user(user_id))

    def rotate_token(self, user_id: str | None = None) -> tuple[User, str]:
        """A new API token for the user (yourself unless given), shown only now; the old ones
        stop working."""
        user_id = user_id if user_id is not None else self.whoami().id
        return self._do(calls.rotate_token(user_id))

    def set_password(self, password: str, user_id: str | None = None) -> User:
        """Set the user's console password (yourself unless given)."""
        user_id = user_id if user_id is not None else self.whoami().id
        return self._do(calls.set_password(password, user_id))

    # -- endpoints -----------------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint with its current session's state (platform admins)."""
        return self._do(calls.endpoints())

    def create_endpoint(self, name: str) -> tuple[Endpoint, str]:
        """Create an endpoint (platform admins): it and its one-time join token."""
        return self._do(calls.create_endpoint(name))

    def drain_endpoint(self, endpoint_id: str) -> Endpoint:
        """Grant the endpoint no new claims; its running attempts finish (platform admins)."""
        return self._do(calls.drain_endpoint(endpoint_id))

    def undrain_endpoint(self, endpoint_id: str) -> Endpoint:
        """Grant the endpoint claims again (platform admins)."""
        return self._do(calls.undrain_endpoint(endpoint_id))

    def set_endpoint_labels(self, endpoint_id: str, labels: Mapping[str, str]) -> Endpoint:
        """Replace the endpoint's labels with `labels` (platform admins); `InvalidLabels` names
        each bad entry."""
        return self._do(calls.set_endpoint_labels(endpoint_id, labels))

    def remove_endpoint(self, endpoint_id: str) -> Endpoint:
        """Remove an endpoint no server points at (platform admins); its Run is refused from
        then on. `EndpointInUse` while servers point at it."""
        return self._do(calls.remove_endpoint(endpoint_id))

    # -- servers -------------------------------------------------------------------------------

    def servers(self, selector: str | None = None) -> list[Server]:
        """The servers the caller owns or administers (all of them for platform admins); with a
        label `selector` (`role=web,env in (prod,staging)`), those whose labels over their
        endpoint's match it. `InvalidSelector` says where a selector stops parsing."""
        return self._do(calls.servers(selector))

    def server(self, server_id: str) -> Server:
        return self._do(calls.server(server_id))

    def create_server(
        self,
        name: str,
        endpoint_id: str,
        owner_id: str,
        labels: Mapping[str, str] | None = None,
    ) -> Server:
        """Create a server on an endpoint, owned by a user, with labels (platform admins)."""
        return self._do(calls.create_server(name, endpoint_id, owner_id, labels))

    def set_server_labels(self, server_id: str, labels: Mapping[str, str]) -> Server:
        """Replace the server's labels with `labels` (its owner, its administrators or a
        platform admin); `InvalidLabels` names each bad entry."""
        return self._do(calls.set_server_labels(server_id, labels))

    def add_server_admin(self, server_id: str, user_id: str) -> None:
        self._do(calls.add_server_admin(server_id, user_id))

    def remove_server_admin(self, server_id: str, user_id: str) -> None:
        self._do(calls.remove_server_admin(server_id, user_id))

    def remove_server(self, server_id: str) -> Server:
        """Remove a server (its owner or a platform admin); `ServerBusy` while any of its jobs
        has not ended: cancel them first."""
        return self._do(calls.remove_server(server_id))

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
        return self._do(
            calls.create_schedule(
                server_id,
                name,
                cron,
                kind,
                payload,
                timezone=timezone,
                overlap=overlap,
                catchup_window_s=catchup_window_s,
                paused=paused,
                max_attempts=max_attempts,
                backoff=backoff,
                priority=priority,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
                selector=selector,
                max_parallel=max_parallel,
                stop_on_failure=stop_on_failure,
            )
        )

    def schedules(self, server_id: str | None = None) -> list[Schedule]:
        """The schedules of the servers whose jobs you manage (or of one server)."""
        return self._do(calls.schedules(server_id))

    def schedule(self, schedule_id: str) -> Schedule:
        return self._do(calls.schedule(schedule_id))

    def change_schedule(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change some of `name`, `cron`, `timezone`, `job`, `overlap`, `catchup_window_s`,
        `paused` (and a selector schedule's `selector`, `max_parallel`, `stop_on_failure`); a
        new calendar starts after now."""
        return self._do(calls.change_schedule(schedule_id, changes))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return self._do(calls.pause_schedule(schedule_id))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Fire again: at most one catch-up firing, for the latest time missed while paused
        if it lies within the catch-up window."""
        return self._do(calls.resume_schedule(schedule_id))

    def trigger_schedule(self, schedule_id: str) -> tuple[Schedule, str | None]:
        """Fire now, outside the calendar, under the overlap policy: the schedule and the job
        made, or for a selector schedule the group (`grp_...`); None when the policy skipped
        it (or a selector matched nothing)."""
        return self._do(calls.trigger_schedule(schedule_id))

    def delete_schedule(self, schedule_id: str) -> Schedule:
        """Delete a schedule; its jobs stay."""
        return self._do(calls.delete_schedule(schedule_id))

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
        return self._do(
            calls.submit(
                server_id,
                kind,
                payload,
                max_attempts=max_attempts,
                not_before=not_before,
                backoff=backoff,
                idempotency_key=idempotency_key,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
                after=after,
                after_group=after_group,
                priority=priority,
            )
        )

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
        return self._do(calls.submit_batch(server_id, jobs, idempotency_key=idempotency_key))

    def rerun(self, job_id: str, *, idempotency_key: str | None = None) -> Job:
        """Queue a new job like a finished one (same server, kind, payload and retry policy);
        like `submit`, always with an Idempotency-Key."""
        return self._do(calls.rerun(job_id, idempotency_key=idempotency_key))

    def kinds(self, server_id: str) -> Kinds:
        """The kinds the server's Run advertised, with their payload schemas."""
        return self._do(calls.kinds(server_id))

    def job(self, job_id: str, *, include_payload: bool = False) -> Job:
        """The job; with `include_payload`, with its payload (`Job.payload`), each
        credential-looking member's value shown as "[redacted]"."""
        return self._do(calls.job(job_id, include_payload=include_payload))

    def jobs(
        self,
        *,
        server_id: str | None = None,
        state: str | None = None,
        kind: str | None = None,
        id_prefix: str | None = None,
        group: str | None = None,
        page_size: int = PAGE_SIZE,
        include_payload: bool = False,
    ) -> Iterator[Job]:
        """The jobs the caller may see, newest first, fetched a page at a time; by server,
        state, kind, id prefix (`job_` and at least three more characters) or fan-out group;
        with `include_payload`, each with its payload (redacted as for `job`)."""
        cursor: str | None = None
        while True:
            page = calls.jobs_page(
                server_id=server_id,
                state=state,
                kind=kind,
                id_prefix=id_prefix,
                group=group,
                page_size=page_size,
                cursor=cursor,
                include_payload=include_payload,
            )
            found, cursor = self._do(page)
            yield from found
            if cursor is None:
                return

    def cancel(self, job_id: str) -> Job:
        """Cancel: a waiting job ends at once; a running one gets a cancel intent (the answer
        then shows the job still running with `cancel.requested`)."""
        return self._do(calls.cancel(job_id))

    def cancel_many(self, job_ids: Sequence[str]) -> list[Job | MoonrunError]:
        """Cancel 1 to 1,000 jobs (each at most once) in one request, each as `cancel` would:
        per job, in order, the job as the cancel left it, or the error a cancel of it alone
        raises (`NotFound`, `Forbidden`, ...), returned rather than raised. A request refused
        whole (no jobs, too many, a job named twice) raises `InvalidRequest`."""
        return self._do(calls.cancel_many(job_ids))

    def delete(self, job_id: str) -> Job:
        """Delete a finished job now, with its attempts, logs, artifacts and Idempotency-Key;
        answers the job as it was. `JobNotFinished` while it has not ended; `NotFound` for a
        job the caller may not manage, as for one that does not exist."""
        return self._do(calls.delete(job_id))

    def wait(self, job_id: str, timeout_s: float | None = None, *, logs: bool = False) -> Job:
        """The job once it has ended, by blocking reads; `WaitTimedOut` after `timeout_s`.
        With `logs`, also until its last attempt's log lines are all in (`logs_complete`), so
        that `logs()` then gives every line. A platform that stops answering for up to
        `outage_grace_s` is waited out."""
        deadline = policy.deadline(timeout_s, self._clock)
        job = self._through_outages(calls.job(job_id))
        while read := policy.job_read(
            job, logs=logs, timeout_s=timeout_s, deadline=deadline, clock=self._clock
        ):
            job = self._through_outages(read)
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
        return self._do(
            calls.fanout(
                selector,
                kind,
                payload,
                max_parallel=max_parallel,
                stop_on_failure=stop_on_failure,
                max_attempts=max_attempts,
                not_before=not_before,
                backoff=backoff,
                idempotency_key=idempotency_key,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
                priority=priority,
            )
        )

    def groups(self, limit: int = 50) -> list[Group]:
        """The groups you made, newest first (the newest `limit`, at most 200)."""
        return self._do(calls.groups(limit))

    def group(self, group_id: str) -> Group:
        """A group you made (any, for platform admins), with its jobs' counts by state."""
        return self._do(calls.group(group_id))

    def wait_group(self, group_id: str, timeout_s: float | None = None) -> Group:
        """The group once every job of it has ended, by blocking reads; `WaitTimedOut` after
        `timeout_s`. A platform that stops answering for up to `outage_grace_s` is waited out."""
        deadline = policy.deadline(timeout_s, self._clock)
        group = self._through_outages(calls.group(group_id))
        while read := policy.group_read(
            group, timeout_s=timeout_s, deadline=deadline, clock=self._clock
        ):
            group = self._through_outages(read)
        return group

    def cancel_group(self, group_id: str) -> Group:
        """Ask every job of the group that has not ended to cancel; the group after it."""
        return self._do(calls.cancel_group(group_id))

    def artifacts(self, job_id: str) -> list[Artifact]:
        """The job's artifacts, every attempt's, by attempt then name."""
        return self._do(calls.artifacts(job_id))

    def download(
        self, job_id: str, name: str, dest: Path | BinaryIO, *, attempt: int | None = None
    ) -> int:
        """Stream an artifact (of the latest attempt that has it unless given) into `dest`, a
        chunk at a time; the bytes written. A path is written beside itself and renamed into
        place once whole, so it never holds part of an artifact."""
        call = calls.download(job_id, name, attempt)
        written = 0

        def copy(response: httpx.Response, into: BinaryIO) -> None:
            nonlocal written
            for part in response.iter_bytes():
                into.write(part)
                written += len(part)

        if not isinstance(dest, Path):
            # A retry after bytes arrived would write them twice; `_stream` only retries before.
            self._stream(call, lambda response: copy(response, dest))
            return written
        partial = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")

        def to_file(response: httpx.Response) -> None:
            with partial.open("wb") as handle:
                copy(response, handle)

        try:
            self._stream(call, to_file)
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
        read = self._through_outages if follow else self._do
        pages = policy.LogFollow(
            job_id,
            attempt=attempt,
            follow=follow,
            settle_s=settle_s,
            page_size=page_size,
            clock=self._clock,
        )
        while True:
            lines, step = pages.paged(read(pages.page()))
            yield from lines
            if step is policy.Step.JOB:
                step = pages.judged(read(calls.job(job_id)))
            if step is policy.Step.DONE:
                return
            if step is policy.Step.PAUSE:
                self._sleep(pages.pause_s())
