"""Directory: users, their API tokens, servers and server administrators."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from moonrun.clock import Clock
from moonrun.errors import (
    AlreadyExists,
    Contention,
    InvalidRequest,
    NotFound,
    ServerBusy,
    Unauthenticated,
)
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.labels import NO_LABELS, Labels, check_labels, effective_labels
from moonrun.scheduling.records import Server, User
from moonrun.scheduling.selectors import parse_selector
from moonrun.security.access import (
    can_manage_admins,
    can_manage_jobs,
    require,
    require_platform_admin,
)
from moonrun.security.passwords import hash_password, password_matches
from moonrun.security.tokens import API_PREFIX, TokenSource
from moonrun.service.checks import NAME_PATTERN
from moonrun.store.protocol import Store

ENDPOINT_READS = 8
"""A selector reads its servers' endpoints one by one up to this many, else all at once."""
BOOTSTRAP_ADMIN_NAME = "admin"
BOOTSTRAP_TOKEN_MIN_LENGTH = 32
"""Characters a bootstrap token needs after its optional `mra_` prefix (a guessable admin
token is the whole platform)."""


class Bootstrap(Enum):
    """What making sure of the bootstrap admin did."""

    CREATED = "created"
    ROTATED = "rotated"
    UNCHANGED = "unchanged"


def check_bootstrap_token(api_token: str) -> None:
    """Refuse a bootstrap token shorter than `BOOTSTRAP_TOKEN_MIN_LENGTH` (after `mra_`)."""
    if len(api_token.removeprefix(API_PREFIX)) < BOOTSTRAP_TOKEN_MIN_LENGTH:
        raise InvalidRequest(
            f"the bootstrap admin token must be at least {BOOTSTRAP_TOKEN_MIN_LENGTH} characters "
            f"after an optional {API_PREFIX} prefix; make one with: python3 -c 'import secrets; "
            f'print("{API_PREFIX}" + secrets.token_urlsafe(32))\''
        )


@dataclass(frozen=True, slots=True)
class NewUser:
    """A created user and its first API token (returned once, stored only as a hash)."""

    user: User
    api_token: str


class Directory:
    """Who exists and who may manage which server."""

    def __init__(self, store: Store, clock: Clock, tokens: TokenSource, cas_retries: int = 32):
        self._store = store
        self._clock = clock
        self._tokens = tokens
        self._cas_retries = cas_retries

    def authenticate(self, api_token: str | None) -> User:
        """The user holding `api_token`; anything else is `Unauthenticated`."""
        if not api_token:
            raise Unauthenticated()
        user = self._store.user_by_api_token(token_hash(api_token))
        if user is None or user.disabled:
            raise Unauthenticated()
        return user

    def ensure_bootstrap_admin(self, api_token: str) -> User:
        """Platform admin `admin`, holding `api_token` (see `bootstrap_admin`)."""
        return self.bootstrap_admin(api_token)[0]

    def bootstrap_admin(
        self, api_token: str, name: str = BOOTSTRAP_ADMIN_NAME, password: str | None = None
    ) -> tuple[User, Bootstrap]:
        """Make platform admin `name` hold `api_token` as its only API token: create it, or
        rotate its token (the old ones stop working); a token it already holds changes nothing.
        A `password` is set too, so the admin can sign in to the console. The edge checks the
        token's length (`check_bootstrap_token`).

        Several platforms starting together on a new database all make sure of the same admin:
        the one that loses the race to create it (or to record its token) looks again and finds
        what the winner made, instead of failing its start."""
        _check_name(name)
        password_hash = None if password is None else hash_password(password)
        for _ in range(self._cas_retries):
            try:
                return self._bootstrap_once(token_hash(api_token), name, password_hash)
            except AlreadyExists:  # another platform made the admin or its token meanwhile
                continue
        raise Contention()

    def _bootstrap_once(
        self, hashed: str, name: str, password_hash: str | None
    ) -> tuple[User, Bootstrap]:
        holder = self._store.user_by_api_token(hashed)
        if holder is not None and holder.name != name:
            raise InvalidRequest(f"user {holder.name!r} already holds that token, not {name!r}")
        admin = holder or self._store.user_by_name(name)
        now = self._clock.now()
        if admin is None:
            admin = User(self._tokens.identifier("usr_"), name, True, now, password_hash)
            self._store.insert_user(admin)
            self._store.insert_api_token(hashed, admin.id, now)
            return admin, Bootstrap.CREATED
        if not admin.platform_admin:
            raise InvalidRequest(f"user {name!r} exists and is not a platform admin")
        outcome = Bootstrap.UNCHANGED
        if holder is None:
            self._store.replace_api_tokens(admin.id, hashed, now)
            outcome = Bootstrap.ROTATED
        if password_hash is not None:
            self._store.set_password_hash(admin.id, password_hash)
            admin = replace(admin, password_hash=password_hash)
        return admin, outcome

    def has_platform_admin(self) -> bool:
        return any(user.platform_admin for user in self._store.list_users())

    def create_user(
        self,
        actor: User,
        name: str,
        *,
        platform_admin: bool = False,
        password: str | None = None,
    ) -> NewUser:
        """A platform admin creates a user, who gets an API token (and may sign in)."""
        require_platform_admin(actor)
        _check_name(name)
        if not isinstance(platform_admin, bool):
            raise InvalidRequest("platform_admin must be a boolean")
        password_hash = None if password is None else hash_password(password)
        now = self._clock.now()
        user = User(self._tokens.identifier("usr_"), name, platform_admin, now, password_hash)
        self._store.insert_user(user)
        return NewUser(user, self.issue_api_token(user))

    def issue_api_token(self, user: User) -> str:
        token = self._tokens.token(API_PREFIX)
        self._store.insert_api_token(token_hash(token), user.id, self._clock.now())
        return token

    def sign_in(self, name: str, password: str) -> User | None:
        """The user with that name and password, or None (same work either way)."""
        user = self._store.user_by_name(name) if isinstance(name, str) else None
        stored = user.password_hash if user is not None else None
        matches = password_matches(password, stored) and user is not None
        return user if matches and user is not None and not user.disabled else None

    def user_by_id(self, user_id: str) -> User:
        user = self._store.get_user(user_id)
        if user is None:
            raise NotFound("no such user")
        return user

    def user_named(self, name: str) -> User | None:
        return self._store.user_by_name(name)

    def names_of(self, user_ids: set[str]) -> dict[str, str]:
        """Display names of users (names are not secret; ids the caller already holds)."""
        found = (self._store.get_user(user_id) for user_id in user_ids)
        return {user.id: user.name for user in found if user is not None}

    def list_users(self, actor: User) -> list[User]:
        require_platform_admin(actor)
        return self._store.list_users()

    def _own_or_admin(self, actor: User, user_id: str) -> User:
        """The user `user_id`, when the actor is that user or a platform admin (anyone else is
        forbidden whether or not the user exists: no oracle of user ids)."""
        require(actor.platform_admin or actor.id == user_id)
        user = self._store.get_user(user_id) if isinstance(user_id, str) else None
        if user is None:
            raise NotFound("no such user")
        return user

    def rotate_api_token(self, actor: User, user_id: str) -> str:
        """A new API token for the user, who holds only it from now (its old ones stop
        working); the user themself or a platform admin."""
        user = self._own_or_admin(actor, user_id)
        token = self._tokens.token(API_PREFIX)
        self._store.replace_api_tokens(user.id, token_hash(token), self._clock.now())
        return token

    def set_password(self, actor: User, user_id: str, password: str) -> User:
        """Set the user's console password (the user themself or a platform admin)."""
        user = self._own_or_admin(actor, user_id)
        password_hash = hash_password(password)
        self._store.set_password_hash(user.id, password_hash)
        return replace(user, password_hash=password_hash)

    def set_disabled(self, actor: User, user_id: str, disabled: bool) -> User:
        """A platform admin disables (or enables) a user: a disabled user's API tokens and
        console sessions are refused, as if they did not exist. An admin cannot disable
        themself, so that a platform always keeps a way in."""
        require_platform_admin(actor)
        user = self._store.get_user(user_id) if isinstance(user_id, str) else None
        if user is None:
            raise NotFound("no such user")
        if disabled and user.id == actor.id:
            raise InvalidRequest("you cannot disable yourself")
        self._store.set_user_disabled(user.id, disabled)
        return replace(user, disabled=disabled)

    def list_servers(self, actor: User, selector: str | None = None) -> list[Server]:
        """The servers the actor may see (all for platform admins, else owned or administered),
        only those whose labels over their endpoint's match `selector` when one is given."""
        return servers_matching(self._store, actor, selector)

    def create_server(
        self,
        actor: User,
        name: str,
        *,
        endpoint_id: str,
        owner_id: str,
        labels: object = None,
    ) -> Server:
        """A platform admin creates a server on an endpoint, owned by a user, with labels."""
        require_platform_admin(actor)
        _check_name(name)
        checked = NO_LABELS if labels is None else check_labels(labels)
        if not isinstance(endpoint_id, str) or self._store.get_endpoint(endpoint_id) is None:
            raise NotFound("no such endpoint")
        if not isinstance(owner_id, str) or self._store.get_user(owner_id) is None:
            raise NotFound("no such user")
        server = Server(
            id=self._tokens.identifier("srv_"),
            name=name,
            endpoint_id=endpoint_id,
            owner_id=owner_id,
            created_at=self._clock.now(),
            labels=checked,
        )
        self._store.insert_server(server)
        return server

    def set_server_labels(self, actor: User, server_id: str, labels: object) -> Server:
        """Replace the server's labels (its owner, its administrators or a platform admin: those
        who manage its jobs say what it is)."""
        checked = check_labels(labels)
        for _ in range(self._cas_retries):
            server = self._store.get_server(server_id) if isinstance(server_id, str) else None
            if server is None:
                raise NotFound("no such server")
            require(can_manage_jobs(actor, server))
            if server.labels == checked:
                return server
            updated = replace(server, labels=checked, version=server.version + 1)
            if self._store.replace_server(updated, server.version):
                return updated
        raise Contention()

    def get_server(self, actor: User, server_id: str) -> Server:
        server = self._store.get_server(server_id)
        if server is None:
            raise NotFound("no such server")
        require(can_manage_jobs(actor, server))
        return server

    def remove_server(self, actor: User, server_id: str) -> Server:
        """The owner (or a platform admin) removes a server none of whose jobs is still
        waiting or running; its ended jobs stay, readable by platform admins only."""
        server = self._store.get_server(server_id) if isinstance(server_id, str) else None
        if server is None:
            raise NotFound("no such server")
        require(can_manage_admins(actor, server))
        live = self._store.delete_server(server.id)
        if live:
            jobs = "1 job has" if live == 1 else f"{live} jobs have"
            raise ServerBusy(f"{jobs} not ended on server {server.id}; cancel them first")
        return server

    def add_server_admin(self, actor: User, server_id: str, user_id: str) -> Server:
        """The owner (or a platform admin) makes a user an administrator of the server."""
        for _ in range(self._cas_retries):
            server = self._store.get_server(server_id)
            if server is None:
                raise NotFound("no such server")
            require(can_manage_admins(actor, server))
            if not isinstance(user_id, str) or self._store.get_user(user_id) is None:
                raise NotFound("no such user")
            if user_id in server.admin_ids:
                return server
            updated = replace(
                server, admin_ids=(*server.admin_ids, user_id), version=server.version + 1
            )
            if self._store.replace_server(updated, server.version):
                return updated
        raise Contention()

    def remove_server_admin(self, actor: User, server_id: str, user_id: str) -> Server:
        """The owner (or a platform admin) takes a user's administration of the server away;
        removing someone who is not an administrator changes nothing."""
        for _ in range(self._cas_retries):
            server = self._store.get_server(server_id)
            if server is None:
                raise NotFound("no such server")
            require(can_manage_admins(actor, server))
            if user_id not in server.admin_ids:
                return server
            kept = tuple(admin for admin in server.admin_ids if admin != user_id)
            updated = replace(server, admin_ids=kept, version=server.version + 1)
            if self._store.replace_server(updated, server.version):
                return updated
        raise Contention()


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidRequest(f"name must match {NAME_PATTERN.pattern}")


def servers_matching(store: Store, actor: User, selector: str | None) -> list[Server]:
    """The servers whose jobs the actor manages (all for platform admins, else owned or
    administered), only those whose labels over their endpoint's match `selector` when one
    is given (`InvalidSelector` when it does not parse)."""
    chosen = None if selector is None else parse_selector(selector)
    servers = store.list_servers() if actor.platform_admin else store.servers_of_user(actor.id)
    if chosen is None or not chosen.requirements:
        return servers
    hosts = _endpoint_labels(store, {server.endpoint_id for server in servers})

    def labels_of(server: Server) -> dict[str, str]:
        return effective_labels(hosts.get(server.endpoint_id, NO_LABELS), server.labels)

    return [server for server in servers if chosen.matches(labels_of(server))]


def _endpoint_labels(store: Store, endpoint_ids: set[str]) -> dict[str, Labels]:
    # Past a few endpoints, one read of them all costs less than a read per endpoint (a
    # platform admin's selector over a fleet).
    many = len(endpoint_ids) > ENDPOINT_READS
    found = (
        store.list_endpoints()
        if many
        else [store.get_endpoint(endpoint_id) for endpoint_id in endpoint_ids]
    )
    return {
        endpoint.id: endpoint.labels
        for endpoint in found
        if endpoint is not None and endpoint.id in endpoint_ids
    }
