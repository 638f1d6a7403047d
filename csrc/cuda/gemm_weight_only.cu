// Weight-only GEMM for decode on sm_90a: out[M, N] bf16 = x[M, K] bf16 @ dequant(W)^T, W in
// Paddle's INT8 / INT4 bytes (contract and accumulation order: include/dsx/gemm_weight_only.h;
// how the bytes meet the tensor cores: gemm_weight_only.cuh).
//
// Work split. A warp owns 16 output channels (one mma M tile) and walks K in steps (64 K
// for int8, 128 K for int4; 1 KB of weights a warp per step either way), with kRing steps
// of weights in flight in registers (16-byte streaming loads straight from Paddle's bytes,
// unpacked in registers, never re-laid out). A block holds `warps` warps side by side
// along N that share the same K range, so the x slice they need is staged once in shared
// memory (cp.async, double-buffered, `chunk` steps at a time). Along K the problem is cut
// into `splits` slices, one block each, which form a thread-block cluster: each block
// leaves its fp32 partial tile in shared memory and the cluster sums them in slice order
// through distributed shared memory (deterministic; no workspace, no atomics).
// M is handled 8 tokens per mma N tile, up to 64 rows per launch; larger M is cut into
// launches of 64 rows (a simple path: weights are re-read for each).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "dsx.h"
#include "gemm_weight_only.cuh"

namespace cg = cooperative_groups;

namespace {

using dsx_wo::bf16_bits_to_f32;
using dsx_wo::Stage;

constexpr int kRing = 4;        // weight steps in flight per warp
constexpr int kMaxWarps = 8;    // warps (16-channel tiles) per block
constexpr int kMaxSplits = 8;   // portable cluster size
constexpr int kMaxRows = 64;    // rows of x per launch
constexpr int kPadElems = 8;    // x row padding in shared memory (16 bytes: fewer bank conflicts)

struct Params {
  const uint16_t* x;      // [m, k] bf16 bits, this launch's rows
  const uint8_t* q;       // Paddle's bytes
  const uint16_t* scale;  // [n] or [ceil(k/group), n] bf16 bits
  uint16_t* out;          // [m, n] bf16 bits, this launch's rows
  int m, n, k, group;
  int chunk;              // steps of x staged at once (a multiple of kRing)
};

template <int BITS, int MT, int GMODE>
__global__ void __launch_bounds__(kMaxWarps * 32, MT <= 2 ? 2 : 1)
    wo_gemm_kernel(const Params p) {
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int kStepK = BITS == 8 ? 64 : 128;
  constexpr int64_t kStepBytes = BITS == 8 ? 128 : 256;  // a step's advance inside a channel group
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int splits = gridDim.x, rank = blockIdx.x;
  const int n_blk = blockIdx.y * nwarps * 16;
  const int n0 = n_blk + warp * 16;
  const bool active = n0 < p.n;  // warp-uniform
  const int kt = p.k / 64;
  const int nsteps_all = BITS == 8 ? kt : (kt + 1) / 2;
  const int s_begin = static_cast<int>(static_cast<int64_t>(nsteps_all) * rank / splits);
  const int s_end = static_cast<int>(static_cast<int64_t>(nsteps_all) * (rank + 1) / splits);
  const int ld = p.chunk * kStepK + kPadElems;
  const int mlast = p.m - 1;

  // This lane's bytes of channels n0+g and n0+g+8 at step 0 (doc section 3: a group of
  // 2 (int8) / 4 (int4) channels owns 2K contiguous bytes, tile by tile).
  const int64_t k2 = 2 * static_cast<int64_t>(p.k);
  int64_t off[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t n = n0 + g + 8 * r;
    off[r] = BITS == 8 ? (n >> 1) * k2 + (n & 1) * 64 + 16 * c
                       : (n >> 2) * k2 + (n & 3) * 32 + (c >> 1) * 128 + (c & 1) * 16;
  }
  const int ngroups = p.group > 0 ? (p.k + p.group - 1) / p.group : 1;
  auto scale_pair = [&](int grp) -> uint32_t {
    if (grp >= ngroups) return 0u;
    const uint16_t* s = p.scale + static_cast<int64_t>(grp) * p.n + n0 + g;
    return static_cast<uint32_t>(__ldg(s)) | static_cast<uint32_t>(__ldg(s + 8)) << 16;
  };
  auto load_stage = [&](Stage& st, int step) {
    const bool in = active && step < s_end;
    const bool ok = in && (BITS == 8 || 2 * step + (c >> 1) < kt);  // int4: odd tile count
#pragma unroll
    for (int r = 0; r < 2; ++r)
      st.w[r] = ok ? dsx_wo::ldg_stream16(p.q + off[r] + step * kStepBytes) : make_uint4(0, 0, 0, 0);
    if (GMODE == 1) st.s[0] = in ? scale_pair(step * kStepK / p.group) : 0u;
    if (GMODE == 2) {
      st.s[0] = in ? scale_pair(2 * step) : 0u;
      st.s[1] = in ? scale_pair(2 * step + 1) : 0u;
    }
  };
  auto stage_x = [&](int ci, uint16_t* buf) {
    const int cs = s_begin + ci * p.chunk, ce = min(cs + p.chunk, s_end);
    const int per_row = (ce - cs) * kStepK / 8, k0 = cs * kStepK;
    for (int i = threadIdx.x; i < p.m * per_row; i += blockDim.x) {
      const int row = i / per_row, kk = k0 + (i - row * per_row) * 8;
      const bool in = kk < p.k;  // the int4 half step past K reads zeros
      dsx_wo::cp_async16(buf + row * ld + (kk - k0), in ? p.x + static_cast<int64_t>(row) * p.k + kk : p.x,
                         in ? 16 : 0);
    }
    dsx_wo::cp_async_commit();
  };

  float acc[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  Stage ring[kRing];
#pragma unroll
  for (int j = 0; j < kRing; ++j) load_stage(ring[j], s_begin + j);

  const int nchunks = (s_end - s_begin + p.chunk - 1) / p.chunk;
  if (nchunks > 0) stage_x(0, smem);
  for (int ci = 0; ci < nchunks; ++ci) {
    uint16_t* buf = smem + (ci & 1) * p.m * ld;
    if (ci + 1 < nchunks) {
      stage_x(ci + 1, smem + ((ci + 1) & 1) * p.m * ld);
      dsx_wo::cp_async_wait<1>();
    } else {
      dsx_wo::cp_async_wait<0>();
    }
    __syncthreads();
    const int cs = s_begin + ci * p.chunk, ce = min(cs + p.chunk, s_end);
    for (int i = cs; i < ce; i += kRing) {
#pragma unroll
      for (int j = 0; j < kRing; ++j) {  // ring[j] holds step i + j ((i - s_begin) % kRing == 0)
        const int step = i + j;
        if (step < ce) {
          if (active) {
            const uint16_t* xs = buf + (step - cs) * kStepK;
            if (BITS == 8) {
              dsx_wo::step_int8<MT, GMODE>(acc, ring[j], xs, ld, mlast, g, c);
            } else if (GMODE == 2) {
              dsx_wo::step_int4_g64<MT>(acc, ring[j], xs, ld, mlast, g, c);
            } else {
              dsx_wo::step_int4<MT, GMODE>(acc, ring[j], xs, ld, mlast, g, c);
            }
          }
          load_stage(ring[j], step + kRing);
        }
      }
    }
    __syncthreads();  // all warps are done with buf before it is refilled
  }

  // Partial tile [m][16 * nwarps] fp32 in shared memory (the x buffers are free now).
  float* part = reinterpret_cast<float*>(smem);
  const int width = 16 * nwarps;
  if (active) {
    float s_lo = 1.f, s_hi = 1.f;
    if (GMODE == 0) {
      s_lo = bf16_bits_to_f32(__ldg(p.scale + n0 + g));
      s_hi = bf16_bits_to_f32(__ldg(p.scale + n0 + g + 8));
    }
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = 8 * t + 2 * c + (i & 1), ch = warp * 16 + g + 8 * (i >> 1);
        if (tok < p.m) part[tok * width + ch] = GMODE == 0 ? acc[t][i] * (i < 2 ? s_lo : s_hi) : acc[t][i];
      }
  }
  const int total = p.m * width;
  if (splits == 1) {
    __syncthreads();
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      const int tok = e / width, n = n_blk + (e - tok * width);
      if (n < p.n) p.out[static_cast<int64_t>(tok) * p.n + n] = dsx_wo::f32_to_bf16_rne(part[e]);
    }
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's partial tile is written
  const float* src[kMaxSplits];
#pragma unroll
  for (int r = 0; r < kMaxSplits; ++r) src[r] = r < splits ? cluster.map_shared_rank(part, r) : nullptr;
  const int e0 = static_cast<int>(static_cast<int64_t>(total) * rank / splits);
  const int e1 = static_cast<int>(static_cast<int64_t>(total) * (rank + 1) / splits);
  for (int e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int tok = e / width, n = n_blk + (e - tok * width);
    if (n >= p.n) continue;
    float v = src[0][e];
#pragma unroll
    for (int r = 1; r < kMaxSplits; ++r)
      if (r < splits) v += src[r][e];  // slice order: deterministic
    p.out[static_cast<int64_t>(tok) * p.n + n] = dsx_wo::f32_to_bf16_rne(v);
  }
  cluster.sync();  // no block leaves while its shared memory may still be read
}

// ------------------------------------------------------------------ host side

struct Config {
  int warps, splits, rounds, mt, smem, blocks_n;
};

bool valid_args(int64_t m, int64_t n, int64_t k, int bits, int group, int arch) {
  if (bits != 4 && bits != 8) return false;
  if (group != -1 && group != 64 && group != 128) return false;
  if (arch != 75 && arch != 80 && arch != 86 && arch != 89 && arch != 90 && arch != 100) return false;
  if (m < 0 || n <= 0 || k <= 0 || n % 64 || k % 64) return false;
  return n < (int64_t(1) << 30) && k < (int64_t(1) << 30) && n * k < (int64_t(1) << 46);
}

bool pow2_upto8(int v) { return v == 1 || v == 2 || v == 4 || v == 8; }

// Automatic choice: 4 warps (8 for M > 16, to share the larger x slice); split K until
// about 16 warps per SM are busy, keeping >= 4 steps per slice; stage ~16 KB of x at once.
int choose(int64_t m, int64_t n, int64_t k, int bits, int algo, int sms, Config* cfg) {
  const int rows = static_cast<int>(std::min<int64_t>(std::max<int64_t>(m, 1), kMaxRows));
  const int mt = rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8;
  const int step_k = bits == 8 ? 64 : 128;
  const int nsteps = static_cast<int>(bits == 8 ? k / 64 : (k / 64 + 1) / 2);
  int warps = algo & 15, splits = (algo >> 4) & 15, rounds = (algo >> 8) & 255;
  if (algo < 0 || (algo >> 16) != 0) return DSX_EINVAL;
  if (warps == 0) warps = mt <= 2 ? 4 : 8;
  if (!pow2_upto8(warps)) return DSX_EINVAL;
  const int64_t tiles = n / 16, blocks_n = (tiles + warps - 1) / warps;
  if (blocks_n > 65535) return DSX_EINVAL;
  if (splits == 0) {
    splits = 1;
    while (splits < kMaxSplits && blocks_n * warps * splits < int64_t(sms) * 16 && nsteps >= 8 * splits) splits *= 2;
  }
  if (!pow2_upto8(splits)) return DSX_EINVAL;
  const int per_split = (nsteps + splits - 1) / splits;
  if (rounds == 0) {
    rounds = std::max(1, 16384 / (rows * step_k * 2 * kRing));
    rounds = std::max(1, std::min(rounds, (per_split + kRing - 1) / kRing));
  }
  const int chunk = rounds * kRing;
  const int64_t x_bytes = 2 * int64_t(rows) * (int64_t(chunk) * step_k + kPadElems) * 2;
  const int64_t part_bytes = int64_t(rows) * 16 * warps * 4;
  const int64_t smem = std::max(x_bytes, part_bytes);
  if (smem > 227 * 1024) return DSX_EINVAL;
  *cfg = Config{warps, splits, rounds, mt, static_cast<int>(smem), static_cast<int>(blocks_n)};
  return DSX_OK;
}

constexpr int kMaxDevices = 64;

// Raise the kernel's dynamic shared memory limit once per device (not on every launch, so
// a warmed-up launch makes no such call while a CUDA graph is being captured).
template <typename Kernel>
cudaError_t ensure_smem(Kernel kernel, int bytes, std::atomic<int>* done) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (done[dev].load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) {
    int cur = done[dev].load(std::memory_order_relaxed);
    while (cur < bytes && !done[dev].compare_exchange_weak(cur, bytes)) {
    }
  }
  return e;
}

template <int BITS, int MT, int GMODE>
cudaError_t launch(const Params& p, const Config& cfg, cudaStream_t stream) {
  auto kernel = wo_gemm_kernel<BITS, MT, GMODE>;
  static std::atomic<int> smem_set[kMaxDevices];  // zero-initialized (static storage)
  const cudaError_t se = ensure_smem(kernel, cfg.smem, smem_set);
  if (se != cudaSuccess) return se;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(cfg.splits, cfg.blocks_n, 1);
  lc.blockDim = dim3(32 * cfg.warps, 1, 1);
  lc.dynamicSmemBytes = cfg.smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cfg.splits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = cfg.splits > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&lc, kernel, p);
}

template <int BITS, int GMODE>
cudaError_t launch_mt(const Params& p, const Config& cfg, cudaStream_t stream) {
  switch (cfg.mt) {
    case 1: return launch<BITS, 1, GMODE>(p, cfg, stream);
    case 2: return launch<BITS, 2, GMODE>(p, cfg, stream);
    case 4: return launch<BITS, 4, GMODE>(p, cfg, stream);
    default: return launch<BITS, 8, GMODE>(p, cfg, stream);
  }
}

int device_sms(int* sms) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DSX_ECUDA;
  if (cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return DSX_ECUDA;
  return DSX_OK;
}

}  // namespace

extern "C" int dsx_wo_gemm_config_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size,
                                       int algo, int* warps, int* splits, int* rounds) {
  if (!valid_args(m, n, k, bits, group_size, 90) || !warps || !splits || !rounds) return DSX_EINVAL;
  int sms = 0;
  if (device_sms(&sms) != DSX_OK) return DSX_ECUDA;
  Config cfg;
  const int rc = choose(m, n, k, bits, algo, sms, &cfg);
  if (rc != DSX_OK) return rc;
  *warps = cfg.warps, *splits = cfg.splits, *rounds = cfg.rounds;
  return DSX_OK;
}

extern "C" int dsx_wo_gemm_bf16_nt_cuda(const void* x, const void* qweight, const void* scale,
                                        void* out, int64_t m, int64_t n, int64_t k, int bits,
                                        int group_size, int arch, int algo, void* stream) {
  if (!valid_args(m, n, k, bits, group_size, arch)) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!x || !qweight || !scale || !out) return DSX_EINVAL;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(qweight)) & 15) return DSX_EINVAL;
  if ((reinterpret_cast<uintptr_t>(scale) | reinterpret_cast<uintptr_t>(out)) & 1) return DSX_EINVAL;
  int sms = 0;
  if (device_sms(&sms) != DSX_OK) return DSX_ECUDA;
  const int gmode = group_size == -1 ? 0 : (bits == 4 && group_size == 64 ? 2 : 1);
  for (int64_t m0 = 0; m0 < m; m0 += kMaxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m - m0));
    Config cfg;
    const int rc = choose(rows, n, k, bits, algo, sms, &cfg);
    if (rc != DSX_OK) return rc;
    Params p;
    p.x = static_cast<const uint16_t*>(x) + m0 * k;
    p.q = static_cast<const uint8_t*>(qweight);
    p.scale = static_cast<const uint16_t*>(scale);
    p.out = static_cast<uint16_t*>(out) + m0 * n;
    p.m = rows, p.n = static_cast<int>(n), p.k = static_cast<int>(k), p.group = group_size;
    p.chunk = cfg.rounds * kRing;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaError_t e;
    if (bits == 8) {
      e = gmode == 0 ? launch_mt<8, 0>(p, cfg, st) : launch_mt<8, 1>(p, cfg, st);
    } else {
      e = gmode == 0   ? launch_mt<4, 0>(p, cfg, st)
          : gmode == 1 ? launch_mt<4, 1>(p, cfg, st)
                       : launch_mt<4, 2>(p, cfg, st);
    }
    if (e != cudaSuccess) return DSX_ECUDA;
  }
  return DSX_OK;
}
