"""Paddle's side effects on a dsx process, set off before paddle is imported (at the CLI's entry and in every rank
process): its noise on stderr, and its SIGTERM handler."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
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
    cleanup: a scheduler stopping `dsx export` (SIGTERM) got that, and the staging directory left behind. The handler
    in place before the import (dsx's own, or the default) is put back once paddle's package has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "paddle":
            return None
        sys.meta_path.remove(self)  # (once: the spec below is found by the finders after this one)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            if threading.current_thread() is not threading.main_thread():  # (only the main thread sets handlers)
                return run(module)
            before = signal.getsignal(signal.SIGTERM)
            # (held back while Paddle's handler is in place; delivered to the one put back)
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                run(module)
            finally:
                if before is not None:  # (None: a handler not set from Python, which cannot be put back)
                    signal.signal(signal.SIGTERM, before)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        spec.loader.exec_module = exec_module
        return spec
