// The block FP8 GEMM's measured table (gemm_fp8_tuned.inc, written by bench/tune_auto.py --kernel fp8) as the
// entries gemm_fp8_api.cu's automatic choice looks up (tuned_tables.cuh: sorted, binary search); a header of its
// own so that bench/tuned_lookup_cost.py times the table the library holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "tuned_tables.cuh"

namespace dsx_cuda {

struct Fp8Tuned {
  int64_t n, k;
  int m_lo, m_hi, algo;
  constexpr std::tuple<int64_t, int64_t> key() const { return {n, k}; }
  constexpr int lo() const { return m_lo; }
  constexpr int hi() const { return m_hi; }
};
constexpr Fp8Tuned kFp8Tuned[] = {
#include "gemm_fp8_tuned.inc"
    {0, 0, 0, 0, 0},  // (end)
};
constexpr size_t kFp8TunedLen = sizeof(kFp8Tuned) / sizeof(kFp8Tuned[0]) - 1;  // (without the end)
static_assert(dsx_cuda::tuned_sorted(kFp8Tuned, kFp8TunedLen),
              "gemm_fp8_tuned.inc must be sorted by (N, K, first M), each range of M non-empty and apart from the "
              "next of its shape: write it with bench/tune_auto.py --kernel fp8 --emit");
constexpr int kFp8TunedSms = 132;  // H200 (and H100 SXM): the table's machine

}  // namespace dsx_cuda
