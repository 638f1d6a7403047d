"""Shared fixtures: tiny checkpoints written once per test session."""

from __future__ import annotations

import pytest

from ds_export.tiny import TinySpec, write_tiny


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
