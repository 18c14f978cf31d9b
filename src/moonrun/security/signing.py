"""Request signing for Run -> platform (docs/protocol.md, "Signing"): an RFC 9421 subset with an
RFC 9530 `Content-Digest`.

One label, `run`; covered components exactly `("@method" "@path" "@query" "content-digest")`;
parameters `created`, `nonce`, `keyid`, `alg`. Session registration is signed with the
endpoint's Ed25519 identity key, everything else with the session's HMAC-SHA256 key. Both
sides of the wire use this module; it reads no clock (times are passed in).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from moonrun.errors import SignatureExpired, SignatureInvalid, SignatureMissing
from moonrun.security.sfv import (
    Member,
    SfvError,
    Token,
    parse_dictionary,
    serialize_inner_list,
)
from moonrun.security.tokens import b64url, b64url_decode

__all__ = [
    "Signed",
    "b64url",
    "b64url_decode",
    "check_created",
    "check_digest",
    "content_digest",
    "parse",
    "parse_head",
    "sign",
    "verify_ed25519",
    "verify_hmac",
]

LABEL = "run"
COMPONENTS = ("@method", "@path", "@query", "content-digest")
HMAC_ALG = "hmac-sha256"
ED25519_ALG = "ed25519"
WINDOW_S = 300
MIN_NONCE_BYTES = 16


def content_digest(body: bytes) -> str:
    """The RFC 9530 `Content-Digest` value for `body`: `sha-256=:...:`."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"


@dataclass(frozen=True, slots=True)
class Signed:
    """A parsed, structurally valid signature, ready to be verified with a key."""

    key_id: str
    alg: str
    created: int
    nonce: str
    base: bytes
    signature: bytes
    digest: bytes
    """The SHA-256 the `Content-Digest` header names (`check_digest`)."""

    @property
    def key_kind(self) -> str:
        """`endpoint` or `session`."""
        return self.key_id.split(":", 1)[0]

    @property
    def key_subject(self) -> str:
        """The endpoint or session id the key id names."""
        return self.key_id.split(":", 1)[1]


def signature_base(
    method: str, path: str, query: str, digest: str, params_serialized: str
) -> bytes:
    lines = [
        f'"@method": {method.upper()}',
        f'"@path": {path}',
        f'"@query": {query or "?"}',
        f'"content-digest": {digest}',
        f'"@signature-params": {params_serialized}',
    ]
    return "\n".join(lines).encode("utf-8")


def _query_component(query: str) -> str:
    return "?" + query if query else "?"


def sign(
    method: str,
    path: str,
    query: str,
    body: bytes,
    *,
    key_id: str,
    key: bytes | Ed25519PrivateKey,
    created: int,
    nonce: str,
) -> dict[str, str]:
    """The `Content-Digest`, `Signature-Input` and `Signature` headers for a request.

    `key` is the session key (HMAC) or the identity key (Ed25519); `query` is the raw query
    string without `?`.
    """
    alg = ED25519_ALG if isinstance(key, Ed25519PrivateKey) else HMAC_ALG
    digest = content_digest(body)
    params = serialize_inner_list(
        COMPONENTS, {"created": created, "nonce": nonce, "keyid": key_id, "alg": alg}
    )
    base = signature_base(method, path, _query_component(query), digest, params)
    if isinstance(key, Ed25519PrivateKey):
        signature = key.sign(base)
    else:
        signature = hmac.new(key, base, hashlib.sha256).digest()
    return {
        "Content-Digest": digest,
        "Signature-Input": f"{LABEL}={params}",
        "Signature": f"{LABEL}=:{base64.b64encode(signature).decode('ascii')}:",
    }


def parse(method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> Signed:
    """Check the signature headers' shape and the body digest; the MAC is checked later."""
    signed = parse_head(method, path, query, headers)
    check_digest(signed, body)
    return signed


def parse_head(method: str, path: str, query: str, headers: Mapping[str, str]) -> Signed:
    """Check the signature headers' shape, without the body: the MAC covers the
    `Content-Digest` header, so it can be verified before the body arrives (`check_digest`
    then ties the body to that header)."""
    raw_input = headers.get("signature-input")
    raw_signature = headers.get("signature")
    raw_digest = headers.get("content-digest")
    if not raw_input or not raw_signature or not raw_digest:
        raise SignatureMissing()
    read = canonical_headers(raw_input, raw_signature, raw_digest) or structured_headers(
        raw_input, raw_signature, raw_digest
    )
    created, nonce, key_id, alg = _parameters(read.member)
    base = signature_base(method, path, _query_component(query), raw_digest.strip(), read.params)
    return Signed(key_id, alg, created, nonce, base, read.signature, read.digest)


@dataclass(frozen=True, slots=True)
class SignatureHeaders:
    """What the three signature headers say: the `run` member of `Signature-Input`, its
    parameters serialized (the `@signature-params` line), the signature and the digest."""

    member: Member
    params: str
    signature: bytes
    digest: bytes


def structured_headers(raw_input: str, raw_signature: str, raw_digest: str) -> SignatureHeaders:
    """The headers read as structured fields (RFC 8941), whatever their form."""
    try:
        inputs = parse_dictionary(raw_input)
        signatures = parse_dictionary(raw_signature)
        digests = parse_dictionary(raw_digest)
    except SfvError as error:
        raise SignatureMissing(f"signature headers do not parse: {error}") from None
    member, signature = inputs.get(LABEL), signatures.get(LABEL)
    if member is None or signature is None or not isinstance(signature.value, bytes):
        raise SignatureInvalid("no signature labelled run")
    _parameters(member)  # its faults come before the digest's, as they always have
    expected = digests.get("sha-256")
    if expected is None or not isinstance(expected.value, bytes):
        raise SignatureInvalid("Content-Digest needs a sha-256 member")
    params = serialize_inner_list(COMPONENTS, dict(member.params))
    return SignatureHeaders(member, params, signature.value, expected.value)


_SF_STRING = r'"([\x20\x21\x23-\x5b\x5d-\x7e]*)"'  # an sf-string without escapes
_CANONICAL_INPUT = re.compile(
    r'run=(\("@method" "@path" "@query" "content-digest"\);created=(0|[1-9][0-9]{0,14})'
    rf";nonce={_SF_STRING};keyid={_SF_STRING};alg={_SF_STRING})"
)
_CANONICAL_SIGNATURE = re.compile(r"run=:([A-Za-z0-9+/]*={0,2}):")
_CANONICAL_DIGEST = re.compile(r"sha-256=:([A-Za-z0-9+/]*={0,2}):")


def canonical_headers(
    raw_input: str, raw_signature: str, raw_digest: str
) -> SignatureHeaders | None:
    """The headers when they are exactly what `sign` writes, read with three regular
    expressions; None for any other form (`structured_headers` reads those). Every Run request
    carries them, and the structured-field parser took 60 us a request (issue 24's fleet
    profile); a differential test holds both readings equal wherever this one answers."""
    given = _CANONICAL_INPUT.fullmatch(raw_input.strip())
    signature = _CANONICAL_SIGNATURE.fullmatch(raw_signature.strip())
    digest = _CANONICAL_DIGEST.fullmatch(raw_digest.strip())
    if given is None or signature is None or digest is None:
        return None
    try:
        signature_bytes = base64.b64decode(signature[1], validate=True)
        digest_bytes = base64.b64decode(digest[1], validate=True)
    except binascii.Error:
        return None
    params = {"created": int(given[2]), "nonce": given[3], "keyid": given[4], "alg": given[5]}
    return SignatureHeaders(Member(COMPONENTS, params), given[1], signature_bytes, digest_bytes)


def check_digest(signed: Signed, body: bytes) -> None:
    """The body is the one the signed `Content-Digest` header names."""
    if not hmac.compare_digest(signed.digest, hashlib.sha256(body).digest()):
        raise SignatureInvalid("Content-Digest does not match the body")


def _parameters(member: Member) -> tuple[int, str, str, str]:
    items = member.value
    if (
        not isinstance(items, tuple)
        or items != COMPONENTS
        or any(isinstance(item, Token) for item in items)
    ):
        raise SignatureInvalid(f"covered components must be exactly {' '.join(COMPONENTS)}")
    params = member.params
    created = params.get("created")
    if isinstance(created, bool) or not isinstance(created, int):
        raise SignatureInvalid("created must be an integer")
    nonce, key_id, alg = (
        _string_param(params.get(name), name) for name in ("nonce", "keyid", "alg")
    )
    try:
        nonce_bytes = b64url_decode(nonce)
    except ValueError:
        raise SignatureInvalid("nonce is not base64url") from None
    if len(nonce_bytes) < MIN_NONCE_BYTES:
        raise SignatureInvalid(f"nonce must be at least {MIN_NONCE_BYTES} bytes")
    kind, _, subject = key_id.partition(":")
    if kind not in ("endpoint", "session") or not subject:
        raise SignatureInvalid("keyid must be endpoint:<id> or session:<id>")
    if (kind, alg) not in (("endpoint", ED25519_ALG), ("session", HMAC_ALG)):
        raise SignatureInvalid(f"alg {alg!r} does not fit keyid {kind}:")
    return created, nonce, key_id, alg


def _string_param(value: object, name: str) -> str:
    if not isinstance(value, str) or isinstance(value, Token):
        raise SignatureInvalid(f"{name} must be a string parameter")
    return value


def check_created(signed: Signed, *, now_s: float, started_s: float) -> None:
    """`created` within +-300 s of the platform clock, and not before this instance started."""
    if abs(now_s - signed.created) > WINDOW_S:
        raise SignatureExpired(f"created is more than {WINDOW_S} s from the platform clock")
    if signed.created < started_s - 1:
        raise SignatureExpired("the signature predates this platform instance; sign again")


def verify_hmac(signed: Signed, key: bytes) -> None:
    expected = hmac.new(key, signed.base, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, signed.signature):
        raise SignatureInvalid()


def verify_ed25519(signed: Signed, public_key: bytes) -> None:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signed.signature, signed.base)
    except (InvalidSignature, ValueError):
        raise SignatureInvalid() from None
