"""Paddle's noise on a command's stderr, set off before paddle is imported (and in every rank process)."""

from __future__ import annotations

import os
import warnings


def quiet_paddle() -> None:
    """`import paddle` warns "No ccache found ..." (paddle.utils.cpp_extension, at import) and its C++ logs at INFO."""
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ logging: warnings and up only
    warnings.filterwarnings("ignore", category=UserWarning, module=r"paddle\.")
