"""Open a file by a path none of whose components is a symbolic link.

A command owns its working directory and may have put a link at any point of an artifact's
path (`out -> /var/lib/moonrun-run`), so it is not enough that the last component is not
one. Where the kernel has `openat2(2)` (Linux 5.6), one call does it, through a ctypes
syscall (the stdlib has no binding): RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH from the base
directory. Elsewhere each directory is opened from the one before with O_NOFOLLOW |
O_DIRECTORY, the last component with O_NOFOLLOW. Both refuse a `..` component up front, so
that both say the same.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

SYS_OPENAT2 = 437
"""The same number on every architecture (it came after the syscall tables were unified)."""
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_has_openat2: bool | None = None
"""None until the first call says whether the kernel has it."""


def open_without_links(base: Path, path: str, flags: int, *, walk: bool = False) -> int:
    """A descriptor for `path` (relative: in `base`; absolute: from `/`) opened with `flags`,
    no component of which is a symbolic link: OSError ELOOP when one is, EXDEV for a `..`
    component. `walk` skips openat2 (for tests)."""
    global _has_openat2
    start = Path("/") if path.startswith("/") else base
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EXDEV, "a path with a '..' component")
    if not parts:
        raise OSError(errno.EISDIR, "not a file")
    relative = "/".join(parts)
    directory = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if not walk and _has_openat2 is not False:
            try:
                return _openat2(directory, relative, flags)
            except OSError as error:
                if error.errno != errno.ENOSYS or _has_openat2:
                    raise
                _has_openat2 = False
        return _walk(directory, parts, flags)
    finally:
        os.close(directory)


def _openat2(directory: int, relative: str, flags: int) -> int:
    global _has_openat2
    how = _OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(directory),
        ctypes.c_char_p(os.fsencode(relative)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))
    _has_openat2 = True
    return int(fd)


def _walk(directory: int, parts: list[str], flags: int) -> int:
    current = os.dup(directory)
    try:
        for part in parts[:-1]:
            try:
                following = os.open(
                    part,
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=current,
                )
            except NotADirectoryError:
                found = os.stat(part, dir_fd=current, follow_symlinks=False)
                if stat.S_ISLNK(found.st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
                raise
            os.close(current)
            current = following
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
    finally:
        os.close(current)
