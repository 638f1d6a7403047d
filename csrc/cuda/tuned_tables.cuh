// Whether the automatic choices consult their measured tables (gemm_fp8_tuned.inc,
// gemm_weight_only_tuned.inc). DSX_TUNED_TABLES=0 in the environment turns them off for the process, so
// that the rules alone decide: bench/tune_auto.py measures the rules against candidate words that way
// (with the tables on, "auto" would already be the tables' words and a re-run would drop them). The
// environment is read once, at the first automatic launch or query; dsx_tuned_tables_cuda switches the
// tables for the process at any time after (tests of the rules at shapes the tables list).
//
// A table is an array of entries, each a key (the launch's shape: entry.key(), a std::tuple) and a range of
// rows [lo, hi], sorted by (key, lo), the ranges of one key apart (bench/tune_auto.py --emit writes them so;
// each table's unit checks it at compile time with tuned_sorted). A lookup is a binary search (tuned_find):
// the weight-only table has about 700 entries, whose linear scan took 0.15-0.3 us of host time a launch
// (forty-sixth session, `bench/tuned_lookup_cost.py`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <tuple>

#include "../include/dsx/env_switch.h"

namespace dsx_cuda {

inline dsx::EnvSwitch& tuned_tables_env() {
  static dsx::EnvSwitch s("DSX_TUNED_TABLES");  // one state a library
  return s;
}

inline bool tuned_tables_on() { return tuned_tables_env().on(); }

// on 0 / 1: switch; -1: only ask. The state before the call.
inline int tuned_tables_switch(int on) { return tuned_tables_env().set(on); }

// Whether table[0, n) is sorted by (key, lo) with every range non-empty, starting at row 1 or above and apart
// from the next range of its key (constexpr: the units static_assert it on their table).
template <class Entry>
constexpr bool tuned_sorted(const Entry* table, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Entry& e = table[i];
    if (e.lo() < 1 || e.hi() < e.lo()) return false;
    if (i == 0) continue;
    const Entry& p = table[i - 1];
    if (!(p.key() < e.key() || (p.key() == e.key() && p.hi() < e.lo()))) return false;
  }
  return true;
}

// The entry of table[0, n) (tuned_sorted) for `key` whose range holds `rows`, or nullptr. The first entry past
// (key, rows) in the table's order is found by bisection; only the one before it can hold the launch.
template <class Entry, class Key>
const Entry* tuned_find(const Entry* table, size_t n, const Key& key, int64_t rows) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const Entry& e = table[mid];
    if (e.key() < key || (e.key() == key && e.lo() <= rows))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  const Entry& e = table[lo - 1];
  return e.key() == key && rows <= e.hi() ? &e : nullptr;
}

}  // namespace dsx_cuda
