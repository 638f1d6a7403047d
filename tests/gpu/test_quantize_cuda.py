"""GPU machine: dsx quantize --device cuda [--gpus ...] writes the same bytes as the CPU path."""

from __future__ import annotations

import pytest

from ds_export.cli.app import main
from ds_export.io.writer import sha256_file
from ds_export.native import cuda

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

TYPES = [["--type", "a8w8_fp8_wint4", "--mtp-type", "a8w8_fp8"], ["--type", "weight_only_int8", "--group-size", "128"],
         ["--type", "bf16"], ["--type", "weight_only_int4", "--arch", "80"]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ds_export.tiny import TinySpec, write_tiny

    out = tmp_path_factory.mktemp("t") / "tiny"
    write_tiny(out, TinySpec())
    bf = tmp_path_factory.mktemp("t") / "tiny-bf16"
    write_tiny(bf, TinySpec(dtype="bf16"))
    return out, bf


def _files(d):
    return {p.name: sha256_file(p) for p in sorted(d.iterdir()) if p.name != "dsx-manifest.json"}


@pytest.mark.parametrize("args", TYPES, ids=lambda a: a[1])
def test_cuda_output_is_byte_identical(tiny, tmp_path, args):
    for src in tiny:
        cpu, gpu = tmp_path / f"cpu-{src.name}", tmp_path / f"gpu-{src.name}"
        assert main(["quantize", str(src), "--out", str(cpu), "-q", *args]) == 0
        assert main(["quantize", str(src), "--out", str(gpu), "-q", "--device", "cuda", "--gpus", "0", *args]) == 0
        assert _files(cpu) == _files(gpu)
        shared = tmp_path / f"shared-{src.name}"  # three worker processes on one GPU
        assert main(["quantize", str(src), "--out", str(shared), "-q", "--device", "cuda", "--gpus", "0",
                     "--workers", "3", *args]) == 0
        assert _files(cpu) == _files(shared)
        if cuda.device_count() > 1:
            multi = tmp_path / f"multi-{src.name}"
            assert main(["quantize", str(src), "--out", str(multi), "-q", "--device", "cuda", *args]) == 0
            assert _files(cpu) == _files(multi)


def test_bad_gpu_list(tiny, tmp_path, capsys):
    assert main(["quantize", str(tiny[0]), "--out", str(tmp_path / "x"), "--type", "bf16", "--device", "cuda",
                 "--gpus", "99"]) == 2
    assert "GPU(s) visible" in capsys.readouterr().err
