// A process's on/off switch for an optional path of a kernel library: read once from an environment variable
// ("0": off; unset or anything else: on) at its first use, switched at any time after. The CPU kernels' SIMD paths
// (DSX_CPU_SIMD, dsx_cpu_simd) and the CUDA automatic choices' measured tables (DSX_TUNED_TABLES,
// dsx_tuned_tables_cuda) are two of them; each library keeps one state a process (a function's static).
// Header-only and internal: not part of the C ABI (dsx.h).
#pragma once

#include <atomic>
#include <cstdlib>

namespace dsx {

class EnvSwitch {
 public:
  explicit constexpr EnvSwitch(const char* var) : var_(var) {}

  bool on() {
    int v = state_.load(std::memory_order_relaxed);
    if (v < 0) {
      const char* e = std::getenv(var_);
      int expected = -1;
      state_.compare_exchange_strong(expected, (e && e[0] == '0' && e[1] == '\0') ? 0 : 1, std::memory_order_relaxed);
      v = state_.load(std::memory_order_relaxed);
    }
    return v != 0;
  }

  // on 0 / 1: switch; any other value: only ask. The state before the call.
  int set(int on) {
    const int before = this->on() ? 1 : 0;
    if (on == 0 || on == 1) state_.store(on, std::memory_order_relaxed);
    return before;
  }

 private:
  const char* var_;
  std::atomic<int> state_{-1};  // 1 on, 0 off, -1 not yet read from the environment
};

}  // namespace dsx
