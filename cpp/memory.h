// Memory kinds, packers and the workspace pool.
//
// A `Packer` is the one small interface every step calls to move bytes in the memory of the
// array it runs on: copy the blocks of a descriptor table (one pass on the host, one kernel
// launch on a GPU), copy to and from host memory (for staging), and wait. `host_packer()`
// is always there; `cuda_packer()` exists when the core was built with CUDA.
//
// A `Workspace` is the pool a mesh's steps share: pack/unpack buffers in the array's memory
// and bounce buffers in host memory (pinned for a GPU), grown on demand, reused by every
// step, trimmed when the executor caches evict, released when the mesh is freed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "geometry.h"
#include "pool.h"

namespace pyshard {

enum class Mem { host = 0, cuda = 1 };

// How a step's MPI call reaches the data: on the array's own memory (host arrays; GPU arrays
// with a CUDA-aware MPI), or staged through host bounce buffers.
enum class Transport { direct = 0, staged = 1 };

class Packer {
 public:
  virtual ~Packer() = default;
  virtual Mem kind() const = 0;
  // Make `stream` (a cudaStream_t as an integer; 0 = the default stream) current.
  virtual void set_stream(std::uintptr_t stream) = 0;
  // Copy blocks [b0, b1) of table `t` from `src` to `dst`; may return before it is done.
  virtual void copy(const DescTable& t, size_t b0, size_t b1, const char* src, char* dst) = 0;
  void copy_all(const DescTable& t, const char* src, char* dst) { copy(t, 0, t.blocks(), src, dst); }
  // Contiguous copies between this memory and host memory; may return before they are done.
  virtual void to_host(char* host, const char* mem, i64 n) = 0;
  virtual void from_host(char* mem, const char* host, i64 n) = 0;
  // A contiguous copy within this memory; may return before it is done.
  virtual void copy_bytes(char* dst, const char* src, i64 n) = 0;
  // Wait until everything queued so far is done (before MPI reads or writes the buffers).
  virtual void sync() = 0;
  // Wait until everything queued on this device, on any stream, is done.
  virtual void sync_device() = 0;
  // The end of a step: later steps on any stream wait for what this one queued.
  virtual void finish() = 0;
  // Memory of this kind, and host memory to stage it through.
  virtual char* alloc(i64 n) = 0;
  virtual void release(char* p, i64 n) = 0;
  virtual char* alloc_bounce(i64 n) = 0;
  virtual void release_bounce(char* p, i64 n) = 0;
};

Packer& host_packer();
Packer& cuda_packer();  // throws std::runtime_error when built without CUDA

// The huge-page size that big host buffers are aligned to and advised to use, and the
// size from which they are (a fresh buffer of this size or more faults in 2 MiB at a time).
inline constexpr std::uintptr_t kHugePageBytes = std::uintptr_t{2} << 20;
inline constexpr i64 kHugeFromBytes = i64{4} << 20;

// Advise the huge-page-aligned interior of [p, p + n) to use transparent huge pages
// (MADV_HUGEPAGE; a hint, errors ignored): its first touch faults in 2 MiB at a time.
void advise_huge_pages(void* p, i64 n);

// CUDA facts for build_info() and cuda_available(); all false / -1 without CUDA.
bool cuda_built();
int cuda_build_version();  // e.g. 13000, or -1
bool cuda_device_present();  // a driver and at least one device

class Workspace {
 public:
  Workspace() = default;
  ~Workspace() { release(); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // At least n bytes of memory of kind `pk`, 4 KiB aligned (contents not kept across calls).
  char* work(Packer& pk, i64 n) { return get(pk.kind() == Mem::host ? 0 : 1, pk, n, false); }
  // At least n bytes of host memory to stage `pk`'s memory through.
  char* bounce(Packer& pk, i64 n) { return get(pk.kind() == Mem::host ? 2 : 3, pk, n, true); }
  // Free every region larger than `keep` bytes plus the growth margin (the next use
  // allocates what it needs); keep < 0 frees everything.
  void trim(i64 keep);
  void release() { trim(-1); }
  i64 held() const;

 private:
  struct Region {
    char* ptr = nullptr;
    i64 cap = 0;
    Packer* owner = nullptr;
    bool bounce = false;
  };
  char* get(int slot, Packer& pk, i64 n, bool bounce);
  Region r_[4];  // host work, device work, host bounce (for host staging), pinned bounce
};

// Host memory for results: a buffer given back (its array freed) is kept, already faulted in,
// for the next result of about its size, so a loop of redistributes without `out=` stops
// paying page faults. A BestFitPool (pool.h) of at most 8 buffers and 1 GiB (set_limit; 0
// keeps nothing).
class ResultPool {
 public:
  static ResultPool& get();
  char* take(i64 n, i64* cap);
  void give(char* p, i64 cap);
  void clear();
  void set_limit(i64 bytes);
  i64 limit() const { return pool_.limit(); }
  i64 held() const { return pool_.held(); }

 private:
  struct Unmap {
    void operator()(char* p, i64 cap) const;
  };
  BestFitPool<char*, Unmap> pool_{8, i64(1) << 30};
};

}  // namespace pyshard
