// The CUDA packer: one kernel launch copies every block of a descriptor table (all blocks of
// all peers of a step), with 16/8/4/2/1-byte loads and stores where the descriptors' alignment
// and the pointers allow. The kernel's body (copy_kernel.h), its descriptor table and its grid
// (kernel_launch.h) are host code too: the CPU build runs them over whole launch grids
// (kernel_harness.h, tests/test_kernels_on_host.py), so this file holds only the CUDA calls.
// Descriptor tables are uploaded to the device once per step and kept there; workspaces come
// from the pool (cudaMalloc only when a workspace grows); bounce buffers are pinned host memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "combine_kernel.h"
#include "copy_kernel.h"
#include "device_fold.h"
#include "kernel_launch.h"
#include "memory.h"

namespace pyshard {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("pyshard: ") + what + " failed: " + cudaGetErrorString(e));
}

// The kernel: one thread of copy_kernel.h's body per CUDA thread (the host harness runs the
// same body over the same grid: kernel_harness.h).
__global__ void copy_kernel(const CopyDesc* __restrict__ descs, int ndesc,
                            const char* __restrict__ src, char* __restrict__ dst, int ptr_align) {
  const ThreadIndex at{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                       static_cast<int>(threadIdx.x), static_cast<int>(gridDim.x),
                       static_cast<int>(gridDim.y), static_cast<int>(blockDim.x)};
  copy_kernel_thread(descs, ndesc, src, dst, ptr_align, at);
}

// The fold's combine: one thread of combine_kernel.h's body per CUDA thread over the runs of
// one descriptor (passed by value: no table to upload), launched per descriptor in order.
template <class T, class F>
__global__ void combine_kernel(CopyDesc d, const char* src, char* dst, F f) {
  const ThreadIndex at{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                       static_cast<int>(threadIdx.x), static_cast<int>(gridDim.x),
                       static_cast<int>(gridDim.y), static_cast<int>(blockDim.x)};
  combine_kernel_thread<T>(d, src, dst, f, at);
}

class CudaPacker final : public Packer {
 public:
  cudaStream_t stream() const { return stream_; }
  Mem kind() const override { return Mem::cuda; }
  void set_stream(std::uintptr_t s) override {
    stream_ = reinterpret_cast<cudaStream_t>(s);
    if (!done_) check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    // the previous step (maybe on another stream) must be done with the shared workspace
    check(cudaStreamWaitEvent(stream_, done_, 0), "cudaStreamWaitEvent");
  }
  void copy(const DescTable& t, size_t b0, size_t b1, const char* src, char* dst) override {
    if (copies_nothing(t, b0, b1)) return;
    upload(t);
    // block b's descriptors in the (split) device table, and the grid (kernel_launch.h)
    const KernelLaunch l = copy_launch(t.device_first, t.device_max_runs, b0, b1);
    if (l.n == 0) return;
    const dim3 grid(l.grid_x, l.grid_y);
    copy_kernel<<<grid, l.block_x, 0, stream_>>>(
        static_cast<const CopyDesc*>(t.device.get()) + l.first, l.n, src, dst,
        pointer_alignment(src, dst));
    check(cudaGetLastError(), "the pack kernel launch");
  }
  void to_host(char* host, const char* mem, i64 n) override {
    if (n > 0)
      check(cudaMemcpyAsync(host, mem, static_cast<size_t>(n), cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (device to host)");
  }
  void from_host(char* mem, const char* host, i64 n) override {
    if (n > 0)
      check(cudaMemcpyAsync(mem, host, static_cast<size_t>(n), cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync (host to device)");
  }
  void copy_bytes(char* dst, const char* src, i64 n) override {
    if (n > 0)
      check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync (device to device)");
  }
  void sync() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void sync_device() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  void finish() override { check(cudaEventRecord(done_, stream_), "cudaEventRecord"); }
  char* alloc(i64 n) override {
    void* p = nullptr;
    check(cudaMalloc(&p, static_cast<size_t>(n)), "cudaMalloc (workspace)");
    return static_cast<char*>(p);
  }
  // the device: the stream of the last call may be gone by the time a pool is trimmed
  void release(char* p, i64) override {
    cudaDeviceSynchronize();
    cudaFree(p);
  }
  char* alloc_bounce(i64 n) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, static_cast<size_t>(n), cudaHostAllocDefault),
          "cudaHostAlloc (staging buffer)");
    return static_cast<char*>(p);
  }
  void release_bounce(char* p, i64) override {
    cudaDeviceSynchronize();
    cudaFreeHost(p);
  }

 private:
  // Upload `t` once: the kernel table (kernel_launch.h: runs split at 4 KiB, block
  // boundaries remembered).
  void upload(const DescTable& t) {
    if (t.device) return;
    KernelTable k = kernel_table(t);
    const std::vector<CopyDesc>& dev = k.descs;
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(1, dev.size() * sizeof(CopyDesc))), "cudaMalloc");
    // On the step's stream, and waited for: a plain cudaMemcpy runs on the legacy default
    // stream and, from pageable memory, may return before the bytes land, and a kernel on a
    // non-blocking stream (XLA's, or a cupy Stream(non_blocking=True)) is not ordered after
    // it: the first call of each step then read a half-uploaded table (pyshard.jax on the
    // GPU, 2026-12-04/05: wrong results on some ranks, an illegal memory access once).
    check(cudaMemcpyAsync(p, dev.data(), dev.size() * sizeof(CopyDesc), cudaMemcpyHostToDevice,
                          stream_),
          "cudaMemcpyAsync (descriptor table)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (descriptor table)");
    t.device = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    t.device_max_runs = k.max_runs;
    t.device_first = std::move(k.first);
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace

void device_fold_combine(Packer& pk, FoldKind kind, FoldOp op, const DescTable& t, size_t b0,
                         size_t b1, const char* src, char* dst) {
  if (pk.kind() != Mem::cuda)
    throw std::invalid_argument("pyshard: device_fold_combine takes the CUDA packer");
  if (!with_fold_type(kind, op, [](auto, auto) {}))
    throw std::invalid_argument("pyshard: the combine kernel has no combine for this element "
                                "kind and op");
  cudaStream_t stream = static_cast<CudaPacker&>(pk).stream();
  for (size_t b = b0; b < b1 && b < t.blocks(); ++b)
    for (size_t i = t.first[b]; i < t.first[b + 1]; ++i) {
      const CopyDesc& d = t.host[i];
      const KernelLaunch l = combine_launch(d);
      if (l.n == 0) continue;
      with_fold_type(kind, op, [&](auto tag, auto f) {
        using T = typename decltype(tag)::type;
        combine_kernel<T, decltype(f)><<<l.grid_x, l.block_x, 0, stream>>>(d, src, dst, f);
      });
      check(cudaGetLastError(), "the combine kernel launch");
    }
}

Packer& cuda_packer() {
  static CudaPacker p;
  return p;
}

bool cuda_built() { return true; }

int cuda_build_version() { return CUDART_VERSION; }

bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return n > 0;
}

}  // namespace pyshard
