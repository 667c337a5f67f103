// The CUDA packer: one kernel launch copies every block of a descriptor table (all blocks of
// all peers of a step), with 16/8/4-byte loads and stores where the descriptors' alignment and
// the pointers allow. The index math is box.h's, which the host tests cover. Descriptor tables
// are uploaded to the device once per step and kept there; workspaces come from the pool
// (cudaMalloc only when a workspace grows); bounce buffers are pinned host memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "memory.h"

namespace pyshard {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("pyshard: ") + what + " failed: " + cudaGetErrorString(e));
}

// Runs longer than this are split (geometry.h split_runs): a warp copies at most 4 KiB per run.
constexpr i64 kRunChunk = 4096;
constexpr int kThreads = 256;

template <class W>
__device__ void copy_run(const char* __restrict__ s, char* __restrict__ t, i64 bytes, int lane) {
  const W* sw = reinterpret_cast<const W*>(s);
  W* tw = reinterpret_cast<W*>(t);
  const i64 n = bytes / static_cast<i64>(sizeof(W));
  for (i64 i = lane; i < n; i += 32) tw[i] = sw[i];
}

// blockIdx.y strides over descriptors; the warps of the x dimension stride over its runs.
__global__ void copy_kernel(const CopyDesc* __restrict__ descs, int ndesc,
                            const char* __restrict__ src, char* __restrict__ dst, int ptr_align) {
  const int lane = threadIdx.x & 31;
  const i64 warp = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const i64 nwarps = (static_cast<i64>(gridDim.x) * blockDim.x) >> 5;
  for (int di = blockIdx.y; di < ndesc; di += gridDim.y) {
    const CopyDesc& d = descs[di];
    const i64 a = d.align < ptr_align ? d.align : ptr_align;
    for (i64 r = warp; r < d.runs; r += nwarps) {
      i64 so, to;
      run_offsets(d, r, &so, &to);
      const char* s = src + so;
      char* t = dst + to;
      if (a >= 16)
        copy_run<uint4>(s, t, d.run, lane);
      else if (a >= 8)
        copy_run<unsigned long long>(s, t, d.run, lane);
      else if (a >= 4)
        copy_run<unsigned int>(s, t, d.run, lane);
      else if (a >= 2)
        copy_run<unsigned short>(s, t, d.run, lane);
      else
        copy_run<unsigned char>(s, t, d.run, lane);
    }
  }
}

int pointer_alignment(const void* a, const void* b) {
  const std::uintptr_t v = reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b);
  for (int k : {16, 8, 4, 2})
    if (v % k == 0) return k;
  return 1;
}

class CudaPacker final : public Packer {
 public:
  Mem kind() const override { return Mem::cuda; }
  void set_stream(std::uintptr_t s) override {
    stream_ = reinterpret_cast<cudaStream_t>(s);
    if (!done_) check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    // the previous step (maybe on another stream) must be done with the shared workspace
    check(cudaStreamWaitEvent(stream_, done_, 0), "cudaStreamWaitEvent");
  }
  void copy(const DescTable& t, size_t b0, size_t b1, const char* src, char* dst) override {
    if (b1 <= b0 || t.first[b1] == t.first[b0]) return;
    upload(t);
    // block b's descriptors in the (split) device table
    const size_t d0 = t.device_first[b0], d1 = t.device_first[b1];
    const int n = static_cast<int>(d1 - d0);
    if (n == 0) return;
    const i64 warps_needed = std::max<i64>(1, t.device_max_runs);
    const int gx = static_cast<int>(std::min<i64>((warps_needed * 32 + kThreads - 1) / kThreads,
                                                  std::max(1, 4096 / std::min(n, 4096))));
    const dim3 grid(std::max(gx, 1), std::min(n, 65535));
    copy_kernel<<<grid, kThreads, 0, stream_>>>(
        static_cast<const CopyDesc*>(t.device.get()) + d0, n, src, dst,
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
  void sync() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
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
  // Upload `t` once: runs split into 4 KiB chunks, block boundaries remembered.
  void upload(const DescTable& t) {
    if (t.device) return;
    std::vector<CopyDesc> dev;
    std::vector<size_t> first{0};
    i64 max_runs = 0;
    for (size_t b = 0; b < t.blocks(); ++b) {
      std::vector<CopyDesc> blk(t.host.begin() + t.first[b], t.host.begin() + t.first[b + 1]);
      for (const CopyDesc& d : split_runs(blk, kRunChunk)) {
        dev.push_back(d);
        max_runs = std::max(max_runs, d.runs);
      }
      first.push_back(dev.size());
    }
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(1, dev.size() * sizeof(CopyDesc))), "cudaMalloc");
    check(cudaMemcpy(p, dev.data(), dev.size() * sizeof(CopyDesc), cudaMemcpyHostToDevice),
          "cudaMemcpy (descriptor table)");
    t.device = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    t.device_max_runs = max_runs;
    t.device_first = std::move(first);
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace

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
