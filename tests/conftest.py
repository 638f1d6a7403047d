"""Shared fixtures: tiny checkpoints written once per test session."""

from __future__ import annotations

import signal

import pytest

from ds_export.tiny import TinySpec, write_tiny

# A run started in the background of a non-interactive shell (`cmd &`) inherits SIGINT ignored, and so would every
# process the tests start: the Ctrl-C tests need Python's own handler, as a terminal's `dsx` has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_fp8(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "fp8"
    write_tiny(out, TinySpec())
    return out


@pytest.fixture(scope="session")
def tiny_bf16(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "bf16"
    write_tiny(out, TinySpec(dtype="bf16"))
    return out
