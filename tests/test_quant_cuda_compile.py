"""csrc/cuda/quant_convert.cu without a GPU: it compiles for sm_90a, and its arithmetic is the CPU's.

1. nvcc (skipped where absent) compiles the file for sm_90a; ptxas reports no local
   memory (stack frame) in the kernels of the FP8 / bf16 paths.
2. Host emulation: the same file built by the host compiler with
   -DDSX_QUANT_CUDA_HOST_EMULATION runs the kernels' element and unit functions
   (quant_convert.cuh: decode, x86 NaN rules, bf16 / e4m3 encoding, round-half-away,
   Paddle's tile permutation and packing) in host loops, behind entry points with the
   kernels' signatures. HostRunner drives ds_export.native.cuda_quant's jobs through
   them, so the Python job layer is exercised too; results must equal the CPU kernels
   bit for bit. (What this cannot see: the kernels' thread mapping, reductions and
   vector accesses; tests/gpu/test_quant_cuda.py checks those on the GPU.)
3. The jobs' input checks (DsxError), which need no GPU.
"""

from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import fp8_block, weight_only
from ds_export.native import cuda_quant as cq
from ds_export.native.build import CSRC

BF16 = ml_dtypes.bfloat16
UNIT = CSRC / "cuda" / "quant_convert.cu"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
CXX = shutil.which("g++") or shutil.which("c++")
EMUL_NAMES = {"deq": "dsxq_emul_dequant", "wo": "dsxq_emul_wo", "fq": "dsxq_emul_fp8q"}


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_compiles_sm90a(tmp_path):
    cmd = [NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-O3",
           "-Xcompiler", "-fPIC", "-Xptxas", "-v", f"-I{CSRC / 'include'}", "-c", str(UNIT), "-o",
           str(tmp_path / "quant_convert.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"nvcc failed:\n{log[-4000:]}"
    blocks = log.split("Compiling entry function")[1:]
    names = [b.split("'")[1] for b in blocks]
    for want in ("wo_kernelILi4ENS_7Fp8Rows", "wo_kernelILi8ENS_7Fp8Rows", "wo_kernelILi4ENS_8Bf16Rows",
                 "dequant_kernelILb1", "fp8_quant_kernelINS_8F32Elems"):
        hit = [b for b, nm in zip(blocks, names) if want in nm]
        assert hit, f"kernel {want} not instantiated: {names}"
        assert "0 bytes stack frame" in hit[0], f"{want} uses local memory:\n{hit[0][:400]}"


# ---------------------------------------------------------------- host emulation


@pytest.fixture(scope="module")
def emul(tmp_path_factory):
    if CXX is None:
        pytest.skip("no host C++ compiler")
    so = tmp_path_factory.mktemp("emul") / "libquant_emul.so"
    cmd = [CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-x", "c++",
           "-DDSX_QUANT_CUDA_HOST_EMULATION", f"-I{CSRC / 'include'}", str(UNIT), "-o", str(so)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return HostRunner(ctypes.CDLL(str(so)))


class HostRunner:
    """Runs cuda_quant jobs through the host twins of the entry points (same signatures)."""

    def __init__(self, lib: ctypes.CDLL):
        self.fns = cq.bind_entry_points(lib, EMUL_NAMES)

    def run(self, job: cq.Job):
        ins = [np.ascontiguousarray(a).copy() for a in job.inputs]
        outs = [np.empty(shape, dt) for shape, dt in job.outputs]
        for o in outs:
            o.view(np.uint8)[...] = 0xA5  # poison
        status = np.zeros(1, np.int32)
        rc = job.launch(self.fns, [a.ctypes.data for a in ins], [o.ctypes.data for o in outs], status.ctypes.data,
                        None)
        if rc:
            raise DsxError(f"{job.what}: emulated entry point returned {rc}")
        return job.finish(outs, int(status[0]))

    def convert_chunks(self, jobs, copy=True):
        for job in jobs:
            yield self.run(job)

    fp8_to_weight_only_rows = cq.CudaConverter.fp8_to_weight_only_rows
    rows_to_weight_only_rows = cq.CudaConverter.rows_to_weight_only_rows
    fp8_dequant_rows = cq.CudaConverter.fp8_dequant_rows
    to_fp8_rows = cq.CudaConverter.to_fp8_rows
    fp8_requant_rows = cq.CudaConverter.fp8_requant_rows


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def fp8_case(rng, n, k, block):
    bn, bk = block
    w = rng.integers(0, 256, (n, k), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0x7E
    s = rng.uniform(1e-4, 5e-2, (-(-n // bn), -(-k // bk))).astype(np.float32)
    w[5], w[5, 0], w[7, :64] = 0, 0x80, 0  # all-zero channel with -0.0 first, a zero group
    w[9] = rng.choice([0x08, 0x88], k)
    s[9 // bn] = 2.0**-126  # bf16 subnormals; amax / bound rounds to 0 on row 9
    s[-1, 0] = 2.0**-4  # exact quotients: round-half-away ties
    return w, s


@pytest.mark.parametrize("bits,group", list(itertools.product([4, 8], [-1, 64, 128])))
def test_emulated_fp8_to_weight_only(emul, bits, group):
    rng = np.random.default_rng(bits * 1000 + group)
    for n, k, block in [(128, 192, (128, 128)), (192, 320, (64, 96)), (64, 128, (32, 48))]:
        w, s = fp8_case(rng, n, k, block)
        for rows in [(0, n), (8, n - 24)]:
            ref = weight_only.quantize_rows_native(fp8_block.dequant_native(w, s, block, "bfloat16", rows=rows), n,
                                                   rows, bits, group, 90)
            got = emul.fp8_to_weight_only_rows(w, s, block, n, rows, bits, group, 90)
            assert same(got[0], ref[0]) and same(got[1], ref[1]), (n, k, block, rows)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_emulated_rows_to_weight_only(emul, dtype):
    rng = np.random.default_rng(1)
    n, k = 128, 256
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 1e-30], (n, 1))).astype(np.float32)
    x[3], x[3, 0], x[9, :64] = 0, -0.0, 0
    x[11] = np.round(rng.uniform(-14, 14, k)) * 0.0625  # ties of round-half-away
    x[11, 0] = 0.875
    src = x.astype(BF16) if dtype == "bf16" else x
    for bits, group in itertools.product([4, 8], [-1, 64, 128]):
        ref = weight_only.quantize_rows_native(src, n, (0, n), bits, group, 90)
        got = emul.rows_to_weight_only_rows(src, n, (0, n), bits, group)
        assert same(got[0], ref[0]) and same(got[1], ref[1]), (bits, group)


def test_emulated_dequant(emul):
    rng = np.random.default_rng(2)
    for (n, k), block, od in itertools.product([(130, 200), (140, 256)], [(128, 128), (32, 48)],
                                               ["bfloat16", "float32"]):
        w = rng.integers(0, 256, (n, k), dtype=np.uint8)  # NaN codes included
        s = rng.uniform(1e-4, 5e-2, (-(-n // block[0]), -(-k // block[1]))).astype(np.float32)
        s[0, 0], s[1, 1], s[-1, -1], s[0, -1] = np.nan, np.inf, 2.0**-140, 3e36
        w[block[0]:block[0] + 3, block[1]:block[1] + 5] = 0
        for rows in [(0, n), (3, n - 7)]:
            assert same(emul.fp8_dequant_rows(w, s, block, rows, od),
                        fp8_block.dequant_native(w, s, block, od, rows=rows)), (n, k, block, od, rows)


def test_emulated_to_fp8_and_requant(emul):
    rng = np.random.default_rng(3)
    for (n, k), block, dtype in itertools.product([(300, 200), (256, 128)], [(128, 128), (64, 96)], ["f32", "bf16"]):
        x = rng.standard_normal((n, k)).astype(np.float32)
        x[: block[0], : block[1]] = 0
        x[block[0]: 2 * block[0], : block[1]] *= 1e-44
        x[-1, -4:] = [448.0, -464.0, 2.0**-9, 3 * 2.0**-10]
        src = x.astype(BF16) if dtype == "bf16" else x
        for rows in [(0, n), (block[0], n)]:
            ref = fp8_block.quantize_native(src, block, rows=rows)
            got = emul.to_fp8_rows(src, block, rows)
            assert same(got[0], ref[0]) and same(got[1], ref[1]), (n, k, block, dtype, rows)
    w = rng.integers(0, 0x7E, (320, 264), dtype=np.uint8)
    s = rng.uniform(1e-3, 1.0, (5, 5)).astype(np.float32)
    for rows in [(0, 320), (128, 320)]:
        ref = fp8_block.quantize_native(fp8_block.dequant_native(w, s, (64, 64), "float32", rows=rows))
        got = emul.fp8_requant_rows(w, s, (64, 64), (128, 128), rows)
        assert same(got[0], ref[0]) and same(got[1], ref[1]), rows


@pytest.mark.parametrize("scale", [np.nan, np.inf, -np.inf, 3e38, 7.59e35, 1e30, -2.0**-4, 0.0])
@pytest.mark.parametrize("group", [-1, 128])
def test_emulated_special_scales(emul, scale, group):
    """The per-channel pass takes |code| maxima: it must agree with the CPU's per-value absmax."""
    rng = np.random.default_rng(6)
    w, s = fp8_case(rng, 128, 256, (128, 128))
    s[0, 1] = scale
    cpu = gpu = None
    try:
        cpu = weight_only.quantize_rows_native(fp8_block.dequant_native(w, s, out_dtype="bfloat16"), 128, (0, 128), 4,
                                               group)
    except DsxError:
        pass
    try:
        gpu = emul.fp8_to_weight_only_rows(w, s, (128, 128), 128, (0, 128), 4, group)
    except DsxError:
        pass
    assert (cpu is None) == (gpu is None)
    assert cpu is None or (same(gpu[0], cpu[0]) and same(gpu[1], cpu[1]))


def test_emulated_nonfinite_and_planted_fault(emul):
    rng = np.random.default_rng(4)
    w, s = fp8_case(rng, 64, 128, (128, 128))
    q, sc = emul.fp8_to_weight_only_rows(w, s, (128, 128), 64, (0, 64), 4)
    ref = weight_only.quantize_rows_native(fp8_block.dequant_native(w, s, out_dtype="bfloat16"), 64, (0, 64), 4)
    assert same(q, ref[0])
    q[100] ^= 0x01  # one nibble off: detected
    assert not same(q, ref[0])
    w[33, 7] = 0xFF
    for group in (-1, 128):
        with pytest.raises(DsxError, match="NaN or Inf"):
            emul.fp8_to_weight_only_rows(w, s, (128, 128), 64, (0, 64), 4, group)
    with pytest.raises(DsxError, match="inf/NaN"):
        emul.to_fp8_rows(np.full((4, 4), np.inf, np.float32), (1, 4))


# ---------------------------------------------------------------- input checks (no GPU)


@pytest.mark.parametrize("make,match", [
    (lambda: cq.fp8_to_weight_only_job(np.zeros((128, 100), np.uint8), np.ones((1, 1), np.float32), (128, 128), 128,
                                       (0, 128), 4), "multiples of 64"),
    (lambda: cq.fp8_to_weight_only_job(np.zeros((128, 128), np.uint8), np.ones((1, 1), np.float32), (128, 128), 128,
                                       (4, 128), 4), "multiples of 8"),
    (lambda: cq.fp8_to_weight_only_job(np.zeros((128, 128), np.uint8), np.ones((2, 1), np.float32), (128, 128), 128,
                                       (0, 128), 4), "scale_inv must be float32"),
    (lambda: cq.fp8_to_weight_only_job(np.zeros((128, 128), np.uint8), np.ones((1, 1), np.float32), (128, 128), 128,
                                       (0, 128), 4, arch=70), "arch >= 75"),
    (lambda: cq.fp8_to_weight_only_job(np.zeros((128, 128), np.float32), np.ones((1, 1), np.float32), (128, 128),
                                       128, (0, 128), 4), "float8_e4m3fn"),
    (lambda: cq.fp8_to_weight_only_job(np.zeros((64, 128), np.uint8), np.ones((1, 1), np.float32), (128, 128), 128,
                                       (0, 128), 4), "fit neither"),
    (lambda: cq.rows_to_weight_only_job(np.zeros((64, 64), np.float16), 64, (0, 64), 4), "bfloat16 or float32"),
    (lambda: cq.rows_to_weight_only_job(np.zeros((64, 64), np.float32), 64, (0, 64), 3), "bits must be 4 or 8"),
    (lambda: cq.fp8_dequant_job(np.zeros((10, 10), np.uint8), np.ones((1, 1), np.float32), (128, 128), (5, 11)),
     "outside"),
    (lambda: cq.fp8_dequant_job(np.zeros((10, 10), np.uint8), np.ones((1, 1), np.float32), out_dtype="f16"),
     "out_dtype"),
    (lambda: cq.to_fp8_job(np.zeros((300, 10), np.float32), rows=(100, 300)), "multiples of 128"),
    (lambda: cq.fp8_requant_job(np.zeros((300, 10), np.uint8), np.ones((3, 1), np.float32), (128, 0)), "block"),
])
def test_job_checks(make, match):
    with pytest.raises(DsxError, match=match):
        make()


@pytest.mark.parametrize("src,qtype,extra", [("fp8", "a8w8_fp8_wint4", {}),
                                             ("bf16", "weight_only_int4", {"group_size": 128}),
                                             ("bf16", "a8w8_fp8", {})])
def test_cuda_backend_chunk_pipeline_writes_the_cpu_bytes(emul, tiny_fp8, tiny_bf16, src, qtype, extra):
    """quant.transforms hands a tensor's chunks to the backend in one call (fp8_to_weight_only_chunks,
    rows_to_weight_only_chunks, to_fp8_chunks); CudaBackend runs them as one convert_chunks pipeline
    of the same jobs. Here its converter is the host twin of the CUDA entry points: every output
    byte equals the CPU backend's, over several chunks a tensor; a backend that drops a chunk fails."""
    from ds_export.io.checkpoint import Checkpoint
    from ds_export.quant import plan as plan_mod, transforms
    from ds_export.quant.backend import CpuBackend, CudaBackend

    ck = Checkpoint.open(tiny_fp8 if src == "fp8" else tiny_bf16)
    recipe = plan_mod.load_recipe(qtype, None, arch=None, group_size=extra.get("group_size"), mtp_type=None)
    tasks = [t for t in plan_mod.build(ck, recipe).tasks() if not t.passthrough]
    gpu = object.__new__(CudaBackend)  # no device: the converter is the host twin
    gpu.threads, gpu.conv = 1, emul

    def run(be):
        outs = {}
        for t in tasks:
            transforms.convert(ck, t, lambda name, a: outs.setdefault(name, []).append(np.asarray(a).tobytes()),
                               chunk_bytes=16 << 10, backend=be)
        return outs

    want, got = run(CpuBackend()), run(gpu)
    assert got == want
    assert max(len(v) for v in got.values()) > 2  # several chunks a tensor went through one pipeline

    class Drops(CudaBackend):
        def fp8_to_weight_only_chunks(self, *a):
            return list(super().fp8_to_weight_only_chunks(*a))[:-1]

        rows_to_weight_only_chunks = to_fp8_chunks = lambda self, chunks, *a: list(chunks)[:0]

    bad = object.__new__(Drops)
    bad.threads, bad.conv = 1, emul
    with pytest.raises(ValueError, match="zip"):
        run(bad)
