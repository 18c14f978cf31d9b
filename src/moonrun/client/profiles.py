"""The CLI user's profiles (platform URL and API token) in one TOML file, mode 0600."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from moonrun.errors import InvalidRequest, Unauthenticated

DEFAULT_PROFILE = "default"


@dataclass(frozen=True)
class Profile:
    platform: str
    token: str = field(repr=False)


def config_home(environ: Mapping[str, str]) -> Path:
    """`$XDG_CONFIG_HOME` when it is an absolute path (the XDG rule), else `~/.config`."""
    xdg = environ.get("XDG_CONFIG_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg)
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".config"


def config_path(home: Path) -> Path:
    return home / "moonrun" / "config.toml"


def load(path: Path) -> dict[str, Profile]:
    """Every profile in the file (none when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise InvalidRequest(f"cannot read {path}: {error.strerror}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidRequest(f"{path} is not valid TOML: {error}") from None
    profiles: dict[str, Profile] = {}
    tables = document.get("profiles", {})
    if not isinstance(tables, dict):
        raise InvalidRequest(f"{path}: `profiles` must be a table of profiles")
    for name, table in tables.items():
        platform = table.get("platform") if isinstance(table, dict) else None
        token = table.get("token") if isinstance(table, dict) else None
        if not isinstance(platform, str) or not isinstance(token, str):
            raise InvalidRequest(f"{path}: profile {name!r} needs a platform and a token string")
        profiles[name] = Profile(platform, token)
    return profiles


def from_env(environ: Mapping[str, str]) -> Profile:
    """The platform and token of MOONRUN_PLATFORM and MOONRUN_TOKEN, as the CLI reads them
    (`Client.from_env`, `AsyncClient.from_env`)."""
    platform, token = environ.get("MOONRUN_PLATFORM"), environ.get("MOONRUN_TOKEN")
    if not platform or not token:
        raise Unauthenticated("MOONRUN_PLATFORM and MOONRUN_TOKEN must both be set")
    return Profile(platform, token)


def saved(name: str, environ: Mapping[str, str]) -> Profile:
    """The profile `name` that `moonrun login` saved in the config file `environ` points at
    (`Client.from_profile`, `AsyncClient.from_profile`)."""
    path = config_path(config_home(environ))
    found = load(path).get(name)
    if found is None:
        raise Unauthenticated(f"no profile {name!r} in {path}: run `moonrun login --platform URL`")
    return found


def _quoted(text: str) -> str:
    # A JSON string is a TOML basic string: both escape the same way for what json.dumps writes.
    return json.dumps(text, ensure_ascii=False)


def render(profiles: Mapping[str, Profile]) -> str:
    lines = ["# moonrun CLI profiles, written by `moonrun login`. Keep this file private (0600)."]
    for name, profile in sorted(profiles.items()):
        lines += [
            "",
            f"[profiles.{_quoted(name)}]",
            f"platform = {_quoted(profile.platform)}",
            f"token = {_quoted(profile.token)}",
        ]
    return "\n".join(lines) + "\n"


def save(path: Path, profiles: Mapping[str, Profile]) -> None:
    """Write the file whole (directory 0700, file 0600), through a rename so that a crash
    leaves the old file or the new one, and the token is never readable by others."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    staging = path.with_name(path.name + ".new")
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        os.fchmod(descriptor, 0o600)  # a file left over from before keeps its mode otherwise
        file.write(render(profiles))
        file.flush()
        os.fsync(descriptor)
    os.replace(staging, path)
