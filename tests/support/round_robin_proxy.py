"""A small round-robin HTTP load balancer for the several-platforms test, run as its own process:

    python -m tests.support.round_robin_proxy --listen PORT --upstream URL [--upstream URL ...]

Each request goes to the next upstream in turn. The request's body is read whole before it is
forwarded, and the answer's before it is sent back (nginx's buffering); there is no timeout
(a long-poll claim or a blocking read waits as long as it asked). The client's address goes
on in `X-Forwarded-For` (the platforms name this proxy with `--trusted-proxy`). Every request
gets a new upstream connection, so an upstream that is gone refuses at once: such a request
goes to the next upstream, as a load balancer's passive health check sends it (nothing reached
the dead one). One that fails after it was sent (the upstream died with it) is retried on the
next upstream only when its method is idempotent (GET, HEAD: nginx's `proxy_next_upstream
error`), else answered 502. `GET /__proxy/stats` answers how many requests each upstream
answered, how many each refused, and how many were answered 502.

`RoundRobinProxy` starts it from a test (tests/support/launcher.py's `Process`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from aiohttp import web
from multidict import CIMultiDict

from tests.support.launcher import Process, free_port, wait_healthy

STATS_PATH = "/__proxy/stats"
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "x-forwarded-for",
    }
)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})


class RoundRobin:
    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = [upstream.rstrip("/") for upstream in upstreams]
        self.turn = 0
        self.answered: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.failed = 0
        self.session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.rel_url.path == STATS_PATH:
            return web.json_response(
                {"answered": self.answered, "refused": self.refused, "failed": self.failed}
            )
        body = await request.read()
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
        )
        headers["X-Forwarded-For"] = request.remote or "unknown"
        first, self.turn = self.turn, (self.turn + 1) % len(self.upstreams)
        assert self.session is not None
        for step in range(len(self.upstreams)):
            upstream = self.upstreams[(first + step) % len(self.upstreams)]
            try:
                async with self.session.request(
                    request.method,
                    upstream + str(request.rel_url),
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    auto_decompress=False,
                ) as answer:
                    data = await answer.read()
                    back = CIMultiDict(
                        (k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP
                    )
                    self.answered[upstream] += 1
                    return web.Response(status=answer.status, body=data, headers=back)
            except aiohttp.ClientConnectorError:
                self.refused[upstream] += 1  # nothing reached it: the next one
            except (aiohttp.ClientError, TimeoutError, OSError):
                if request.method not in IDEMPOTENT:
                    break  # it may have been applied: the client decides (502)
        self.failed += 1
        return web.Response(status=502, text="no upstream answered")


async def serve(port: int, upstreams: list[str]) -> None:
    proxy = RoundRobin(upstreams)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None),
        connector=aiohttp.TCPConnector(limit=0, force_close=True),
    ) as session:
        proxy.session = session
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", proxy.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print(f"round-robin proxy on 127.0.0.1:{port} -> {upstreams}", flush=True)
        await asyncio.Event().wait()


class RoundRobinProxy(Process):
    """This module in its own process, in front of `upstreams`."""

    def __init__(self, workdir: Path, upstreams: list[str]) -> None:
        super().__init__("round-robin proxy", workdir)
        self.upstreams = upstreams
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "tests.support.round_robin_proxy"]
        command += ["--listen", str(self.port)]
        for upstream in self.upstreams:
            command += ["--upstream", upstream]
        self.spawn(command)
        wait_healthy(self, self.url, STATS_PATH)

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(self.url + STATS_PATH, timeout=5.0).json()
        return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--upstream", action="append", required=True)
    options = parser.parse_args()
    asyncio.run(serve(options.listen, options.upstream))


if __name__ == "__main__":
    main()
