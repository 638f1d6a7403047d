// Paddle custom operators over the dsx C ABI (csrc/include/dsx.h), CPU kernels.
//
// This file is the only place that sees both Paddle and dsx. It is compiled together with
// csrc/cpu/{gemm_weight_only,gemm_fp8,quant_fp8}.cc into one op library (ds_export/export/ops.py),
// so a predictor process needs only this .so.
//
//   dsx_wo_linear(x [..., K] f32|bf16, qweight int8 [N, K] (bits 8) | [N/2, K] (bits 4),
//                 scale bf16 [N] | [ceil(K/g), N]; bits, group_size, arch) -> [..., N], x's dtype
//       out = x @ dequant(qweight, scale)^T  (Paddle weight_quantize layout, see
//       csrc/include/dsx/gemm_weight_only.h); float32 x is rounded to bf16 first.
//   dsx_fp8_linear(x [..., K] f32|bf16, weight fp8 e4m3 [N, K], scale_inv f32 [ceil(N/128), ceil(K/128)])
//       -> [..., N], x's dtype: per-token 1x128 activation quant (amax/448) then the block FP8 GEMM
//       (csrc/include/dsx/gemm_fp8.h), bf16 output.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dsx.h"
#include "paddle/extension.h"

namespace {

void check_rc(int rc, const char* what) {
  PD_CHECK(rc == 0, std::string(what) + " failed with dsx code " + std::to_string(rc) +
                        " (bad shape or argument, see csrc/include/dsx.h)");
}

int64_t rows_of(const std::vector<int64_t>& shape) {
  int64_t m = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
  return m;
}

// x as bf16 bits [M, K]: a view of x when x is bf16, else a rounded copy in `buf`.
const uint16_t* bf16_rows(const paddle::Tensor& x, std::vector<uint16_t>* buf) {
  if (x.dtype() == paddle::DataType::BFLOAT16) return static_cast<const uint16_t*>(x.data());
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "dsx linear: x must be float32 or bfloat16");
  buf->resize(x.numel());
  check_rc(dsx_f32_to_bf16(x.data<float>(), x.numel(), buf->data()), "dsx_f32_to_bf16");
  return buf->data();
}

// bf16 result bits [M, N] -> a tensor of x's dtype with x's leading dims.
paddle::Tensor finish(const std::vector<uint16_t>& out, const paddle::Tensor& x, int64_t n) {
  std::vector<int64_t> shape = x.shape();
  shape.back() = n;
  paddle::Tensor y = paddle::empty(shape, x.dtype(), x.place());
  if (x.dtype() == paddle::DataType::BFLOAT16) {
    if (!out.empty()) std::memcpy(y.data(), out.data(), out.size() * sizeof(uint16_t));
  } else {
    float* dst = y.data<float>();
    for (size_t i = 0; i < out.size(); ++i) {
      uint32_t bits = static_cast<uint32_t>(out[i]) << 16;
      std::memcpy(dst + i, &bits, sizeof(float));
    }
  }
  return y;
}

}  // namespace

std::vector<paddle::Tensor> WoLinear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                     const paddle::Tensor& scale, int bits, int group_size, int arch) {
  PD_CHECK(x.is_cpu() && qweight.is_cpu() && scale.is_cpu(), "dsx_wo_linear: CPU tensors only");
  PD_CHECK(qweight.dtype() == paddle::DataType::INT8 && qweight.shape().size() == 2,
           "dsx_wo_linear: qweight must be int8 [N, K] or [N/2, K]");
  PD_CHECK(scale.dtype() == paddle::DataType::BFLOAT16, "dsx_wo_linear: scale must be bfloat16");
  const int64_t k = qweight.shape()[1];
  const int64_t n = qweight.shape()[0] * (bits == 4 ? 2 : 1);
  PD_CHECK(x.shape().back() == k, "dsx_wo_linear: x has " + std::to_string(x.shape().back()) +
                                      " features, qweight expects K = " + std::to_string(k));
  const int64_t m = rows_of(x.shape());
  std::vector<uint16_t> xb, out(static_cast<size_t>(m * n));
  const uint16_t* xp = bf16_rows(x, &xb);
  check_rc(dsx_wo_gemm_bf16_nt_cpu(xp, qweight.data<int8_t>(), static_cast<const uint16_t*>(scale.data()),
                                   out.data(), m, n, k, bits, group_size, arch, 0),
           "dsx_wo_gemm_bf16_nt_cpu");
  return {finish(out, x, n)};
}

std::vector<paddle::Tensor> Fp8Linear(const paddle::Tensor& x, const paddle::Tensor& weight,
                                      const paddle::Tensor& scale_inv) {
  PD_CHECK(x.is_cpu() && weight.is_cpu() && scale_inv.is_cpu(), "dsx_fp8_linear: CPU tensors only");
  PD_CHECK(weight.dtype() == paddle::DataType::FLOAT8_E4M3FN && weight.shape().size() == 2,
           "dsx_fp8_linear: weight must be float8_e4m3fn [N, K]");
  PD_CHECK(scale_inv.dtype() == paddle::DataType::FLOAT32, "dsx_fp8_linear: scale_inv must be float32");
  const int64_t n = weight.shape()[0], k = weight.shape()[1], kb = (k + 127) / 128;
  PD_CHECK(x.shape().back() == k, "dsx_fp8_linear: x has " + std::to_string(x.shape().back()) +
                                      " features, weight expects K = " + std::to_string(k));
  PD_CHECK(scale_inv.numel() == ((n + 127) / 128) * kb, "dsx_fp8_linear: scale_inv must be [ceil(N/128), ceil(K/128)]");
  const int64_t m = rows_of(x.shape());
  std::vector<uint16_t> out(static_cast<size_t>(m * n));
  if (m > 0) {
    std::vector<uint8_t> a(static_cast<size_t>(m * k));
    std::vector<float> sa(static_cast<size_t>(m * kb));
    if (x.dtype() == paddle::DataType::BFLOAT16) {
      check_rc(dsx_fp8_act_quant_bf16_rowmajor(static_cast<const uint16_t*>(x.data()), m, k, 128, 0, m, a.data(),
                                               sa.data()), "dsx_fp8_act_quant_bf16_rowmajor");
    } else {
      PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "dsx_fp8_linear: x must be float32 or bfloat16");
      check_rc(dsx_fp8_act_quant_f32_rowmajor(x.data<float>(), m, k, 128, 0, m, a.data(), sa.data()),
               "dsx_fp8_act_quant_f32_rowmajor");
    }
    check_rc(dsx_gemm_fp8_nt_cpu(a.data(), sa.data(), static_cast<const uint8_t*>(weight.data()),
                                 scale_inv.data<float>(), out.data(), m, n, k), "dsx_gemm_fp8_nt_cpu");
  }
  return {finish(out, x, n)};
}

std::vector<std::vector<int64_t>> WoLinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>& q,
                                                const std::vector<int64_t>& s, int bits, int group_size, int arch) {
  std::vector<int64_t> y = x;
  y.back() = q[0] * (bits == 4 ? 2 : 1);
  return {y};
}

std::vector<std::vector<int64_t>> Fp8LinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                 const std::vector<int64_t>& s) {
  std::vector<int64_t> y = x;
  y.back() = w[0];
  return {y};
}

std::vector<paddle::DataType> SameAsX3(const paddle::DataType& x, const paddle::DataType&, const paddle::DataType&) {
  return {x};
}

PD_BUILD_OP(dsx_wo_linear)
    .Inputs({"X", "QWeight", "Scale"})
    .Outputs({"Out"})
    .Attrs({"bits: int", "group_size: int", "arch: int"})
    .SetKernelFn(PD_KERNEL(WoLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(WoLinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameAsX3));

PD_BUILD_OP(dsx_fp8_linear)
    .Inputs({"X", "Weight", "ScaleInv"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(Fp8Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(Fp8LinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameAsX3));
