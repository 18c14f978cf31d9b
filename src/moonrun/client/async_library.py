"""The user client on asyncio: `AsyncClient`, every method of `Client`, awaited.

It sends the same `calls.py` requests over `httpx.AsyncClient` and makes the same decisions
(`policy.py`: retries, riding through a platform restart in `wait` and a followed log, when a
followed log stops), so only the awaiting is its own. Each method has the signature of
`Client`'s: a coroutine, or an async iterator where `Client`'s returns an iterator
(`jobs`, `logs`); its docstring is `Client`'s. Use it as `async with AsyncClient(...) as c:`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self, TypeVar

import httpx

from moonrun.backoff import Backoff
from moonrun.client import calls, policy, profiles
from moonrun.client.library import Client
from moonrun.client.policy import LOG_SETTLE_S, OUTAGE_GRACE_S, PAGE_SIZE, RETRY_BACKOFF
from moonrun.client.records import (
    Artifact,
    Endpoint,
    FanOut,
    Group,
    Job,
    Kinds,
    LogLine,
    Schedule,
    Server,
    User,
)
from moonrun.errors import MoonrunError, Unreachable

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """A user of one platform, by API token, on asyncio. Close it (`await client.close()`)
    or use it as an async context manager."""

    def __init__(
        self,
        platform: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff: Backoff = RETRY_BACKOFF,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
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
        self._http = httpx.AsyncClient(
            base_url=self.platform,
            headers=calls.headers(token),
            timeout=timeout_s,
            transport=transport,
        )

    async def close(self) -> None:
        await self._http.aclose()

    aclose = close
    """As httpx names it (and `contextlib.aclosing` calls it)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}({self.platform!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **options: Any) -> Self:
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
        found = profiles.saved(name, environ)
        return cls(found.platform, found.token, **options)

    # -- the wire ------------------------------------------------------------------------------

    async def _do(self, call: calls.Call[T]) -> T:
        """What `call` answers, tried again as `policy.Retry` decides; errors raised typed."""
        retry = policy.Retry(self.platform, self.retries, self.backoff)
        while True:
            try:
                response = await self._http.request(
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
            await self._sleep(pause)

    async def _stream(
        self, call: calls.Call[None], write: Callable[[httpx.Response], Awaitable[None]]
    ) -> None:
        """A streamed GET: `write` reads the answer's body; tried again as `_do` is until the
        body begins (a retry after some of it was written would write that part twice)."""
        retry = policy.Retry(self.platform, self.retries, self.backoff)
        while True:
            try:
                async with self._http.stream(
                    call.method, call.path, params=call.params
                ) as response:
                    if response.status_code < 400:
                        try:
                            await write(response)
                        except httpx.TransportError as error:
                            raise policy.broken_off(self.platform, error) from None
                        return
                    content = await response.aread()
                    raise calls.refusal(
                        call.method,
                        response.status_code,
                        content,
                        response.headers,
                        retried=retry.retried,
                    )
            except policy.RETRIED as error:
                pause = retry.pause(error)
            await self._sleep(pause)

    async def _through_outages(self, call: calls.Call[T]) -> T:
        """`call`, tried again while the platform does not answer for up to `outage_grace_s`
        (`policy.Outage`)."""
        outage = policy.Outage(self.outage_grace_s, self.backoff, self._clock)
        while True:
            try:
                return await self._do(call)
            except Unreachable as error:
                pause = outage.pause(error)
            await self._sleep(pause)

    # -- users ---------------------------------------------------------------------------------

    async def whoami(self) -> User:
        return await self._do(calls.whoami())

    async def users(self) -> list[User]:
        return await self._do(calls.users())

    async def create_user(
        self, name: str, *, password: str | None = None, platform_admin: bool = False
    ) -> tuple[User, str]:
        return await self._do(
            calls.create_user(name, password=password, platform_admin=platform_admin)
        )

    async def disable_user(self, user_id: str) -> User:
        return await self._do(calls.disable_user(user_id))

    async def enable_user(self, user_id: str) -> User:
        return await self._do(calls.enable_user(user_id))

    async def rotate_token(self, user_id: str | None = None) -> tuple[User, str]:
        user_id = user_id if user_id is not None else (await self.whoami()).id
        return await self._do(calls.rotate_token(user_id))

    async def set_password(self, password: str, user_id: str | None = None) -> User:
        user_id = user_id if user_id is not None else (await self.whoami()).id
        return await self._do(calls.set_password(password, user_id))

    # -- endpoints -----------------------------------------------------------------------------

    async def endpoints(self) -> list[Endpoint]:
        return await self._do(calls.endpoints())

    async def create_endpoint(self, name: str) -> tuple[Endpoint, str]:
        return await self._do(calls.create_endpoint(name))

    async def drain_endpoint(self, endpoint_id: str) -> Endpoint:
        return await self._do(calls.drain_endpoint(endpoint_id))

    async def undrain_endpoint(self, endpoint_id: str) -> Endpoint:
        return await self._do(calls.undrain_endpoint(endpoint_id))

    async def set_endpoint_labels(self, endpoint_id: str, labels: Mapping[str, str]) -> Endpoint:
        return await self._do(calls.set_endpoint_labels(endpoint_id, labels))

    async def remove_endpoint(self, endpoint_id: str) -> Endpoint:
        return await self._do(calls.remove_endpoint(endpoint_id))

    # -- servers -------------------------------------------------------------------------------

    async def servers(self, selector: str | None = None) -> list[Server]:
        return await self._do(calls.servers(selector))

    async def server(self, server_id: str) -> Server:
        return await self._do(calls.server(server_id))

    async def create_server(
        self,
        name: str,
        endpoint_id: str,
        owner_id: str,
        labels: Mapping[str, str] | None = None,
    ) -> Server:
        return await self._do(calls.create_server(name, endpoint_id, owner_id, labels))

    async def set_server_labels(self, server_id: str, labels: Mapping[str, str]) -> Server:
        return await self._do(calls.set_server_labels(server_id, labels))

    async def add_server_admin(self, server_id: str, user_id: str) -> None:
        await self._do(calls.add_server_admin(server_id, user_id))

    async def remove_server_admin(self, server_id: str, user_id: str) -> None:
        await self._do(calls.remove_server_admin(server_id, user_id))

    async def remove_server(self, server_id: str) -> Server:
        return await self._do(calls.remove_server(server_id))

    # -- schedules -----------------------------------------------------------------------------

    async def create_schedule(
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
        return await self._do(
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

    async def schedules(self, server_id: str | None = None) -> list[Schedule]:
        return await self._do(calls.schedules(server_id))

    async def schedule(self, schedule_id: str) -> Schedule:
        return await self._do(calls.schedule(schedule_id))

    async def change_schedule(self, schedule_id: str, **changes: Any) -> Schedule:
        return await self._do(calls.change_schedule(schedule_id, changes))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return await self._do(calls.pause_schedule(schedule_id))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return await self._do(calls.resume_schedule(schedule_id))

    async def trigger_schedule(self, schedule_id: str) -> tuple[Schedule, str | None]:
        return await self._do(calls.trigger_schedule(schedule_id))

    async def delete_schedule(self, schedule_id: str) -> Schedule:
        return await self._do(calls.delete_schedule(schedule_id))

    # -- jobs ----------------------------------------------------------------------------------

    async def submit(
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
        return await self._do(
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

    async def submit_batch(
        self,
        server_id: str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> list[Job]:
        return await self._do(calls.submit_batch(server_id, jobs, idempotency_key=idempotency_key))

    async def rerun(self, job_id: str, *, idempotency_key: str | None = None) -> Job:
        return await self._do(calls.rerun(job_id, idempotency_key=idempotency_key))

    async def kinds(self, server_id: str) -> Kinds:
        return await self._do(calls.kinds(server_id))

    async def job(self, job_id: str, *, include_payload: bool = False) -> Job:
        return await self._do(calls.job(job_id, include_payload=include_payload))

    async def jobs(
        self,
        *,
        server_id: str | None = None,
        state: str | None = None,
        kind: str | None = None,
        id_prefix: str | None = None,
        group: str | None = None,
        page_size: int = PAGE_SIZE,
        include_payload: bool = False,
    ) -> AsyncIterator[Job]:
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
            found, cursor = await self._do(page)
            for job in found:
                yield job
            if cursor is None:
                return

    async def cancel(self, job_id: str) -> Job:
        return await self._do(calls.cancel(job_id))

    async def cancel_many(self, job_ids: Sequence[str]) -> list[Job | MoonrunError]:
        return await self._do(calls.cancel_many(job_ids))

    async def delete(self, job_id: str) -> Job:
        return await self._do(calls.delete(job_id))

    async def wait(self, job_id: str, timeout_s: float | None = None, *, logs: bool = False) -> Job:
        deadline = policy.deadline(timeout_s, self._clock)
        job = await self._through_outages(calls.job(job_id))
        while read := policy.job_read(
            job, logs=logs, timeout_s=timeout_s, deadline=deadline, clock=self._clock
        ):
            job = await self._through_outages(read)
        return job

    # -- fan-out groups -------------------------------------------------------------------------

    async def fanout(
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
        return await self._do(
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

    async def groups(self, limit: int = 50) -> list[Group]:
        return await self._do(calls.groups(limit))

    async def group(self, group_id: str) -> Group:
        return await self._do(calls.group(group_id))

    async def wait_group(self, group_id: str, timeout_s: float | None = None) -> Group:
        deadline = policy.deadline(timeout_s, self._clock)
        group = await self._through_outages(calls.group(group_id))
        while read := policy.group_read(
            group, timeout_s=timeout_s, deadline=deadline, clock=self._clock
        ):
            group = await self._through_outages(read)
        return group

    async def cancel_group(self, group_id: str) -> Group:
        return await self._do(calls.cancel_group(group_id))

    async def artifacts(self, job_id: str) -> list[Artifact]:
        return await self._do(calls.artifacts(job_id))

    async def download(
        self, job_id: str, name: str, dest: Path | BinaryIO, *, attempt: int | None = None
    ) -> int:
        call = calls.download(job_id, name, attempt)
        written = 0

        async def copy(response: httpx.Response, into: BinaryIO) -> None:
            nonlocal written
            async for part in response.aiter_bytes():
                into.write(part)  # a local file: written as the chunks come
                written += len(part)

        if not isinstance(dest, Path):
            # A retry after bytes arrived would write them twice; `_stream` only retries before.
            await self._stream(call, lambda response: copy(response, dest))
            return written
        partial = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")

        async def to_file(response: httpx.Response) -> None:
            with partial.open("wb") as handle:
                await copy(response, handle)

        try:
            await self._stream(call, to_file)
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
        return written

    async def logs(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        follow: bool = False,
        settle_s: float = LOG_SETTLE_S,
        page_size: int | None = None,
    ) -> AsyncIterator[LogLine]:
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
            lines, step = pages.paged(await read(pages.page()))
            for line in lines:
                yield line
            if step is policy.Step.JOB:
                step = pages.judged(await read(calls.job(job_id)))
            if step is policy.Step.DONE:
                return
            if step is policy.Step.PAUSE:
                await self._sleep(pages.pause_s())


def _borrow_docs(into: type, source: type) -> None:
    """Each public method of `into` without a docstring takes `source`'s (the sync client's
    says what both do)."""
    for name, found in vars(into).items():
        function = found.__func__ if isinstance(found, classmethod) else found
        original = getattr(source, name, None)
        if inspect.isfunction(function) and function.__doc__ is None and original is not None:
            function.__doc__ = original.__doc__


_borrow_docs(AsyncClient, Client)
