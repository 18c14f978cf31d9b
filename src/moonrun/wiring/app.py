"""The ASGI app: the Run and user APIs (http/), the console (web/), health and metrics, and the
sweeper's lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response

from moonrun import __version__
from moonrun.http import group_api, run_api, schedule_api, user_api
from moonrun.http.api import Api, openapi_paths
from moonrun.http.platform import AnonymousBodies, BodyLimit, RequestLog, Scope, error_response
from moonrun.http.schemas import HealthAnswer
from moonrun.service.firing import Firer
from moonrun.service.liveness import LivenessFlusher
from moonrun.service.retention import job_data
from moonrun.service.sweeper import Sweeper
from moonrun.web import console
from moonrun.wire.error_body import ErrorBody
from moonrun.wiring.error_handlers import install_error_handlers
from moonrun.wiring.platform import Platform

API_ROUTES = (*run_api.ROUTES, *user_api.ROUTES, *schedule_api.ROUTES, *group_api.ROUTES)
"""The routes `Api` serves: everything under /run/ and /api/."""


class PlatformApp(FastAPI):
    """The Run and user APIs on `Api`; FastAPI for the console, operations and the docs."""

    api: Api

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(("/run/", "/api/")):
            await self.api(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document of its own routes, with the APIs' routes added."""
        if self.openapi_schema is None:
            document = super().openapi()
            paths, schemas = openapi_paths(API_ROUTES, ErrorBody)
            document["paths"] = {**paths, **document["paths"]}
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in schemas.items():
                components.setdefault(name, schema)
            self.openapi_schema = document
        return self.openapi_schema


def create_app(platform: Platform, *, sweep: bool = True, api_docs: bool = False) -> FastAPI:
    """The platform's HTTP service over `platform`; `sweep=False` leaves sweeping, firing
    schedules and writing heartbeats (the liveness flusher) to the caller
    (tests drive it with a manual clock). `api_docs` serves /docs and /redoc, whose pages load
    scripts from a CDN: off unless the operator asks (/openapi.json is always served)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = anyio.Event()
        sweeper = Sweeper(
            platform.service,
            platform.channels.ops,
            platform.http.sweep_interval_s,
            forget=job_data(platform.logs, platform.artifacts),
            on_pruned=platform.metrics.pruned.inc,
        )
        app.state.sweeper = sweeper
        service = platform.service
        # Heartbeats' last_seen_at, all those of a pass in one write, on the ops channel's
        # threads (a FileStore's fsync never holds up the loop).
        flusher = LivenessFlusher(
            service.beats,
            service.record_beats,
            platform.channels.ops.thread,
            service.settings.liveness_flush_s,
        )
        peers = platform.peers
        if peers is not None:
            peers.start()
        async with anyio.create_task_group() as tasks:
            if sweep:
                tasks.start_soon(sweeper.run, stop)
                tasks.start_soon(Firer(platform.service.schedules, platform.channels.ops).run, stop)
                tasks.start_soon(flusher.run, stop)
            tasks.start_soon(platform.lag.run, stop.is_set)
            try:
                yield
            finally:
                stop.set()
                if peers is not None:
                    await anyio.to_thread.run_sync(peers.stop)

    app = PlatformApp(
        title="moonrun platform",
        version=__version__,
        description="Durable job scheduling for fleets of hosts: the Run API and the user API.",
        lifespan=lifespan,
        docs_url="/docs" if api_docs else None,
        redoc_url="/redoc" if api_docs else None,
    )
    app.api = Api(platform, API_ROUTES, run_api.SIGNATURES)
    install_error_handlers(app)
    console.install(app, platform)

    @app.get("/healthz", response_model=HealthAnswer, tags=["ops"])
    async def healthz(request: Request) -> Any:
        """200 once the store is open and the sweeper runs; 503 `store_unavailable` while the
        sweeper's latest pass could not reach the store."""
        sweeper: Sweeper | None = getattr(request.app.state, "sweeper", None)
        if sweep and (sweeper is None or not sweeper.running):
            return error_response(503, "starting", "the sweeper is not running yet")
        if sweeper is not None and sweeper.store_failure is not None:
            return error_response(503, "store_unavailable", sweeper.store_failure)
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus text: jobs by state, claims, rejections by code, latency by channel."""
        with platform.channels.ops.admit():
            body = await platform.channels.ops.run(platform.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(AnonymousBodies, platform_of=lambda: platform)
    app.add_middleware(BodyLimit, limit=platform.http.user_body_limit)
    app.add_middleware(RequestLog, metrics_of=lambda: platform.metrics)
    return app
