"""A command's output pipe is closed exactly once when its reader goes, on uvloop (what Run
runs on) as on the standard loop. uvloop's pipe transport closes the descriptor itself and
then closes the file object it was handed too (MagicStack/uvloop#763): a file opened between
the two closes (by another thread, or the loop) lost its descriptor. In Run that was an
artifact opened for upload right after its command's pipes went: `artifact unreadable: Bad
file descriptor`, and the artifact was never listed complete."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from moonrun.run.handlers.command import connect_pipe_reader

uvloop = pytest.importorskip("uvloop")


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_name == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_a_file_opened_while_a_pipes_reader_goes_keeps_its_descriptor(
    loop_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is opened at the worst moment: as the reader's file object is being closed,
    when the pipe's number may be free already (uvloop's transport closed it first)."""
    target = tmp_path / "artifact"
    target.write_bytes(b"artifact")
    opened: list[BinaryIO] = []

    class OpensAFileAsItCloses(io.FileIO):
        def close(self) -> None:
            if not self.closed:
                opened.append(target.open("rb"))  # the lowest free number
            super().close()

    def fdopen(fd: int, mode: str, buffering: int = -1, closefd: bool = True) -> io.FileIO:
        return OpensAFileAsItCloses(fd, mode, closefd=closefd)

    monkeypatch.setattr(os, "fdopen", fdopen)

    async def main() -> None:
        read_end, write_end = os.pipe()
        transport, reader = await connect_pipe_reader(read_end, limit=2**16)
        os.write(write_end, b"line\n")
        os.close(write_end)
        assert await reader.readline() == b"line\n"
        transport.close()
        for _ in range(5):
            await asyncio.sleep(0.01)  # whatever closing the transport still does

    run_on(loop_name, main)
    assert len(opened) == 1
    with opened[0] as artifact:
        assert artifact.read() == b"artifact"  # OSError EBADF: its descriptor was closed


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_a_pipes_reader_that_goes_leaves_no_descriptor_open(loop_name: str) -> None:
    async def main() -> None:
        read_end, write_end = os.pipe()
        transport, _ = await connect_pipe_reader(read_end, limit=2**16)
        os.close(write_end)
        transport.close()
        for _ in range(5):
            await asyncio.sleep(0.01)
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(read_end)

    run_on(loop_name, main)
