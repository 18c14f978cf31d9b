"""Who may do what: platform admins everything; a server's owner and administrators its jobs."""

from __future__ import annotations

from moonrun.errors import Forbidden
from moonrun.scheduling.records import Server, User


def can_manage_jobs(user: User, server: Server) -> bool:
    """Read, create and cancel the server's jobs."""
    return user.platform_admin or user.id == server.owner_id or user.id in server.admin_ids


def can_manage_admins(user: User, server: Server) -> bool:
    """Add administrators to the server."""
    return user.platform_admin or user.id == server.owner_id


def require(allowed: bool) -> None:
    """Raise `Forbidden` unless `allowed`."""
    if not allowed:
        raise Forbidden()


def require_platform_admin(user: User) -> None:
    require(user.platform_admin)
