// Grouped (MoE, contiguous expert layout) block-scaled FP8 GEMM through CUTLASS's Hopper
// ptr-array kernel. Two launches, no host sync: a setup kernel turns the device offsets
// [E+1] into CUTLASS's per-expert argument arrays (kept in the caller's workspace), then
// the grouped GEMM reads its problem shapes from the device.
#include "gemm_fp8_internal.cuh"

#if defined(DSX_HAVE_CUTLASS)
#include "gemm_fp8_cutlass.cuh"

namespace dsx_cuda {
namespace {

using G = cfg::Grouped::Gemm;
using Shape3 = typename cfg::Grouped::Problem::UnderlyingProblemShape;
using StrideA = typename G::GemmKernel::InternalStrideA;
using StrideB = typename G::GemmKernel::InternalStrideB;
using StrideD = typename G::GemmKernel::InternalStrideD;
using LayoutSFA = cfg::LayoutSFA;
using LayoutSFB = cfg::LayoutSFB;

// The per-expert arrays, carved out of the workspace in this order.
struct Arrays {
  Shape3* shapes;
  const cfg::ElementA** pa;
  const cfg::ElementB** pb;
  const float** psa;
  const float** psb;
  cfg::ElementD** pd;
  StrideA* sta;
  StrideB* stb;
  StrideD* std_;
  LayoutSFA* lsa;
  LayoutSFB* lsb;
};

constexpr size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

size_t carve(char* base, int64_t e, Arrays* out) {
  size_t off = 0;
  auto take = [&](auto*& p, size_t elem) {
    p = reinterpret_cast<std::remove_reference_t<decltype(p)>>(base ? base + off : nullptr);
    off = align_up(off + elem * static_cast<size_t>(e));
  };
  Arrays a{};
  take(a.shapes, sizeof(Shape3));
  take(a.pa, sizeof(void*));
  take(a.pb, sizeof(void*));
  take(a.psa, sizeof(void*));
  take(a.psb, sizeof(void*));
  take(a.pd, sizeof(void*));
  take(a.sta, sizeof(StrideA));
  take(a.stb, sizeof(StrideB));
  take(a.std_, sizeof(StrideD));
  take(a.lsa, sizeof(LayoutSFA));
  take(a.lsb, sizeof(LayoutSFB));
  if (out) *out = a;
  return off;
}

__global__ void setup_groups(GemmNt g, const int32_t* offsets, int experts, Arrays arr) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= experts) return;
  const int n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int64_t kb = (g.k + 127) / 128, nb = (g.n + 127) / 128;
  const int64_t r0 = offsets[e];
  const int rows = offsets[e + 1] - offsets[e];
  arr.shapes[e] = Shape3{rows, n, k};
  arr.pa[e] = reinterpret_cast<const cfg::ElementA*>(g.a + r0 * g.k);
  arr.pb[e] = reinterpret_cast<const cfg::ElementB*>(g.b + e * g.n * g.k);
  arr.psa[e] = g.sa + r0 * kb;
  arr.psb[e] = g.sb + e * nb * kb;
  arr.pd[e] = reinterpret_cast<cfg::ElementD*>(g.out + r0 * g.n);
  arr.sta[e] = cfg::row_stride<StrideA>(k);
  arr.stb[e] = cfg::row_stride<StrideB>(k);
  arr.std_[e] = cfg::row_stride<StrideD>(n);
  arr.lsa[e] = cfg::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(rows, n, k, 1));
  arr.lsb[e] = cfg::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(rows, n, k, 1));
}

typename G::Arguments grouped_args(const Arrays& a, int experts, Tuning t,
                                   const cutlass::KernelHardwareInfo& hw) {
  typename G::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {experts, a.shapes, nullptr},
      {a.pa, a.sta, a.pb, a.stb, a.psa, a.lsa, a.psb, a.lsb},
      {{}, nullptr, nullptr, a.pd, a.std_},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  cfg::set_tuning(args.scheduler, t);
  return args;
}

}  // namespace

int cutlass_grouped_workspace(int64_t experts, int64_t, int64_t, int64_t, size_t* bytes) {
  cutlass::KernelHardwareInfo hw;
  if (!cfg::hw_info(&hw)) return DSX_ECUDA;
  Arrays a{};
  const size_t own = carve(nullptr, experts, &a);
  *bytes = own + align_up(G::get_workspace_size(grouped_args(a, static_cast<int>(experts), {}, hw)));
  return DSX_OK;
}

int cutlass_grouped_run(const GemmNt& g, const int32_t* offsets, int64_t experts, void* ws,
                        size_t ws_bytes, Tuning t, cudaStream_t s) {
  cutlass::KernelHardwareInfo hw;
  if (!cfg::hw_info(&hw)) return DSX_ECUDA;
  size_t need = 0;
  cutlass_grouped_workspace(experts, g.m, g.n, g.k, &need);
  if (ws_bytes < need || ws == nullptr) return DSX_EINVAL;
  Arrays a{};
  const size_t own = carve(static_cast<char*>(ws), experts, &a);
  const int e = static_cast<int>(experts);
  setup_groups<<<(e + 127) / 128, 128, 0, s>>>(g, offsets, e, a);
  if (cudaGetLastError() != cudaSuccess) return DSX_ECUDA;
  auto args = grouped_args(a, e, t, hw);
  G gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return DSX_EINVAL;
  if (gemm.initialize(args, static_cast<char*>(ws) + own, s) != cutlass::Status::kSuccess) {
    return DSX_ECUDA;
  }
  if (gemm.run(s) != cutlass::Status::kSuccess) return DSX_ECUDA;
  return cuda_rc(cudaGetLastError());
}

}  // namespace dsx_cuda

#else

namespace dsx_cuda {
int cutlass_grouped_workspace(int64_t, int64_t, int64_t, int64_t, size_t* bytes) {
  *bytes = 0;
  return DSX_OK;
}
int cutlass_grouped_run(const GemmNt&, const int32_t*, int64_t, void*, size_t, Tuning,
                        cudaStream_t) {
  return DSX_EINVAL;
}
}  // namespace dsx_cuda

#endif
