"""Request signing (RFC 9421 subset, RFC 9530 digest), structured fields, keys and nonces."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from moonrun.errors import Replayed, SignatureExpired, SignatureInvalid, SignatureMissing
from moonrun.security import signing
from moonrun.security.keys import NonceCache, SecretFileError, load_or_create_secret, session_key
from moonrun.security.sfv import SfvError, Token, parse_dictionary, serialize_inner_list

KEY = b"k" * 32
NONCE = signing.b64url(b"n" * 16)
NOW = 1_795_000_000


def signed(body: bytes = b"{}", path: str = "/run/v1/heartbeat", **options: object) -> dict:
    arguments: dict = {"key_id": "session:ses_1", "key": KEY, "created": NOW, "nonce": NONCE}
    arguments.update(options)
    return {k.lower(): v for k, v in signing.sign("POST", path, "", body, **arguments).items()}


def parse(headers: dict, body: bytes = b"{}", path: str = "/run/v1/heartbeat") -> signing.Signed:
    return signing.parse("POST", path, "", headers, body)


def test_a_signed_request_verifies_with_its_key() -> None:
    """sign -> parse -> verify round-trips, and names its key."""
    result = parse(signed())
    signing.verify_hmac(result, KEY)
    assert (result.key_kind, result.key_subject, result.created) == ("session", "ses_1", NOW)


def test_the_signature_base_is_rfc_9421_shaped() -> None:
    """Covered components in order, then @signature-params exactly as in Signature-Input."""
    headers = signed()
    base = parse(headers).base.decode()
    digest = "sha-256=:" + base64.b64encode(hashlib.sha256(b"{}").digest()).decode() + ":"
    params = headers["signature-input"].removeprefix("run=")
    expected = "\n".join(
        [
            '"@method": POST',
            '"@path": /run/v1/heartbeat',
            '"@query": ?',
            f'"content-digest": {digest}',
            f'"@signature-params": {params}',
        ]
    )
    assert expected == base
    assert digest == headers["content-digest"]


def test_ed25519_signatures_verify_with_the_public_key() -> None:
    """Registration signatures use the identity key; another key fails."""
    identity = Ed25519PrivateKey.generate()
    headers = signed(key_id="endpoint:ep_1", key=identity)
    result = parse(headers)
    public = identity.public_key().public_bytes_raw()
    signing.verify_ed25519(result, public)
    other = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    with pytest.raises(SignatureInvalid):
        signing.verify_ed25519(result, other)


@pytest.mark.parametrize("missing", ["signature", "signature-input", "content-digest"])
def test_a_missing_header_is_signature_missing(missing: str) -> None:
    """Any of the three headers absent."""
    headers = signed()
    del headers[missing]
    with pytest.raises(SignatureMissing):
        parse(headers)


def test_unparseable_headers_are_signature_missing() -> None:
    """Headers that are not structured fields."""
    headers = signed()
    headers["signature"] = "run=not a byte sequence ::"
    with pytest.raises(SignatureMissing):
        parse(headers)


ALL = '"@method" "@path" "@query" "content-digest"'


def run_input(components: str = ALL, label: str = "run", **params: object) -> str:
    """A Signature-Input value; parameters default to a well-formed set."""
    values: dict[str, object] = {
        "created": NOW,
        "keyid": '"session:s"',
        "alg": '"hmac-sha256"',
        "nonce": f'"{NONCE}"',
    }
    values.update(params)
    rendered = "".join(f";{k}={v}" for k, v in values.items() if v is not None)
    return f"{label}=({components}){rendered}"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("signature-input", run_input(label="other")),
        ("signature-input", run_input('"@method" "@path"')),
        ("signature-input", run_input('"@method" "@path" "@query" content-digest')),
        ("signature-input", run_input(created=None)),
        ("signature-input", run_input(nonce='"c2hvcnQ"')),
        ("signature-input", run_input(alg='"ed25519"')),
        ("signature-input", run_input(keyid='"endpoint:e"')),
        ("signature-input", run_input(keyid='"user:u"')),
        ("content-digest", "sha-512=:AAAA:"),
        ("content-digest", "sha-256=:" + base64.b64encode(b"x" * 32).decode() + ":"),
    ],
)
def test_malformed_signature_parameters_are_signature_invalid(header: str, value: str) -> None:
    """Wrong label, components, missing created, short nonce, alg/keyid mismatch, bad digest."""
    headers = signed()
    headers[header] = value
    with pytest.raises(SignatureInvalid):
        parse(headers)


def test_a_changed_body_path_or_key_fails_verification() -> None:
    """The digest binds the body; the base binds method, path and query; the MAC binds the key."""
    headers = signed()
    with pytest.raises(SignatureInvalid):
        parse(headers, body=b'{"x":1}')
    with pytest.raises(SignatureInvalid):
        signing.verify_hmac(parse(headers, path="/run/v1/jobs/claim"), KEY)
    with pytest.raises(SignatureInvalid):
        signing.verify_hmac(parse(headers), b"other key" * 4)


@pytest.mark.parametrize(
    ("created", "ok"),
    [(NOW - 300, True), (NOW + 300, True), (NOW - 301, False), (NOW + 301, False)],
)
def test_created_must_be_within_300_seconds(created: int, ok: bool) -> None:
    """The window is +-300 s of the platform clock, inclusive."""
    result = parse(signed(created=created))
    if ok:
        signing.check_created(result, now_s=NOW, started_s=NOW - 1000)
    else:
        with pytest.raises(SignatureExpired):
            signing.check_created(result, now_s=NOW, started_s=NOW - 1000)


def test_signatures_from_before_the_instance_started_are_expired() -> None:
    """A restart does not reopen the replay window its lost nonce cache covered."""
    result = parse(signed(created=NOW - 10))
    signing.check_created(result, now_s=NOW, started_s=NOW - 11)
    with pytest.raises(SignatureExpired):
        signing.check_created(result, now_s=NOW, started_s=NOW - 5)


def test_nonces_are_refused_the_second_time() -> None:
    """A verified nonce seen again within the window is a replay; the cache forgets old ones."""
    cache = NonceCache(window_s=300)
    cache.remember("session:s", NONCE, NOW, NOW)
    with pytest.raises(Replayed):
        cache.remember("session:s", NONCE, NOW, NOW + 10)
    cache.remember("session:other", NONCE, NOW, NOW)
    cache.remember("session:s", NONCE, NOW, NOW + 400)  # long expired: purged, then fresh


def test_session_keys_derive_from_the_secret_and_the_session_id() -> None:
    """Same inputs, same key; any other secret or id, another key."""
    assert session_key(KEY, "ses_1") == session_key(KEY, "ses_1")
    assert session_key(KEY, "ses_1") != session_key(KEY, "ses_2")
    assert session_key(KEY, "ses_1") != session_key(b"x" * 32, "ses_1")


def test_a_missing_secret_file_is_created_private(tmp_path: Path) -> None:
    """64 hex characters, mode 0600, and read back the same."""
    path = tmp_path / "state" / "platform.secret"
    secret = load_or_create_secret(path)
    assert (len(secret), stat.S_IMODE(path.stat().st_mode)) == (32, 0o600)
    assert secret == load_or_create_secret(path)


@pytest.mark.parametrize(
    ("content", "mode"), [("ab" * 32, 0o644), ("not hex", 0o600), ("ab" * 31, 0o600)]
)
def test_a_bad_secret_file_is_refused(tmp_path: Path, content: str, mode: int) -> None:
    """Readable by others, or not exactly 64 hex characters."""
    path = tmp_path / "platform.secret"
    path.write_text(content)
    os.chmod(path, mode)
    with pytest.raises(SecretFileError):
        load_or_create_secret(path)


def test_structured_fields_parse_and_serialize() -> None:
    """Dictionaries of inner lists and items with parameters, strings with escapes."""
    parsed = parse_dictionary('a=("x" "y\\"z");n=5;t=tok;b=?1, c=:AAE=:;p')
    assert (
        parsed["a"].value,
        parsed["a"].params,
    ) == (("x", 'y"z'), {"n": 5, "t": "tok", "b": True})
    assert isinstance(parsed["a"].params["t"], Token)
    assert (parsed["c"].value, parsed["c"].params) == (b"\x00\x01", {"p": True})
    assert serialize_inner_list(("x", 'y"z'), parsed["a"].params) == '("x" "y\\"z");n=5;t=tok;b'
    for bad in ('a="unterminated', "a=(", "A=1", "a=1,", 'a="\x01"', "a=:!!:"):
        with pytest.raises(SfvError):
            parse_dictionary(bad)


@pytest.mark.parametrize(
    ("header", "value", "error", "message"),
    [
        (
            "signature-input",
            run_input(label="other"),
            SignatureInvalid,
            "no signature labelled run",
        ),
        ("signature", "other=:AAAA:", SignatureInvalid, "no signature labelled run"),
        ("signature", "run=AAAA", SignatureInvalid, "no signature labelled run"),
        ("signature", "run=(1 2)", SignatureInvalid, "no signature labelled run"),
        (
            "signature-input",
            run_input('"@method" "@path"'),
            SignatureInvalid,
            "covered components must be exactly @method @path @query content-digest",
        ),
        (
            "signature-input",
            run_input('"@method" "@path" "@query" content-digest'),
            SignatureInvalid,
            "covered components must be exactly @method @path @query content-digest",
        ),
        (
            "signature-input",
            run_input(created=None),
            SignatureInvalid,
            "created must be an integer",
        ),
        (
            "signature-input",
            run_input(created='"1"'),
            SignatureInvalid,
            "created must be an integer",
        ),
        (
            "signature-input",
            run_input(created="?1"),
            SignatureInvalid,
            "created must be an integer",
        ),
        (
            "signature-input",
            run_input(nonce='"c2hvcnQ"'),
            SignatureInvalid,
            "nonce must be at least 16 bytes",
        ),
        ("signature-input", run_input(nonce='"a"'), SignatureInvalid, "nonce is not base64url"),
        (
            "signature-input",
            run_input(nonce="tok"),
            SignatureInvalid,
            "nonce must be a string parameter",
        ),
        (
            "signature-input",
            run_input(nonce=None),
            SignatureInvalid,
            "nonce must be a string parameter",
        ),
        (
            "signature-input",
            run_input(keyid=None),
            SignatureInvalid,
            "keyid must be a string parameter",
        ),
        (
            "signature-input",
            run_input(alg=None),
            SignatureInvalid,
            "alg must be a string parameter",
        ),
        (
            "signature-input",
            run_input(alg='"ed25519"'),
            SignatureInvalid,
            "alg 'ed25519' does not fit keyid session:",
        ),
        (
            "signature-input",
            run_input(keyid='"endpoint:e"'),
            SignatureInvalid,
            "alg 'hmac-sha256' does not fit keyid endpoint:",
        ),
        *(
            (
                "signature-input",
                run_input(keyid=keyid),
                SignatureInvalid,
                "keyid must be endpoint:<id> or session:<id>",
            )
            for keyid in ('"user:u"', '"session:"', '"session"', '"endpoint"')
        ),
        (
            "content-digest",
            "sha-512=:AAAA:",
            SignatureInvalid,
            "Content-Digest needs a sha-256 member",
        ),
        (
            "content-digest",
            "sha-256=abc",
            SignatureInvalid,
            "Content-Digest needs a sha-256 member",
        ),
        (
            "content-digest",
            "sha-256=:" + base64.b64encode(b"x" * 32).decode() + ":",
            SignatureInvalid,
            "Content-Digest does not match the body",
        ),
        ("signature", "run=:AAAA", SignatureMissing, "signature headers do not parse: "),
    ],
    ids=repr,
)
def test_each_malformed_signature_says_what_is_wrong(
    header: str, value: str, error: type[Exception], message: str
) -> None:
    """The refusal's type and its words, one per check, in the checks' order."""
    headers = signed()
    headers[header] = value
    with pytest.raises(error) as refused:
        parse(headers)
    assert refused.value.args[0].startswith(message), refused.value.args[0]
    if not message.endswith(": "):
        assert refused.value.args[0] == message


def test_a_signature_covers_the_query() -> None:
    """`?a=1` is in the base; the same signature with another query does not verify."""
    headers = {
        k.lower(): v
        for k, v in signing.sign(
            "GET", "/p", "a=1", b"", key_id="session:s", key=KEY, created=NOW, nonce=NONCE
        ).items()
    }
    same = signing.parse("GET", "/p", "a=1", headers, b"")
    signing.verify_hmac(same, KEY)
    assert b'"@query": ?a=1\n' in same.base
    with pytest.raises(SignatureInvalid):
        signing.verify_hmac(signing.parse("GET", "/p", "a=2", headers, b""), KEY)
    with pytest.raises(SignatureInvalid):
        signing.verify_hmac(signing.parse("GET", "/p", "", headers, b""), KEY)


def test_the_signature_headers_carry_their_rfc_names_and_the_parsed_parameters() -> None:
    """sign() answers Content-Digest, Signature-Input and Signature; parse() gives back the
    key id, algorithm, created and nonce that were signed."""
    identity = Ed25519PrivateKey.generate()
    headers = signing.sign(
        "POST", "/p", "", b"{}", key_id="endpoint:ep_1", key=identity, created=NOW, nonce=NONCE
    )
    result = signing.parse("POST", "/p", "", {k.lower(): v for k, v in headers.items()}, b"{}")
    assert sorted(headers) == ["Content-Digest", "Signature", "Signature-Input"]
    assert headers["Signature-Input"].startswith(
        'run=("@method" "@path" "@query" "content-digest")'
    )
    assert (result.key_id, result.alg, result.created, result.nonce) == (
        "endpoint:ep_1",
        "ed25519",
        NOW,
        NONCE,
    )


def test_a_key_id_names_its_subject_after_the_first_colon() -> None:
    """`session:a:b` is session `a:b` (ids have no colons; the split is still the first)."""
    result = parse(signed(key_id="session:a:b"))
    assert (result.key_kind, result.key_subject) == ("session", "a:b")


def test_a_signature_created_up_to_one_second_before_the_start_is_accepted() -> None:
    """Clocks tick in whole seconds: created 1 s before the instance started still passes,
    anything earlier is expired, saying why."""
    result = parse(signed(created=NOW))
    signing.check_created(result, now_s=NOW, started_s=NOW + 1)
    with pytest.raises(SignatureExpired) as early:
        signing.check_created(result, now_s=NOW, started_s=NOW + 1.5)
    with pytest.raises(SignatureExpired) as late:
        signing.check_created(result, now_s=NOW + 301, started_s=NOW)
    assert (early.value.message, late.value.message) == (
        "the signature predates this platform instance; sign again",
        "created is more than 300 s from the platform clock",
    )
