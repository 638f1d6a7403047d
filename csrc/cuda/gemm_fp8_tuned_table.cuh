// The block FP8 GEMM's measured tables (gemm_fp8_tuned.inc for the H200, gemm_fp8_tuned_h100.inc for the H100 SXM,
// written by bench/tune_auto.py --kernel fp8 [--card h100]) as the entries gemm_fp8_api.cu's automatic choice looks
// up in the table of the card it runs on (tuned_card.cuh; tuned_tables.cuh: sorted, binary search); a header of its
// own so that bench/tuned_lookup_cost.py times the tables the library holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "tuned_card.cuh"
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
// The H100 SXM's: the H200's table with the rows of the fifty-eighth session's sweep on an H100 (M = 16, 32, 64,
// 128 at every shape; 68 rows of 22 shapes changed, among them M = 128 at 7168x16384 / 7168x18432, where the H200's
// word was 14% / 12% slower than the rules there; on an H100, -3.3% summed over the rows the sweep first moved).
constexpr Fp8Tuned kFp8TunedH100[] = {
#include "gemm_fp8_tuned_h100.inc"
    {0, 0, 0, 0, 0},  // (end)
};
constexpr size_t kFp8TunedLen = sizeof(kFp8Tuned) / sizeof(kFp8Tuned[0]) - 1;  // (without the end)
constexpr size_t kFp8TunedH100Len = sizeof(kFp8TunedH100) / sizeof(kFp8TunedH100[0]) - 1;
static_assert(dsx_cuda::tuned_sorted(kFp8Tuned, kFp8TunedLen),
              "gemm_fp8_tuned.inc must be sorted by (N, K, first M), each range of M non-empty and apart from the "
              "next of its shape: write it with bench/tune_auto.py --kernel fp8 --emit");
static_assert(dsx_cuda::tuned_sorted(kFp8TunedH100, kFp8TunedH100Len),
              "gemm_fp8_tuned_h100.inc must be sorted by (N, K, first M), each range of M non-empty and apart from "
              "the next of its shape: write it with bench/tune_auto.py --kernel fp8 --emit --card h100");

// The entry for an automatic launch of m rows at (n, k) in the table of `card` (tuned_card.cuh), or nullptr:
// a card without a table of its own (none yet) would take the H200's; kCardNone (another SM count) has none.
inline const Fp8Tuned* fp8_tuned_find(int card, int64_t n, int64_t k, int64_t m) {
  if (card != kCardH200 && card != kCardH100) return nullptr;
  const bool h100 = card == kCardH100;
  return tuned_find(h100 ? kFp8TunedH100 : kFp8Tuned, h100 ? kFp8TunedH100Len : kFp8TunedLen,
                    std::make_tuple(n, k), m);
}

}  // namespace dsx_cuda
