"""One seed of the simulation: a scenario drawn from the seed, a fault phase, a calm phase.

`simulate(seed, store)` builds the platform (one or two instances over one store), the hosts
and their Runs, a user, and draws from ONE `random.Random(seed)` everything that happens:
the scenario, when users act, every network fault, partitions, platform and Run crashes (with
or without the Run's journal), Run clock jumps and late sweeps, and the platform's tokens
and jitter. During the fault phase faults are injected; then faults stop, every crashed
process restarts and the simulation goes on until every job has ended (or the liveness bound
has passed). Last, every platform instance restarts once more, and the checker reads the
history.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from moonrun.clock import ManualClock
from moonrun.errors import PlatformUnreachable
from moonrun.service.config import SchedulingSettings
from moonrun.service.schedules import ScheduleSpec
from moonrun.service.scheduling import SchedulingService
from moonrun.service.specs import JobSpec
from tests.sim.checker import Violation, check
from tests.sim.history import History
from tests.sim.kernel import Call, Node, Resume, Scheduler
from tests.sim.known import KnownBugs
from tests.sim.network import CALM_LATENCY_MS, Network, NetworkFaults
from tests.sim.platform import Platform, Request
from tests.sim.recording import StoreKind, StoreWrapper
from tests.sim.run import RunHost, RunProcess, RunTimings, choose_rate
from tests.sim.users import KEY_LIMITS, UserNode, spec_of
from tests.support.harness import public_key

SETTINGS = SchedulingSettings(
    ack_timeout_s=6,
    lease_ttl_s=8,
    session_ttl_s=10,
    heartbeat_interval_s=2,
    max_attempts=3,
    backoff_initial_s=0.5,
    backoff_multiplier=2,
    backoff_max_s=4,
    backoff_jitter=0.5,
    transfer_grace_s=1,
)
"""docs/protocol.md's defaults (ack 30 s, lease 40 s, session 50 s, heartbeat 10 s) divided by five,
backoff capped at 4 s, with jitter so that its bounds are checked. The transfer grace (60 s),
which only logs and artifacts use (the simulation has neither), is 1 s: retention never prunes
a job sooner after its end, and each seed's window is a few seconds (`RETAIN_S`)."""

RETAIN_S = (1, 3, 8, 20)
"""Each seed keeps finished jobs one of these (`--retain-finished`, drawn per seed), so the
sweeper prunes while jobs, groups, dependencies and schedules are live."""

RUN_TIMINGS = RunTimings()
CLOCK_DRIFT = 0.03
"""Each host's monotonic clock runs within 3% of true time. Run self-fences lease_ttl/8
before its lease would lapse on its own clock, so it stays safe while its clock runs no more
than 12.5% slow over a lease; jumps forward are always safe, only early."""

SELECTOR_SCHEDULES = 0.3
"""The share of schedules that name a selector (a group per firing) in place of a server."""
MAX_WORK_MS = 12_000
MAX_NOT_BEFORE_MS = 5_000
SWEEP_INTERVAL_MS = 1_000
START = 1_795_000_000_000
STEP_CAP = 400_000
"""A runaway seed (a livelock) stops here and fails liveness."""


@dataclass(frozen=True)
class Scenario:
    """What a seed is made of (drawn first, from the seed's one random source)."""

    seed: int
    store: str
    instances: int
    hosts: tuple[tuple[int, float, bool], ...]
    """Per host: capacity, clock rate, whether it is an older Run that polls for cancels."""
    jobs: int
    fault_ms: int
    network: NetworkFaults
    partitions: int
    platform_crashes: int
    run_crashes: int
    clock_jumps: int
    late_sweeps: int
    cancels: int
    reads: int

    @classmethod
    def draw(cls, seed: int, store: str, rng: random.Random) -> Scenario:
        file = store == "file"
        fault_ms = rng.randint(12_000, 25_000) if file else rng.randint(20_000, 40_000)
        hosts = tuple(
            (rng.randint(1, 3), choose_rate(rng, CLOCK_DRIFT), rng.random() < 0.2)
            for _ in range(rng.randint(2, 3) if file else rng.randint(2, 4))
        )
        jobs = rng.randint(5, 12) if file else rng.randint(8, 24)
        calm = rng.random() < 0.08  # now and then a seed without faults, as a baseline
        level = 0.0 if calm else rng.choice([0.0, 0.02, 0.05, 0.1])
        network = NetworkFaults(
            drop=level,
            duplicate=0.0 if calm else rng.choice([0.0, 0.02, 0.05]),
            delay=0.0 if calm else rng.choice([0.0, 0.02, 0.05]),
            max_delay_ms=rng.randint(1_000, 2 * round(SETTINGS.lease_ttl_s * 1000)),
            latency_ms=(1, rng.choice([5, 20, 60])),
        )
        seconds = fault_ms / 1000

        def count(per_s: float) -> int:
            return 0 if calm else rng.randint(0, max(1, round(seconds * per_s)))

        return cls(
            seed=seed,
            store=store,
            instances=rng.choice([1, 1, 2]),
            hosts=hosts,
            jobs=jobs,
            fault_ms=fault_ms,
            network=network,
            partitions=count(1 / 10),
            platform_crashes=count(1 / 20),
            run_crashes=count(1 / 12),
            clock_jumps=count(1 / 12),
            late_sweeps=count(1 / 15),
            cancels=rng.randint(0, jobs // 3),
            reads=rng.randint(0, jobs // 3),
        )


@dataclass
class Outcome:
    seed: int
    store: str
    bug: str | None
    known_bugs: tuple[str, ...]
    scenario: Scenario
    history: History
    violations: list[Violation]
    steps: int
    simulated_ms: int
    faults: Counter[str] = field(default_factory=Counter)

    def replay(self) -> str:
        """The one-line command that replays this seed."""
        bug = f" MOONRUN_SIM_BUG={self.bug}" if self.bug else ""
        known = self.known_bugs
        agent = f" MOONRUN_SIM_KNOWN_BUGS={','.join(known)}" if known else ""
        return (
            f"MOONRUN_SIM_SEED={self.seed} MOONRUN_SIM_STORE={self.store}{bug}{agent} "
            ".venv/bin/pytest tests/sim -k replay"
        )

    def report(self, limit: int = 5) -> str:
        lines = [f"seed {self.seed} on {self.store}: {len(self.violations)} violation(s)"]
        lines += [f"  {v}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        lines.append(f"  replay: {self.replay()}")
        return "\n".join(lines)


class Simulation:
    """The world of one seed."""

    def __init__(
        self,
        seed: int,
        store: str,
        *,
        bug: str | None = None,
        wrap_store: StoreWrapper | None = None,
        service_class: Any = SchedulingService,
        known_bugs: tuple[str, ...] = (),
    ) -> None:
        self.seed = seed
        self.known_bug_names = known_bugs
        self.known = KnownBugs.named(known_bugs)
        self.rng = random.Random(seed)
        self.dependency_rng = random.Random(f"dependencies-{seed}")
        """Which jobs wait on others (drawn apart, so that the other draws stay as they were)."""
        self.priority_rng = random.Random(f"priorities-{seed}")
        """Each job's priority (drawn apart, likewise)."""
        self.selector_rng = random.Random(f"selectors-{seed}")
        """Which schedules name a selector in place of a server (drawn apart, likewise)."""
        self.scenario = Scenario.draw(seed, store, self.rng)
        self.bug = bug
        self.retention_rng = random.Random(f"retention-{seed}")
        """How long finished jobs are kept, which the user deletes (drawn apart, so that the
        other draws stay as they were)."""
        self.settings = retention_settings(SETTINGS, self.retention_rng)
        self.run_timings = RUN_TIMINGS
        self.max_work_ms = MAX_WORK_MS
        self.max_backoff_s = SETTINGS.backoff_max_s
        self.max_not_before_ms = MAX_NOT_BEFORE_MS
        self.clock = ManualClock(START)
        self.scheduler = Scheduler(self.clock)
        self.history = History(self.settings, started_at=START)
        self.network = Network(self.scheduler, self.rng, self.scenario.network, self.history.faults)
        self.platform = Platform(
            scheduler=self.scheduler,
            clock=self.clock,
            network=self.network,
            history=self.history,
            store_kind=StoreKind(store),
            settings=self.settings,
            token_seed=self.rng.getrandbits(64),
            instances=self.scenario.instances,
            wrap_store=wrap_store,
            service_class=service_class,
            sweep_interval_ms=SWEEP_INTERVAL_MS,
            # An instance takes signatures made up to a second before it started
            # (`signing.check_created`), so a copy may be applied after a restart too.
            start_slack_ms=1000,
        )
        self._nonces = 0
        self.hosts: list[RunHost] = []
        self.user: UserNode
        self.calm = False
        self._setup()

    # -- the world ---------------------------------------------------------------------------

    def _setup(self) -> None:
        directory, service = self.platform.directory, self.platform.service
        admin = directory.ensure_bootstrap_admin("mra_" + "s" * 43)
        owner = directory.create_user(admin, "owner").user
        servers = []
        for index, (capacity, rate, polls) in enumerate(self.scenario.hosts):
            name = "abcdefgh"[index]
            enrolled = service.create_endpoint(admin, f"host-{name}")
            endpoint = service.join_endpoint(enrolled.join_token, public_key(index + 1))
            servers.append(
                directory.create_server(
                    admin,
                    f"srv-{name}",
                    endpoint_id=endpoint.id,
                    owner_id=owner.id,
                    labels={"role": "sim"},
                )
            )
            self.hosts.append(RunHost(name, endpoint.id, capacity, rate, polls))
        self.user = UserNode(self, owner, servers)
        for n in range(self.rng.randint(1, 3)):
            overlap = self.rng.choice(["allow", "allow", "skip", "cancel_previous"])
            work = JobSpec("sim.work", {"ms": self.rng.randint(20, 2000)})
            spec = ScheduleSpec(f"every minute {n}", "* * * * *", work, overlap=overlap)
            server_id: str | None = self.rng.choice(servers).id
            if self.selector_rng.random() < SELECTOR_SCHEDULES:
                # A group per firing over every host (each server is labelled role=sim).
                server_id, spec = None, replace(spec, selector="role=sim")
            made = service.schedules.create(owner, server_id, spec)
            self.history.schedules[made.schedule.id] = overlap

    def job_spec(self) -> JobSpec:
        return spec_of(self)

    def send(self, node: Node, call: Call, resume: Resume) -> None:
        """A request from `node` to a platform instance (the load balancer picks one), and its
        answer back; `resume` gets the answer, or `PlatformUnreachable` after the timeout."""
        index = self.rng.randrange(len(self.platform.instances))
        nonce = None
        if call.signed:
            self._nonces += 1
            nonce = f"nonce-{self._nonces}"
        request = Request(
            node.name,
            call.kind,
            call.args,
            call.kwargs,
            call.session_id,
            nonce,
            self.scheduler.now(),
            call.entries,
        )
        state = {"done": False}

        def finish(outcome: Any) -> None:
            if state["done"] or not node.alive:
                return
            state["done"] = True
            timer.cancel()
            resume(outcome)

        timer = node.after(call.timeout_ms, lambda: finish(PlatformUnreachable("no answer")))

        def copy_to(index: int) -> tuple[str, Callable[[], None]]:
            target = f"platform:{index}"

            def answer(outcome: Any) -> None:
                self.network.send(target, node.name, lambda: finish(outcome))

            def arrive() -> None:
                self.platform.receive(index, request, answer)

            return target, arrive

        arriving = self.network.copies()
        copies = [copy_to(index)] if arriving else []
        if arriving == 2:
            # A late duplicate, as a proxy retrying a request sends it: to any instance, which
            # may not have seen its nonce (a replayed reconciliation once lost the attempts
            # claimed since: docs/simulation.md, finding 1).
            other = self.rng.randrange(len(self.platform.instances))
            copies.append(copy_to(other))
        self.network.send_copies(node.name, copies)

    def _boot(self, host: RunHost) -> None:
        if host.process is None or not host.process.alive:
            host.process = RunProcess(self, host)

    # -- faults ----------------------------------------------------------------------------

    def _schedule(self) -> None:
        rng, scenario, scheduler = self.rng, self.scenario, self.scheduler
        fault_ms, ttl_ms = scenario.fault_ms, round(SETTINGS.lease_ttl_s * 1000)
        for host in self.hosts:
            scheduler.at(START + rng.randint(0, 500), lambda h=host: self._boot(h))
        for _ in range(scenario.jobs):
            scheduler.at(START + rng.randint(0, fault_ms), self.user.create)
        for _ in range(scenario.cancels):
            scheduler.at(START + rng.randint(1000, fault_ms), self.user.cancel)
        # Fan-outs, drawn from a source of their own so that every other draw of a seed stays
        # what it was before the simulation fanned out.
        fans = random.Random(self.seed * 7919 + 17)
        for _ in range(fans.choice([0, 1, 1, 2])):
            scheduler.at(START + fans.randint(0, fault_ms), self.user.fanout)
        for _ in range(scenario.reads):
            scheduler.at(START + rng.randint(1000, fault_ms), self.user.read)
        self._schedule_deletes()

        def at(action: Any) -> None:
            scheduler.at(
                START + rng.randint(500, fault_ms), lambda: None if self.calm else action()
            )

        for _ in range(scenario.partitions):
            host = rng.choice(self.hosts)
            peer = None if rng.random() < 0.7 else f"platform:{rng.randrange(scenario.instances)}"
            duration, hold = rng.randint(500, 3 * ttl_ms), rng.random() < 0.3
            at(lambda h=host, p=peer, d=duration, o=hold: self.network.partition(h.node, p, d, o))
        for _ in range(scenario.platform_crashes):
            index, down = rng.randrange(scenario.instances), rng.choice([0, 0, 500, 3000])
            at(lambda i=index, d=down: self._crash_platform(i, d))
        for _ in range(scenario.run_crashes):
            host, lose, down = rng.choice(self.hosts), rng.random() < 0.3, rng.randint(0, 4000)
            at(lambda h=host, lo=lose, d=down: self._crash_run(h, lo, d))
        for _ in range(scenario.clock_jumps):
            host, jump = rng.choice(self.hosts), rng.randint(200, 2 * ttl_ms)
            at(lambda h=host, j=jump: self._jump(h, j))
        for _ in range(scenario.late_sweeps):
            index, late = rng.randrange(scenario.instances), rng.randint(1000, 3 * ttl_ms)
            at(lambda i=index, d=late: self.platform.pause_sweeper(i, d))
        scheduler.at(START + fault_ms, self._become_calm)

    def _schedule_deletes(self) -> None:
        """The user deletes a job it knows of now and then (`DELETE /api/v1/jobs/{id}`), at
        times drawn from the retention source (retention itself runs in every sweep)."""
        deletes = self.retention_rng
        for _ in range(deletes.choice([0, 1, 2, 3])):
            at = START + deletes.randint(2000, self.scenario.fault_ms + 10_000)
            self.scheduler.at(at, self.user.delete)

    def _crash_platform(self, index: int, down_ms: int) -> None:
        self.platform.crash(index)

        def restart() -> None:
            if not self.platform.instances[index].up:
                self.platform.restart(index)

        self.scheduler.after(down_ms, restart)

    def _crash_run(self, host: RunHost, lose_journal: bool, down_ms: int) -> None:
        if host.process is None or not host.process.alive:
            return
        host.process.crash()
        self.history.faults["run_crashes"] += 1
        if lose_journal:
            host.disk.clear()
            self.history.faults["journals_lost"] += 1
        self.scheduler.after(down_ms, lambda: None if self.calm else self._boot(host))

    def _jump(self, host: RunHost, ms: int) -> None:
        if host.process is not None and host.process.alive:
            host.process.jump_clock(ms)
            self.history.faults["clock_jumps"] += 1

    def _become_calm(self) -> None:
        self.calm = True
        self.network.become_calm()
        for instance in list(self.platform.instances):
            instance.sweeper_paused_until = 0
            if not instance.up:
                self.platform.restart(instance.index)
        for host in self.hosts:
            self._boot(host)
        self.history.calm_at = self.scheduler.now()
        self.history.liveness_bound_ms = self.liveness_bound_ms()

    def liveness_bound_ms(self) -> int:
        """How long after faults stop (or after its creation, if later) every job has ended.

        Messages sent before then arrive within the longest delay (D); a Run whose request
        was lost then gets its answer or times out and retries after its longest backoff,
        twice over for a renewal interrupted by a stale answer (S); an attempt no live Run
        holds ends at its deadline and the next sweep (A); a job may wait for its not_before
        (N). Then, on an endpoint with capacity c and J jobs of at most m attempts, each
        attempt taking at most P (a claim poll, the longest work, round trips), the last job
        to end spends at most m x (P + longest backoff) on its own chain and otherwise waits
        only while every slot is busy, at most ceil(J x m / c) x P (Graham's list-scheduling
        argument).
        """
        timings, scenario = self.run_timings, self.scenario
        latency = max(scenario.network.latency_ms[1], CALM_LATENCY_MS[1])
        rtt = 2 * latency
        delay = scenario.network.max_delay_ms + 3 * latency
        settle = 2 * (timings.jobs_timeout_ms + timings.max_backoff_ms + 4 * rtt)
        expire = max(SETTINGS.ack_timeout_s, SETTINGS.lease_ttl_s) * 1000 + SWEEP_INTERVAL_MS
        attempt = timings.claim_interval_ms + MAX_WORK_MS + 6 * rtt
        worst = 0.0
        for host in self.hosts:
            jobs = [j for j in self.history.latest.values() if j.endpoint_id == host.endpoint_id]
            if not jobs:
                continue
            m = max(job.policy.max_attempts for job in jobs)
            backoff = max(job.policy.max_s for job in jobs) * 1000
            chain = m * (attempt + backoff)
            busy = math.ceil(len(jobs) * m / host.capacity) * attempt
            worst = max(worst, chain + busy)
        # A group's held job waits for its predecessors: at most one wave of the group after
        # another, each ended within `worst` (and a release a crash lost, by the next sweep).
        waves = 1
        for group_id, sizes in self._group_sizes().items():
            max_parallel = self.history.groups.get(group_id, (1, {}, False))[0] or sizes
            waves = max(waves, math.ceil(sizes / max_parallel))
        # A key's held job waits for the key's earlier jobs likewise, on every host together
        # (and within a group's wave, for its key).
        keyed: dict[tuple[str, str], int] = {}
        for job in self.history.latest.values():
            if job.concurrency is not None:
                scope = (job.owner_id, job.concurrency.key)
                keyed[scope] = keyed.get(scope, 0) + 1
        key_waves = max(
            (math.ceil(count / KEY_LIMITS.get(key, 1)) for (_, key), count in keyed.items()),
            default=1,
        )
        # A job waiting on others starts only once they ended: one more wave per link of the
        # longest chain of dependencies (a settle a crash lost, made by the next sweep).
        waves *= 1 + self._dependency_depth()
        worst = waves * key_waves * (worst + SWEEP_INTERVAL_MS)
        return math.ceil(delay + settle + expire + MAX_NOT_BEFORE_MS + worst)

    def _dependency_depth(self) -> int:
        """The longest chain of jobs each waiting on the next (0: no job waits on another)."""
        latest = self.history.latest
        depth: dict[str, int] = {}

        def of(job_id: str) -> int:
            if job_id not in depth:
                job = latest.get(job_id)
                named = () if job is None else job.after
                depth[job_id] = max((1 + of(other) for other in named), default=0)
            return depth[job_id]

        return max((of(job_id) for job_id in latest), default=0)

    def _group_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for job in self.history.latest.values():
            if job.group_id is not None:
                sizes[job.group_id] = sizes.get(job.group_id, 0) + 1
        return sizes

    def _record_groups(self) -> None:
        """Each group's options, counts and `done` as the store answers them at the end."""
        store = self.platform.instances[0].raw
        for group_id in self._group_sizes():
            group = store.get_group(group_id)
            if group is None:
                continue
            counts = store.group_counts(group_id)
            done = all(state.is_terminal for state, n in counts.items() if n)
            self.history.groups[group_id] = (
                group.max_parallel,
                {state.value: n for state, n in counts.items() if n},
                done,
            )

    # -- running -----------------------------------------------------------------------------

    def _finished(self) -> bool:
        if not self.calm or self.user.busy():
            return False
        gone = self.history.gone
        return all(job.state.is_terminal or job.id in gone for job in self.history.latest.values())

    def run(self) -> Outcome:
        self._schedule()
        scheduler, history = self.scheduler, self.history
        try:
            while True:
                if scheduler.steps >= STEP_CAP:
                    history.hit_step_cap = True
                    break
                if not scheduler.step():
                    break
                if self.calm and scheduler.steps % 64 == 0 and self._finished():
                    break
                bound = history.liveness_bound_ms
                if (  # well past the bound: liveness has failed, no need to go on
                    bound is not None
                    and history.calm_at is not None
                    and scheduler.now() > history.calm_at + 2 * bound
                ):
                    break
            history.ended_at = scheduler.now()
            self._record_groups()
            # The bound again, over every job (a create held up by the network may land late).
            history.liveness_bound_ms = self.liveness_bound_ms()
            for instance in list(self.platform.instances):
                self.platform.restart(instance.index, final=True)
        finally:
            self.platform.close()
        return Outcome(
            self.seed,
            self.scenario.store,
            self.bug,
            self.known_bug_names,
            self.scenario,
            history,
            check(history),
            scheduler.steps,
            scheduler.now() - START,
            history.faults,
        )


def retention_settings(settings: SchedulingSettings, rng: random.Random) -> SchedulingSettings:
    """The seed's settings with its retention window (one of `RETAIN_S`)."""
    return replace(settings, retain_finished_s=rng.choice(RETAIN_S))


def simulate(
    seed: int, store: str, bug: str | None = None, *, known_bugs: tuple[str, ...] = ()
) -> Outcome:
    """Run one seed on `memory` or `file`, with a planted bug of `tests.sim.bugs` if named;
    `known_bugs`: moonrun's known, unfixed bugs to reproduce (`KnownBugs` field names, or
    `all`) rather than steer around."""
    if bug is None:
        return Simulation(seed, store, known_bugs=known_bugs).run()
    from tests.sim.bugs import BUGS

    planted = BUGS[bug]
    return Simulation(
        seed,
        store,
        bug=bug,
        wrap_store=planted.wrap_store,
        service_class=planted.service_class or SchedulingService,
        known_bugs=known_bugs,
    ).run()
