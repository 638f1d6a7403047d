"""Where the per-chunk arithmetic runs: the C++ kernels (cpu) or a GPU (cuda).

Both backends give bit-identical results (the CUDA kernels are tested against
the CPU ones byte for byte), so the output of `dsx quantize` does not depend on
the device or on the number of GPUs. A CudaBackend belongs to one worker process
(the engine spawns one or more per GPU); its converter's streams and buffers live on
that GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ds_export.errors import UsageError
from ds_export.formats import fp8_block, weight_only


class CpuBackend:
    name = "cpu"

    def __init__(self, threads: int = 0):
        self.threads = threads

    def dequant(self, w_fp8, scale_inv, block, out_dtype: str, rows) -> np.ndarray:
        return fp8_block.dequant_native(w_fp8, scale_inv, block, out_dtype, rows=rows)

    def to_fp8(self, w_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fp8_block.quantize_native(w_rows, fp8_block.BLOCK)

    def fp8_to_weight_only(self, w_fp8, scale_inv, block, rows, bits, group, arch):
        return weight_only.quantize_fp8_rows_native(w_fp8, scale_inv, block, rows, bits, group, arch,
                                                    threads=self.threads)

    def rows_to_weight_only(self, w_rows, n_out, rows, bits, group, arch):
        return weight_only.quantize_rows_native(w_rows, n_out, rows, bits, group, arch, threads=self.threads)

    # A tensor's chunks in one call, results in order: the GPU backend overlaps chunk i's kernel with
    # chunk i+1's staging and upload and chunk i-1's download. The chunk sources are produced lazily
    # and must not call this backend themselves.
    def fp8_to_weight_only_chunks(self, w_fp8, scale_inv, block, ranges, bits, group, arch) -> Iterator:
        for rows in ranges:
            yield self.fp8_to_weight_only(w_fp8, scale_inv, block, rows, bits, group, arch)

    def rows_to_weight_only_chunks(self, chunks: Iterable, n_out, bits, group, arch) -> Iterator:
        """chunks: (w_rows, (r0, r1)) pairs."""
        for w_rows, rows in chunks:
            yield self.rows_to_weight_only(w_rows, n_out, rows, bits, group, arch)

    def to_fp8_chunks(self, chunks: Iterable) -> Iterator:
        """chunks: row blocks (float32 or bf16) of one tensor."""
        for w_rows in chunks:
            yield self.to_fp8(w_rows)

    def close(self) -> None:
        pass


class CudaBackend(CpuBackend):
    """The same calls on GPU `device`, through ds_export.native.cuda_quant.CudaConverter."""

    name = "cuda"

    def __init__(self, device: int, staging_threads: int = 8):
        super().__init__(staging_threads)  # the CPU kernels this backend still runs get as many threads
        from ds_export.native import cuda
        from ds_export.native.cuda_quant import CudaConverter

        cuda.set_device(device)
        self.device = device
        self.conv = CudaConverter(staging_threads=staging_threads)

    def dequant(self, w_fp8, scale_inv, block, out_dtype, rows):
        return self.conv.fp8_dequant_rows(w_fp8, scale_inv, block, rows, out_dtype)

    def to_fp8(self, w_rows):
        return self.conv.to_fp8_rows(w_rows, fp8_block.BLOCK)

    def fp8_to_weight_only(self, w_fp8, scale_inv, block, rows, bits, group, arch):
        return self.conv.fp8_to_weight_only_rows(w_fp8, scale_inv, block, w_fp8.shape[0], rows, bits, group, arch)

    def rows_to_weight_only(self, w_rows, n_out, rows, bits, group, arch):
        return self.conv.rows_to_weight_only_rows(w_rows, n_out, rows, bits, group, arch)

    # Through the converter's pipeline (two slots of pinned host + device buffers, copy-in, compute and
    # copy-out streams): the same jobs, hence the same bytes, as the one-chunk calls above.
    def fp8_to_weight_only_chunks(self, w_fp8, scale_inv, block, ranges, bits, group, arch):
        from ds_export.native import cuda_quant as cq

        n = w_fp8.shape[0]
        return self.conv.convert_chunks(cq.fp8_to_weight_only_job(w_fp8, scale_inv, block, n, rows, bits, group, arch)
                                        for rows in ranges)

    def rows_to_weight_only_chunks(self, chunks, n_out, bits, group, arch):
        from ds_export.native import cuda_quant as cq

        return self.conv.convert_chunks(cq.rows_to_weight_only_job(w, n_out, rows, bits, group, arch)
                                        for w, rows in chunks)

    def to_fp8_chunks(self, chunks):
        from ds_export.native import cuda_quant as cq

        return self.conv.convert_chunks(cq.to_fp8_job(w, fp8_block.BLOCK) for w in chunks)

    def close(self) -> None:
        self.conv.close()


def parse_gpus(device: str, gpus: str | None) -> list[int]:
    """--device/--gpus -> the GPU indices to use ([] for cpu)."""
    if device == "cpu":
        if gpus:
            raise UsageError("--gpus needs --device cuda")
        return []
    if device != "cuda":
        raise UsageError(f"--device {device!r}: expected cpu or cuda")
    from ds_export.native import cuda

    if not cuda.available():
        raise UsageError("--device cuda: no CUDA device is visible", hint="use --device cpu")
    n = cuda.device_count()
    if not gpus:
        return list(range(n))
    try:
        ids = [int(x) for x in gpus.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {gpus!r}: expected a comma-separated list of GPU indices") from None
    bad = [i for i in ids if not 0 <= i < n]
    if bad or not ids or len(set(ids)) != len(ids):
        raise UsageError(f"--gpus {gpus!r}: {n} GPU(s) visible (indices 0..{n - 1}), each listed once")
    return ids
