/* MTP / speculative decoding: acceptance of draft tokens, greedy and top-p.
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
 * Top-p variant (sampling with speculation: a draft is kept when the base model could have
 * sampled it, i.e. when it lies in the base model's top-p candidate set at its position):
 *   candidates     : [B, K+1, C] the base model's top-p candidates at each verify position
 *                    (any order; C = the largest set size of the batch)
 *   num_candidates : int32 [B, K+1], 1..C: how many entries of row (b, i) are real
 *   sampled        : [B, K+1] the token the base model sampled at each verify position
 * Rule: i = 0; while i < num_draft[b] and draft[b, i] is in candidates[b, i, 0:num_candidates[b, i]]:
 * accept draft[b, i]; then append sampled[b, i] as the bonus token. With C = 1 and
 * candidates = sampled = the argmax, this is the greedy rule.
 *
 * CPU: returns DSX_EINVAL if any num_draft is outside [0, K] (or, top-p, any
 * num_candidates outside [1, C]).
 * CUDA: device pointers, one kernel launch, no allocation (CUDA-graph capturable);
 * the kernel cannot report errors, so num_draft is clamped to [0, K] and num_candidates
 * to [1, C] there.
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

int dsx_mtp_accept_topp_i32_cpu(const int32_t* draft, const int32_t* candidates,
                                const int32_t* num_candidates, const int32_t* sampled,
                                const int32_t* num_draft, int32_t* accepted, int32_t* count,
                                int64_t batch, int64_t k, int64_t c);
int dsx_mtp_accept_topp_i64_cpu(const int64_t* draft, const int64_t* candidates,
                                const int32_t* num_candidates, const int64_t* sampled,
                                const int32_t* num_draft, int64_t* accepted, int32_t* count,
                                int64_t batch, int64_t k, int64_t c);

int dsx_mtp_accept_topp_i32_cuda(const int32_t* draft, const int32_t* candidates,
                                 const int32_t* num_candidates, const int32_t* sampled,
                                 const int32_t* num_draft, int32_t* accepted, int32_t* count,
                                 int64_t batch, int64_t k, int64_t c, void* stream);
int dsx_mtp_accept_topp_i64_cuda(const int64_t* draft, const int64_t* candidates,
                                 const int32_t* num_candidates, const int64_t* sampled,
                                 const int32_t* num_draft, int64_t* accepted, int32_t* count,
                                 int64_t batch, int64_t k, int64_t c, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DSX_MTP_ACCEPT_H_ */
