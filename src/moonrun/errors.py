"""One error root for moonrun: every error's docstring is its default message.

`ERROR_TABLE` is the single map from error type to HTTP status and stable wire code
(docs/protocol.md, "Error codes"). Codes are API; messages are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final


class MoonrunError(Exception):
    """Something went wrong in moonrun."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message if message is not None else type(self).default_message())

    @classmethod
    def default_message(cls) -> str:
        doc = (cls.__doc__ or cls.__name__).strip()
        return doc.splitlines()[0]

    @property
    def message(self) -> str:
        return str(self.args[0])

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """(field, message) pairs naming each bad field of the request, when the error has
        them; the error body carries them as `fields`."""
        return ()

    @property
    def code(self) -> str:
        return status_and_code(type(self))[1]

    @property
    def status(self) -> int:
        return status_and_code(type(self))[0]


# -- request shape -------------------------------------------------------------------------


class InvalidRequest(MoonrunError):
    """The request is missing a required field or a field has a bad value."""

    def __init__(
        self, message: str | None = None, *, fields: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self._fields = fields

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        return self._fields


class MalformedRequest(InvalidRequest):
    """The request is not valid HTTP/1.1 (its framing, say a negative Content-Length)."""


class UnknownKind(InvalidRequest):
    """This server's Run does not run that kind of job."""


class InvalidPayload(InvalidRequest):
    """The payload does not fit the schema its kind's Run advertised."""


class InvalidLabels(InvalidRequest):
    """The labels are not a map of at most 32 keys (each a short lower-case name) to values of
    at most 128 characters without control characters."""


class InvalidSelector(InvalidRequest):
    """The label selector does not parse."""

    def __init__(
        self,
        message: str | None = None,
        *,
        fields: tuple[tuple[str, str], ...] = (),
        position: int | None = None,
    ) -> None:
        super().__init__(message, fields=fields)
        self.position = position
        """Where in the selector's text (counting from 0) parsing stopped, when known."""


class NoMatch(InvalidRequest):
    """No server the caller may submit to matches the selector."""


class TooLarge(MoonrunError):
    """The request body or a field of it is larger than allowed."""


class HeadersTooLarge(TooLarge):
    """The request head is larger than allowed (in all, a line of it, or its header count)."""


class UriTooLong(TooLarge):
    """The request line is longer than allowed."""


class ClientGone(MoonrunError):
    """The client closed its connection before its request had arrived (logged, never sent)."""


class AlreadyExists(MoonrunError):
    """A resource with that name already exists."""


class ArtifactConflict(MoonrunError):
    """That artifact chunk was already stored with different bytes."""


class ArtifactTooLarge(MoonrunError):
    """The attempt's artifacts would pass the platform's cap on artifact bytes per attempt."""


class ArtifactIncomplete(MoonrunError):
    """That artifact is not complete yet: its final chunk has not arrived."""


class ServerBusy(MoonrunError):
    """The server has jobs that have not ended; cancel them first."""


class EndpointInUse(MoonrunError):
    """Servers still point at this endpoint; remove them first."""


class JobNotFinished(MoonrunError):
    """That job has not ended yet; only a finished job can be run again."""


class JobNotEnded(JobNotFinished):
    """That job has not ended yet; only a finished job can be deleted."""


class IdempotencyConflict(MoonrunError):
    """That Idempotency-Key was already used with a different request."""


# -- users ---------------------------------------------------------------------------------


class Unauthenticated(MoonrunError):
    """No valid credentials were presented."""


class Forbidden(MoonrunError):
    """You do not have access to this resource."""


class MethodNotAllowed(MoonrunError):
    """That route does not take this method."""


class NotFound(MoonrunError):
    """No such resource."""


# -- Run authentication --------------------------------------------------------------------


class JoinTokenInvalid(MoonrunError):
    """The join token is unknown, expired or already used."""


class SignatureMissing(MoonrunError):
    """The request is not signed, or its signature headers do not parse."""


class SignatureInvalid(MoonrunError):
    """The request signature, key id or content digest does not verify."""


class SignatureExpired(MoonrunError):
    """The signature was created too far from the platform clock."""


class Replayed(MoonrunError):
    """This signature nonce was already seen."""


class SessionRotated(MoonrunError):
    """A newer session was registered for this endpoint; register again."""


class SessionExpired(MoonrunError):
    """The session expired; register again."""


class RegistrationSuperseded(MoonrunError):
    """A registration of this endpoint asked later was applied first; register again."""


# -- jobs channel: fencing and state (in the order of docs/protocol.md, "Fencing and deadlines")


class JobRejected(MoonrunError):
    """The job message was rejected and changed nothing."""


class JobNotFound(JobRejected):
    """No such job."""


class WrongEndpoint(JobRejected):
    """The job is assigned to another endpoint."""


class StaleAttempt(JobRejected):
    """The message names an attempt that is not the job's current attempt."""


class LeaseMismatch(JobRejected):
    """The lease does not match the current attempt's lease."""


class ReconcileRequired(JobRejected):
    """Reconcile after registering before claiming or touching jobs of an older session."""


class AckDeadlineExpired(JobRejected):
    """The ack deadline of this attempt has passed."""


class LeaseExpired(JobRejected):
    """The execution lease of this attempt has expired."""


class NotActive(JobRejected):
    """The job is not in a state that accepts this message."""


class NoCancelIntent(JobRejected):
    """A cancelled result needs a cancel intent, and there is none."""


class SequenceRegression(JobRejected):
    """The progress sequence number went backwards."""


class TerminalConflict(JobRejected):
    """A different result is already recorded for this attempt."""


# -- service health ------------------------------------------------------------------------


class ChannelBusy(MoonrunError):
    """This channel is at its concurrency limit; retry later."""


class TooManyWaiting(ChannelBusy):
    """Too many of your requests are waiting already; retry later."""


class PlatformUnreachable(MoonrunError):
    """The platform did not answer (connection failed, timed out, or answered 5xx)."""


Unreachable = PlatformUnreachable
"""The name Run and the user client use for a platform that did not answer."""


class ForeignAnswer(PlatformUnreachable):
    """The platform answered in a shape this Run does not know (a field missing or of another
    type): as good as no answer."""


class JoinUnconfirmed(PlatformUnreachable):
    """The join may have reached the platform, but no answer came back: run the same
    `moonrun run join` again (same token, same data directory) to finish it."""


class DataDirError(MoonrunError):
    """Run's data directory is missing, not joined, or already joined."""


class JournalCorrupt(MoonrunError):
    """The journal is damaged; it is kept as it is for inspection."""


class SecretFileError(MoonrunError):
    """The platform secret file is missing, malformed or readable by others."""


class WaitTimedOut(MoonrunError):
    """The job had not ended when the wait's timeout passed."""


class Overloaded(MoonrunError):
    """The platform is behind on its work; try again after Retry-After."""

    def __init__(self, message: str | None = None, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """How long the platform asks to be left alone (its `Retry-After`)."""


class Contention(MoonrunError):
    """The record changed too often under this request; retry."""


class StoreUnavailable(MoonrunError):
    """The store cannot be opened or does not answer."""


class SchemaTooNew(StoreUnavailable):
    """The store's schema is newer than this moonrun knows; upgrade moonrun."""


class IllegalTransition(MoonrunError):
    """A transition outside the job state machine was attempted (a bug in moonrun)."""


ERROR_TABLE: Final[Mapping[type[MoonrunError], tuple[int, str]]] = {
    MoonrunError: (500, "internal"),
    InvalidRequest: (422, "invalid_request"),
    MalformedRequest: (400, "invalid_request"),
    UnknownKind: (422, "unknown_kind"),
    InvalidPayload: (422, "invalid_payload"),
    InvalidLabels: (422, "invalid_labels"),
    InvalidSelector: (422, "invalid_selector"),
    NoMatch: (422, "no_match"),
    TooLarge: (413, "too_large"),
    HeadersTooLarge: (431, "headers_too_large"),
    UriTooLong: (414, "uri_too_long"),
    ClientGone: (499, "client_gone"),
    AlreadyExists: (409, "already_exists"),
    IdempotencyConflict: (409, "idempotency_conflict"),
    JobNotFinished: (409, "job_not_finished"),
    ServerBusy: (409, "server_busy"),
    EndpointInUse: (409, "endpoint_in_use"),
    ArtifactConflict: (409, "artifact_conflict"),
    ArtifactTooLarge: (413, "artifact_too_large"),
    ArtifactIncomplete: (409, "artifact_incomplete"),
    Unauthenticated: (401, "unauthenticated"),
    Forbidden: (403, "forbidden"),
    NotFound: (404, "not_found"),
    MethodNotAllowed: (405, "method_not_allowed"),
    JoinTokenInvalid: (401, "join_token_invalid"),
    SignatureMissing: (401, "signature_missing"),
    SignatureInvalid: (401, "signature_invalid"),
    SignatureExpired: (401, "signature_expired"),
    Replayed: (401, "replayed"),
    SessionRotated: (401, "session_rotated"),
    SessionExpired: (401, "session_expired"),
    RegistrationSuperseded: (409, "registration_superseded"),
    JobRejected: (409, "rejected"),
    JobNotFound: (404, "job_not_found"),
    WrongEndpoint: (403, "wrong_endpoint"),
    StaleAttempt: (409, "stale_attempt"),
    LeaseMismatch: (409, "lease_mismatch"),
    ReconcileRequired: (409, "reconcile_required"),
    AckDeadlineExpired: (409, "ack_deadline_expired"),
    LeaseExpired: (409, "lease_expired"),
    NotActive: (409, "not_active"),
    NoCancelIntent: (409, "no_cancel_intent"),
    SequenceRegression: (409, "sequence_regression"),
    TerminalConflict: (409, "terminal_conflict"),
    ChannelBusy: (429, "channel_busy"),
    TooManyWaiting: (429, "too_many_waiting"),
    Contention: (503, "contention"),
    Overloaded: (503, "overloaded"),
    PlatformUnreachable: (503, "unreachable"),
    WaitTimedOut: (504, "wait_timed_out"),
    StoreUnavailable: (503, "store_unavailable"),
    # Never sent: said by the command that meets them on its own host (`moonrun: error: ...`).
    DataDirError: (500, "data_dir"),
    JournalCorrupt: (500, "journal_corrupt"),
    SecretFileError: (500, "secret_file"),
    IllegalTransition: (500, "internal"),
}


def status_and_code(error_type: type[MoonrunError]) -> tuple[int, str]:
    """The HTTP status and wire code of an error type (its nearest entry in the table)."""
    for klass in error_type.__mro__:
        entry = ERROR_TABLE.get(klass)
        if entry is not None:
            return entry
    return ERROR_TABLE[MoonrunError]
