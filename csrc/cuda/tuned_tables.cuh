// Whether the automatic choices consult their measured tables (gemm_fp8_tuned.inc,
// gemm_weight_only_tuned.inc). DSX_TUNED_TABLES=0 in the environment turns them off for the process, so
// that the rules alone decide: bench/tune_auto.py measures the rules against candidate words that way
// (with the tables on, "auto" would already be the tables' words and a re-run would drop them).
// Read once, at the first automatic launch.
#pragma once

#include <cstdlib>

namespace dsx_cuda {

inline bool tuned_tables_on() {
  static const bool on = [] {
    const char* v = std::getenv("DSX_TUNED_TABLES");
    return !(v && v[0] == '0' && v[1] == '\0');
  }();
  return on;
}

}  // namespace dsx_cuda
