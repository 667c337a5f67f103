// The host harness of the CUDA kernels: runs a kernel body (a PYSHARD_HD function of its
// ThreadIndex, see copy_kernel.h) for every (blockIdx.x, blockIdx.y, threadIdx.x) of a launch
// grid, one thread after another, on host memory, with the descriptor table and grid that the
// device packer would upload and launch (kernel_launch.h). The kernels take no shared memory
// and no barriers, and no two threads write the same byte, so running the threads in turn
// gives what the device gives. Python reaches it through _core.copy_kernel_on_host, tested in
// tests/test_kernels_on_host.py against the host packer and numpy.
//
// Adding a kernel (e.g. a halo pack that reuses the descriptor tables):
//   1. write its body as a PYSHARD_HD function of plain pointers, counts and a ThreadIndex in
//      a header (no threadIdx, no CUDA types or intrinsics), beside copy_kernel.h;
//   2. in the .cu, a `__global__` wrapper passes ThreadIndex{blockIdx.x, blockIdx.y,
//      threadIdx.x, gridDim.x, gridDim.y, blockDim.x}; the launcher computes its table and
//      grid with host functions (kernel_launch.h, or new ones there) that the CPU build
//      compiles too;
//   3. here, a function that builds the same table and grid and calls for_each_thread with
//      the body; a binding beside copy_kernel_on_host (bindings_kernels.cpp) and a test in
//      tests/test_kernels_on_host.py comparing with the host copy, over odd sizes, every word
//      width, misaligned pointers, empty tables and many descriptors.
#pragma once

#include "fold_kind.h"
#include "kernel_launch.h"

namespace pyshard {

// Call body(ThreadIndex) for every thread of launch `l` (nothing when l.n == 0).
template <class Body>
void for_each_thread(const KernelLaunch& l, Body&& body) {
  if (l.n == 0) return;
  for (int by = 0; by < l.grid_y; ++by)
    for (int bx = 0; bx < l.grid_x; ++bx)
      for (int tx = 0; tx < l.block_x; ++tx)
        body(ThreadIndex{bx, by, tx, l.grid_x, l.grid_y, l.block_x});
}

// What one host run of the copy kernel launched, for the tests to check the case they meant.
struct CopyKernelReport {
  KernelLaunch launch;
  size_t table_descriptors = 0;  // in the whole kernel table
  i64 max_runs = 0;              // of the whole kernel table
  i64 runs = 0;                  // runs of the launched descriptors
  i64 max_run = 0;               // longest run (bytes) of a launched descriptor
  i64 widths[5] = {0, 0, 0, 0, 0};  // launched descriptors copied with 16, 8, 4, 2, 1-byte words
};

// Copy blocks [b0, b1) of `t` from `src` (src_bytes readable) to `dst` (dst_bytes writable)
// with the CUDA copy kernel's body run on the host over its whole launch grid. Throws
// std::out_of_range, before copying anything, when a descriptor reaches outside either buffer,
// and std::runtime_error when the kernel moves a misaligned word (a fault on the device).
CopyKernelReport copy_kernel_on_host(const DescTable& t, size_t b0, size_t b1, const char* src,
                                     i64 src_bytes, char* dst, i64 dst_bytes);

// dst = op(dst, src) over blocks [b0, b1) of `t` with the CUDA fold-combine kernel's body
// (combine_kernel.h) run on the host, one launch a descriptor in table order, as the CUDA
// packer launches it (device_fold.h); src and dst may be one buffer (a fold's wraps).
// Returns the launches. Throws std::out_of_range, before combining anything, where a
// descriptor reaches outside either buffer; std::invalid_argument for a kind or op the
// kernel has no combine for; std::runtime_error for a misaligned element.
i64 combine_kernel_on_host(FoldKind kind, FoldOp op, const DescTable& t, size_t b0, size_t b1,
                           const char* src, i64 src_bytes, char* dst, i64 dst_bytes);

}  // namespace pyshard
