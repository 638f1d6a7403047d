"""Checkpoint I/O: round trips (fp8 bit-exact), malformed headers, index checks, atomic writes."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import CheckpointError
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.manifest import Manifest
from ds_export.io.safetensors_file import SafetensorsFile
from ds_export.io.writer import Entry, ShardWriter, sha256_file, write_file, write_index


def _sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    all_fp8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).reshape(16, 16)  # NaN codes included
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "bf16": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
        "fp8": all_fp8,
        "e5m2": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2),
        "i8": rng.integers(-128, 127, (4, 4), dtype=np.int8),
        "i64": np.array([1, -2, 3], dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(2.5, dtype=np.float32),
        "flag": np.array([True, False]),
    }


def test_round_trip_bit_exact(tmp_path):
    ts = _sample_tensors()
    sha = write_file(tmp_path / "a.safetensors", ts, {"format": "pt"})
    assert sha == sha256_file(tmp_path / "a.safetensors")
    f = SafetensorsFile(tmp_path / "a.safetensors")
    assert f.metadata == {"format": "pt"}
    for k, v in ts.items():
        got = f.get(k)
        assert got.dtype == v.dtype and got.shape == v.shape
        assert got.tobytes() == v.tobytes(), k  # bit-exact, NaN payloads included
        assert f.raw(k).tobytes() == v.tobytes()
    assert f.info("fp8").dtype == "F8_E4M3"


def test_interop_with_safetensors_library(tmp_path):
    from safetensors.numpy import load_file, save_file

    ts = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int8)}
    save_file(ts, tmp_path / "theirs.safetensors")
    f = SafetensorsFile(tmp_path / "theirs.safetensors")
    for k, v in ts.items():
        np.testing.assert_array_equal(f.get(k), v)
    write_file(tmp_path / "ours.safetensors", ts)
    back = load_file(tmp_path / "ours.safetensors")
    for k, v in ts.items():
        np.testing.assert_array_equal(back[k], v)


def test_fp8_interop_with_paddle(tmp_path):
    paddle = pytest.importorskip("paddle")
    from safetensors.paddle import load_file

    codes = np.arange(256, dtype=np.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # skip NaN codes: compare values
    write_file(tmp_path / "f.safetensors", {"w": codes.view(ml_dtypes.float8_e4m3fn)})
    t = load_file(str(tmp_path / "f.safetensors"))["w"]
    assert t.dtype == paddle.float8_e4m3fn
    assert t.view(paddle.uint8).numpy().tobytes() == codes.tobytes()


# -------------------------------------------------------- malformed files ----

def _raw_file(path, header: dict | bytes, data: bytes = b"", hlen: int | None = None):
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(js) if hlen is None else hlen) + js + data)
    return path


GOOD = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize("header,data,hlen,msg", [
    (b"", b"", 0, "not valid JSON"),
    (GOOD, b"\0" * 8, 10**12, "header length"),
    (b"{not json", b"", None, "not valid JSON"),
    (b"[1, 2]", b"", None, "not a JSON object"),
    ({"t": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "unknown dtype"),
    ({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "shape"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, None, "data_offsets"),
    ({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "needs 12 bytes"),
    (GOOD, b"\0" * 5, None, "truncated"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None, "overlaps"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None, "unaccounted"),
    (GOOD, b"\0" * 12, None, "after the last tensor"),
    ({"t": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, None, "needs dtype, shape and data_offsets"),
    ({"__metadata__": {"k": 1}, **GOOD}, b"\0" * 8, None, "__metadata__"),
])
def test_malformed_headers(tmp_path, header, data, hlen, msg):
    p = _raw_file(tmp_path / "bad.safetensors", header, data, hlen)
    with pytest.raises(CheckpointError, match=msg) as ei:
        SafetensorsFile(p)
    assert str(p) in str(ei.value)  # the message names the file


def test_short_and_missing_files(tmp_path):
    (tmp_path / "short.safetensors").write_bytes(b"\1\2")
    with pytest.raises(CheckpointError, match="too short"):
        SafetensorsFile(tmp_path / "short.safetensors")
    with pytest.raises(CheckpointError, match="not found"):
        SafetensorsFile(tmp_path / "nope.safetensors")


def test_truncated_real_shard(tiny_fp8, tmp_path):
    import shutil

    shutil.copytree(tiny_fp8, tmp_path / "ck")
    shard = sorted((tmp_path / "ck").glob("model-*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1000)
    with pytest.raises(CheckpointError, match=shard.name):
        Checkpoint.open(tmp_path / "ck")


# ------------------------------------------------------------ checkpoints ----

def _ck(tmp_path, weight_map, files: dict[str, dict[str, np.ndarray]], total=None):
    for name, ts in files.items():
        write_file(tmp_path / name, ts)
    (tmp_path / "config.json").write_text("{}")
    meta = {"total_size": total} if total is not None else {}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": meta, "weight_map": weight_map}))
    return tmp_path


A = {"a": np.zeros(4, np.float32)}


@pytest.mark.parametrize("wm,files,total,msg", [
    ({"a": "s1.safetensors", "b": "s2.safetensors"}, {"s1.safetensors": A}, None, "s2.safetensors, which is missing"),
    ({"a": "../outside.safetensors"}, {}, None, "outside the checkpoint"),
    ({"a": "/etc/passwd"}, {}, None, "not a relative file name"),
    ({"a": "s1.safetensors", "b": "s1.safetensors"}, {"s1.safetensors": A}, None, "does not hold it"),
    ({}, {"s1.safetensors": A}, None, "empty weight_map"),
    ({"a": "s1.safetensors"}, {"s1.safetensors": {**A, "x": np.ones(1, np.int8)}}, None, "index maps to None"),
    ({"a": "s1.safetensors"}, {"s1.safetensors": A}, 99, "total_size"),
    ({"a": "s1.safetensors"}, {"s1.safetensors": A}, "16", "metadata.total_size is '16', not a byte count"),
])
def test_index_checks(tmp_path, wm, files, total, msg):
    _ck(tmp_path, wm, files, total)
    with pytest.raises(CheckpointError, match=msg):
        Checkpoint.open(tmp_path)


@pytest.mark.parametrize("meta", [5, "x", [1]])
def test_index_metadata_that_is_not_a_mapping(tmp_path, meta):
    """A damaged index's metadata (a number, a string, a list) was an internal error in every command."""
    _ck(tmp_path, {"a": "s1.safetensors"}, {"s1.safetensors": A})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": meta,
                                                                       "weight_map": {"a": "s1.safetensors"}}))
    with pytest.raises(CheckpointError, match="metadata is .*, not a mapping"):
        Checkpoint.open(tmp_path)


def test_duplicate_across_shards(tmp_path):
    _ck(tmp_path, {"a": "s1.safetensors"}, {"s1.safetensors": A, "s2.safetensors": A})
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    idx["weight_map"]["b"] = "s2.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError):
        Checkpoint.open(tmp_path)


def test_a_shard_that_is_a_symlink_loop_is_one_clear_error(tmp_path):
    """A shard that is a link to itself was an internal error (pathlib's RuntimeError) in every command."""
    _ck(tmp_path, {"a": "s1.safetensors"}, {"s1.safetensors": A})
    (tmp_path / "s1.safetensors").unlink()
    (tmp_path / "s1.safetensors").symlink_to(tmp_path / "s1.safetensors")
    with pytest.raises(CheckpointError, match=r"s1.safetensors: cannot be resolved \(.*\); expected a .safetensors file"):
        Checkpoint.open(tmp_path)


def test_single_file_checkpoint(tmp_path):
    write_file(tmp_path / "model.safetensors", A)
    (tmp_path / "config.json").write_text("{}")
    ck = Checkpoint.open(tmp_path)
    assert ck.names() == ["a"] and ck.total_bytes() == 16
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither"):
        Checkpoint.open(tmp_path)


def test_tensor_reads_are_zero_copy(tiny_fp8):
    ck = Checkpoint.open(tiny_fp8)
    name = "model.layers.0.self_attn.o_proj.weight"
    a = ck.get(name)
    assert not a.flags.owndata and not a.flags.writeable  # a view into the read-only map


# ------------------------------------------------------------------ writer ----

def test_writer_streams_chunks_and_checks_plan(tmp_path):
    x = np.arange(1000, dtype=np.float32).reshape(100, 10)
    entries = [Entry("x", "F32", (100, 10)), Entry("y", "I8", (3,))]
    with ShardWriter(tmp_path / "o.safetensors", entries) as w:
        for r in range(0, 100, 30):
            w.write("x", x[r:r + 30])
        with pytest.raises(ValueError, match="only 3 left"):
            w.write("y", np.zeros(4, np.int8))
        w.write("y", np.ones(3, np.int8))
        sha = w.close()
    f = SafetensorsFile(tmp_path / "o.safetensors")
    np.testing.assert_array_equal(f.get("x"), x)
    assert sha == sha256_file(tmp_path / "o.safetensors")
    with ShardWriter(tmp_path / "p.safetensors", entries) as w:
        with pytest.raises(ValueError, match="expected data for 'x'"):
            w.write("y", np.ones(3, np.int8))
        w.write("x", x)
        with pytest.raises(ValueError, match="not fully written"):
            w.close()
    assert not (tmp_path / "p.safetensors").exists()
    assert not list(tmp_path.glob("*.partial"))


def test_writer_exception_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path / "o.safetensors", [Entry("x", "F32", (4,))]) as w:
            w.write("x", np.zeros(2, np.float32))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_killed_writer_leaves_no_complete_looking_file(tmp_path):
    """SIGKILL mid-write: the final name never appears; only a .partial file is left."""
    script = textwrap.dedent(f"""
        import sys, time, numpy as np
        from ds_export.io.writer import Entry, ShardWriter
        w = ShardWriter({str(tmp_path / 'big.safetensors')!r}, [Entry('x', 'F32', (1024, 1024))])
        w.write('x', np.zeros((512, 1024), np.float32))
        print('half', flush=True)
        time.sleep(60)
        w.write('x', np.zeros((512, 1024), np.float32))
        w.close()
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "half"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    assert not (tmp_path / "big.safetensors").exists()
    assert (tmp_path / "big.safetensors.partial").exists()


def test_index_and_manifest(tmp_path):
    write_file(tmp_path / "s.safetensors", A)
    write_index(tmp_path, {"a": "s.safetensors"}, 16)
    ck = Checkpoint.open(tmp_path, need_config=False)
    assert ck.index_metadata["total_size"] == 16
    m = Manifest(tmp_path, run={"tool": "test"})
    m.record_file("s.safetensors")
    m2 = Manifest.load(tmp_path)
    assert m2.verify_file("s.safetensors") is None and not m2.complete
    with open(tmp_path / "s.safetensors", "r+b") as f:  # flip one data byte
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 1]))
    assert "sha256 differs" in m2.verify_file("s.safetensors")
    assert "not in the manifest" in m2.verify_file("other")


_SHA = "ab" * 32


@pytest.mark.parametrize("patch,msg", [
    ({"files": ["s.safetensors"]}, "files is ['s.safetensors'], expected a mapping"),
    ({"run": [1]}, "run is [1], expected a mapping"),
    ({"version": []}, "version is [], expected a positive integer"),
    ({"version": True}, "version is True, expected a positive integer"),
    ({"version": 0}, "version is 0, expected a positive integer"),
    ({"complete": "yes"}, "complete is 'yes', expected true or false"),
    ({"files": {"s.safetensors": "x"}}, "the record of s.safetensors is 'x'"),
    ({"files": {"s.safetensors": {"size": "16", "sha256": _SHA}}}, "the size of s.safetensors is '16'"),
    ({"files": {"s.safetensors": {"size": True, "sha256": _SHA}}}, "the size of s.safetensors is True"),
    ({"files": {"s.safetensors": {"size": 16, "sha256": 5}}}, "the sha256 of s.safetensors is 5"),
    ({"files": {"s.safetensors": {"size": 16, "sha256": _SHA.upper()}}}, "expected 64 hex digits"),
    ({"files": {"/etc/hostname": {"size": 16, "sha256": _SHA}}}, "'/etc/hostname' is not a path inside"),
    ({"files": {"../x": {"size": 16, "sha256": _SHA}}}, "'../x' is not a path inside"),
    ({"files": {"": {"size": 16, "sha256": _SHA}}}, "'' is not a path inside"),
])
def test_a_damaged_manifest_is_one_clear_error(tmp_path, patch, msg):
    """Every reader trusts the manifest's fields (records against files, `complete`): a damaged one was an internal
    error, taken at face value ("yes"), or sent verify to hash files outside the directory."""
    m = Manifest(tmp_path, run={"tool": "test"}, files={"a/s.safetensors": {"size": 16, "sha256": _SHA}}, complete=True)
    m.save()
    assert Manifest.load(tmp_path).files == m.files  # (a path with a folder is inside)
    obj = json.loads(m.path.read_text())
    m.path.write_text(json.dumps({**obj, **patch}))
    with pytest.raises(CheckpointError, match="damaged manifest: .*" + re.escape(msg)):
        Manifest.load(tmp_path)


def test_a_manifest_of_a_newer_dsx_is_refused(tmp_path):
    """A later manifest version may record what this dsx cannot judge (a directory it would call finished): say
    which version, and to upgrade, instead of reading it as version 1."""
    m = Manifest(tmp_path, run={"tool": "test"}, files={}, complete=True)
    m.save()
    obj = json.loads(m.path.read_text())
    m.path.write_text(json.dumps({**obj, "version": 2}))
    with pytest.raises(CheckpointError, match=r"written by a newer dsx \(manifest version 2; this dsx reads version "
                                              r"1\)"):
        Manifest.load(tmp_path)


def test_mmap_pages_are_released(tiny_fp8):
    f = SafetensorsFile(next(tiny_fp8.glob("model-00001-*.safetensors")))
    name = next(iter(f.tensors))
    _ = f.get(name).sum() if f.info(name).dtype == "F32" else f.raw(name).sum()
    f.advise_done(name)  # must not raise
    f.close()
    time.sleep(0)


def test_atomic_open_leaves_the_old_file_or_the_whole_new_one(tmp_path):
    """A report, an HTML page or dumped logits written in place were cut short by a failure or a kill, and looked
    like results: the file is the old one or the whole new one, and a failed write leaves no partial file."""
    from ds_export.io.writer import atomic_open

    p = tmp_path / "r.npz"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_open(p, "wb") as f:
            f.write(b"half of the new")
            raise RuntimeError("killed")
    assert p.read_bytes() == b"old" and sorted(x.name for x in tmp_path.iterdir()) == ["r.npz"]
    with atomic_open(p, "wb") as f:
        np.savez(f, a=np.arange(3))
    assert np.load(p)["a"].tolist() == [0, 1, 2] and sorted(x.name for x in tmp_path.iterdir()) == ["r.npz"]
    from ds_export.errors import UsageError

    for d in (tmp_path, tmp_path / "."):  # ("." was an internal error: it has no name to write beside)
        with pytest.raises(UsageError, match="is a directory; expected a file path"):
            with atomic_open(d) as f:
                f.write("x")


def test_write_behind_writes_in_order_and_hands_the_first_failure_back():
    """io.writer.WriteBehind (dsx quantize's chunks, dsx export's tensors): the sink runs in its own thread in put
    order; flush returns once every item is written; the sink's first failure is raised at the next put / flush /
    drain, the items after it are dropped; drain ends the thread."""
    import threading

    from ds_export.io.writer import WriteBehind

    got, gate = [], threading.Event()

    def sink(i, data):
        gate.wait(5)
        got.append((i, data))
    wb = WriteBehind(sink, depth=2, name="dsx-test-wb")
    wb.put(0, "a")
    assert got == []  # (the sink waits on the gate: put returned before the write)
    gate.set()
    wb.put(1, "b")
    wb.flush()
    assert got == [(0, "a"), (1, "b")]
    wb.drain()
    assert not wb.t.is_alive()

    def failing(i):
        if i == 1:
            raise OSError(28, "No space left on device")
        got.append(i)
    got.clear()
    wb = WriteBehind(failing, depth=1)
    wb.put(0)
    wb.put(1)
    with pytest.raises(OSError, match="No space"):
        wb.flush()
    with pytest.raises(OSError, match="No space"):
        wb.put(2)
    with pytest.raises(OSError, match="No space"):
        wb.drain()
    assert got == [0] and not wb.t.is_alive()


def test_write_hashed_hashes_beside_the_writes_and_waits_for_both(tmp_path):
    """io.writer.write_hashed (ShardWriter's bytes, dsx export's parameter files): the bytes are written in pieces of
    at most `chunk` and hashed whole; from `beside` bytes up the hash runs in a thread of its own while the writes go
    on (a write here waits until the hash has started), smaller buffers are hashed in the caller's thread; it returns
    once both are done, also when a write fails."""
    import hashlib
    import threading

    from ds_export.io.writer import write_hashed

    data = np.random.default_rng(3).integers(0, 256, 3 << 20, dtype=np.uint8)
    for n, chunk in [(0, 7), (5, 2), ((1 << 20) - 1, 1 << 18), (3 << 20, (1 << 20) + 3)]:
        pieces, sha = [], hashlib.sha256()
        assert write_hashed(lambda p: pieces.append(bytes(p)), sha, data[:n], chunk) == n
        assert b"".join(pieces) == data[:n].tobytes() and all(len(p) <= chunk for p in pieces)
        assert sha.hexdigest() == hashlib.sha256(data[:n].tobytes()).hexdigest(), n

    class Sha:  # (hashlib's object cannot be watched: this one tells where and when it ran)
        def __init__(self):
            self.started, self.threads, self.n = threading.Event(), [], 0

        def update(self, b):
            self.started.set()
            self.threads.append(threading.current_thread().name)
            time.sleep(0.05)
            self.n += memoryview(b).nbytes

    sha, waited = Sha(), []

    def write(piece):
        waited.append(sha.started.wait(5))
    assert write_hashed(write, sha, data, 1 << 20) == data.nbytes
    assert waited == [True] * 3 and sha.threads == ["dsx-hash"] and sha.n == data.nbytes
    sha = Sha()
    write_hashed(lambda p: None, sha, data[:100])
    assert sha.threads == [threading.current_thread().name]

    sha = Sha()

    def full(piece):
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space"):
        write_hashed(full, sha, data)
    assert sha.n == data.nbytes  # (the hash of the buffer finished before the error came back)
    assert not [t for t in threading.enumerate() if t.name == "dsx-hash"]
