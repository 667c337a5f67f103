// What a device packer computes on the host before it launches the copy kernel
// (copy_kernel.h): the kernel's descriptor table (runs split at kRunChunk, the first
// descriptor of every block, the most runs of any descriptor) and the launch grid for a
// range of blocks. Host code, compiled in every build: the CUDA packer uploads and launches
// exactly these, and the host harness (kernel_harness.h) runs the kernel body over them.
#pragma once

#include <cstddef>
#include <vector>

#include "copy_kernel.h"
#include "geometry.h"

namespace pyshard {

// A descriptor table as the kernel gets it.
struct KernelTable {
  std::vector<CopyDesc> descs;  // runs split at kRunChunk, block after block
  std::vector<size_t> first;    // first[b]..first[b+1]: the descriptors of block b
  i64 max_runs = 0;             // the most runs of any descriptor (sizes the grid's x)
};

KernelTable kernel_table(const DescTable& t);

// One launch of the copy kernel over blocks [b0, b1): descriptors [first, first + n) of the
// kernel table on a grid_x x grid_y grid of block_x threads; n == 0: no launch.
struct KernelLaunch {
  size_t first = 0;
  int n = 0;
  int grid_x = 0, grid_y = 0, block_x = kThreads;
  i64 threads() const { return static_cast<i64>(grid_x) * grid_y * block_x; }
};

// `first` and `max_runs` of a kernel table (uploaded or not).
KernelLaunch copy_launch(const std::vector<size_t>& first, i64 max_runs, size_t b0, size_t b1);

// One launch of the fold-combine kernel (combine_kernel.h) over the runs of descriptor `d`:
// a warp per run up to about 4096 blocks, grid_y 1; n == 0 (no launch) when it has no runs.
KernelLaunch combine_launch(const CopyDesc& d);

// Blocks [b0, b1) of `t` hold no descriptor: the packer neither uploads nor launches.
inline bool copies_nothing(const DescTable& t, size_t b0, size_t b1) {
  return b1 <= b0 || t.first[b1] == t.first[b0];
}

}  // namespace pyshard
