"""One dsx process at a time writing a directory, and none reading it meanwhile: an exclusive flock on the directory
itself (no lock file to leave behind or to list in a manifest) for a writer, a shared one for each reader, held for the
run and released with the process, a killed one included.

The same command started twice (a second terminal, an overlapping job) otherwise has two processes writing the same
partial files and saving state that drops each other's records; an export or verify reading a directory that a
`quantize --force` rewrites meanwhile reads a mix of two conversions. File systems without locks run unlocked."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ds_export.errors import UsageError


@contextlib.contextmanager
def exclusive(root: str | os.PathLike, command: str):
    """Hold `root`'s lock (creating the directory) while the block runs; another writer or a reader is refused at
    once, naming `command` (e.g. "dsx quantize")."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root}: exists and is not a directory", hint="give a directory's path")
    fd = _lock(root, fcntl.LOCK_EX, command)
    if fd is None:
        raise UsageError(f"{root}: another dsx process is writing or reading it now ({command} writes it alone)",
                         hint="wait for it to finish, or stop it, then run this again")
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def shared(root: str | os.PathLike, command: str):
    """Read `root` (a directory dsx writes: a download, a quantize output, an export) while no dsx process writes it,
    and keep any from starting to until the block ends; other readers are welcome. Not a directory: no lock (the
    reader's own checks say what is wrong)."""
    root = Path(root)
    if not root.is_dir():
        yield
        return
    fd = _lock(root, fcntl.LOCK_SH, command)
    if fd is None:
        raise UsageError(f"{root}: a dsx process is writing it now; {command} reads it once that has finished",
                         hint="wait for it to finish (or stop it and let a rerun finish it), then run this again")
    try:
        yield
    finally:
        os.close(fd)


def _lock(root: Path, op: int, command: str) -> int | None:
    """An open descriptor of `root` holding its lock `op` (or none where the file system has no locks), None when
    another process holds a conflicting one. A writer (LOCK_EX) creates `root`."""
    for _ in range(3):
        if op == fcntl.LOCK_EX:
            root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            return fd  # (no locks on this file system: unlocked)
        if _same(root, fd):
            return fd
        # (the holder renamed it away between our open and our lock, e.g. an export's staging directory moved to
        # its place as it finished: the lock is on that directory now, not on `root`; take root's afresh)
        os.close(fd)
    raise UsageError(f"{root}: another dsx process keeps replacing it ({command})",
                     hint="wait for it to finish, or stop it")


def _same(root: Path, fd: int) -> bool:
    try:
        a, b = os.stat(root), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
