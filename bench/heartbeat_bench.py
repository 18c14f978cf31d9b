"""Heartbeat round trips, idle and while 8 artifact uploads hang inside the platform.

The platform runs as the real command, `moonrun platform serve`, over a FileStore in a
temporary directory (JSON request logs at level info go to a file there). The client is Run's
own `moonrun.run.client.PlatformClient`: it joins an endpoint, registers a session,
reconciles, and claims and acks one `noop` job, whose attempt the uploads below belong to.

How the uploads hang without touching src/: the platform's FileArtifactStore writes chunk
`i` of artifact `name` to `<data>/artifacts/<job>/<attempt>/<name>/.<i:06d>.tmp` and then
renames it. The bench makes that temporary path a named pipe (os.mkfifo) for 8 artifact
names, so the platform's `open(..., "wb")` blocks in the kernel until someone opens the pipe
for reading, which nobody does. The artifacts channel admits 4 requests at a time: 4 uploads
hang inside the platform (one in open(), three on the artifact store's lock), the other 4 are
answered 429 `channel_busy` at once and retried every 50 ms by their client, as a busy Run
would, so the channel stays full for the whole measurement.

Heartbeats are sent one after the other on the control channel, each timed from the call to
`PlatformClient.heartbeat()` to its parsed answer (signing included). The figure that matters
is the ratio blocked/idle of p50 and p99; it should stay at or under 2.

    python bench/heartbeat_bench.py [--heartbeats N] [--warmup N] [--uploads N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kit import Served, child_env, free_port, platform_command
from moonrun.errors import ChannelBusy
from moonrun.run.client import TRANSIENT, PlatformClient, join
from moonrun.security.tokens import b64url

ADMIN_TOKEN = "mra_" + secrets.token_urlsafe(32)
BUSY_RETRY_S = 0.05
LONG_S = 3600


def start_platform(workdir: Path, port: int) -> Served:
    """The platform on `port` over a FileStore, with leases, acks and sessions that never
    lapse during the bench."""
    never = str(LONG_S)
    command = platform_command(
        f"file:{workdir / 'platform.db'}",
        port,
        workdir,
        *("--lease-ttl-s", never, "--ack-timeout-s", never, "--session-ttl-s", never),
        log_level=None,
    )
    return Served("platform", command, port, workdir, child_env(ADMIN_TOKEN))


async def admin(http: aiohttp.ClientSession, url: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with http.post(url + path, json=body, headers=headers) as response:
        answer = await response.json()
        if response.status >= 300:
            raise SystemExit(f"POST {path}: {response.status} {answer}")
        return answer


async def timed_heartbeats(client: PlatformClient, count: int) -> list[float]:
    """Round-trip times in milliseconds of `count` heartbeats sent one after the other."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await client.heartbeat()
        times.append((time.perf_counter() - started) * 1000)
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Upload:
    """One artifact upload that retries `channel_busy` until the platform takes the request."""

    def __init__(self, client: PlatformClient, job_id: str, attempt: int, lease: str, name: str):
        self.client, self.job_id, self.attempt, self.lease, self.name = (
            client,
            job_id,
            attempt,
            lease,
            name,
        )
        self.sent_at: float | None = None
        self.busy_answers = 0

    async def run(self) -> None:
        while True:
            self.sent_at = time.monotonic()
            try:
                await self.client.put_chunk(
                    self.job_id, self.attempt, self.lease, self.name, 0, b"x" * 1024, final=True
                )
                return
            except ChannelBusy:
                self.sent_at = None
                self.busy_answers += 1
                await asyncio.sleep(BUSY_RETRY_S)
            except TRANSIENT:
                self.sent_at = None
                await asyncio.sleep(BUSY_RETRY_S)

    def hanging(self, for_s: float) -> bool:
        return self.sent_at is not None and time.monotonic() - self.sent_at > for_s


async def bench(options: argparse.Namespace, workdir: Path) -> None:
    port = free_port()
    platform = start_platform(workdir, port)
    url = platform.url
    uploaders: list[PlatformClient] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession() as http:
            platform.wait_ready()
            owner = await admin(http, url, "/api/v1/users", {"name": "o", "platform_admin": False})
            created = await admin(http, url, "/api/v1/endpoints", {"name": "bench-host"})
            identity = Ed25519PrivateKey.generate()
            public = b64url(identity.public_key().public_bytes_raw())
            endpoint_id = await join(url, created["join_token"], public)
            server = await admin(
                http,
                url,
                "/api/v1/servers",
                {"name": "s", "endpoint_id": endpoint_id, "owner_id": owner["user"]["id"]},
            )
            await admin(http, url, f"/api/v1/servers/{server['id']}/jobs", {"kind": "noop"})

            async with PlatformClient(url, endpoint_id, identity) as client:
                await client.register(b64url(secrets.token_bytes(16)), capacity=16)
                await client.reconcile([])
                (job,) = await client.claim(1)
                job_id, attempt, lease = job["job_id"], job["attempt"], job["lease"]
                (acked,) = await client.acks(
                    [{"job_id": job_id, "attempt": attempt, "lease": lease}]
                )
                if isinstance(acked, Exception):
                    raise acked

                await timed_heartbeats(client, options.warmup)
                idle = await timed_heartbeats(client, options.heartbeats)

                names = [f"blocked-{index}" for index in range(options.uploads)]
                for name in names:
                    directory = workdir / "data" / "artifacts" / job_id / str(attempt) / name
                    directory.mkdir(mode=0o700, parents=True)
                    os.mkfifo(directory / ".000000.tmp", 0o600)
                uploads = []
                for name in names:
                    uploader = PlatformClient(url, endpoint_id, identity)
                    await uploader.__aenter__()
                    uploaders.append(uploader)
                    uploader.session = client.session
                    uploads.append(Upload(uploader, job_id, attempt, lease, name))
                tasks = [asyncio.create_task(upload.run()) for upload in uploads]
                await asyncio.sleep(1.0)
                hung = sum(1 for upload in uploads if upload.hanging(0.5))
                if hung == 0:
                    raise SystemExit("no upload hangs inside the platform: the trick failed")

                await timed_heartbeats(client, options.warmup)
                blocked = await timed_heartbeats(client, options.heartbeats)
                hung_after = sum(1 for upload in uploads if upload.hanging(0.5))
                busy = sum(upload.busy_answers for upload in uploads)
                finished = sum(1 for task in tasks if task.done())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for uploader in uploaders:
            await uploader.__aexit__()
        # The platform's artifact threads sit in open() on the pipes: no graceful stop.
        platform.kill()

    idle_p50, idle_p99 = percentile(idle, 0.50), percentile(idle, 0.99)
    blocked_p50, blocked_p99 = percentile(blocked, 0.50), percentile(blocked, 0.99)
    ratio_p50, ratio_p99 = blocked_p50 / idle_p50, blocked_p99 / idle_p99
    print(f"heartbeat round trips, {options.heartbeats} each (after {options.warmup} warm-up)")
    print(
        f"  idle:              p50 {idle_p50:7.2f} ms   p99 {idle_p99:7.2f} ms   "
        f"mean {statistics.fmean(idle):6.2f} ms"
    )
    print(
        f"  {options.uploads} uploads blocked: p50 {blocked_p50:7.2f} ms   "
        f"p99 {blocked_p99:7.2f} ms   mean {statistics.fmean(blocked):6.2f} ms"
    )
    print(
        f"  ratio blocked/idle: p50 {ratio_p50:.2f}   p99 {ratio_p99:.2f}   "
        f"({'within' if max(ratio_p50, ratio_p99) <= 2 else 'OVER'} the bound of 2)"
    )
    print(
        f"  uploads: {hung} of {options.uploads} hanging inside the platform at the start, "
        f"{hung_after} at the end, {finished} finished; {busy} answers 429 channel_busy"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeats", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--uploads", type=int, default=8)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moonrun-heartbeat-bench-") as workdir:
        asyncio.run(bench(options, Path(workdir)))


if __name__ == "__main__":
    main()
