"""A small world for service-level tests: users, a server on an endpoint, and simulated Runs."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from moonrun.clock import ManualClock
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.messages import Evidence
from moonrun.scheduling.reconcile import ReconcileEntry
from moonrun.scheduling.records import Endpoint, Server, User
from moonrun.security.tokens import SeededTokenSource
from moonrun.service.answers import ClaimedJob
from moonrun.service.config import SchedulingSettings
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.store.protocol import Store
from tests.support.stores import StoreFactory

SETTINGS = SchedulingSettings(
    ack_timeout_s=30,
    lease_ttl_s=40,
    session_ttl_s=50,
    max_attempts=3,
    backoff_initial_s=1,
    backoff_multiplier=2,
    backoff_max_s=60,
)


def public_key(seed: int) -> str:
    return base64.urlsafe_b64encode(bytes([seed % 256]) * 32).decode().rstrip("=")


@dataclass
class Run:
    """What a Run process knows: its endpoint, its session, and the leases it was granted."""

    world: World
    endpoint_id: str
    session_id: str = ""
    leases: dict[tuple[str, int], str] = field(default_factory=dict)

    def register(self, capacity: int = 4, boot_id: str = "boot-1") -> int:
        registration = self.world.service.register_session(
            self.endpoint_id, boot_id=boot_id, run_version="0.1.0", capacity=capacity
        )
        self.session_id = registration.session.id
        return registration.session.generation

    def start(self, capacity: int = 4) -> Run:
        """Register and reconcile an empty journal: ready to claim."""
        self.register(capacity)
        self.world.service.reconcile(self.session_id, [])
        return self

    def claim(self, max_jobs: int = 1) -> list[ClaimedJob]:
        granted = self.world.service.claim(self.session_id, max_jobs)
        for job in granted:
            self.leases[(job.job_id, job.attempt)] = job.lease
        return granted

    def evidence(self, job_id: str, attempt: int) -> Evidence:
        return Evidence(attempt, self.leases[(job_id, attempt)])

    def entry(self, job_id: str, attempt: int) -> ReconcileEntry:
        return ReconcileEntry(job_id, attempt, self.leases[(job_id, attempt)])

    def heartbeat(self) -> Any:
        return self.world.service.heartbeat(self.session_id)

    def ack(self, job_id: str, attempt: int) -> Any:
        return self.world.service.ack(self.session_id, job_id, self.evidence(job_id, attempt))

    def progress(self, job_id: str, attempt: int, seq: int, **fields: Any) -> Any:
        return self.world.service.progress(
            self.session_id, job_id, self.evidence(job_id, attempt), seq=seq, **fields
        )

    def cancel_poll(self, job_id: str, attempt: int) -> Any:
        return self.world.service.cancel_poll(
            self.session_id, job_id, self.evidence(job_id, attempt)
        )

    def result(self, job_id: str, attempt: int, outcome: str = "succeeded", **fields: Any) -> Any:
        fields.setdefault("retryable", False)
        return self.world.service.result(
            self.session_id, job_id, self.evidence(job_id, attempt), outcome=outcome, **fields
        )

    def run_to_running(self, job_id: str) -> int:
        """Claim `job_id` (it must be next) and ack it; returns the attempt."""
        (granted,) = self.claim(1)
        assert granted.job_id == job_id
        self.ack(job_id, granted.attempt)
        return granted.attempt


class World:
    """A platform over one store with an admin, an owner, a stranger and two endpoints."""

    def __init__(
        self,
        factory: StoreFactory,
        settings: SchedulingSettings = SETTINGS,
        clock: ManualClock | None = None,
    ) -> None:
        self.factory = factory
        self.settings = settings
        self.clock = clock or ManualClock()
        self.tokens = SeededTokenSource(7)
        self.store: Store = factory.open()
        self._build_services()
        self.admin = self.directory.ensure_bootstrap_admin("mra_bootstrap-admin-token")
        self.owner = self.directory.create_user(self.admin, "owner").user
        self.helper = self.directory.create_user(self.admin, "helper").user
        self.stranger = self.directory.create_user(self.admin, "stranger").user
        self.endpoint = self.join("host-a", 1)
        self.other_endpoint = self.join("host-b", 2)
        self.server = self.directory.create_server(
            self.admin, "web-1", endpoint_id=self.endpoint.id, owner_id=self.owner.id
        )
        self.server = self.directory.add_server_admin(self.owner, self.server.id, self.helper.id)
        self.other_server = self.directory.create_server(
            self.admin, "db-1", endpoint_id=self.other_endpoint.id, owner_id=self.stranger.id
        )

    def _build_services(self) -> None:
        self.service = SchedulingService(self.store, self.clock, self.tokens, self.settings)
        self.directory = Directory(self.store, self.clock, self.tokens)

    def restart(self) -> None:
        """A new platform process: reopen the store and build new services over it."""
        self.store = self.factory.reopen(self.store)
        self._build_services()

    def join(self, name: str, key_seed: int) -> Endpoint:
        enrolled = self.service.create_endpoint(self.admin, name)
        return self.service.join_endpoint(enrolled.join_token, public_key(key_seed))

    def run(self, endpoint: Endpoint | None = None) -> Run:
        return Run(self, (endpoint or self.endpoint).id)

    def submit(self, server: Server | None = None, actor: User | None = None, **fields: Any) -> Job:
        fields.setdefault("kind", "noop")
        job = self.service.create_job(actor or self.owner, (server or self.server).id, **fields)
        # One millisecond between submissions makes "oldest first" a total order in tests.
        self.clock.advance(1)
        return job

    def job(self, job_id: str) -> Job:
        job = self.store.get_job(job_id)
        assert job is not None
        return job
