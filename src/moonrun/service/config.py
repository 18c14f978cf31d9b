"""The use cases' settings: scheduling (docs/protocol.md, "Operating interface") and waiting
requests. (The log and artifact stores' bounds live with them: `LogLimits`, `ArtifactLimits`.)"""

from __future__ import annotations

from dataclasses import dataclass

from moonrun.scheduling.retry import RetryPolicy
from moonrun.scheduling.time import seconds_to_ms


@dataclass(frozen=True, slots=True)
class SchedulingSettings:
    """Timing and limits the service applies; `wiring/settings.py` builds one from flags."""

    ack_timeout_s: float = 30.0
    lease_ttl_s: float = 40.0
    session_ttl_s: float = 50.0
    heartbeat_interval_s: float = 10.0
    """The interval Runs are told to heartbeat at, and `session_ttl_s` their sessions' TTL,
    while a platform process has at most `max_heartbeats_per_s` x this many Runs; with more,
    both are stretched (`service/liveness.py`, `Cadence`)."""
    max_heartbeats_per_s: float = 100.0
    """Heartbeats a second one platform process asks of its Runs at most: with 5,000 Runs the
    interval is 50 s and the session TTL 250 s. 0: never stretched."""
    join_token_ttl_s: float = 900.0
    join_replay_s: float = 600.0
    """A join presented again with its token and the same identity key this long after it was
    accepted gets the same endpoint: the first answer may have been lost on the way."""
    max_attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_multiplier: float = 2.0
    backoff_max_s: float = 300.0
    backoff_jitter: float = 0.0
    max_claim_batch: int = 64
    max_capacity: int = 1024
    max_reconcile_entries: int = 4096
    sweep_batch: int = 500
    retain_finished_s: float = 30 * 24 * 3600.0
    """Finished jobs are deleted this long after they ended (`--retain-finished`); 0 keeps
    them forever."""
    prune_batch: int = 200
    """Jobs deleted in one transaction (at most 1,000, whatever this says): 200 jobs of 2 KB
    payloads held SQLite's write lock 10 to 26 ms on a loaded 2-core machine, 1,000 about
    100 ms, past the ~50 ms that serving does not notice (docs/operations.md, "Retention")."""
    cas_retries: int = 32
    transfer_grace_s: float = 60.0
    """Logs and artifacts of an attempt are accepted this long after it ends."""
    session_extend_granularity_s: float = 1.0
    """A session's expiry is rewritten only when it would move by at least this much (the
    least of `session_extend_slack_ms`)."""
    liveness_margin_s: float = 5.0
    """An endpoint is online while its last heartbeat is at most the heartbeat interval plus
    this old (`liveness_bound_ms`): room for a heartbeat's jitter (a tenth of the interval),
    the beats' flush (`liveness_flush_s`) and a slow answer."""
    liveness_flush_s: float = 2.0
    """How often each platform process writes the heartbeats it received since its last pass,
    all in one write (`service/liveness.py`)."""

    def default_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_s=self.backoff_initial_s,
            multiplier=self.backoff_multiplier,
            max_s=self.backoff_max_s,
            jitter=self.backoff_jitter,
        )

    @property
    def retain_finished_ms(self) -> int:
        return seconds_to_ms(self.retain_finished_s)

    @property
    def ack_timeout_ms(self) -> int:
        return seconds_to_ms(self.ack_timeout_s)

    @property
    def lease_ttl_ms(self) -> int:
        return seconds_to_ms(self.lease_ttl_s)

    @property
    def session_ttl_ms(self) -> int:
        return seconds_to_ms(self.session_ttl_s)

    @property
    def session_extend_slack_ms(self) -> int:
        """A session's expiry is rewritten only when it would move by at least this much: half
        the TTL, so that an idle Run's session costs a write every TTL/2 or so, not one per
        request; but never so much that a Run heartbeating on time, one heartbeat lost, could
        see its session lapse (at most TTL - 2 heartbeat intervals), and at least the
        granularity."""
        ttl = self.session_ttl_ms
        beats = 2 * seconds_to_ms(self.heartbeat_interval_s)
        least = seconds_to_ms(self.session_extend_granularity_s)
        return max(least, min(ttl // 2, ttl - beats))

    @property
    def liveness_bound_ms(self) -> int:
        """An endpoint shows online only while its Run's last heartbeat is at most this old:
        the heartbeat interval plus the margin (15 s with the defaults), whatever the session
        TTL (which fences; a session may outlive its liveness by up to the TTL)."""
        return seconds_to_ms(self.heartbeat_interval_s) + seconds_to_ms(self.liveness_margin_s)

    @property
    def join_token_ttl_ms(self) -> int:
        return seconds_to_ms(self.join_token_ttl_s)

    @property
    def join_replay_ms(self) -> int:
        return seconds_to_ms(self.join_replay_s)


@dataclass(frozen=True, slots=True)
class WaitLimits:
    """How often a waiting request looks again, and how many may wait at once.

    Runs' claims and users' reads are bounded apart (docs/operations.md, "Waiting requests"):
    however many reads users keep waiting, Runs' claims keep their own room.
    """

    recheck_s: float = 1.0
    """A waiting request reads the store again at least this often: the only way to notice a
    change another platform process made (wiring/settings.py shortens it for MySQL stores)."""
    claims: int = 20_000
    """Waiting claims at once, over every endpoint: two for each Run of a 10,000-Run fleet
    (its claim, and its cancel watch while handlers run). At 4,096 a fleet of 5,000 Runs had
    about 900 claims answered at once at any moment, each Run then pausing a second before it
    claimed again: a job for one of them waited that second (fleet_bench's dispatch p99). Each
    waiting claim also holds a connection, which `--max-connections` bounds."""
    claims_per_endpoint: int = 16
    """Waiting claims of one endpoint at once (its Run keeps one waiting)."""
    reads: int = 4096
    """Waiting job reads at once, over every user."""
    reads_per_user: int = 64
    """Waiting job reads of one user at once."""
    reads_per_address: int = 256
    """Waiting job reads from one client address at once (several users may share one)."""
