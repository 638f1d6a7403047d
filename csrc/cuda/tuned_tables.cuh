// Whether the automatic choices consult their measured tables (gemm_fp8_tuned.inc,
// gemm_weight_only_tuned.inc). DSX_TUNED_TABLES=0 in the environment turns them off for the process, so
// that the rules alone decide: bench/tune_auto.py measures the rules against candidate words that way
// (with the tables on, "auto" would already be the tables' words and a re-run would drop them). The
// environment is read once, at the first automatic launch or query; dsx_tuned_tables_cuda switches the
// tables for the process at any time after (tests of the rules at shapes the tables list).
#pragma once

#include <atomic>
#include <cstdlib>

namespace dsx_cuda {

// 1 on, 0 off, -1 not yet read from the environment (one state a library: an inline function's static)
inline std::atomic<int>& tuned_tables_state() {
  static std::atomic<int> state{-1};
  return state;
}

inline bool tuned_tables_on() {
  std::atomic<int>& s = tuned_tables_state();
  int v = s.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("DSX_TUNED_TABLES");
    int expected = -1;
    s.compare_exchange_strong(expected, (e && e[0] == '0' && e[1] == '\0') ? 0 : 1, std::memory_order_relaxed);
    v = s.load(std::memory_order_relaxed);
  }
  return v != 0;
}

// on 0 / 1: switch; -1: only ask. The state before the call.
inline int tuned_tables_switch(int on) {
  const int before = tuned_tables_on() ? 1 : 0;
  if (on == 0 || on == 1) tuned_tables_state().store(on, std::memory_order_relaxed);
  return before;
}

}  // namespace dsx_cuda
