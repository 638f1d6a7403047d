// CUTLASS 3.x (nvidia-cutlass 4.2.0.0 headers) configurations of the Hopper block-scaled
// FP8 GEMM, written for dsx's layouts. Included only where DSX_HAVE_CUTLASS is set.
//
// Mapping of dsx's "nt" layout onto CUTLASS's (M, N, K, L) GEMM:
//   A  = activations e4m3 [M, K] row-major            -> RowMajor (K-major) A
//   B  = weights e4m3 [N, K] row-major (HF [out, in])  -> ColumnMajor (K-major) B
//   SFA = float32 [M, ceil(K/128)] row-major           -> scale granularity (1, 128), K-major
//   SFB = float32 [ceil(N/128), ceil(K/128)] row-major -> scale granularity (128, 128), K-major
//   D  = bf16 [M, N] row-major, no C operand (D = 1 * accumulator).
// The mainloop (KernelTmaWarpSpecializedCooperativeFP8Blockwise) runs one 128-deep wgmma
// sequence per K block into a temporary accumulator and promotes it as acc += tmp * sa*sb,
// which is the order documented in gemm_fp8.h.
#pragma once

#include "cute/tensor.hpp"
#include "gemm_fp8_internal.cuh"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"
#include "cutlass/numeric_types.h"

namespace dsx_cuda::cfg {

using namespace cute;

using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 16;  // 16 bytes of e4m3
constexpr int kAlignD = 8;    // 16 bytes of bf16

// Scale granularity (M, N, K) = (1, 128, 128), both scale tensors K-major (row-major above).
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K,
                                                              cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using Epilogue1 = cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>;

// ---- mainloop whose scale promotion overlaps the next K block's tensor-core work ----
//
// CUTLASS's block-wise mainloop issues one K block's wgmma batch into a temporary accumulator,
// waits for the batch to finish and only then promotes it (acc += tmp * sa*sb): while a consumer
// warpgroup promotes, it has no wgmma in flight, and in the cooperative kernel both warpgroups
// promote at the same time, so the tensor cores idle once per K block. This mainloop is CUTLASS's
// collective (loads, shared storage, parameters, mma_tail unchanged) with its consumer loop
// replaced: two temporaries alternate, K block k+1's batch is issued before block k is promoted,
// so the promotion FFMAs run under the next batch, and each stage is released as soon as its
// batch has finished. The arithmetic is unchanged: per K block the same wgmma sequence into a
// zeroed temporary, the same fp32 scale product, and acc = acc + tmp_k * s_k in increasing k, so
// the results are bitwise those of the base mainloop. Cost: one more accumulator-sized register
// fragment per thread (64 floats for a warpgroup's 64x128 share).
template <class Base>
struct OverlappedPromotion : Base {
  using TiledMma = typename Base::TiledMma;
  using TileShape = typename Base::TileShape;
  using Scale = typename Base::ElementBlockScale;
  static_assert(Base::ScaleGranularityK == size<2>(TileShape{}),
                "one scale block per K tile: the scale views below drop the K mode");
  static_assert(Base::ScaleMsPerTile == 1 || Base::ScaleNsPerTile == 1,
                "the combined scale is kept on the side that varies within a tile");

  template <class Accum>
  CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline,
                          typename Base::PipelineState read, Accum& accum, int k_tiles,
                          int thread_idx, typename Base::TensorStorage& smem,
                          typename Base::Params const&) {
    static_assert(is_rmem<Accum>::value, "accumulators live in registers");
    // Operand tiles in shared memory and this warpgroup's wgmma descriptors over them.
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), typename Base::SmemLayoutB{});
    TiledMma tiled_mma;
    const int wg = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto wg_mma = tiled_mma.get_slice(wg * cutlass::NumThreadsPerWarpGroup);
    Tensor dA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor dB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    constexpr int kAtoms = size<2>(dA);

    // Scales in shared memory seen as (BLK_M, BLK_N, PIPE) tensors: each side broadcast along
    // the other side's dimension, then split like the accumulators.
    using LSA = typename Base::SmemLayoutSFA;  // ((M granule, M blocks), (K granule, 1), PIPE)
    using LSB = typename Base::SmemLayoutSFB;  // ((N granule, N blocks), (K granule, 1), PIPE)
    Tensor sSA = make_tensor(
        make_smem_ptr(smem.smem_SFA.data()),
        make_layout(make_shape(get<0>(LSA{}.shape()), get<1>(TileShape{}), get<2>(LSA{}.shape())),
                    make_stride(get<0>(LSA{}.stride()), _0{}, get<2>(LSA{}.stride()))));
    Tensor sSB = make_tensor(
        make_smem_ptr(smem.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), get<0>(LSB{}.shape()), get<2>(LSB{}.shape())),
                    make_stride(_0{}, get<0>(LSB{}.stride()), get<2>(LSB{}.stride()))));
    auto thr_mma = tiled_mma.get_slice(thread_idx);
    Tensor cSA = thr_mma.partition_C(sSA);  // (MMA, MMA_M, MMA_N, PIPE)
    Tensor cSB = thr_mma.partition_C(sSB);

    // Two temporaries with their scales (register copies keep the broadcast: few registers).
    Tensor t0 = make_fragment_like(accum);
    Tensor t1 = make_fragment_like(accum);
    Tensor a0 = make_tensor_like<Scale>(cSA(_, _, _, _0{}));
    Tensor a1 = make_tensor_like<Scale>(cSA(_, _, _, _0{}));
    Tensor b0 = make_tensor_like<Scale>(cSB(_, _, _, _0{}));
    Tensor b1 = make_tensor_like<Scale>(cSB(_, _, _, _0{}));
    CUTE_STATIC_ASSERT_V(shape(a0) == shape(accum));

    auto token = pipeline.consumer_try_wait(read);
    typename Base::PipelineState release = read;

    // Wait for the next stage, read its scales, issue its wgmma batch into t (zeroed by the
    // first atom), then form the scale product while the batch runs.
    auto issue = [&](auto& t, auto& sa, auto& sb) CUTLASS_LAMBDA_FUNC_INLINE {
      pipeline.consumer_wait(read, token);
      const int stage = read.index();
      copy(cSA(_, _, _, stage), sa);
      copy(cSB(_, _, _, stage), sb);
      warpgroup_fence_operand(t);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < kAtoms; ++kb) {
        cute::gemm(tiled_mma, dA(_, _, kb, stage), dB(_, _, kb, stage), t);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(t);
      if constexpr (Base::ScaleNsPerTile == 1) {
        const Scale s = sb(_0{});
        auto v = filter_zeros(sa);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(v); ++i) v(i) = v(i) * s;
      } else {
        const Scale s = sa(_0{});
        auto v = filter_zeros(sb);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(v); ++i) v(i) = v(i) * s;
      }
      ++read;
      token = pipeline.consumer_try_wait(read);
    };
    // The batch issued before the newest one has finished: free its stage.
    auto retire_older = [&]() CUTLASS_LAMBDA_FUNC_INLINE {
      warpgroup_wait<1>();
      pipeline.consumer_release(release);
      ++release;
    };
    auto promote = [&](auto& t, auto& sa, auto& sb) CUTLASS_LAMBDA_FUNC_INLINE {
      warpgroup_fence_operand(t);
      if constexpr (Base::ScaleNsPerTile == 1) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += t(i) * sa(i);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += t(i) * sb(i);
      }
      warpgroup_fence_operand(t);
    };

    // Zero the accumulators and pin them (and the temporaries) as opaque register values before the
    // first wgmma: otherwise the compiler materializes them from a zero register that it coalesces
    // with a wgmma operand, and ptxas then waits for the first batch before the loop (C7517).
    clear(accum);
    warpgroup_fence_operand(accum);
    warpgroup_fence_operand(t0);
    warpgroup_fence_operand(t1);
    issue(t0, a0, b0);
    int k = 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tiles; k += 2) {
      issue(t1, a1, b1);
      retire_older();
      promote(t0, a0, b0);
      issue(t0, a0, b0);
      retire_older();
      promote(t1, a1, b1);
    }
    if (k < k_tiles) {
      issue(t1, a1, b1);
      retire_older();
      promote(t0, a0, b0);
      warpgroup_wait<0>();
      promote(t1, a1, b1);
    } else {
      warpgroup_wait<0>();
      promote(t0, a0, b0);
    }
    // The last stage is released by the base's mma_tail, as after the base's loop.
  }
};

// The epilogue and mainloop CUTLASS builds for one block-scaled FP8 configuration: tile,
// cluster, output layout (a pointer for ptr-array grouping), epilogue schedule, the mainloop's
// A and B (element, tuple of data and scale layouts) and its kernel schedule. The mainloop's
// stages fill the shared memory the epilogue leaves.
template <class Tile, class Cluster, class LayoutOut, class EpiSchedule, class ElemA, class LayA,
          class ElemB, class LayB, class MainSchedule>
struct Collectives {
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutOut, 1,
      ElementD, LayoutOut, kAlignD, EpiSchedule, Epilogue1>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElemA, LayA, kAlignAB, ElemB, LayB,
      kAlignAB, ElementAcc, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epi::SharedStorage))>,
      MainSchedule>::CollectiveOp;
};

// dsx's nt layout (activations A, weights B, row-major D) with its (1, 128, 128) scales.
template <class Tile, class Cluster, class EpiSchedule, class MainSchedule>
using NtCollectives = Collectives<Tile, Cluster, LayoutD, EpiSchedule, ElementA,
                                  cute::tuple<LayoutA, LayoutSFA>, ElementB,
                                  cute::tuple<LayoutB, LayoutSFB>, MainSchedule>;

// Dense: 128x128x128 tiles, 2 CTAs per cluster along N (A multicast), cooperative
// warp-specialized FP8 block-wise mainloop, stream-K tile scheduler (full waves run
// data-parallel, the tail is split along K so small-M problems fill all SMs).
struct Dense {
  static constexpr bool kStreamK = true;
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_1, _2, _1>;
  using C = NtCollectives<Tile, Cluster, cutlass::epilogue::TmaWarpSpecializedCooperative,
                          cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>;
  using Epi = typename C::Epi;
  using Main = typename C::Main;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi,
                                                      cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Dense, pingpong: two consumer warpgroups work on separate 64x128 tiles, so one's scale
// promotion overlaps the other's tensor-core work; persistent data-parallel scheduler.
struct DensePingpong {
  static constexpr bool kStreamK = false;
  using Tile = Shape<_64, _128, _128>;
  using Cluster = Shape<_1, _2, _1>;
  using C = NtCollectives<Tile, Cluster, cutlass::epilogue::TmaWarpSpecialized,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise>;
  using Epi = typename C::Epi;
  using Main = typename C::Main;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Dense, cooperative like Dense (same tiles, cluster and stream-K scheduler, so the same
// decomposition and bitwise the same output) with the promotion overlapped (above).
struct DenseOverlap {
  static constexpr bool kStreamK = true;
  using Tile = Dense::Tile;
  using Cluster = Dense::Cluster;
  using Epi = Dense::Epi;
  using Main = OverlappedPromotion<Dense::Main>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi,
                                                      cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Dense, swapped operands for few tokens: CUTLASS computes D^T[N, M] = W[N, K] . A[M, K]^T,
// so the weights fill the 128-row side of the tile and the tokens a 32-wide side (less
// wasted tensor-core work and 4x more tiles than 128x128 at M <= 128). Scale granularity
// becomes (128, 1, 128); D^T is column-major with leading dimension N, i.e. exactly our
// row-major out[M, N]. Cooperative, stream-K.
struct DenseSwapAB {
  static constexpr bool kStreamK = true;
  using Tile = Shape<_128, _32, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using LayoutDt = cutlass::layout::ColumnMajor;
  using Scale = cutlass::detail::Sm90BlockwiseScaleConfig<128, 1, 128, cute::GMMA::Major::K,
                                                          cute::GMMA::Major::K>;
  using LayoutSFW = decltype(Scale::deduce_layoutSFA());
  using LayoutSFX = decltype(Scale::deduce_layoutSFB());
  using C = Collectives<Tile, Cluster, LayoutDt, cutlass::epilogue::TmaWarpSpecializedCooperative,
                        ElementB, cute::tuple<LayoutA, LayoutSFW>, ElementA,
                        cute::tuple<LayoutB, LayoutSFX>,
                        cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>;
  using Epi = typename C::Epi;
  using Main = typename C::Main;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi,
                                                      cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Grouped (MoE, ptr-array): one problem per expert, arguments in device arrays.
struct Grouped {
  using Problem = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using Tile = Shape<_128, _128, _128>;
  using Cluster = Shape<_1, _1, _1>;
  using C = Collectives<Tile, Cluster, LayoutD*,
                        cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, ElementA,
                        cute::tuple<LayoutA*, LayoutSFA*>, ElementB,
                        cute::tuple<LayoutB*, LayoutSFB*>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>;
  using Epi = typename C::Epi;
  using Main = typename C::Main;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Main, Epi>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Row-major / K-major strides: only the leading (row) stride is dynamic for L = 1.
template <class Stride>
CUTE_HOST_DEVICE Stride row_stride(int64_t ld) {
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

// Column-major strides (M, N, L): only the second (column) stride is dynamic for L = 1.
template <class Stride>
CUTE_HOST_DEVICE Stride col_stride(int64_t ld) {
  Stride s{};
  cute::get<1>(s) = ld;
  return s;
}

template <class Sched>
void set_tuning(Sched& sched, Tuning t) {
  using Raster = decltype(sched.raster_order);
  if (t.raster == 1) sched.raster_order = Raster::AlongM;
  if (t.raster == 2) sched.raster_order = Raster::AlongN;
  if (t.swizzle == 1 || t.swizzle == 2 || t.swizzle == 4 || t.swizzle == 8) {
    sched.max_swizzle_size = t.swizzle;
  }
}

template <class Sched>
void set_stream_k(Sched& sched, Tuning t) {
  using Mode = decltype(sched.decomposition_mode);
  if (t.decomposition == 1) sched.decomposition_mode = Mode::DataParallel;
  if (t.decomposition == 2) sched.decomposition_mode = Mode::SplitK;
  if (t.decomposition == 3) sched.decomposition_mode = Mode::StreamK;
  if (t.splits > 1) sched.splits = t.splits;
  if (t.reduction == 1) sched.reduction_mode = decltype(sched.reduction_mode)::Nondeterministic;
}

// The current device and its SM count; false when no device is usable (the tile
// schedulers divide by the SM count, so it must never be 0).
inline bool hw_info(cutlass::KernelHardwareInfo* hw) {
  hw->sm_count = 0;
  if (cudaGetDevice(&hw->device_id) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&hw->sm_count, cudaDevAttrMultiProcessorCount, hw->device_id) !=
      cudaSuccess) {
    return false;
  }
  return hw->sm_count > 0;
}

// ---- dense runner, shared by the dense configurations (one per translation unit) ----

template <class Cfg>
typename Cfg::Gemm::Arguments dense_args(const GemmNt& g, Tuning t,
                                         const cutlass::KernelHardwareInfo& hw) {
  using G = typename Cfg::Gemm;
  using StrideA = typename G::GemmKernel::StrideA;
  using StrideB = typename G::GemmKernel::StrideB;
  using StrideD = typename G::GemmKernel::StrideD;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  typename G::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {reinterpret_cast<const ElementA*>(g.a), row_stride<StrideA>(k),
       reinterpret_cast<const ElementB*>(g.b), row_stride<StrideB>(k), g.sa,
       ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1)), g.sb,
       ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1))},
      {{}, nullptr, row_stride<StrideD>(n), reinterpret_cast<ElementD*>(g.out),
       row_stride<StrideD>(n)},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  set_tuning(args.scheduler, t);
  if constexpr (Cfg::kStreamK) set_stream_k(args.scheduler, t);
  return args;
}

// D^T = W . A^T (DenseSwapAB): weights are CUTLASS's A, activations its B.
template <class Cfg>
typename Cfg::Gemm::Arguments swap_args(const GemmNt& g, Tuning t,
                                        const cutlass::KernelHardwareInfo& hw) {
  using G = typename Cfg::Gemm;
  using StrideA = typename G::GemmKernel::StrideA;
  using StrideB = typename G::GemmKernel::StrideB;
  using StrideD = typename G::GemmKernel::StrideD;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  typename G::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {n, m, k, 1},
      {reinterpret_cast<const ElementB*>(g.b), row_stride<StrideA>(k),
       reinterpret_cast<const ElementA*>(g.a), row_stride<StrideB>(k), g.sb,
       Cfg::Scale::tile_atom_to_shape_SFA(make_shape(n, m, k, 1)), g.sa,
       Cfg::Scale::tile_atom_to_shape_SFB(make_shape(n, m, k, 1))},
      {{}, nullptr, col_stride<StrideD>(n), reinterpret_cast<ElementD*>(g.out),
       col_stride<StrideD>(n)},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  set_tuning(args.scheduler, t);
  set_stream_k(args.scheduler, t);
  return args;
}

template <class Cfg, bool kSwap = false>
typename Cfg::Gemm::Arguments make_args(const GemmNt& g, Tuning t,
                                        const cutlass::KernelHardwareInfo& hw) {
  if constexpr (kSwap) {
    return swap_args<Cfg>(g, t, hw);
  } else {
    return dense_args<Cfg>(g, t, hw);
  }
}

template <class Cfg, bool kSwap = false>
int dense_workspace(int64_t m, int64_t n, int64_t k, Tuning t, size_t* bytes) {
  cutlass::KernelHardwareInfo hw;
  if (!hw_info(&hw)) return DSX_ECUDA;
  GemmNt g{nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k};
  *bytes = Cfg::Gemm::get_workspace_size(make_args<Cfg, kSwap>(g, t, hw));
  return DSX_OK;
}

template <class Cfg, bool kSwap = false>
int dense_run(const GemmNt& g, void* ws, size_t ws_bytes, Tuning t, cudaStream_t s) {
  using G = typename Cfg::Gemm;
  cutlass::KernelHardwareInfo hw;
  if (!hw_info(&hw)) return DSX_ECUDA;
  auto args = make_args<Cfg, kSwap>(g, t, hw);
  if (G::get_workspace_size(args) > ws_bytes) return DSX_EINVAL;
  G gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return DSX_EINVAL;
  if (gemm.initialize(args, ws, s) != cutlass::Status::kSuccess) return DSX_ECUDA;
  if (gemm.run(s) != cutlass::Status::kSuccess) return DSX_ECUDA;
  return cuda_rc(cudaGetLastError());
}

}  // namespace dsx_cuda::cfg
