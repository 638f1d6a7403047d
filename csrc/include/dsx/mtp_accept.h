/* MTP / speculative decoding: greedy acceptance of draft tokens.
 *
 * Per sequence b (row-major arrays):
 *   draft      : [B, K]   the draft tokens proposed for positions 0..K-1
 *   target     : [B, K+1] the base model's argmax at the verify positions
 *                (target[b, i] is what the base model predicts where draft[b, i] stands)
 *   num_draft  : int32 [B] how many drafts sequence b really has (0..K)
 * Outputs:
 *   accepted   : [B, K+1] accepted[b, 0..count-1] are the tokens to append; the
 *                remaining slots are written with -1 (every element is written)
 *   count      : int32 [B] number of tokens to append (1..num_draft+1)
 *
 * Rule: i = 0; while i < num_draft[b] and draft[b, i] == target[b, i]: accept draft[b, i];
 * then append target[b, i] as the bonus token (the base model's token at the first
 * mismatch, or after the last accepted draft). Tokens are int32 (_i32) or int64 (_i64);
 * draft, target and accepted share the dtype.
 *
 * CPU: returns DSX_EINVAL if any num_draft is outside [0, K].
 * CUDA: device pointers, one kernel launch, no allocation (CUDA-graph capturable);
 * the kernel cannot report errors, so num_draft is clamped to [0, K] there.
 */
#ifndef DSX_MTP_ACCEPT_H_
#define DSX_MTP_ACCEPT_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int dsx_mtp_accept_greedy_i32_cpu(const int32_t* draft, const int32_t* target,
                                  const int32_t* num_draft, int32_t* accepted, int32_t* count,
                                  int64_t batch, int64_t k);
int dsx_mtp_accept_greedy_i64_cpu(const int64_t* draft, const int64_t* target,
                                  const int32_t* num_draft, int64_t* accepted, int32_t* count,
                                  int64_t batch, int64_t k);

int dsx_mtp_accept_greedy_i32_cuda(const int32_t* draft, const int32_t* target,
                                   const int32_t* num_draft, int32_t* accepted, int32_t* count,
                                   int64_t batch, int64_t k, void* stream);
int dsx_mtp_accept_greedy_i64_cuda(const int64_t* draft, const int64_t* target,
                                   const int32_t* num_draft, int64_t* accepted, int32_t* count,
                                   int64_t batch, int64_t k, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DSX_MTP_ACCEPT_H_ */
