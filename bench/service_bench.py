"""In-process lifecycles per second through SchedulingService on MemoryStore.

One lifecycle is create -> claim -> ack -> progress -> result (succeeded), each a real use
case with its store reads and compare-and-swap writes. Also prints the same loop's figure with
the pure domain alone, so the service and store overhead reads as a ratio from one run.

    python bench/service_bench.py [--lifecycles N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from moonrun.clock import SystemClock
from moonrun.run.handlers import advertised_kinds, load_handlers
from moonrun.scheduling import jobs, messages
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.jobs import RunResult
from moonrun.scheduling.messages import Caller, Evidence
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.store.memory import MemoryStore

PUBLIC_KEY = "A" * 43


def service_lifecycles(count: int) -> float:
    """Lifecycles per second through the whole service."""
    store, clock, tokens = MemoryStore(), SystemClock(), SystemTokenSource()
    settings = SchedulingSettings(max_claim_batch=1)
    service = SchedulingService(store, clock, tokens, settings)
    directory = Directory(store, clock, tokens)
    admin = directory.ensure_bootstrap_admin("mra_bench")
    enrolled = service.create_endpoint(admin, "bench-host")
    service.join_endpoint(enrolled.join_token, PUBLIC_KEY)
    server = directory.create_server(
        admin, "bench", endpoint_id=enrolled.endpoint.id, owner_id=admin.id
    )
    kinds = advertised_kinds(load_handlers())  # as a real Run registers: jobs are checked
    session = service.register_session(
        enrolled.endpoint.id, boot_id="bench", run_version="0.1.0", capacity=1, kinds=kinds
    ).session.id
    service.reconcile(session, [])
    gc.collect()
    started = time.perf_counter()
    for _ in range(count):
        job = service.create_job(admin, server.id, kind="noop")
        (granted,) = service.claim(session, 1)
        evidence = Evidence(granted.attempt, granted.lease)
        service.ack(session, job.id, evidence)
        service.progress(session, job.id, evidence, seq=1, percent=50.0)
        service.result(session, job.id, evidence, outcome="succeeded", retryable=False)
    return count / (time.perf_counter() - started)


def domain_lifecycles(count: int) -> float:
    """The same lifecycle through the pure functions only: the floor the service adds to."""
    tokens = SystemTokenSource()
    policy = SchedulingSettings().default_policy()
    caller = Caller("ep", 1)
    now = time.time_ns() // 1_000_000
    started = time.perf_counter()
    for n in range(count):
        job = jobs.create_job(
            job_id=f"job_{n}",
            server_id="srv",
            endpoint_id="ep",
            owner_id="usr",
            kind="noop",
            payload=None,
            policy=policy,
            now=now,
        )
        lease = tokens.token("mrl_")
        job = jobs.claim(
            job, now=now, lease_hash=token_hash(lease), generation=1, ack_timeout_ms=30_000
        )
        evidence = Evidence(job.attempt, lease)
        job = messages.ack(job, caller, evidence, now=now, lease_ttl_ms=40_000, draw=0.0).job
        job = messages.progress(
            job,
            caller,
            evidence,
            seq=1,
            percent=50.0,
            message=None,
            now=now,
            lease_ttl_ms=40_000,
            draw=0.0,
        ).job
        reported = RunResult.of("succeeded", False)
        messages.result(job, caller, evidence, reported, now=now, draw=0.0)
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    service_rates = [service_lifecycles(args.lifecycles) for _ in range(args.rounds)]
    domain_rates = [domain_lifecycles(args.lifecycles) for _ in range(args.rounds)]
    service_rate = statistics.median(service_rates)
    domain_rate = statistics.median(domain_rates)
    print(f"lifecycles (create->claim->ack->progress->result), {args.rounds} rounds, median:")
    print(f"  service on MemoryStore : {service_rate:10,.0f} /s")
    print(f"  pure domain only       : {domain_rate:10,.0f} /s")
    print(f"  service / domain       : {service_rate / domain_rate:10.2f}")


if __name__ == "__main__":
    main()
