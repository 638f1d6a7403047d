"""Quantized Linear layers of the export model: Paddle Layers over the dsx custom operators.

`WeightOnlyLinear` ("weight_only" LinearWeights) and `Fp8Linear` ("fp8") hold the stored quantized
tensors as parameters in their own dtypes (int8, bf16, float32, fp8; saved into .pdiparams exactly) and call the
ops of `ops.py` (ops/dsx_paddle_ops.cc, CPU kernels from csrc/). Layouts: weights.py and
docs/export-model.md; `modeling.LINEAR_FORMATS` maps the format name to these classes.
"""

from __future__ import annotations

from paddle import nn

from ds_export.export.params import make_param
from ds_export.export.weights import LinearWeights


class WeightOnlyLinear(nn.Layer):
    """y = x @ dequant(qweight, scale)^T through the dsx_wo_linear op (ops/dsx_paddle_ops.cc).

    Buffers: qweight int8 [N, K] (int8) or [N/2, K] (int4), Paddle weight_quantize layout for
    `arch`; scale bf16 [N] (group -1) or [ceil(K/g), N]. The op rounds x to bf16 and returns
    bf16-exact values in x's dtype (float32 here), i.e. a bf16 GEMM whatever the model dtype.
    """

    def __init__(self, lw: LinearWeights, dtype: str):
        super().__init__()
        from ds_export.export.ops import load_ops

        t = lw.tensors
        self.bits, self.group, self.arch = int(t["bits"]), int(t["group"]), int(t["arch"])
        self.qweight = make_param(self, t["qweight"])
        self.scale = make_param(self, t["scale"])
        self._op = load_ops().dsx_wo_linear

    def forward(self, x):
        return self._op(x, self.qweight, self.scale, self.bits, self.group, self.arch)


class Fp8Linear(nn.Layer):
    """y = fp8_gemm(act_quant_1x128(x), weight, scale_inv) through the dsx_fp8_linear op.

    Buffers: weight float8_e4m3fn [N, K] (HF layout), scale_inv float32 [ceil(N/128), ceil(K/128)].
    x (float32 here) is quantized per token in 1x128 groups (amax/448); the output is bf16-exact.
    """

    def __init__(self, lw: LinearWeights, dtype: str):
        super().__init__()
        from ds_export.export.ops import load_ops

        self.weight = make_param(self, lw.tensors["weight"])
        self.scale_inv = make_param(self, lw.tensors["scale_inv"])
        self._op = load_ops().dsx_fp8_linear

    def forward(self, x):
        return self._op(x, self.weight, self.scale_inv)
