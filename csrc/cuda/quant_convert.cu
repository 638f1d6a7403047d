// GPU conversion kernels of `dsx quantize --device cuda` (C ABI: include/dsx/quant_cuda.h):
// FP8 block dequant, fused FP8 / bf16 / float32 -> weight-only INT8 / INT4 in Paddle's
// layout, and block-FP8 quantization (also FP8 requant), each bit-identical with the CPU
// kernels. Element and unit operations live in quant_convert.cuh (host + device).
//
// Work mapping:
//  - weight-only: one warp per output channel (row); lane l takes the 32-element units
//    l, l+32, ... of the row (32 fp8 bytes = two 16-byte loads; the unit's int4 output
//    is one 16-byte store, int8 two, at the unit's place in Paddle's tiled layout).
//    Per channel (group -1): pass 1 takes the row's absmax (warp max-reduction), pass 2
//    quantizes (the re-read hits L1/L2). Group 64 / 128: a group is 2 / 4 adjacent units,
//    i.e. adjacent lanes, reduced with two xor-shuffles, in one pass.
//  - dequant: one 128-thread block per row, 16 elements per thread and step.
//  - block-FP8 quant: one 256-thread block per (bn x bk) block: amax pass, block
//    reduction, encode pass; a warp walks rows, its lanes consecutive columns.
// Built without -DDSX_QUANT_CUDA_HOST_EMULATION this file holds the kernels and the C
// entry points; with it (host compiler only), host loops over the same unit functions,
// which tests/test_quant_cuda_compile.py compares with the CPU kernels.
#include <stdint.h>

#include "dsx.h"
#include "quant_convert.cuh"

namespace dsxq {

constexpr uint32_t kFull = 0xFFFFFFFFu;
constexpr int kWoWarps = 8;
constexpr int kDeqThreads = 128;
constexpr int kFqThreads = 256;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Arguments shared by the entry points and the host emulation.
struct WoArgs {
  int64_t n, k, r0, r1;
  int bits, group, arch;
};

bool wo_valid(const WoArgs& a) {
  if (a.bits != 4 && a.bits != 8) return false;
  if (a.group != -1 && a.group != 64 && a.group != 128) return false;
  if (a.arch != 75 && a.arch != 80 && a.arch != 86 && a.arch != 89 && a.arch != 90 && a.arch != 100) return false;
  if (a.n <= 0 || a.k <= 0 || a.n % 64 || a.k % 64 || a.k > (int64_t{1} << 30)) return false;
  return 0 <= a.r0 && a.r0 < a.r1 && a.r1 <= a.n && a.r0 % 8 == 0 && a.r1 % 8 == 0;
}

bool block_valid(int64_t n, int64_t k, int64_t bn, int64_t bk) {
  return n >= 0 && k >= 0 && bn > 0 && bk > 0 && n < (int64_t{1} << 40) && k < (int64_t{1} << 30) &&
         bn < (int64_t{1} << 30) && bk < (int64_t{1} << 30);
}

#ifndef DSX_QUANT_CUDA_HOST_EMULATION

// ---- kernels --------------------------------------------------------------------------

template <bool BF16>
__global__ void __launch_bounds__(kDeqThreads)
    dequant_kernel(const uint8_t* __restrict__ w, const float* __restrict__ s, int64_t k, int64_t r0,
                   int bn, int bk, int nbk, void* __restrict__ out, bool vec) {
  const int64_t rr = blockIdx.x;
  const float* sr = s + ((r0 + rr) / bn - r0 / bn) * nbk;
  const uint8_t* wrow = w + rr * k;
  char* orow = static_cast<char*>(out) + rr * k * (BF16 ? 2 : 4);
  for (int64_t c0 = 16 * static_cast<int64_t>(threadIdx.x); c0 < k; c0 += 16 * kDeqThreads)
    dequant16<BF16>(wrow, sr, k, bk, c0, orow, vec);
}

struct WoOut {
  uint8_t* q;
  uint16_t* scale;
  int* status;
  int64_t rows, k;
  int group;
};

template <int BITS>
__device__ __forceinline__ void store_unit(const WoOut& o, int64_t rr, int64_t c0, const uint32_t* x, float s) {
  uint32_t words[BITS == 4 ? 4 : 8];
  quant_pack_unit<BITS>(x, s, words);
  uint8_t* dst = o.q + unit_out_byte<BITS>(rr, o.k, c0);
  store16(dst, words);
  if (BITS == 8) store16(dst + 16, words + 4);
}

template <int BITS, class Src>
__global__ void __launch_bounds__(kWoWarps * 32) wo_kernel(Src src, WoOut o) {
  const int lane = threadIdx.x & 31;
  const int64_t rr = static_cast<int64_t>(blockIdx.x) * kWoWarps + (threadIdx.x >> 5);
  if (rr >= o.rows) return;  // warp-uniform
  const float* sr = src.srow(rr);
  const int64_t nunits = o.k / 32;
  const float bound = BITS == 8 ? 127.0f : 7.0f;
  uint32_t x[32];
  if (o.group < 0) {
    uint32_t m = 0;
    for (int64_t u = lane; u < nunits; u += 32) m = max(m, src.amax32(rr, sr, u * 32));
    m = __reduce_max_sync(kFull, m);
    if (m >= 0x7F80u) {
      if (lane == 0) *o.status = DSX_WO_ENONFINITE;
      return;
    }
    // Paddle seeds the running max with the signed first element: -0.0 survives.
    const uint32_t amax = m == 0 ? src.first(rr, sr) : m;
    const uint32_t sb = f32_to_bf16_wo(div_rn(bf16_to_f32(amax), bound));
    if (lane == 0) o.scale[rr] = static_cast<uint16_t>(sb);
    const float s = bf16_to_f32(sb);
    for (int64_t u = lane; u < nunits; u += 32) {
      src.load32(rr, sr, u * 32, x);
      store_unit<BITS>(o, rr, u * 32, x, s);
    }
  } else {
    const int upg = o.group / 32;  // units per group: 2 or 4 adjacent lanes
    for (int64_t base = 0; base < nunits; base += 32) {  // uniform trip count: shuffles are safe
      const int64_t u = base + lane;
      const bool valid = u < nunits;
      uint32_t m = 0;
      if (valid) {
        src.load32(rr, sr, u * 32, x);
#pragma unroll
        for (int i = 0; i < 32; ++i) m = max(m, x[i] & 0x7FFFu);
      }
      m = max(m, __shfl_xor_sync(kFull, m, 1));
      if (upg == 4) m = max(m, __shfl_xor_sync(kFull, m, 2));
      if (__any_sync(kFull, m >= 0x7F80u)) {
        if (lane == 0) *o.status = DSX_WO_ENONFINITE;
        return;
      }
      const uint32_t sb = f32_to_bf16_wo(div_rn(bf16_to_f32(m), bound));
      if (valid) {
        if (lane % upg == 0) o.scale[(u / upg) * o.rows + rr] = static_cast<uint16_t>(sb);
        store_unit<BITS>(o, rr, u * 32, x, bf16_to_f32(sb));
      }
    }
  }
}

template <class Src>
__global__ void __launch_bounds__(kFqThreads)
    fp8_quant_kernel(Src src, int64_t rows, int64_t k, int bn, int bk, int nbk, uint8_t* __restrict__ out,
                     float* __restrict__ sout, int* status) {
  __shared__ uint32_t red[kFqThreads / 32];
  const int64_t bi = blockIdx.x / nbk, bj = blockIdx.x % nbk;
  const int64_t tr0 = bi * bn, tr1 = min(tr0 + bn, rows);
  const int64_t tc0 = bj * bk, tc1 = min(tc0 + bk, k);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t m = 0;  // max of |x|'s bits: inf / NaN (>= 0x7F800000) come out on top
  for (int64_t r = tr0 + warp; r < tr1; r += kFqThreads / 32)
    for (int64_t c = tc0 + lane; c < tc1; c += 32) m = max(m, src.at(r, c) & 0x7FFFFFFFu);
  m = __reduce_max_sync(kFull, m);
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
#pragma unroll
  for (int i = 1; i < kFqThreads / 32; ++i) m = max(m, red[i]);
  if (m >= 0x7F800000u) {
    if (threadIdx.x == 0) *status = DSX_EINVAL;
    return;
  }
  float sc = div_rn(u2f(m), 448.0f);
  sc = sc == 0.0f ? 1.0f : sc;  // all-zero block, or amax / 448 underflows
  if (threadIdx.x == 0) sout[blockIdx.x] = sc;  // blockIdx.x == bi * nbk + bj
  for (int64_t r = tr0 + warp; r < tr1; r += kFqThreads / 32)
    for (int64_t c = tc0 + lane; c < tc1; c += 32)
      out[r * k + c] = static_cast<uint8_t>(encode_e4m3(f2u(div_rn(u2f(src.at(r, c)), sc))));
}

int launch_rc() { return cudaGetLastError() == cudaSuccess ? DSX_OK : DSX_ECUDA; }

template <int BITS, class Src>
int launch_wo(const Src& src, const WoOut& o, cudaStream_t st) {
  const int64_t blocks = cdiv(o.rows, kWoWarps);
  if (blocks > INT32_MAX) return DSX_EINVAL;
  wo_kernel<BITS, Src><<<static_cast<unsigned>(blocks), kWoWarps * 32, 0, st>>>(src, o);
  return launch_rc();
}

template <class Src>
int launch_wo_bits(int bits, const Src& src, const WoOut& o, cudaStream_t st) {
  return bits == 8 ? launch_wo<8>(src, o, st) : launch_wo<4>(src, o, st);
}

#endif  // !DSX_QUANT_CUDA_HOST_EMULATION

}  // namespace dsxq

#ifndef DSX_QUANT_CUDA_HOST_EMULATION

using namespace dsxq;

extern "C" int dsx_fp8_block_dequant_rowmajor_rows_cuda(const void* w_rows, const void* scale_rows, int64_t n,
                                                        int64_t k, int64_t block_n, int64_t block_k,
                                                        int64_t row_begin, int64_t row_end, int out_dtype,
                                                        void* out, void* stream) {
  if (!block_valid(n, k, block_n, block_k) || row_begin < 0 || row_end < row_begin || row_end > n) return DSX_EINVAL;
  if (out_dtype != DSX_FP8_OUT_F32 && out_dtype != DSX_FP8_OUT_BF16) return DSX_EINVAL;
  const int64_t rows = row_end - row_begin;
  if (rows == 0 || k == 0) return DSX_OK;
  if (!w_rows || !scale_rows || !out || !aligned16(w_rows) || !aligned16(out) || rows > INT32_MAX) return DSX_EINVAL;
  const bool vec = k % 16 == 0;
  const int nbk = static_cast<int>(cdiv(k, block_k));
  auto st = static_cast<cudaStream_t>(stream);
  const auto* w = static_cast<const uint8_t*>(w_rows);
  const auto* s = static_cast<const float*>(scale_rows);
  const int bn = static_cast<int>(block_n), bk = static_cast<int>(block_k);
  if (out_dtype == DSX_FP8_OUT_BF16)
    dequant_kernel<true><<<static_cast<unsigned>(rows), kDeqThreads, 0, st>>>(w, s, k, row_begin, bn, bk, nbk, out, vec);
  else
    dequant_kernel<false><<<static_cast<unsigned>(rows), kDeqThreads, 0, st>>>(w, s, k, row_begin, bn, bk, nbk, out, vec);
  return launch_rc();
}

extern "C" int dsx_wo_quantize_rowmajor_nk_rows_cuda(const void* w_rows, int in_dtype, const void* scale_rows,
                                                     int64_t block_n, int64_t block_k, int64_t n_out, int64_t k_in,
                                                     int64_t row_begin, int64_t row_end, int bits, int group_size,
                                                     int arch, void* qweight_rows, void* scale_out, void* status,
                                                     void* stream) {
  const WoArgs a{n_out, k_in, row_begin, row_end, bits, group_size, arch};
  if (!wo_valid(a) || !w_rows || !qweight_rows || !scale_out || !status) return DSX_EINVAL;
  if (!aligned16(w_rows) || !aligned16(qweight_rows)) return DSX_EINVAL;
  const WoOut o{static_cast<uint8_t*>(qweight_rows), static_cast<uint16_t*>(scale_out), static_cast<int*>(status),
                row_end - row_begin, k_in, group_size};
  auto st = static_cast<cudaStream_t>(stream);
  switch (in_dtype) {
    case DSX_QC_FP8: {
      if (!scale_rows || !block_valid(n_out, k_in, block_n, block_k)) return DSX_EINVAL;
      const Fp8Rows src{static_cast<const uint8_t*>(w_rows), static_cast<const float*>(scale_rows), k_in, row_begin,
                        static_cast<int>(block_n), static_cast<int>(block_k), static_cast<int>(cdiv(k_in, block_k))};
      return launch_wo_bits(bits, src, o, st);
    }
    case DSX_QC_BF16:
      return launch_wo_bits(bits, Bf16Rows{static_cast<const uint16_t*>(w_rows), k_in}, o, st);
    case DSX_QC_F32:
      return launch_wo_bits(bits, F32Rows{static_cast<const float*>(w_rows), k_in}, o, st);
    default:
      return DSX_EINVAL;
  }
}

extern "C" int dsx_fp8_block_quant_rowmajor_rows_cuda(const void* w_rows, int in_dtype, const void* src_scale_rows,
                                                      int64_t src_block_n, int64_t src_block_k, int64_t n, int64_t k,
                                                      int64_t block_n, int64_t block_k, int64_t row_begin,
                                                      int64_t row_end, void* out, void* scale_inv_out, void* status,
                                                      void* stream) {
  if (!block_valid(n, k, block_n, block_k) || row_begin < 0 || row_end < row_begin || row_end > n) return DSX_EINVAL;
  if (row_begin % block_n || (row_end % block_n && row_end != n)) return DSX_EINVAL;
  const int64_t rows = row_end - row_begin;
  if (rows == 0 || k == 0) return DSX_OK;
  if (!w_rows || !out || !scale_inv_out || !status) return DSX_EINVAL;
  const int nbk = static_cast<int>(cdiv(k, block_k));
  const int64_t blocks = cdiv(rows, block_n) * nbk;
  if (blocks > INT32_MAX) return DSX_EINVAL;
  auto st = static_cast<cudaStream_t>(stream);
  auto* q = static_cast<uint8_t*>(out);
  auto* so = static_cast<float*>(scale_inv_out);
  auto* stt = static_cast<int*>(status);
  const int bn = static_cast<int>(block_n), bk = static_cast<int>(block_k);
  const auto grid = static_cast<unsigned>(blocks);
  switch (in_dtype) {
    case DSX_QC_F32:
      fp8_quant_kernel<<<grid, kFqThreads, 0, st>>>(F32Elems{static_cast<const float*>(w_rows), k}, rows, k, bn, bk,
                                                    nbk, q, so, stt);
      break;
    case DSX_QC_BF16:
      fp8_quant_kernel<<<grid, kFqThreads, 0, st>>>(Bf16Elems{static_cast<const uint16_t*>(w_rows), k}, rows, k, bn,
                                                    bk, nbk, q, so, stt);
      break;
    case DSX_QC_FP8: {
      if (!src_scale_rows || !block_valid(n, k, src_block_n, src_block_k)) return DSX_EINVAL;
      const Fp8Elems src{static_cast<const uint8_t*>(w_rows), static_cast<const float*>(src_scale_rows), k, row_begin,
                         static_cast<int>(src_block_n), static_cast<int>(src_block_k),
                         static_cast<int>(cdiv(k, src_block_k))};
      fp8_quant_kernel<<<grid, kFqThreads, 0, st>>>(src, rows, k, bn, bk, nbk, q, so, stt);
      break;
    }
    default:
      return DSX_EINVAL;
  }
  return launch_rc();
}

#else  // DSX_QUANT_CUDA_HOST_EMULATION: the kernels' unit functions, driven by host loops

namespace dsxq {

template <int BITS, class Src>
int emul_wo(const Src& src, const WoArgs& a, uint8_t* q, uint16_t* scale) {
  const int64_t rows = a.r1 - a.r0, nunits = a.k / 32;
  const float bound = BITS == 8 ? 127.0f : 7.0f;
  uint32_t x[32], words[8];
  for (int64_t rr = 0; rr < rows; ++rr) {
    const float* sr = src.srow(rr);
    const int upg = a.group < 0 ? static_cast<int>(nunits) : a.group / 32;
    for (int64_t u0 = 0; u0 < nunits; u0 += upg) {  // one scale group (the whole row for -1)
      uint32_t m = 0;
      for (int64_t u = u0; u < u0 + upg && u < nunits; ++u) {
        uint32_t um;
        if (a.group < 0) {  // the kernel's per-channel pass
          um = src.amax32(rr, sr, u * 32);
        } else {
          src.load32(rr, sr, u * 32, x);
          um = 0;
          for (int i = 0; i < 32; ++i) um = um > (x[i] & 0x7FFFu) ? um : (x[i] & 0x7FFFu);
        }
        m = m > um ? m : um;
      }
      if (m >= 0x7F80u) return DSX_WO_ENONFINITE;
      const uint32_t amax = (a.group < 0 && m == 0) ? src.first(rr, sr) : m;
      const uint32_t sb = f32_to_bf16_wo(div_rn(bf16_to_f32(amax), bound));
      scale[a.group < 0 ? rr : (u0 / upg) * rows + rr] = static_cast<uint16_t>(sb);
      for (int64_t u = u0; u < u0 + upg && u < nunits; ++u) {
        src.load32(rr, sr, u * 32, x);
        quant_pack_unit<BITS>(x, bf16_to_f32(sb), words);
        memcpy(q + unit_out_byte<BITS>(rr, a.k, u * 32), words, BITS == 4 ? 16 : 32);
      }
    }
  }
  return DSX_OK;
}

template <class Src>
int emul_fp8q(const Src& src, int64_t rows, int64_t k, int64_t bn, int64_t bk, uint8_t* out, float* sout) {
  const int64_t nbk = cdiv(k, bk);
  for (int64_t bi = 0; bi < cdiv(rows, bn); ++bi) {
    for (int64_t bj = 0; bj < nbk; ++bj) {
      uint32_t m = 0;
      for (int64_t r = bi * bn; r < rows && r < (bi + 1) * bn; ++r)
        for (int64_t c = bj * bk; c < k && c < (bj + 1) * bk; ++c) {
          const uint32_t v = src.at(r, c) & 0x7FFFFFFFu;
          m = m > v ? m : v;
        }
      if (m >= 0x7F800000u) return DSX_EINVAL;
      float sc = div_rn(u2f(m), 448.0f);
      sc = sc == 0.0f ? 1.0f : sc;
      sout[bi * nbk + bj] = sc;
      for (int64_t r = bi * bn; r < rows && r < (bi + 1) * bn; ++r)
        for (int64_t c = bj * bk; c < k && c < (bj + 1) * bk; ++c)
          out[r * k + c] = static_cast<uint8_t>(encode_e4m3(f2u(div_rn(u2f(src.at(r, c)), sc))));
    }
  }
  return DSX_OK;
}

}  // namespace dsxq

using namespace dsxq;

// Host twins of the three entry points: the same signatures, host pointers, run at once;
// input-dependent failures go to *status as on the device.
extern "C" int dsxq_emul_dequant(const void* w_rows, const void* scale_rows, int64_t n, int64_t k, int64_t block_n,
                                 int64_t block_k, int64_t row_begin, int64_t row_end, int out_dtype, void* out,
                                 void*) {
  if (!block_valid(n, k, block_n, block_k) || row_begin < 0 || row_end < row_begin || row_end > n) return DSX_EINVAL;
  if (out_dtype != DSX_FP8_OUT_F32 && out_dtype != DSX_FP8_OUT_BF16) return DSX_EINVAL;
  const int64_t nbk = cdiv(k, block_k);
  const bool vec = k % 16 == 0;
  for (int64_t rr = 0; rr < row_end - row_begin; ++rr) {
    const float* sr = static_cast<const float*>(scale_rows) + ((row_begin + rr) / block_n - row_begin / block_n) * nbk;
    const uint8_t* wrow = static_cast<const uint8_t*>(w_rows) + rr * k;
    char* orow = static_cast<char*>(out) + rr * k * (out_dtype == DSX_FP8_OUT_BF16 ? 2 : 4);
    for (int64_t c0 = 0; c0 < k; c0 += 16) {
      if (out_dtype == DSX_FP8_OUT_BF16) dequant16<true>(wrow, sr, k, static_cast<int>(block_k), c0, orow, vec);
      else dequant16<false>(wrow, sr, k, static_cast<int>(block_k), c0, orow, vec);
    }
  }
  return DSX_OK;
}

extern "C" int dsxq_emul_wo(const void* w_rows, int in_dtype, const void* scale_rows, int64_t block_n, int64_t block_k,
                            int64_t n_out, int64_t k_in, int64_t row_begin, int64_t row_end, int bits,
                            int group_size, int arch, void* qweight_rows, void* scale_out, void* status, void*) {
  const WoArgs a{n_out, k_in, row_begin, row_end, bits, group_size, arch};
  if (!wo_valid(a) || !status) return DSX_EINVAL;
  auto* q = static_cast<uint8_t*>(qweight_rows);
  auto* s = static_cast<uint16_t*>(scale_out);
  int rc;
  if (in_dtype == DSX_QC_FP8) {
    if (!block_valid(n_out, k_in, block_n, block_k)) return DSX_EINVAL;
    const Fp8Rows src{static_cast<const uint8_t*>(w_rows), static_cast<const float*>(scale_rows), k_in, row_begin,
                      static_cast<int>(block_n), static_cast<int>(block_k), static_cast<int>(cdiv(k_in, block_k))};
    rc = bits == 8 ? emul_wo<8>(src, a, q, s) : emul_wo<4>(src, a, q, s);
  } else if (in_dtype == DSX_QC_BF16) {
    const Bf16Rows src{static_cast<const uint16_t*>(w_rows), k_in};
    rc = bits == 8 ? emul_wo<8>(src, a, q, s) : emul_wo<4>(src, a, q, s);
  } else if (in_dtype == DSX_QC_F32) {
    const F32Rows src{static_cast<const float*>(w_rows), k_in};
    rc = bits == 8 ? emul_wo<8>(src, a, q, s) : emul_wo<4>(src, a, q, s);
  } else {
    return DSX_EINVAL;
  }
  if (rc) *static_cast<int*>(status) = rc;
  return DSX_OK;
}

extern "C" int dsxq_emul_fp8q(const void* w_rows, int in_dtype, const void* src_scale_rows, int64_t src_block_n,
                              int64_t src_block_k, int64_t n, int64_t k, int64_t block_n, int64_t block_k,
                              int64_t row_begin, int64_t row_end, void* out, void* scale_inv_out, void* status, void*) {
  if (!block_valid(n, k, block_n, block_k) || row_begin < 0 || row_end < row_begin || row_end > n) return DSX_EINVAL;
  if (row_begin % block_n || (row_end % block_n && row_end != n) || !status) return DSX_EINVAL;
  const int64_t rows = row_end - row_begin;
  auto* q = static_cast<uint8_t*>(out);
  auto* so = static_cast<float*>(scale_inv_out);
  int rc;
  if (in_dtype == DSX_QC_F32) {
    rc = emul_fp8q(F32Elems{static_cast<const float*>(w_rows), k}, rows, k, block_n, block_k, q, so);
  } else if (in_dtype == DSX_QC_BF16) {
    rc = emul_fp8q(Bf16Elems{static_cast<const uint16_t*>(w_rows), k}, rows, k, block_n, block_k, q, so);
  } else if (in_dtype == DSX_QC_FP8) {
    if (!block_valid(n, k, src_block_n, src_block_k)) return DSX_EINVAL;
    const Fp8Elems src{static_cast<const uint8_t*>(w_rows), static_cast<const float*>(src_scale_rows), k, row_begin,
                       static_cast<int>(src_block_n), static_cast<int>(src_block_k),
                       static_cast<int>(cdiv(k, src_block_k))};
    rc = emul_fp8q(src, rows, k, block_n, block_k, q, so);
  } else {
    return DSX_EINVAL;
  }
  if (rc) *static_cast<int*>(status) = rc;
  return DSX_OK;
}

#endif  // DSX_QUANT_CUDA_HOST_EMULATION
