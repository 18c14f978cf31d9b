"""What of a payload its readers are shown: every credential-looking part redacted.

A payload is what its submitter typed, shown back only to whoever may read the job
(docs/protocol.md, "Payload"). The platform's own secrets never enter one; what a user put there
by mistake is hidden by three rules, each applied at every depth:

- an object member whose key looks like a credential has its value, whatever it is, replaced by
  `"[redacted]"` (`{"db_password": {...}}` -> `{"db_password": "[redacted]"}`);
- a string `NAME=value` or `NAME: value` whose NAME (leading dashes aside) looks like one shows as
  `NAME=[redacted]` (`TOKEN=abc`, `--password=abc`, `Authorization: Bearer abc`: how a command's
  environment, flags and headers are written in an `argv`);
- in an array, the string after a flag `-NAME` or `--NAME` that looks like one is replaced
  (`["--token", "abc"]`).

A key looks like a credential when, compatibility-normalised (NFKC), case-folded and with
everything but letters and digits removed, it contains one of `CREDENTIAL_WORDS` or is one of
`CREDENTIAL_NAMES`. Everything else is unchanged. The work is one pass over the payload, without
recursion (a stored payload is at most 64 KiB and 32 levels deep, but nothing here relies on it).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

REDACTED = "[redacted]"

CREDENTIAL_WORDS = (
    "secret",
    "token",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "apikey",
    "privatekey",
    "accesskey",
    "authorization",
    "cookie",
)
"""A key containing one of these, once normalised, looks like a credential (`api_key`, `API-Key`,
`X-Auth-Token`, `aws_secret_access_key`, `Set-Cookie`)."""

CREDENTIAL_NAMES = ("auth", "pwd")
"""A key that is one of these, once normalised, does too (but `author` does not)."""

_ASSIGNMENT = re.compile(r"(-{0,2}[^\s=:]{1,256})(=|:[ \t]*)(.+)", re.DOTALL)
"""`NAME=value` or `NAME: value`: a name of at most 256 characters (so a match costs little
however long the string), then a value that is not empty."""

_FLAG = re.compile(r"-{1,2}([^\s=:]{1,256})")


_WORD = re.compile("|".join(CREDENTIAL_WORDS))
_NAMES = frozenset(CREDENTIAL_NAMES)
_NOT_ASCII_ALNUM = re.compile("[^a-z0-9]+")


def normalised(name: str) -> str:
    """`name` as it is compared: NFKC, case-folded, letters and digits only (`API-Key`,
    `api_key` and a full-width `apiKey` are all `apikey`)."""
    if name.isascii():  # the common case, a third of the cost: NFKC and case-folding agree
        return _NOT_ASCII_ALNUM.sub("", name.lower())
    folded = unicodedata.normalize("NFKC", name).casefold()
    return "".join(char for char in folded if char.isalnum())


def looks_like_credential(name: str) -> bool:
    """Whether a key (or a flag's or an assignment's name) names a credential."""
    plain = normalised(name)
    return plain in _NAMES or _WORD.search(plain) is not None


def redacted_string(text: str) -> str:
    """`text`, or with the value of a credential's `NAME=value` (or `NAME: value`) redacted."""
    found = _ASSIGNMENT.fullmatch(text)
    if found is None or not looks_like_credential(found.group(1).lstrip("-")):
        return text
    return f"{found.group(1)}{found.group(2)}{REDACTED}"


def is_credential_flag(text: str) -> bool:
    """Whether `text` is a flag (`-NAME`, `--NAME`, no value) naming a credential."""
    found = _FLAG.fullmatch(text)
    return found is not None and looks_like_credential(found.group(1))


def redacted(value: Any) -> Any:
    """A copy of a JSON value with every credential-looking part redacted (see the module's
    doc); `value` itself is not changed."""
    if not isinstance(value, dict | list):
        return redacted_string(value) if isinstance(value, str) else value
    top: Any = {} if isinstance(value, dict) else []
    pending: list[tuple[Any, Any]] = [(value, top)]
    while pending:
        source, target = pending.pop()
        if isinstance(source, dict):
            for key, item in source.items():
                target[key] = REDACTED if looks_like_credential(key) else _copy(item, pending)
        else:
            after_flag = False
            for item in source:
                hidden = after_flag and isinstance(item, str)
                target.append(REDACTED if hidden else _copy(item, pending))
                after_flag = isinstance(item, str) and is_credential_flag(item)
    return top


def _copy(item: Any, pending: list[tuple[Any, Any]]) -> Any:
    """`item`'s copy: a string redacted now, a container empty, to be filled when it is taken
    from `pending`."""
    if isinstance(item, dict | list):
        copy: Any = {} if isinstance(item, dict) else []
        pending.append((item, copy))
        return copy
    return redacted_string(item) if isinstance(item, str) else item
