"""What the suites that start real `moonrun` processes share: ports and environments."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def command_env(admin_token: str) -> dict[str, str]:
    """The environment of a child `moonrun` process: this checkout's code, the bootstrap
    admin token, unbuffered output, and none of the caller's other MOONRUN_* settings."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("MOONRUN_")}
    return {
        **inherited,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT),
        "MOONRUN_BOOTSTRAP_ADMIN_TOKEN": admin_token,
        "PYTHONUNBUFFERED": "1",
    }


def serve_command(store_url: str, port: int, secret_file: Path, data_dir: Path) -> list[str]:
    """`moonrun platform serve` on loopback `port`, as the tests start it."""
    return [
        sys.executable,
        "-m",
        "moonrun",
        "platform",
        "serve",
        "--store",
        store_url,
        "--listen",
        f"127.0.0.1:{port}",
        "--secret-file",
        str(secret_file),
        "--data-dir",
        str(data_dir),
    ]
