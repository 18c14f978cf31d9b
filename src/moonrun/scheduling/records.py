"""The other records the platform keeps: endpoints, sessions, users and servers."""

from __future__ import annotations

from dataclasses import dataclass

from moonrun.scheduling.labels import NO_LABELS, Labels
from moonrun.scheduling.time import Instant


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A host's Run identity: joined once with a one-time token, then registers sessions."""

    id: str
    name: str
    created_at: Instant
    join_token_hash: str
    join_token_expires_at: Instant
    version: int = 1
    identity_public_key: str | None = None
    """Base64url of the raw Ed25519 public key, set by join."""
    joined_at: Instant | None = None
    generation: int = 0
    """The generation of the latest session registration; never decreases."""
    current_session_id: str | None = None
    draining: bool = False
    """No new claims are granted to it; its running attempts finish."""
    labels: Labels = NO_LABELS
    """Set by platform admins, or proposed by its Run's join (`scheduling/labels.py`)."""


@dataclass(frozen=True, slots=True)
class Advertisement:
    """The job kinds an endpoint's Run said at its latest registration that it runs, each with
    the JSON Schema of its payload (`scheduling/kinds.py`)."""

    endpoint_id: str
    kinds_json: str
    """Compact JSON of `{kind: schema}`."""
    advertised_at: Instant


@dataclass(frozen=True, slots=True)
class Session:
    """One registration of Run on an endpoint. Never holds the session key."""

    id: str
    endpoint_id: str
    generation: int
    boot_id: str
    capacity: int
    run_version: str
    created_at: Instant
    last_seen_at: Instant
    expires_at: Instant
    reconciled_at: Instant | None = None
    """When this session last reconciled; claims wait for it."""


@dataclass(frozen=True, slots=True)
class User:
    """A person or program using the user API."""

    id: str
    name: str
    platform_admin: bool
    created_at: Instant
    password_hash: str | None = None
    disabled: bool = False
    """Its API tokens and console sessions are refused."""


@dataclass(frozen=True, slots=True)
class Server:
    """A server hosted by one endpoint; its owner and administrators manage its jobs."""

    id: str
    name: str
    endpoint_id: str
    owner_id: str
    created_at: Instant
    admin_ids: tuple[str, ...] = ()
    version: int = 1
    labels: Labels = NO_LABELS
    """Set by its owner or a platform admin; they win over its endpoint's (`effective_labels`)."""
