// How many thread-block clusters of each size an H200 holds at once, for blocks that fit 1, 2 or 3 to an SM
// (cudaOccupancyMaxActiveClusters on a stand-in kernel whose shared memory sets the blocks an SM). The weight-only
// warp-specialized kernel reduces its K slices inside a cluster of `splits` blocks, so a grid whose clusters do not
// all fit at once runs a second round: this says which grids can (e.g. 7168 x 18432 at 8 splits with 7 warps: 32
// clusters of 8 at two blocks an SM). Build and run on the GPU machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_occupancy bench/cluster_occupancy.cu && /tmp/cluster_occupancy
// Also launches each case for real: every block of the grid announces itself on a global counter and waits (up to
// ~50 ms) for all of them; "all at once" = every block saw the whole grid resident (a grid of max-active clusters).
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);        \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

__global__ void __launch_bounds__(320, 1) stand_in(unsigned* arrived, unsigned* all_seen, unsigned total) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) {
    smem[0] = 1;
    atomicAdd(arrived, 1u);
    long long t0 = clock64();
    bool seen = false;
    while (clock64() - t0 < 100000000LL) {  // ~50 ms at 2 GHz
      if (atomicAdd(arrived, 0u) >= total) { seen = true; break; }
    }
    if (seen) atomicAdd(all_seen, 1u);
  }
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t per_sm = prop.sharedMemPerMultiprocessor;  // (bytes; each block also reserves 1 KB)
  std::printf("%s: %d SMs, %zu bytes of shared memory an SM, %zu a block at most\n", prop.name, sms, per_sm,
              prop.sharedMemPerBlockOptin);
  CHECK(cudaFuncSetAttribute(stand_in, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(prop.sharedMemPerBlockOptin)));
  CHECK(cudaFuncSetAttribute(stand_in, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  unsigned *arrived, *all_seen;
  CHECK(cudaMalloc(&arrived, 4));
  CHECK(cudaMalloc(&all_seen, 4));
  std::printf("%-8s %-14s %-12s %-12s %-18s\n", "cluster", "blocks an SM", "max active", "blocks", "all at once");
  for (int per : {1, 2, 3}) {
    const size_t smem = per_sm / per - 1024 - 64;  // (so that `per` blocks fit, not per + 1)
    for (int cs : {1, 2, 4, 6, 7, 8, 16}) {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = cs, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr, cfg.numAttrs = 1;
      cfg.blockDim = dim3(320), cfg.dynamicSmemBytes = smem;
      cfg.gridDim = dim3(cs * 256);
      int clusters = 0;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, stand_in, &cfg);
      if (e != cudaSuccess) {
        std::printf("%-8d %-14d query failed: %s\n", cs, per, cudaGetErrorString(e));
        cudaGetLastError();
        continue;
      }
      const unsigned total = static_cast<unsigned>(clusters * cs);
      cfg.gridDim = dim3(total);
      CHECK(cudaMemset(arrived, 0, 4));
      CHECK(cudaMemset(all_seen, 0, 4));
      e = cudaLaunchKernelEx(&cfg, stand_in, arrived, all_seen, total);
      unsigned seen = 0;
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      if (e == cudaSuccess) CHECK(cudaMemcpy(&seen, all_seen, 4, cudaMemcpyDeviceToHost));
      std::printf("%-8d %-14d %-12d %-12u %u of %u%s\n", cs, per, clusters, total, seen, total,
                  e == cudaSuccess ? "" : cudaGetErrorString(e));
      cudaGetLastError();
    }
  }
  return 0;
}
