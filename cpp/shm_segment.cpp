#include "shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <stdexcept>

namespace pyshard {

namespace shm {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

char* map_foreign(std::int64_t pid, std::int64_t fd, i64 cap, bool populate) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/fd/%lld", static_cast<long long>(pid),
                static_cast<long long>(fd));
  const int f = ::open(path, O_RDWR | O_CLOEXEC);
  if (f < 0) return nullptr;
  void* p = ::mmap(nullptr, static_cast<size_t>(cap), PROT_READ | PROT_WRITE,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), f, 0);
  const int e = errno;
  ::close(f);
  errno = e;
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

}  // namespace shm

using shm::errno_text;
using shm::kPage;
using shm::map_foreign;
using shm::page_up;

void shm_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void futex_wait(std::atomic<std::uint32_t>* w, std::uint32_t v) {
  timespec t{0, 10 * 1000 * 1000};  // 10 ms: a safety net, not the wake-up path
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAIT, v, &t, nullptr, 0);
}

static std::atomic<double> g_peer_timeout{300.0};

double peer_timeout() { return g_peer_timeout.load(std::memory_order_relaxed); }

void set_peer_timeout(double seconds) {
  if (!(seconds > 0)) throw std::invalid_argument("pyshard: the peer timeout must be > 0 s");
  g_peer_timeout.store(seconds, std::memory_order_relaxed);
}

void peer_timed_out(const std::string& what) {
  char t[32];
  std::snprintf(t, sizeof t, "%g", peer_timeout());
  throw std::runtime_error(std::string("pyshard: waited ") + t + " s for " + what +
                           " (PYSHARD_PEER_TIMEOUT): that rank died or stopped, or waits in another "
                           "call (exchanges started in different orders, or settings or "
                           "arguments that differ between ranks: PYSHARD_VALIDATE=1 checks "
                           "them); the job cannot go on");
}

static std::atomic<bool> g_cma{true};

bool cma_enabled() { return g_cma.load(std::memory_order_relaxed); }
void set_cma_enabled(bool on) { g_cma.store(on, std::memory_order_relaxed); }

int allow_peer_attach(const std::string& scope_file) {
  std::FILE* f = std::fopen(scope_file.c_str(), "r");
  if (f == nullptr) return 0;
  const int c = std::fgetc(f);
  std::fclose(f);
  if (c == EOF || c == '0') return 0;
#ifdef PR_SET_PTRACER
  if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0) return 1;
  return -errno;
#else
  return -ENOSYS;
#endif
}

void futex_wake(std::atomic<std::uint32_t>* w) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

static_assert(sizeof(ShmSlot) <= kPage, "a rank's slot fits its control page");

namespace {
// Fault in [p, p + n) for writing, as MAP_POPULATE would have at mmap (before which a huge
// page hint could not be given): MADV_POPULATE_WRITE (Linux 5.14), else, where the kernel does
// not know it, a write to each page (the memfd is new, so its pages hold zeros either way).
// 0, or the errno of a refusal (ENOMEM: the node's shared memory is short), which the caller
// raises rather than leave a later write to die of SIGBUS.
int populate(char* p, i64 n) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(p, static_cast<size_t>(n), MADV_POPULATE_WRITE) == 0) return 0;
  if (errno != EINVAL) return errno;
#endif
  for (i64 i = 0; i < n; i += kPage) reinterpret_cast<volatile char*>(p)[i] = 0;
  return 0;
}
// memfd_create refused (errno set): out of file descriptors says why and what to do (the
// node peers of this call wait for this rank until PYSHARD_PEER_TIMEOUT)
[[noreturn]] void memfd_failed() {
  const bool fds = errno == EMFILE || errno == ENFILE;
  std::string e = errno_text("memfd_create");
  if (fds)
    e += " (each node-shared result, and each segment a pool keeps, holds one file "
         "descriptor while it lives: raise the limit, `ulimit -n`, keep fewer results, or "
         "set PYSHARD_SHM=off to move host arrays by MPI; docs/site/troubleshooting.md)";
  throw std::runtime_error(e);
}
}  // namespace

ShmSegment::ShmSegment(i64 bytes, std::uint64_t seg_id) : cap(page_up(bytes)), id(seg_id) {
  fd = ::memfd_create("pyshard", MFD_CLOEXEC);
  if (fd < 0) memfd_failed();
  if (::ftruncate(fd, cap) != 0) {
    const std::string e = errno_text("ftruncate");
    ::close(fd);
    throw std::runtime_error(e);
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(cap), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string e = errno_text("mmap");
    ::close(fd);
    throw std::runtime_error(e);
  }
  ptr = static_cast<char*>(p);
  // Huge pages where the kernel gives shared memory them on request
  // (/sys/kernel/mm/transparent_hugepage/shmem_enabled "advise"; "always" and "within_size"
  // give them unasked, "never", Debian's default, not at all): the hint goes before the pages
  // are faulted in, which is then done here (the kernel aligns a shared mapping to 2 MiB where
  // it may hold huge pages, and node peers' mappings of the memfd map the same huge pages).
  // Measured (2026-12-05, a 64 MiB streamed copy into the segment): 5.3-5.4 ms on huge pages
  // against 7.2-7.9 on 4 KiB ones.
#ifdef MADV_HUGEPAGE
  ::madvise(p, static_cast<size_t>(cap), MADV_HUGEPAGE);  // a hint: no error if refused
#endif
  if (const int e = populate(ptr, cap)) {
    ::munmap(p, static_cast<size_t>(cap));
    ::close(fd);
    ptr = nullptr;
    fd = -1;
    throw std::runtime_error(std::string("pyshard: node-shared memory of ") + std::to_string(cap) +
                             " bytes could not be faulted in: " + std::strerror(e));
  }
}

ShmSegment::ShmSegment(i64 bytes, std::uint64_t seg_id,
                       const std::vector<std::pair<i64, i64>>& shared)
    : cap(page_up(bytes)), id(seg_id) {
  for (const auto& [off, len] : shared)
    if (off < 0 || len <= 0 || off % kPage || len % kPage || off + len > cap)
      throw std::invalid_argument("pyshard: a shared range outside its segment's pages");
  fd = ::memfd_create("pyshard", MFD_CLOEXEC);
  if (fd < 0) memfd_failed();
  // the private view, at a 2 MiB boundary (where huge pages can back it)
  constexpr i64 kHuge = i64(2) << 20;
  const size_t span = static_cast<size_t>(cap + kHuge);
  void* a = MAP_FAILED;
  if (::ftruncate(fd, cap) == 0)
    a = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
  if (a == MAP_FAILED) {
    const std::string e = errno_text("mmap");
    ::close(fd);
    throw std::runtime_error(e);
  }
  char* base = static_cast<char*>(a);
  char* at = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(base) + kHuge - 1) /
                                     kHuge * kHuge);
  if (at > base) ::munmap(base, static_cast<size_t>(at - base));
  char* end = at + cap;
  if (end < base + span) ::munmap(end, static_cast<size_t>(base + span - end));
#ifdef MADV_HUGEPAGE
  ::madvise(at, static_cast<size_t>(cap), MADV_HUGEPAGE);  // a hint: no error if refused
#endif
  for (const auto& [off, len] : shared) {
    void* q = ::mmap(at + off, static_cast<size_t>(len), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, off);
    if (q == MAP_FAILED) {
      const std::string e = errno_text("mmap");
      ::munmap(at, static_cast<size_t>(cap));
      ::close(fd);
      throw std::runtime_error(e);
    }
  }
  ptr = at;
}

ShmSegment::~ShmSegment() {
  if (ptr) ::munmap(ptr, static_cast<size_t>(cap));
  if (fd >= 0) ::close(fd);
}

// ----------------------------------------------------------------------------- setup

namespace {
// the header: the owner's state, and how many of its peers have tried to map it
std::atomic<std::uint32_t>& ctl_state(char* segment) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(segment);
}
std::atomic<std::uint32_t>& ctl_tried(char* segment) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(segment + 64);
}
// where the owner has its own segment mapped (written before the mesh's Allgather), and
// whether the owner could write into each of its node peers by process_vm_writev (1: yes,
// 2: no; published with the state)
std::atomic<std::uint64_t>& ctl_self(char* segment) {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(segment + 128);
}
std::atomic<std::uint32_t>& ctl_cma(char* segment) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(segment + 192);
}
// a word of the header that node peers write into (by process_vm_writev) to try it
char* ctl_scratch(char* segment) { return segment + 256; }

// Can this process write into process `pid` by cross-memory attach? Writes the word the
// peer holds at `scratch` (its own address of it) with what is already there, read through
// the mapping `seen`: the same permission check as every later write (ptrace's attach
// mode: Yama's ptrace_scope, seccomp and containers may refuse it where /proc/<pid>/fd
// opened).
bool cma_works(std::int64_t pid, std::uint64_t scratch, const char* seen) {
  if (scratch == 0) return false;
  std::uint64_t v;
  std::memcpy(&v, seen, sizeof v);
  iovec l{&v, sizeof v}, r{reinterpret_cast<void*>(scratch), sizeof v};
  return ::process_vm_writev(static_cast<pid_t>(pid), &l, 1, &r, 1, 0) ==
         static_cast<ssize_t>(sizeof v);
}
}  // namespace

NodeCtl::NodeCtl(int slots, bool fail) : slots_(slots) {
  try {
    if (fail)  // asked for: this rank cannot set up (the others follow)
      throw std::runtime_error("this rank's NodeCtl was made with fail=True");
    mine_ = std::make_shared<ShmSegment>((1 + static_cast<i64>(slots)) * kPage, 0);
    bytes_ = mine_->cap;
    for (int k = 0; k < slots; ++k) {
      auto* s = new (mine_->ptr + (1 + k) * kPage) ShmSlot();
      s->epoch.store(0);
      s->failed.store(0);
      s->arrived.store(0);
      s->seq.store(0);
      s->sleepers.store(0);
      s->nids.store(0);
      s->pid = static_cast<std::int64_t>(::getpid());
      s->dst_addr = 0;
    }
    ctl_self(mine_->ptr).store(reinterpret_cast<std::uint64_t>(mine_->ptr));
    // a peer opens it through /proc/<pid>/fd/<fd>: check that this works here at all
    char* probe = map_foreign(::getpid(), mine_->fd, kPage);
    if (!probe) throw std::runtime_error(errno_text("opening node-shared memory through /proc/<pid>/fd"));
    ::munmap(probe, kPage);
    ok_ = true;
  } catch (const std::exception& e) {
    mine_.reset();
    why_ = e.what();
  }
}

NodeCtl::~NodeCtl() { release(); }


void NodeCtl::release() {
  if (mine_ && expect_ > 0) {
    // a peer opens this segment through /proc/<pid>/fd after the mesh's Allgather: keep it
    // open until every peer has tried (a rank may free its mesh, or exit, at once). Bounded:
    // a peer that died never tries.
    auto& tried = ctl_tried(mine_->ptr);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::uint32_t v;
    while ((v = tried.load(std::memory_order_acquire)) < static_cast<std::uint32_t>(expect_) &&
           std::chrono::steady_clock::now() < until)
      futex_wait(&tried, v);
  }
  expect_ = 0;
  for (auto& [r, p] : peers_) ::munmap(p, static_cast<size_t>(bytes_));
  peers_.clear();
  mine_.reset();
}

bool NodeCtl::connect(int me, const std::vector<int>& ranks,
                      const std::vector<std::int64_t>& pids, const std::vector<std::int64_t>& fds,
                      bool fail, bool no_cma) {
  me_ = me;
  if (!mine_) return false;
  expect_ = 0;
  for (int r : ranks) expect_ += r != me;
  bool all = !fail, cma = !no_cma;
  if (fail) why_ = "this rank's NodeCtl.connect was called with fail=True";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == me) continue;
    char* p = fds[i] >= 0 ? map_foreign(pids[i], fds[i], bytes_) : nullptr;
    if (!p) {
      all = false;
      why_ = errno_text("opening a node peer's memory through /proc/<pid>/fd");
      continue;
    }
    peers_.emplace_back(ranks[i], p);
    const std::uint64_t at = ctl_self(p).load(std::memory_order_acquire);
    cma = cma && cma_works(pids[i], at ? at + 256 : 0, ctl_scratch(p));
    ctl_tried(p).fetch_add(1, std::memory_order_acq_rel);  // it may close its segment now
    futex_wake(&ctl_tried(p));
  }
  ctl_cma(mine_->ptr).store(cma ? 1 : 2, std::memory_order_relaxed);
  ctl_state(mine_->ptr).store(all ? 1 : 2, std::memory_order_release);
  futex_wake(&ctl_state(mine_->ptr));
  return all;
}

bool NodeCtl::cma(const std::vector<int>& ranks) const {
  if (!mine_) return false;
  for (int r : ranks) {
    char* p = r == me_ ? mine_->ptr : nullptr;
    for (const auto& [q, m] : peers_)
      if (q == r) p = m;
    // published before the state that healthy() waited for
    if (!p || ctl_cma(p).load(std::memory_order_acquire) != 1) return false;
  }
  return true;
}

char* NodeCtl::page(int r, int slot) const {
  if (slot < 0 || slot >= slots_) return nullptr;
  if (r == me_) return mine_ ? mine_->ptr + (1 + slot) * kPage : nullptr;
  for (const auto& [q, p] : peers_)
    if (q == r) return p + (1 + slot) * kPage;
  return nullptr;
}

bool NodeCtl::healthy(const std::vector<int>& ranks) const {
  if (!mine_ || ctl_state(mine_->ptr).load(std::memory_order_acquire) != 1) return false;
  for (int r : ranks) {
    if (r == me_) continue;
    char* p = nullptr;
    for (const auto& [q, m] : peers_)
      if (q == r) p = m;
    if (!p) return false;
    auto& st = ctl_state(p);
    std::uint32_t v;
    const auto t0 = std::chrono::steady_clock::now();
    while ((v = st.load(std::memory_order_acquire)) == 0) {
      futex_wait(&st, 0);
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
              peer_timeout() &&
          st.load(std::memory_order_acquire) == 0)
        peer_timed_out("mesh rank " + std::to_string(r) +
                       " to set up its node-shared memory (after the mesh's Allgather)");
    }
    if (v != 1) return false;
  }
  return true;
}

}  // namespace pyshard
