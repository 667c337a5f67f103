#include "memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include <algorithm>
#include <new>
#include <stdexcept>

#include "device_fold.h"

namespace pyshard {

void advise_huge_pages(void* p, i64 n) {
#ifdef MADV_HUGEPAGE
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + kHugePageBytes - 1) &
                 ~(kHugePageBytes - 1);
  const auto b = (reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(n)) &
                 ~(kHugePageBytes - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);  // a hint: no error
#else
  (void)p;
  (void)n;
#endif
}

namespace {

// Buffers of kHugeFromBytes or more start on a huge-page boundary and are advised to use
// huge pages (MADV_HUGEPAGE; transparent huge pages are "madvise" on many systems): their
// first touch then faults in 2 MiB at a time. Writing 64 MiB of fresh pages took 42 ms in
// 4 KiB faults and 9.7 ms so advised, against 2.9 ms for pages already there (this VM).

char* map_pages(i64 n) {
  const bool huge = n >= kHugeFromBytes;
  const size_t span = static_cast<size_t>(n) + (huge ? kHugePageBytes : 0);
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  char* base = static_cast<char*>(p);
  if (!huge) return base;
  // keep [at, at + n) on a huge-page boundary, give back the rest (unmap_pages(at, n) then
  // unmaps exactly what is left)
  const auto b0 = reinterpret_cast<std::uintptr_t>(base);
  char* at = reinterpret_cast<char*>((b0 + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* end = at + (static_cast<size_t>(n) + page - 1) / page * page;
  if (at > base) munmap(base, static_cast<size_t>(at - base));
  if (end < base + span) munmap(end, static_cast<size_t>(base + span - end));
  advise_huge_pages(at, n);
  return at;
}

void unmap_pages(char* p, i64 n) {
  if (p) munmap(p, static_cast<size_t>(n));
}

// Host memory: copies are memcpy loops over the descriptors, done when they return. Its
// buffers are mmap'd pages, so a trimmed workspace goes back to the OS at once.
class HostPacker final : public Packer {
 public:
  Mem kind() const override { return Mem::host; }
  void set_stream(std::uintptr_t) override {}
  void copy(const DescTable& t, size_t b0, size_t b1, const char* src, char* dst) override {
    if (b1 <= b0) return;
    for (size_t i = t.first[b0]; i < t.first[b1]; ++i) copy_host(t.host[i], src, dst);
  }
  void to_host(char* host, const char* mem, i64 n) override {
    if (n > 0) std::memcpy(host, mem, static_cast<size_t>(n));
  }
  void from_host(char* mem, const char* host, i64 n) override {
    if (n > 0) std::memcpy(mem, host, static_cast<size_t>(n));
  }
  void copy_bytes(char* dst, const char* src, i64 n) override {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n));
  }
  void sync() override {}
  void sync_device() override {}
  void finish() override {}
  char* alloc(i64 n) override { return map_pages(n); }
  void release(char* p, i64 n) override { unmap_pages(p, n); }
  char* alloc_bounce(i64 n) override { return map_pages(n); }
  void release_bounce(char* p, i64 n) override { unmap_pages(p, n); }
};

}  // namespace

Packer& host_packer() {
  static HostPacker p;
  return p;
}

char* Workspace::get(int slot, Packer& pk, i64 n, bool bounce) {
  Region& r = r_[slot];
  if (n <= 0) return nullptr;
  if (r.ptr && r.cap >= n) return r.ptr;
  if (r.ptr) {
    if (r.bounce)
      r.owner->release_bounce(r.ptr, r.cap);
    else
      r.owner->release(r.ptr, r.cap);
    r.ptr = nullptr;
  }
  // grow by a quarter at least, so a slowly growing need does not reallocate every call
  const i64 cap = align_up(std::max(n, r.cap + r.cap / 4));
  r.ptr = bounce ? pk.alloc_bounce(cap) : pk.alloc(cap);
  r.cap = cap;
  r.owner = &pk;
  r.bounce = bounce;
  return r.ptr;
}

void Workspace::trim(i64 keep) {
  // keep a region that the growth rule in get() would have made for `keep` bytes anyway
  const i64 limit = keep < 0 ? -1 : align_up(keep + keep / 4);
  for (Region& r : r_) {
    if (r.ptr && r.cap > limit) {
      if (r.bounce)
        r.owner->release_bounce(r.ptr, r.cap);
      else
        r.owner->release(r.ptr, r.cap);
      r.ptr = nullptr;
      r.cap = 0;
    }
  }
}

i64 Workspace::held() const {
  i64 t = 0;
  for (const Region& r : r_) t += r.cap;
  return t;
}

ResultPool& ResultPool::get() {
  static ResultPool p;
  return p;
}

void ResultPool::Unmap::operator()(char* p, i64 cap) const { unmap_pages(p, cap); }

char* ResultPool::take(i64 n, i64* cap) {
  char* p = nullptr;
  if (pool_.take(n, &p, cap)) return p;
  *cap = align_up(n);
  return map_pages(*cap);
}

void ResultPool::give(char* p, i64 cap) { pool_.give(p, cap); }

void ResultPool::clear() { pool_.clear(); }

void ResultPool::set_limit(i64 bytes) {
  pool_.set_limit(bytes < 0 ? 0 : bytes);
  pool_.shrink();
}

#ifndef PYSHARD_WITH_CUDA
Packer& cuda_packer() {
  throw std::runtime_error(
      "pyshard: this build of the core has no CUDA support; rebuild with PYSHARD_CUDA=ON "
      "(see the README, 'GPU arrays')");
}
bool cuda_built() { return false; }
int cuda_build_version() { return -1; }
bool cuda_device_present() { return false; }
void device_fold_combine(Packer&, FoldKind, FoldOp, const DescTable&, size_t, size_t,
                         const char*, char*) {
  cuda_packer();  // throws: no CUDA in this build
}
#endif

}  // namespace pyshard
