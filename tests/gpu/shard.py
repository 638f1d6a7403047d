"""pytest plugin: run one of N fixed parts of the collected tests, so a GPU suite longer than one device call
(10 minutes) runs whole over N calls, each part known, their union every test.

    python -m pytest -p shard --shard 1/3 tests/gpu/ ...      (tests/gpu on PYTHONPATH; run_all.sh: SHARD=1/3)

A test's part is a hash of its id (crc32 of the node id, modulo N): the same test lands in the same part on every
machine and in every run, whatever else was collected, and the parts are disjoint. Parts are even by count, not by
time."""

from __future__ import annotations

import zlib

import pytest


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N parts of the collected tests (0 <= I < N)")


def part_of(nodeid: str, n: int) -> int:
    return zlib.crc32(nodeid.encode()) % n


def parse(spec: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {spec!r}: expected I/N, e.g. 0/3") from None
    if not (n >= 1 and 0 <= i < n):
        raise pytest.UsageError(f"--shard {spec}: expected 0 <= I < N")
    return i, n


def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--shard")
    if not spec:
        return
    i, n = parse(spec)
    keep = [it for it in items if part_of(it.nodeid, n) == i]
    drop = [it for it in items if part_of(it.nodeid, n) != i]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_report_header(config):
    spec = config.getoption("--shard")
    return f"shard {spec} (tests/gpu/shard.py)" if spec else None
