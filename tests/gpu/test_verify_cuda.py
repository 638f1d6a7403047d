"""GPU machine: dsx verify --device cuda runs every kernel check through the CUDA kernels and agrees with --device cpu."""

from __future__ import annotations

import re

import pytest

from ds_export.cli.app import main
from ds_export.native import cuda
from ds_export.verify import verify
from ds_export.verify.kernels import KERNEL_GATE

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny model with DeepSeek-V3's 512-d latent (so MLA decode runs) in the mixed format."""
    from ds_export.tiny import TinySpec, write_tiny

    root = tmp_path_factory.mktemp("vc")
    write_tiny(root / "src", TinySpec(overrides=(("kv_lora_rank", 512),)))
    assert main(["quantize", str(root / "src"), "--out", str(root / "q"), "--type", "a8w8_fp8_wint4", "--mtp-type",
                 "a8w8_fp8", "-q"]) == 0
    return root


def _key(k: dict) -> tuple:
    """The check without its device: (kernel name, tensor)."""
    return re.sub(r"\b(cpu|cuda)\b", "dev", k["kernel"]), k["tensor"]


def test_cuda_kernel_checks_agree_with_cpu(converted):
    cpu = verify(converted / "q", converted / "src", samples=4, device="cpu")
    gpu = verify(converted / "q", converted / "src", samples=4, device="cuda")
    assert cpu["ok"] and gpu["ok"] and gpu["device"] == "cuda"
    kc, kg = {_key(k): k for k in cpu["kernels"]}, {_key(k): k for k in gpu["kernels"]}
    assert set(kc) == set(kg)
    kinds = {k[0].split(" (")[0] for k in kg}
    assert {"block fp8 gemm", "weight_only_int4 gemm", "grouped fp8 gemm", "mla decode", "mtp accept"} <= kinds
    for key, g in kg.items():
        assert g["kernel_err"] <= KERNEL_GATE, key
        c = kc[key]
        if c["quant_sqnr_db"] is not None:  # the same quantization error, whichever device computed it
            assert abs(g["quant_sqnr_db"] - c["quant_sqnr_db"]) < 1.0, (key, g, c)


def test_cli_device_cuda(converted, capsys):
    assert main(["verify", str(converted / "q"), "--reference", str(converted / "src"), "--device", "cuda",
                 "--samples", "1"]) == 0
    assert "kernels (csrc, CUDA)" in capsys.readouterr().out
