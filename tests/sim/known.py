"""Bugs this simulation found in moonrun's Run, fixed since in moonrun.run.agent
(docs/simulation.md, "Findings"). The simulated Run behaves as the fixed agent does; name one
(`MOONRUN_SIM_KNOWN_BUGS=<name>,...`, or `all`) and it behaves as the agent did before that
fix: tests/sim/test_checker.py shows the checker would have caught each.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class KnownBugs:
    ack_lease_from_last_send: bool = False
    """moonrun.run.agent: `_ack` takes its lease to run lease_ttl from when the *accepted* ack
    was sent. But a repeated ack renews nothing: when an earlier copy was applied and only its
    answer was lost, or when a restarted Run acks an attempt whose `running` state its journal
    lost (a reconciliation reported it running), the lease ends before the Run thinks, and it
    works (and self-fences) past the platform's lease. Fixed (agent, sim): from the first
    send of this process's acks, and not at all for an attempt a reconciliation reported
    running."""

    reconcile_cancels_its_own_renewal: bool = False
    """moonrun.run.agent: `_apply_reconcile` cancels the supervisor of every attempt it drops,
    also the one whose `_settle` is renewing the session right now: the CancelledError then
    lands at `await self.journal.sync()`, `_renew_session` never sets `_session_ok`, and that
    Run never claims again (its heartbeats go on). Fixed (agent, sim): the current task is not
    cancelled; `_settle` sees its entry gone and gives up."""

    handler_starts_without_lease_check: bool = False
    """moonrun.run.agent: `_execute` starts the handler without asking whether the lease still
    holds; the first check comes a tick (lease_ttl/4) later. A cancel poll that takes long (it
    is sent when the ack answer says nothing about a cancel, protocol 42), or an ack that was
    retried for long, can hold the start past the lease. Fixed (agent, sim): the handler starts only
    while another renewal could still land in time, else Run self-fences at once."""

    renewals_keyed_by_job: bool = False
    """moonrun.run.agent: `_renewed_until` and `_cancel_known` are keyed by job id, but two
    supervisors of one job may live at once (the job was granted again to the same Run while
    the earlier attempt's supervisor was still busy: delivering its result, or in a slow cancel
    poll). The earlier one then reads the later one's renewals: its handler may start, and run
    until its next renewal tick, while the later attempt's handler runs (two at once on one
    job); and when it ends it pops the later one's renewal, which then self-fences for
    nothing. Fixed (agent, sim): both are kept per attempt."""

    @classmethod
    def named(cls, names: tuple[str, ...]) -> KnownBugs:
        """These bugs (`all`: every one); an unknown name is an error."""
        known = tuple(f.name for f in fields(cls))
        chosen = known if "all" in names else names
        unknown = set(chosen) - set(known)
        if unknown:
            raise ValueError(f"unknown known bugs {sorted(unknown)}; known: {', '.join(known)}")
        return cls(**dict.fromkeys(chosen, True))
