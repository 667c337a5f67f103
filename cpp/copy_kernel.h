// The body of the CUDA copy kernel, one thread at a time, as a plain function of its block and
// thread indices: nvcc compiles it into the `__global__` wrapper in cuda_packer.cu (which only
// passes blockIdx/threadIdx/gridDim/blockDim), and the host compiler compiles the same lines
// into the CPU build, where kernel_harness.h runs it over the whole launch grid. No CUDA
// intrinsics or CUDA types in here: what the kernel does is what the host tests see.
//
// One launch copies every descriptor of a range of blocks of a descriptor table (box.h),
// after kernel_launch.h has split its runs at kRunChunk bytes: the y dimension of the grid
// strides over the descriptors, the warps of the x dimension (all blocks' warps together)
// stride over the runs of a descriptor, and the 32 lanes of a warp copy the words of a run,
// 16, 8, 4, 2 or 1 bytes wide: the widest word that divides the descriptor's alignment (run
// length, both offsets, every stride) and the alignment of both base pointers.
#pragma once

#include <cstdint>
#include <initializer_list>
#ifndef __CUDA_ARCH__
#include <stdexcept>
#endif

#include "box.h"

namespace pyshard {

// Runs longer than this are split (geometry.h split_runs): a warp copies at most 4 KiB per run.
constexpr i64 kRunChunk = 4096;
// Threads per block of the copy kernel (8 warps).
constexpr int kThreads = 256;

// Where one thread sits in a launch (CUDA's blockIdx.x/y, threadIdx.x, gridDim.x/y, blockDim.x).
struct ThreadIndex {
  int block_x, block_y, thread_x;
  int grid_x, grid_y, block_dim_x;
};

// The widest word a copy may use: 16 bytes as a plain aligned struct (CUDA's uint4 is the
// same size and alignment; nvcc moves it with one vector load and store).
struct alignas(16) Word16 {
  std::uint32_t x, y, z, w;
};

// Largest of 16, 8, 4, 2, 1 dividing both base pointers, as the launcher passes it.
inline int pointer_alignment(const void* a, const void* b) {
  const std::uintptr_t v =
      reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b);
  for (int k : {16, 8, 4, 2})
    if (v % k == 0) return k;
  return 1;
}

// The word width (bytes) the kernel copies a descriptor with.
PYSHARD_HD inline int word_width(i64 desc_align, int ptr_align) {
  const i64 a = desc_align < ptr_align ? desc_align : ptr_align;
  return a >= 16 ? 16 : a >= 8 ? 8 : a >= 4 ? 4 : a >= 2 ? 2 : 1;
}

// Lane `lane` of a warp copies words lane, lane + 32, ... of one run of `bytes` bytes.
// Compiled for the host (the harness), a misaligned word traps as it would on the device
// ("misaligned address"), instead of working as x86 lets it.
template <class W>
PYSHARD_HD inline void copy_run(const char* __restrict__ s, char* __restrict__ t, i64 bytes,
                                int lane) {
#ifndef __CUDA_ARCH__
  if ((reinterpret_cast<std::uintptr_t>(s) | reinterpret_cast<std::uintptr_t>(t)) % sizeof(W))
    throw std::runtime_error("pyshard: the copy kernel would read or write a misaligned word");
#endif
  const W* sw = reinterpret_cast<const W*>(s);
  W* tw = reinterpret_cast<W*>(t);
  const i64 n = bytes / static_cast<i64>(sizeof(W));
  for (i64 i = lane; i < n; i += 32) tw[i] = sw[i];
}

// One thread of the copy kernel over descriptors descs[0, ndesc) (a launch's range of the
// kernel table), from `src` to `dst`; ptr_align = pointer_alignment(src, dst).
PYSHARD_HD inline void copy_kernel_thread(const CopyDesc* __restrict__ descs, int ndesc,
                                          const char* __restrict__ src, char* __restrict__ dst,
                                          int ptr_align, const ThreadIndex& at) {
  const int lane = at.thread_x & 31;
  const i64 warp = (static_cast<i64>(at.block_x) * at.block_dim_x + at.thread_x) >> 5;
  const i64 nwarps = (static_cast<i64>(at.grid_x) * at.block_dim_x) >> 5;
  for (int di = at.block_y; di < ndesc; di += at.grid_y) {
    const CopyDesc& d = descs[di];
    const int w = word_width(d.align, ptr_align);
    for (i64 r = warp; r < d.runs; r += nwarps) {
      i64 so, to;
      run_offsets(d, r, &so, &to);
      const char* s = src + so;
      char* t = dst + to;
      if (w == 16)
        copy_run<Word16>(s, t, d.run, lane);
      else if (w == 8)
        copy_run<std::uint64_t>(s, t, d.run, lane);
      else if (w == 4)
        copy_run<std::uint32_t>(s, t, d.run, lane);
      else if (w == 2)
        copy_run<std::uint16_t>(s, t, d.run, lane);
      else
        copy_run<std::uint8_t>(s, t, d.run, lane);
    }
  }
}

}  // namespace pyshard
