/* dsx kernels: the one C ABI of csrc/.
 *
 * Conventions for every function declared under include/dsx/:
 *  - plain C types only; pointers are host memory for the *_cpu entry points;
 *  - bfloat16 travels as uint16_t bit patterns, float8_e4m3fn as uint8_t;
 *  - matrices are row-major, and the layout is in the name (e.g. _rowmajor_nk);
 *  - every function returns 0 on success or a negative DSX_E* code, and never
 *    aborts, prints or allocates framework memory.
 */
#ifndef DSX_H_
#define DSX_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  DSX_OK = 0,
  DSX_EINVAL = -1,   /* a shape or argument is out of range */
  DSX_ENOMEM = -2,   /* a scratch allocation failed */
  DSX_ECUDA = -3,    /* a CUDA runtime call failed */
};

/* ABI version: bump when a signature changes; Python refuses a mismatch. */
int dsx_abi_version(void);

/* CUDA (libdsx_cuda): whether the automatic choices of the block FP8 and weight-only GEMMs first look
 * the launch up in their measured tables (on GPUs with the tables' SM count). on = 0 or 1 switches the
 * tables for the process from now on (DSX_TUNED_TABLES=0 in the environment starts it with them off);
 * on = -1 only asks. Returns the state before the call (0 or 1), or DSX_EINVAL. */
int dsx_tuned_tables_cuda(int on);

/* CUDA (libdsx_cuda): the card whose measured tables the automatic choices use. A table is measured on one card
 * (codes: 1 H200, 2 H100 SXM; 3 none); a launch uses the table of the card it runs on, the card of its SM count
 * whose peak memory bandwidth is nearest to the device's (else none: the rules alone; a kernel with no table of
 * that card uses its H200 table). card = 1 or 2 makes every device that card for the process from now on, 0 goes
 * back to judging by the device (DSX_TUNED_CARD=h200 / h100 in the environment starts it forced); card = -1 only
 * asks. Returns the setting before the call (0, 1 or 2), or DSX_EINVAL. dsx_device_card_cuda: the card the current
 * device counts as now (forced or judged), or DSX_ECUDA. */
int dsx_tuned_card_cuda(int card);
int dsx_device_card_cuda(int* card);

/* CPU (libdsx_cpu): whether the CPU kernels take their SIMD paths (AVX2 where the build has it) or their scalar
 * ones; both give the same numbers (tests compare them bit for bit). on = 0 or 1 switches for the process from now
 * on (DSX_CPU_SIMD=0 in the environment starts it at 0); on = -1 only asks. Returns the state before the call (0 or
 * 1), or DSX_EINVAL. */
int dsx_cpu_simd(int on);

#ifdef __cplusplus
}
#endif

#include "dsx/quant_weight_only.h"
#include "dsx/quant_fp8.h"
#include "dsx/gemm_fp8.h"
#include "dsx/mtp_accept.h"
#include "dsx/gemm_weight_only.h"
#include "dsx/quant_cuda.h"
#include "dsx/mla_decode.h"
#include "dsx/layout.h"

#endif /* DSX_H_ */
