"""Paddle's side effects on a dsx process, set off before paddle is imported (at the CLI's entry and in every rank
process): its noise on stderr, and its SIGTERM handler."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import signal
import sys
import warnings


def quiet_paddle() -> None:
    """`import paddle` warns "No ccache found ..." (paddle.utils.cpp_extension, at import) and its C++ logs at INFO."""
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ logging: warnings and up only
    warnings.filterwarnings("ignore", category=UserWarning, module=r"paddle\.")
    if "paddle" not in sys.modules and not any(isinstance(f, _KeepSigterm) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeepSigterm())


class _KeepSigterm(importlib.abc.MetaPathFinder):
    """`import paddle` replaces the process's SIGTERM handler with one of its own (C++), which prints a 12-line
    "FatalError: `Termination signal` is detected" block with a "C++ Traceback" on stdout and leaves no room for
    cleanup: a scheduler stopping `dsx export` (SIGTERM) got that, and the staging directory left behind. The action
    in place before the import (dsx's handler, or the default) is put back once paddle's package has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "paddle":
            return None
        sys.meta_path.remove(self)  # (once: the spec below is found by the finders after this one)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            # The C-level action is saved and put back as it was (Python's own handler, or the default): unlike
            # signal.signal, sigaction works from any thread, and the first `import paddle` may run in a worker
            # thread (a rank process's did). SIGTERM is held back meanwhile in this thread (the main one: all of it).
            try:
                saved = _sigterm_action()
            except (OSError, AttributeError):  # (no libc sigaction to call: Paddle's handler stays, as before)
                return run(module)
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                run(module)
            finally:
                with contextlib.suppress(OSError):
                    _sigterm_action(saved)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        spec.loader.exec_module = exec_module
        return spec


def _sigterm_action(restore: bytes | None = None) -> bytes:
    """SIGTERM's `struct sigaction` as opaque bytes (glibc's sigaction), or put back to `restore`."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(512)  # (larger than any libc's struct sigaction)
    if restore is None:
        rc = libc.sigaction(signal.SIGTERM, None, buf)
    else:
        new = ctypes.create_string_buffer(restore, len(restore))
        rc = libc.sigaction(signal.SIGTERM, new, None)
    if rc != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGTERM) failed")
    return buf.raw
