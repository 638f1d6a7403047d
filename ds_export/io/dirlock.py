"""One dsx process at a time writing a directory: an exclusive flock on the directory itself (no lock file to leave
behind or to list in a manifest), held for the run and released with the process, a killed one included.

The same command started twice (a second terminal, an overlapping job) otherwise has two processes writing the same
partial files and saving state that drops each other's records. File systems without locks run unlocked."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ds_export.errors import UsageError


@contextlib.contextmanager
def exclusive(root: str | os.PathLike, command: str):
    """Hold `root`'s lock (creating the directory) while the block runs; a second holder is refused at once, naming
    `command` (e.g. "dsx quantize")."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{root}: another {command} is writing it now",
                             hint="wait for it to finish, or stop it; a rerun then resumes") from None
        except OSError:
            pass  # (no locks on this file system: unlocked)
        yield
    finally:
        os.close(fd)
