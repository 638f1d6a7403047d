// Launch attributes shared by the kernels' host sides: a thread-block cluster along x and programmatic
// dependent launch, for cudaLaunchKernelEx and for the occupancy queries that must see the same cluster.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace dsx_launch {

// The attributes a launch configuration points at: keep this alive until the launch or query is made.
struct Attrs {
  cudaLaunchAttribute a[2];

  // Sets lc's attributes: a cluster of `cluster_x` blocks along x when cluster_x > 1 (none at 1: a plain
  // launch), and programmatic stream serialization when pdl (the kernel may start while the previous
  // kernel of the stream ends; it waits with griddepcontrol.wait before reading that kernel's output).
  void set(cudaLaunchConfig_t& lc, unsigned cluster_x, bool pdl = false) {
    unsigned n = 0;
    if (cluster_x > 1) {
      a[n].id = cudaLaunchAttributeClusterDimension;
      a[n].val.clusterDim.x = cluster_x;
      a[n].val.clusterDim.y = 1;
      a[n].val.clusterDim.z = 1;
      ++n;
    }
    if (pdl) {
      a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    lc.attrs = n > 0 ? a : nullptr;
    lc.numAttrs = n;
  }
};

// Clusters of `cluster_x` (> 1) blocks of `threads` threads and `smem` bytes of dynamic shared memory that
// the current device holds at once (cudaOccupancyMaxActiveClusters); the kernel's shared-memory limit must
// already allow smem. On an error *clusters is 0 and the error is returned, still pending for the caller to clear.
template <typename Kernel>
cudaError_t max_active_clusters(int* clusters, Kernel kernel, unsigned cluster_x, unsigned threads, size_t smem) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(cluster_x, 1, 1);
  lc.blockDim = dim3(threads, 1, 1);
  lc.dynamicSmemBytes = smem;
  Attrs at;
  at.set(lc, cluster_x);
  const cudaError_t e = cudaOccupancyMaxActiveClusters(clusters, kernel, &lc);
  if (e != cudaSuccess) *clusters = 0;
  return e;
}

}  // namespace dsx_launch
