"""An HTTP/1.1 forwarding proxy for the fault tests, run as its own process.

    python tests/support/e2e_faults_proxy.py --listen PORT --upstream URL [--hang PREFIX ...]

Every request is forwarded to the upstream as it came (method, path, query, headers that are
not hop-by-hop, body) and its answer is sent back as it came, except requests whose path
starts with a `--hang` prefix: those are held open without an answer until the proxy is
killed. `GET /__proxy/stats` answers how many requests were forwarded and held, by prefix.

A partition can be switched on and off while the proxy runs: `POST /__proxy/partition`
with `{"mode": "hang"}` holds every request that arrives (never forwarded; when the mode
changes, their connections are closed unanswered, as packets lost on the way), `{"mode":
"drop"}` closes each request's connection at once without an answer, and `{"mode": "none"}`
heals it. Stats count what each mode swallowed.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import aiohttp
from aiohttp import web

STATS_PATH = "/__proxy/stats"
PARTITION_PATH = "/__proxy/partition"
PARTITION_MODES = ("none", "hang", "drop")
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
    }
)


def route_of(path: str) -> str:
    """The path with job ids and artifact coordinates left out, as a stats key."""
    parts = path.split("/")
    if path.startswith("/run/v1/jobs/") and len(parts) == 6:
        return f"/run/v1/jobs/*/{parts[5]}"
    if path.startswith("/run/v1/artifacts/"):
        return "/run/v1/artifacts/*"
    if path.startswith("/api/"):
        return "/api/*"
    return path


class Proxy:
    def __init__(self, upstream: str, hang: list[str]) -> None:
        self.upstream = upstream.rstrip("/")
        self.hang = hang
        self.held: Counter[str] = Counter()
        self.forwarded: Counter[str] = Counter()
        self.failed = 0
        self.forever = asyncio.Event()  # never set: held requests wait for the proxy's end
        self.session: aiohttp.ClientSession | None = None
        self.partition = "none"
        self.healed = asyncio.Event()
        self.healed.set()
        self.partitioned: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.path
        if path == STATS_PATH:
            return web.json_response(
                {
                    "held": dict(self.held),
                    "forwarded": dict(self.forwarded),
                    "failed": self.failed,
                    "partition": self.partition,
                    "partitioned": dict(self.partitioned),
                }
            )
        if path == PARTITION_PATH and request.method == "POST":
            mode = (await request.json()).get("mode")
            if mode not in PARTITION_MODES:
                return web.json_response(
                    {"error": f"mode must be one of {PARTITION_MODES}"}, status=422
                )
            self.partition = mode
            if mode == "hang":
                self.healed.clear()
            else:
                self.healed.set()  # held requests are closed now, unanswered
            return web.json_response({"partition": mode})
        if self.partition != "none":
            return await self.swallow(request)
        for prefix in self.hang:
            if path.startswith(prefix):
                self.held[prefix] += 1
                await request.read()
                await self.forever.wait()
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        assert self.session is not None
        try:
            async with self.session.request(
                request.method,
                self.upstream + str(request.rel_url),
                data=body,
                headers=headers,
                allow_redirects=False,
                auto_decompress=False,
            ) as answer:
                data = await answer.read()
                status = answer.status
                back = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        except (aiohttp.ClientError, TimeoutError, OSError):
            self.failed += 1
            return web.Response(status=502, text="upstream unreachable")
        self.forwarded[route_of(path)] += 1
        return web.Response(status=status, body=data, headers=back)

    async def swallow(self, request: web.Request) -> web.StreamResponse:
        """A partitioned request: held until the partition heals, or dropped at once; either
        way its connection is closed without an answer and nothing reaches the upstream."""
        mode = self.partition
        self.partitioned[mode] += 1
        await request.read()
        if mode == "hang":
            await self.healed.wait()
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=502)  # never sent: the connection is gone


async def serve(port: int, upstream: str, hang: list[str]) -> None:
    proxy = Proxy(upstream, hang)
    # No total timeout: a paused upstream is the upstream's business, the client times out.
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None),
        connector=aiohttp.TCPConnector(limit=0),
    ) as session:
        proxy.session = session
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", proxy.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        print(f"proxy listening on 127.0.0.1:{port} -> {upstream}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--hang", action="append", default=[])
    options = parser.parse_args()
    asyncio.run(serve(options.listen, options.upstream, options.hang))


if __name__ == "__main__":
    main()
