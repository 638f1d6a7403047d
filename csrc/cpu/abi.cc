#include "dsx.h"
#include "numeric.h"

extern "C" int dsx_abi_version(void) { return 1; }

extern "C" int dsx_cpu_simd(int on) {
  if (on != -1 && on != 0 && on != 1) return DSX_EINVAL;
  const int before = dsx_num::simd_on() ? 1 : 0;
  if (on >= 0) dsx_num::simd_state().store(on, std::memory_order_relaxed);
  return before;
}
