"""No-op job lifecycles per second through real HTTP, against the bare server stack's limit.

The platform runs as the real command, `moonrun platform serve`, in a subprocess (uvicorn with
its defaults: uvloop and httptools, which moonrun depends on; JSON request logs
at level info go to a temporary file, as they would go to a log in production). The client is
aiohttp in this process, signing every Run request with `moonrun.security.signing` (HMAC of
the session key, real clock, fresh nonce) exactly as Run does.

One lifecycle is a share of a claim of 16 (`max_jobs: 16`), then ack, then result (succeeded)
of one no-op job: 2 + 1/16 signed requests. Jobs are created first, untimed, through the user
API. The client then runs `--concurrency` lanes (default 4) on one session, each with its own
keep-alive connection, so that many requests are in flight: a lane claims 16, acks and
finishes them one request at a time, and claims again until a claim comes back empty. This
models a Run that sends one message per request (today's Run batches acks and results); the
session's capacity is 16 per lane, so claims are never cut short. The platform's jobs channel
admits 32 requests at once: keep the concurrency at 32 or below (more gets 429 `channel_busy`).
The sweeper runs as in production (every second).

"The limit" is the same client (same lanes, same signing work, the same POST body and
headers) against a bare ASGI endpoint that reads the body and answers a small JSON object,
served by uvicorn in a subprocess with the settings `moonrun platform serve` uses
(`log_config=None`, `access_log=False`, `timeout_graceful_shutdown=10`, default loop and
HTTP protocol). The ratio lifecycles/s / round trips/s is what the platform leaves of the
stack's capacity; requests/s / round trips/s is the same per request.

    python bench/http_bench.py [--jobs N] [--warmup N] [--round-trips N] [--concurrency C]
                               [--stores memory,file]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kit import Served, child_env, free_port, platform_command
from moonrun.security import signing

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
CLAIM_BATCH = 16
STORES = {"memory": "MemoryStore", "file": "FileStore"}


# -- the servers -------------------------------------------------------------------------------


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The limit: read the whole body, answer a small JSON object. Lifespan is accepted."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = b'{"jobs":[]}'
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve_bare(port: int) -> None:
    """Serve `bare_app` with the uvicorn settings of `moonrun platform serve` (cli.py)."""
    import uvicorn

    uvicorn.Server(
        uvicorn.Config(
            bare_app,
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
        )
    ).run()


# -- the client --------------------------------------------------------------------------------


class Rejected(Exception):
    pass


@dataclass
class Client:
    """An aiohttp session to one server, signing as one Run would (docs/protocol.md, "Signing")."""

    http: aiohttp.ClientSession
    url: str
    endpoint_id: str = ""
    identity: Ed25519PrivateKey | None = None
    session_id: str = "bench"
    session_key: bytes = b"\0" * 32
    requests: int = 0

    async def signed(self, path: str, body: Any, *, expect: int = 200) -> Any:
        """POST `body` signed with the session key (the identity key for registration)."""
        data = json.dumps(body).encode()
        registering = path == "/run/v1/sessions"
        key: bytes | Ed25519PrivateKey | None = self.identity if registering else self.session_key
        assert key is not None
        headers = signing.sign(
            "POST",
            path,
            "",
            data,
            key_id=f"endpoint:{self.endpoint_id}" if registering else f"session:{self.session_id}",
            key=key,
            created=int(time.time()),
            nonce=signing.b64url(secrets.token_bytes(16)),
        )
        headers["Content-Type"] = "application/json"
        return await self._send(path, data, headers, expect)

    async def api(self, path: str, body: Any, *, expect: int = 201) -> Any:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
        return await self._send(path, json.dumps(body).encode(), headers, expect)

    async def _send(self, path: str, data: bytes, headers: dict[str, str], expect: int) -> Any:
        async with self.http.post(self.url + path, data=data, headers=headers) as response:
            answer = await response.read()
            self.requests += 1
            if response.status != expect:
                raise Rejected(f"POST {path}: {response.status} {answer[:300]!r}")
            return json.loads(answer)


async def enroll(client: Client, capacity: int) -> str:
    """Owner, endpoint, join, server, session, reconcile: ready to claim. Returns the server id."""
    owner = await client.api("/api/v1/users", {"name": "bench-owner"})
    created = await client.api("/api/v1/endpoints", {"name": "bench-host"})
    client.identity = Ed25519PrivateKey.generate()
    raw = client.identity.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    joined = await client.api(
        "/run/v1/join",
        {"join_token": created["join_token"], "identity_public_key": signing.b64url(raw)},
        expect=200,
    )
    client.endpoint_id = joined["endpoint_id"]
    server = await client.api(
        "/api/v1/servers",
        {"name": "bench", "endpoint_id": client.endpoint_id, "owner_id": owner["user"]["id"]},
    )
    session = await client.signed(
        "/run/v1/sessions",
        {"boot_id": secrets.token_hex(8), "run_version": "0.1.0", "capacity": capacity},
        expect=201,
    )
    client.session_id = session["session_id"]
    client.session_key = signing.b64url_decode(session["session_key"])
    await client.signed("/run/v1/reconcile", {"entries": []})
    server_id: str = server["id"]
    return server_id


async def in_lanes(lanes: int, work: Callable[[int], Awaitable[None]]) -> None:
    async with asyncio.TaskGroup() as group:
        for lane in range(lanes):
            group.create_task(work(lane))


async def create_jobs(client: Client, server_id: str, count: int, lanes: int) -> None:
    async def lane(n: int) -> None:
        for _ in range(n, count, lanes):
            await client.api(f"/api/v1/servers/{server_id}/jobs", {"kind": "noop"})

    await in_lanes(lanes, lane)


async def drain(client: Client, lanes: int) -> int:
    """Claim 16, ack and finish each, until nothing is left; returns the jobs finished."""
    finished = 0

    async def lane(_: int) -> None:
        nonlocal finished
        while True:
            claimed = await client.signed("/run/v1/jobs/claim", {"max_jobs": CLAIM_BATCH})
            if not claimed["jobs"]:
                return
            for job in claimed["jobs"]:
                evidence = {"attempt": job["attempt"], "lease": job["lease"]}
                await client.signed(f"/run/v1/jobs/{job['job_id']}/ack", evidence)
                done = await client.signed(
                    f"/run/v1/jobs/{job['job_id']}/result",
                    {**evidence, "outcome": "succeeded", "retryable": False},
                )
                if done["state"] != "succeeded":
                    raise Rejected(f"job {job['job_id']} ended {done['state']}")
                finished += 1

    await in_lanes(lanes, lane)
    return finished


@dataclass(frozen=True)
class Figure:
    label: str
    count: int
    requests: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def requests_rate(self) -> float:
        return self.requests / self.seconds


def connector(lanes: int) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=lanes, force_close=False)


async def lifecycles(store: str, args: argparse.Namespace, workdir: Path) -> Figure:
    store_url = "memory://" if store == "memory" else f"file:{workdir / 'platform.db'}"
    port = free_port()
    command = platform_command(store_url, port, workdir, log_level=None)
    served = Served(f"platform-{store}", command, port, workdir, child_env(ADMIN_TOKEN))
    try:
        async with aiohttp.ClientSession(connector=connector(args.concurrency)) as http:
            served.wait_ready("/healthz")
            client = Client(http, served.url)
            server_id = await enroll(client, capacity=CLAIM_BATCH * args.concurrency)
            await create_jobs(client, server_id, args.warmup, args.concurrency)
            await drain(client, args.concurrency)
            await create_jobs(client, server_id, args.jobs, args.concurrency)
            before = client.requests
            started = time.perf_counter()
            finished = await drain(client, args.concurrency)
            seconds = time.perf_counter() - started
        if finished != args.jobs:
            raise Rejected(f"{finished} of {args.jobs} jobs finished")
        return Figure(STORES[store], finished, client.requests - before, seconds)
    except BaseException:
        print(served.tail(), file=sys.stderr)
        raise
    finally:
        served.stop()


async def bare_round_trips(args: argparse.Namespace, workdir: Path) -> Figure:
    port = free_port()
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(port)]
    served = Served("bare", command, port, workdir, child_env(ADMIN_TOKEN))
    # The body and headers of a claim, signed like one, so the client's work is the same.
    path, body = "/run/v1/jobs/claim", {"max_jobs": CLAIM_BATCH}
    try:
        async with aiohttp.ClientSession(connector=connector(args.concurrency)) as http:
            served.wait_ready("/")
            client = Client(http, served.url)

            async def lane(n: int) -> None:
                for _ in range(n, count, args.concurrency):
                    await client.signed(path, body)

            count = args.warmup
            await in_lanes(args.concurrency, lane)
            count = args.round_trips
            started = time.perf_counter()
            await in_lanes(args.concurrency, lane)
            seconds = time.perf_counter() - started
        return Figure("bare ASGI (the limit)", count, count, seconds)
    except BaseException:
        print(served.tail(), file=sys.stderr)
        raise
    finally:
        served.stop()


async def measure(args: argparse.Namespace) -> None:
    from uvicorn.loops.auto import auto_loop_factory
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    stores = [name for name in args.stores.split(",") if name]
    unknown = set(stores) - set(STORES)
    if unknown:
        raise SystemExit(f"unknown stores: {', '.join(sorted(unknown))} (memory, file)")
    loop = auto_loop_factory(use_subprocess=False).__module__
    print(
        f"uvicorn ({AutoHTTPProtocol.__name__}, {loop}) in a subprocess; aiohttp client,"
        f" {args.concurrency} lanes in flight; claim batch {CLAIM_BATCH}"
    )
    with tempfile.TemporaryDirectory(prefix="moonrun-http-bench-") as tmp:
        bare = await bare_round_trips(args, Path(tmp))
        figures = []
        for store in stores:
            workdir = Path(tmp) / store
            workdir.mkdir()
            figures.append(await lifecycles(store, args, workdir))
    print(
        f"{'':24} {'count':>7} {'seconds':>8} {'per second':>11} {'requests/s':>11}"
        f" {'lc/s / rt/s':>12} {'req/s / rt/s':>13}"
    )
    print(
        f"{bare.label:24} {bare.count:7} {bare.seconds:8.2f} {bare.rate:9,.0f} rt"
        f" {bare.requests_rate:11,.0f}"
    )
    for figure in figures:
        print(
            f"{'lifecycles, ' + figure.label:24} {figure.count:7} {figure.seconds:8.2f}"
            f" {figure.rate:9,.0f} lc {figure.requests_rate:11,.0f}"
            f" {figure.rate / bare.rate:12.3f} {figure.requests_rate / bare.rate:13.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2048, help="timed lifecycles per store")
    parser.add_argument("--warmup", type=int, default=128, help="untimed lifecycles first")
    parser.add_argument("--round-trips", type=int, default=8192, help="timed bare round trips")
    parser.add_argument("--concurrency", type=int, default=4, help="lanes (requests in flight)")
    parser.add_argument("--stores", default="memory,file", help="comma-separated: memory,file")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare is not None:
        serve_bare(args.serve_bare)
        return
    if not 1 <= args.concurrency <= 32:
        parser.error("--concurrency must be 1 to 32 (the jobs channel admits 32 at once)")
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
