#include "dsx.h"
#include "numeric.h"

extern "C" int dsx_abi_version(void) { return 1; }

extern "C" int dsx_cpu_simd(int on) {
  if (on != -1 && on != 0 && on != 1) return DSX_EINVAL;
  return dsx_num::simd_switch().set(on);
}
