#include "dsx.h"

extern "C" int dsx_abi_version(void) { return 1; }
