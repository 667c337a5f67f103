#include "shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <ctime>

#include <algorithm>
#include <complex>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "mpi_calls.h"
#include "p2p.h"
#include "tags.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace pyshard {

namespace {

constexpr i64 kPage = 4096;
constexpr size_t kMapsPerPeer = 32;  // a peer's segments kept mapped here (LRU)

i64 page_up(i64 n) { return (std::max<i64>(n, 1) + kPage - 1) / kPage * kPage; }

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Map `cap` bytes of another process's memfd, or null (errno set).
char* map_foreign(std::int64_t pid, std::int64_t fd, i64 cap) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/fd/%lld", static_cast<long long>(pid),
                static_cast<long long>(fd));
  const int f = ::open(path, O_RDWR | O_CLOEXEC);
  if (f < 0) return nullptr;
  void* p = ::mmap(nullptr, static_cast<size_t>(cap), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, f, 0);
  const int e = errno;
  ::close(f);
  errno = e;
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}


// Copy n bytes with streaming (non-temporal) stores where it pays: the destination is another
// rank's result or this rank's fresh one, not read by this core soon, and a streaming store
// skips reading each destination line first (the read-for-ownership a plain store makes).
// glibc's memcpy streams only copies larger than the cache; the runs here are rows of a
// block (kilobytes). Ordered before the arrival flag by the sfence in copy_interleaved().
inline void stream_run(char* dst, const char* src, size_t n) {
#if defined(__x86_64__)
  if (n >= 256) {
    const size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    auto* d = reinterpret_cast<__m128i*>(dst);
    auto* q = reinterpret_cast<const __m128i*>(src);
    size_t k = n / 64;
    for (; k; --k, d += 4, q += 4) {
      const __m128i a = _mm_loadu_si128(q), b = _mm_loadu_si128(q + 1);
      const __m128i c = _mm_loadu_si128(q + 2), e = _mm_loadu_si128(q + 3);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
    const size_t done = n / 64 * 64;
    std::memcpy(dst + done, src + done, n - done);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Runs of at least kStreamRun bytes are copied by streaming stores, shorter ones by plain
// stores. Measured: streaming runs of 1-2 KiB (200 transposes at 2 ranks) took 10.0 ms where
// plain stores took 6.6 (the partial lines at both ends of each run); the 8192^2 transpose's
// 8 and 16 KiB runs gain from it.
constexpr i64 kStreamRun = 4096;

// Several descriptors over one source, copied in lockstep: a run of each in turn, then the
// next run of each. The blocks of a transpose for each peer read the same source rows (each a
// different piece of every row), so each row is read from memory once, in order (the
// prefetcher's pattern), instead of once per destination with a stride. Measured (200
// transposes' blocks, one core): 5.2 ms for 55 MiB, as fast as one memcpy of as many bytes
// (5.1); 8.4 in chunks of 64 KiB of source rows for each destination in turn.
struct Cursor {
  const CopyDesc* d;
  char* dst;
  i64 left;  // runs still to copy
  i64 s, t;
  i64 idx[kMaxDims];
};

// The common case of copy_interleaved: every cursor loops over the same dims (counts and
// source strides), as the blocks of a transpose for each peer and the own one do: pieces of
// the same source rows. Copied row by row, each row's pieces in turn, with one odometer.
bool same_loops(const std::vector<Cursor>& cs) {
  const CopyDesc& a = *cs[0].d;
  if (a.nd < 1) return false;
  for (const Cursor& c : cs) {
    const CopyDesc& d = *c.d;
    if (d.nd != a.nd) return false;
    for (int j = 0; j < static_cast<int>(a.nd); ++j)
      if (d.ext[j] != a.ext[j] || d.sstr[j] != a.sstr[j]) return false;
  }
  return true;
}

void copy_rows(std::vector<Cursor>& cs, const char* src) {
  const CopyDesc& a = *cs[0].d;
  const int in = static_cast<int>(a.nd) - 1;
  const i64 rows = a.ext[in], sstr = a.sstr[in];
  i64 idx[kMaxDims] = {0};
  for (i64 o = a.runs / rows; o > 0; --o) {
    const char* row = src;
    for (i64 i = 0; i < rows; ++i, row += sstr)
      for (Cursor& c : cs) {
        const CopyDesc& d = *c.d;
        const size_t n = static_cast<size_t>(d.run);
        if (d.run >= kStreamRun)
          stream_run(c.dst + c.t, row + c.s, n);
        else
          std::memcpy(c.dst + c.t, row + c.s, n);
        c.t += d.dstr[in];
      }
    for (Cursor& c : cs) c.t -= rows * c.d->dstr[in];
    for (int j = in - 1; j >= 0; --j) {  // the outer dims' odometer, shared
      if (++idx[j] < a.ext[j]) {
        src += a.sstr[j];
        for (Cursor& c : cs) c.t += c.d->dstr[j];
        break;
      }
      src -= (a.ext[j] - 1) * a.sstr[j];
      for (Cursor& c : cs) c.t -= (a.ext[j] - 1) * c.d->dstr[j];
      idx[j] = 0;
    }
  }
}

void copy_interleaved(std::vector<Cursor>& cs, const char* src) {
  if (cs.empty()) return;
  // the pieces in source order (the own piece among the peers'): a transpose's rows read from
  // left to right. Measured (200 transposes at 4 ranks, redistribute_many): 16.0 ms a call,
  // 19.5 with the own piece after the peers'
  std::sort(cs.begin(), cs.end(), [](const Cursor& a, const Cursor& b) { return a.s < b.s; });
  if (same_loops(cs)) {
    copy_rows(cs, src);
#if defined(__x86_64__)
    _mm_sfence();
#endif
    return;
  }
  bool streamed = false, more = true;
  while (more) {
    more = false;
    for (Cursor& c : cs) {
      if (c.left == 0) continue;
      const CopyDesc& d = *c.d;
      const size_t n = static_cast<size_t>(d.run);
      const bool stream = d.run >= kStreamRun;
      streamed |= stream;
      const int nd = static_cast<int>(d.nd);
      if (stream)
        stream_run(c.dst + c.t, src + c.s, n);
      else
        std::memcpy(c.dst + c.t, src + c.s, n);
      for (int j = nd - 1; j >= 0; --j) {  // the odometer of for_each_run
        if (++c.idx[j] < d.ext[j]) {
          c.s += d.sstr[j];
          c.t += d.dstr[j];
          break;
        }
        c.s -= (d.ext[j] - 1) * d.sstr[j];
        c.t -= (d.ext[j] - 1) * d.dstr[j];
        c.idx[j] = 0;
      }
      --c.left;
      if (c.left) more = true;
    }
  }
#if defined(__x86_64__)
  if (streamed) _mm_sfence();
#else
  (void)streamed;
#endif
}

// Add the descriptors of `t` (into `dst`) to `cs`; those of short runs (a few elements: the
// fixed-size copies of copy_host are faster) are copied here and now instead.
void add_cursors(std::vector<Cursor>& cs, const DescTable& t, const char* src, char* dst) {
  for (const CopyDesc& d : t.host) {
    if (d.runs == 0) continue;
    if (d.run < 64) {
      copy_host(d, src, dst);
      continue;
    }
    Cursor c{};
    c.d = &d;
    c.dst = dst;
    c.left = d.runs;
    c.s = d.src_off;
    c.t = d.dst_off;
    cs.push_back(c);
  }
}

}  // namespace

void shm_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void futex_wait(std::atomic<std::uint32_t>* w, std::uint32_t v) {
  timespec t{0, 10 * 1000 * 1000};  // 10 ms: a safety net, not the wake-up path
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAIT, v, &t, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* w) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

static_assert(sizeof(ShmSlot) <= kPage, "a rank's slot fits its control page");

ShmSegment::ShmSegment(i64 bytes, std::uint64_t seg_id) : cap(page_up(bytes)), id(seg_id) {
  fd = ::memfd_create("pyshard", MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error(errno_text("memfd_create"));
  if (::ftruncate(fd, cap) != 0) {
    const std::string e = errno_text("ftruncate");
    ::close(fd);
    throw std::runtime_error(e);
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(cap), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const std::string e = errno_text("mmap");
    ::close(fd);
    throw std::runtime_error(e);
  }
  ptr = static_cast<char*>(p);
}

ShmSegment::~ShmSegment() {
  if (ptr) ::munmap(ptr, static_cast<size_t>(cap));
  if (fd >= 0) ::close(fd);
}

// ----------------------------------------------------------------------------- setup

NodeCtl::NodeCtl(int slots, bool fail) : slots_(slots) {
  try {
    if (fail)  // tests: this rank cannot set up (the others follow)
      throw std::runtime_error("the test hook PYSHARD_TEST_SHM_FAIL is set on this rank");
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
    }
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

namespace {
// the header: the owner's state, and how many of its peers have tried to map it
std::atomic<std::uint32_t>& ctl_state(char* segment) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(segment);
}
std::atomic<std::uint32_t>& ctl_tried(char* segment) {
  return *reinterpret_cast<std::atomic<std::uint32_t>*>(segment + 64);
}
}  // namespace

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
                      bool fail) {
  me_ = me;
  if (!mine_) return false;
  expect_ = 0;
  for (int r : ranks) expect_ += r != me;
  bool all = !fail;
  if (fail) why_ = "the test hook PYSHARD_TEST_SHM_FAIL=map is set on this rank";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == me) continue;
    char* p = fds[i] >= 0 ? map_foreign(pids[i], fds[i], bytes_) : nullptr;
    if (!p) {
      all = false;
      why_ = errno_text("opening a node peer's memory through /proc/<pid>/fd");
      continue;
    }
    peers_.emplace_back(ranks[i], p);
    ctl_tried(p).fetch_add(1, std::memory_order_acq_rel);  // it may close its segment now
    futex_wake(&ctl_tried(p));
  }
  ctl_state(mine_->ptr).store(all ? 1 : 2, std::memory_order_release);
  futex_wake(&ctl_state(mine_->ptr));
  return all;
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
    while ((v = st.load(std::memory_order_acquire)) == 0) futex_wait(&st, 0);
    if (v != 1) return false;
  }
  return true;
}

NodeShm::NodeShm(std::shared_ptr<Comm> comm, std::shared_ptr<NodeCtl> ctl, int slot,
                 std::vector<int> node_ranks, const std::vector<int>& mesh_ranks, int nodes,
                 bool oversubscribed, bool spin_long)
    : comm_(std::move(comm)), ctl_owner_(std::move(ctl)), nodes_(nodes),
      node_ranks_(std::move(node_ranks)), spin_(spin_long ? 20000 : 64),
      oversubscribed_(oversubscribed) {
  const int rank = comm_->rank();
  if (node_ranks_.size() != mesh_ranks.size())
    throw std::invalid_argument("pyshard: NodeShm: one mesh rank per node rank");
  auto mine = std::find(node_ranks_.begin(), node_ranks_.end(), rank);
  if (mine == node_ranks_.end())
    throw std::invalid_argument("pyshard: NodeShm: this rank is not among its node's ranks");
  me_ = static_cast<int>(mine - node_ranks_.begin());
  const int my_mesh_rank = mesh_ranks[me_];
  usable_ = ctl_owner_ && ctl_owner_->healthy(mesh_ranks);
  if (!usable_) {
    why_ = ctl_owner_ && !ctl_owner_->why().empty()
               ? ctl_owner_->why()
               : "a rank of this node could not map its node peers' memory";
    if (nodes_ == 1) return;  // the whole communicator: every rank takes MPI
    // other nodes go on with theirs: this node's ranks reach each other by MPI messages
    usable_ = true;
    node_ranks_ = {rank};
    me_ = 0;
  }
  const int nn = static_cast<int>(node_ranks_.size());
  local_of_.assign(comm_->size(), -1);
  for (int i = 0; i < nn; ++i) local_of_[node_ranks_[i]] = i;
  ctl_.assign(nn, nullptr);
  maps_.resize(nn);
  for (int i = 0; i < nn; ++i) {
    ctl_[i] = ctl_owner_->page(i == me_ ? my_mesh_rank : mesh_ranks[i], slot);
    if (!ctl_[i]) throw std::invalid_argument("pyshard: NodeShm: a slot page is not mapped");
  }
}

NodeShm::~NodeShm() { release(); }

void NodeShm::release() {
  std::lock_guard<std::mutex> lock(mu_);
  free_.clear();
  for (auto& per : maps_)
    for (PeerMap& m : per)
      if (m.ptr) ::munmap(m.ptr, static_cast<size_t>(m.cap));
  maps_.clear();
  ctl_.clear();  // the pages are the mesh's (NodeCtl)
  ctl_owner_.reset();
  usable_ = false;
}

std::shared_ptr<ShmSegment> NodeShm::take(i64 n) {
  const i64 need = page_up(n);
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<ShmSegment> s;
  i64 cap = 0;
  if (!free_.take(need, &s, &cap)) s = std::make_shared<ShmSegment>(need, next_id_++);
  // forget results that are gone, then remember this one
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [](const std::weak_ptr<ShmSegment>& w) { return w.expired(); }),
              live_.end());
  live_.push_back(s);
  publish_ids();
  return s;
}

void NodeShm::publish_ids() {
  if (ctl_.empty()) return;
  ShmSlot& me = slot(me_);
  std::uint32_t n = 0;
  auto add = [&](const ShmSegment& g) {
    if (n < ShmSlot::kMaxIds) me.ids[n].store(g.id, std::memory_order_relaxed);
    ++n;
  };
  for (const auto& w : live_)
    if (auto g = w.lock()) add(*g);
  free_.for_each([&](const std::shared_ptr<ShmSegment>& f) { add(*f); });
  me.nids.store(n, std::memory_order_release);
}

void NodeShm::give(std::shared_ptr<ShmSegment> s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!usable_) return;  // released: the segment goes with its last reference
  const i64 cap = s->cap;
  free_.give(std::move(s), cap);
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [](const std::weak_ptr<ShmSegment>& w) { return w.expired(); }),
              live_.end());
  publish_ids();
}

ShmSegment* NodeShm::find(const char* p, i64 n, i64* off) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : live_) {
    auto s = w.lock();
    if (s && p >= s->ptr && p + n <= s->ptr + s->cap) {
      *off = p - s->ptr;
      return s.get();  // alive: the caller's array holds it
    }
  }
  return nullptr;
}

i64 NodeShm::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.held();
}

void NodeShm::set_limit(i64 bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.set_limit(bytes);
}

i64 NodeShm::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  i64 b = 0;
  for (const auto& per : maps_)
    for (const PeerMap& m : per) b += m.cap;
  return b;
}

void NodeShm::signal(ShmSlot& s) {
  s.seq.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&s.seq);
}

void NodeShm::publish(ShmSegment* mine, i64 off) {
  ShmSlot& s = slot(me_);
  s.dst_id = mine->id;
  s.dst_fd = mine->fd;
  s.dst_cap = mine->cap;
  s.dst_off = off;
  s.epoch.store(epoch_, std::memory_order_release);
  signal(s);
}

void NodeShm::wait_epoch(int idx, std::uint64_t e) {
  ShmSlot& s = slot(idx);
  wait_for(s, [&] { return s.epoch.load(std::memory_order_acquire) >= e; });
}

void NodeShm::arrive(int idx) {
  ShmSlot& s = slot(idx);
  s.arrived.fetch_add(1, std::memory_order_acq_rel);
  signal(s);
}

void NodeShm::check_failed() {
  for (int i = 0; i < node_size(); ++i)
    if (slot(i).failed.load(std::memory_order_relaxed) == epoch_)
      throw std::runtime_error("pyshard: node-shared memory: node rank " + std::to_string(i) +
                               " could not map a peer's result (" +
                               (i == me_ ? why_ : std::string("see that rank's error")) + ")");
}

void NodeShm::wait_arrivals() {
  const std::uint64_t want = epoch_ * static_cast<std::uint64_t>(node_size() - 1);
  ShmSlot& s = slot(me_);
  wait_for(s, [&] { return s.arrived.load(std::memory_order_acquire) >= want; });
}

char* NodeShm::map_peer(int idx, const ShmSlot& s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& per = maps_[idx];
  ++clock_;
  for (PeerMap& m : per)
    if (m.id == s.dst_id) {
      m.used = clock_;
      return m.ptr;
    }
  const ShmSlot& owner = *reinterpret_cast<const ShmSlot*>(ctl_[idx]);
  // a miss: first unmap this owner's segments that are gone (its ids table; a table read
  // while the owner changes it can only unmap one that is mapped again when next needed)
  const std::uint32_t nids = owner.nids.load(std::memory_order_acquire);
  if (nids <= ShmSlot::kMaxIds) {
    auto gone = [&](const PeerMap& m) {
      for (std::uint32_t i = 0; i < nids; ++i)
        if (owner.ids[i].load(std::memory_order_relaxed) == m.id) return false;
      return true;
    };
    for (auto it = per.begin(); it != per.end();) {
      if (gone(*it)) {
        ::munmap(it->ptr, static_cast<size_t>(it->cap));
        it = per.erase(it);
      } else {
        ++it;
      }
    }
  }
  char* p = map_foreign(owner.pid, s.dst_fd, s.dst_cap);
  if (!p) {
    why_ = errno_text("mapping a node peer's result segment");
    return nullptr;
  }
  if (per.size() >= kMapsPerPeer) {
    auto lru = std::min_element(per.begin(), per.end(),
                                [](const PeerMap& a, const PeerMap& b) { return a.used < b.used; });
    ::munmap(lru->ptr, static_cast<size_t>(lru->cap));
    per.erase(lru);
  }
  per.push_back(PeerMap{s.dst_id, p, s.dst_cap, clock_});
  return p;
}

// ----------------------------------------------------------------------------- the step

ShmExchangeStep::ShmExchangeStep(
    std::shared_ptr<Comm> comm, std::shared_ptr<NodeShm> node, i64 item, Shape src_shape,
    Shape dst_shape, const std::vector<std::tuple<int, Shape, Shape, Shape, Shape>>& pushes,
    const std::vector<BlockSpec>& recvs, const std::vector<LocalSpec>& local,
    std::shared_ptr<Workspace> ws)
    : comm_(std::move(comm)),
      node_(std::move(node)),
      ws_(std::move(ws)),
      item_(item),
      src_shape_(std::move(src_shape)),
      dst_shape_(std::move(dst_shape)) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  dst_bytes_ = volume(dst_shape_) * item_;
  push_.resize(node_->node_size());
  for (const auto& [peer, sstart, pshape, pstart, ext] : pushes) {
    const i64 bytes = volume(ext) * item_;
    if (bytes == 0) continue;
    const int idx = node_->local_index(peer);
    if (idx >= 0) {
      DescTable& t = push_[idx];
      t.begin_block();
      describe_copy(src_shape_, sstart, pshape, pstart, ext, item_, 0, 0, &t.host);
      t.end_block();
    } else {
      off_pack_.begin_block();
      describe_copy(src_shape_, sstart, ext, Shape(ext.size(), 0), ext, item_, 0, off_send_,
                    &off_pack_.host);
      off_pack_.end_block();
      off_sends_.push_back(Msg{peer, off_send_, bytes});
      off_send_ += align_up(bytes);
    }
  }
  for (const auto& [peer, dstart, ext] : recvs) {
    const i64 bytes = volume(ext) * item_;
    if (bytes == 0 || node_->local_index(peer) >= 0) continue;
    off_unpack_.begin_block();
    describe_copy(ext, Shape(ext.size(), 0), dst_shape_, dstart, ext, item_, off_recv_, 0,
                  &off_unpack_.host);
    off_unpack_.end_block();
    off_recvs_.push_back(Msg{peer, off_recv_, bytes});
    off_recv_ += align_up(bytes);
  }
  local_.begin_block();
  for (const auto& [sstart, dstart, ext] : local)
    describe_copy(src_shape_, sstart, dst_shape_, dstart, ext, item_, 0, 0, &local_.host);
  local_.end_block();
}

void ShmExchangeStep::post(const char* src, char* work, MPI_Request* reqs) {
  char* rbase = work + off_send_;
  p2p::post(
      comm_->get(), tags::kShmOffNode, off_recvs_.size(),
      [&](size_t i) {
        const Msg& m = off_recvs_[i];
        return p2p::Msg{rbase + m.off, m.bytes, m.peer};
      },
      [&] {
        if (!off_sends_.empty()) host_packer().copy_all(off_pack_, src, work);
      },
      off_sends_.size(), nullptr, [](size_t) {},
      [&](size_t i) {
        const Msg& m = off_sends_[i];
        return p2p::Msg{work + m.off, m.bytes, m.peer};
      },
      reqs);
}

void ShmExchangeStep::complete(const char* work, char* target, MPI_Request* reqs) const {
  if (n_requests() == 0) return;
  p2p::complete(off_recvs_.size(), off_sends_.size(), reqs, [&](size_t i) {
    host_packer().copy(off_unpack_, i, i + 1, work + off_send_, target);
  });
}

void ShmExchangeStep::copy_all(const char* src, const std::vector<char*>& bases,
                               char* target) const {
  thread_local std::vector<Cursor> cs;
  cs.clear();
  for (size_t idx = 0; idx < bases.size(); ++idx)
    if (bases[idx]) add_cursors(cs, push_[idx], src, bases[idx]);
  add_cursors(cs, local_, src, target);
  copy_interleaved(cs, src);
}

void ShmExchangeStep::run(const char* src, char* dst) {
  Packer& pk = host_packer();
  i64 off = 0;
  ShmSegment* mine = node_->find(dst, dst_bytes_, &off);
  std::shared_ptr<ShmSegment> tmp;  // a destination in private memory (out=): land here first
  char* target = dst;
  if (!mine) {
    tmp = node_->take(dst_bytes_);
    mine = tmp.get();
    off = 0;
    target = tmp->ptr;
  }
  char* work = off_bytes() > 0 ? ws_->work(pk, off_bytes()) : nullptr;
  reqs_.assign(n_requests(), MPI_REQUEST_NULL);
  post(src, work, reqs_.data());
  try {
    node_->exchange_all(mine, off,
                        [&](const std::vector<char*>& bases) { copy_all(src, bases, target); });
  } catch (...) {  // a node peer failed: this rank's messages still complete, then it raises
    mpi::waitall_unchecked(reqs_.size(), reqs_.data());
    if (tmp) node_->give(std::move(tmp));
    throw;
  }
  complete(work, target, reqs_.data());
  if (tmp) {
    std::memcpy(dst, target, static_cast<size_t>(dst_bytes_));
    node_->give(std::move(tmp));
  }
  auto& s = stats();
  s["shm"] += 1;
}

// ----------------------------------------------------------------------------- fused

ShmFusedStep::ShmFusedStep(std::shared_ptr<NodeShm> node,
                           std::vector<std::shared_ptr<ShmExchangeStep>> parts,
                           std::vector<std::vector<i64>> offsets, std::shared_ptr<Workspace> ws)
    : node_(std::move(node)), parts_(std::move(parts)), ws_(std::move(ws)) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  if (offsets.size() != parts_.size())
    throw std::invalid_argument("pyshard: one list of offsets per fused array");
  const int n = node_->node_size();
  const auto& ranks = node_->node_ranks();
  peer_off_.assign(n, std::vector<i64>(parts_.size(), 0));
  for (size_t k = 0; k < parts_.size(); ++k) {
    if (!parts_[k] || &parts_[k]->node() != node_.get())
      throw std::invalid_argument("pyshard: every fused array runs on the same node transport");
    for (int idx = 0; idx < n; ++idx) {
      const size_t r = static_cast<size_t>(ranks[idx]);
      if (r >= offsets[k].size())
        throw std::invalid_argument("pyshard: an offset per rank of the communicator");
      peer_off_[idx][k] = offsets[k][r];
    }
  }
  mine_.resize(parts_.size());
  work_off_.resize(parts_.size());
  const int self = node_->self();
  for (size_t k = 0; k < parts_.size(); ++k) {
    mine_[k] = peer_off_[self][k];
    if (mine_[k] < 0 || (k > 0 && mine_[k] < mine_[k - 1] + parts_[k - 1]->dst_bytes()))
      throw std::invalid_argument("pyshard: fused results overlap in the batch");
    bytes_ = std::max(bytes_, mine_[k] + parts_[k]->dst_bytes());
    work_off_[k] = off_;
    off_ += align_up(parts_[k]->off_bytes());
    nreq_ += parts_[k]->n_requests();
  }
}

void ShmFusedStep::run(const std::vector<const char*>& srcs, char* dst) {
  if (srcs.size() != parts_.size())
    throw std::invalid_argument("pyshard: one source per fused array");
  i64 off = 0;
  ShmSegment* mine = node_->find(dst, std::max<i64>(bytes_, 1), &off);
  if (!mine) throw std::invalid_argument("pyshard: a fused batch's results lie in node-shared memory");
  char* work = off_ > 0 ? ws_->work(host_packer(), off_) : nullptr;
  reqs_.assign(nreq_, MPI_REQUEST_NULL);
  size_t q = 0;
  for (size_t k = 0; k < parts_.size(); ++k) {
    parts_[k]->post(srcs[k], work + work_off_[k], reqs_.data() + q);
    q += parts_[k]->n_requests();
  }
  const size_t np = parts_.size();
  try {
    node_->exchange_all(mine, off, [&](const std::vector<char*>& bases) {
      std::vector<char*>& at = at_;
      at.assign(bases.size(), nullptr);
      for (size_t k = 0; k < np; ++k) {
        for (size_t idx = 0; idx < bases.size(); ++idx)
          if (bases[idx]) at[idx] = bases[idx] + peer_off_[idx][k];
        parts_[k]->copy_all(srcs[k], at, dst + mine_[k]);
      }
    });
  } catch (...) {  // a node peer failed: this rank's messages still complete, then it raises
    mpi::waitall_unchecked(reqs_.size(), reqs_.data());
    throw;
  }
  q = 0;
  for (size_t k = 0; k < np; ++k) {
    parts_[k]->complete(work + work_off_[k], dst + mine_[k], reqs_.data() + q);
    q += parts_[k]->n_requests();
  }
  auto& s = stats();
  s["shm"] += 1;
}

// ----------------------------------------------------------------------------- reduce

namespace {

// dst = parts[0] op parts[1] op ... (in that order, for each element), in chunks that stay in
// L1 so that each part is read once and dst written once.
template <class T, class Op>
void reduce_parts(char* dst, const std::vector<const char*>& parts, i64 n, Op op) {
  constexpr i64 kB = 2048;
  T* d = reinterpret_cast<T*>(dst);
  for (i64 a = 0; a < n; a += kB) {
    const i64 m = std::min(kB, n - a);
    const T* p0 = reinterpret_cast<const T*>(parts[0]) + a;
    if (parts.size() == 1) {
      std::memcpy(d + a, p0, static_cast<size_t>(m) * sizeof(T));
      continue;
    }
    const T* p1 = reinterpret_cast<const T*>(parts[1]) + a;
    for (i64 i = 0; i < m; ++i) d[a + i] = op(p0[i], p1[i]);
    for (size_t k = 2; k < parts.size(); ++k) {
      const T* pk = reinterpret_cast<const T*>(parts[k]) + a;
      for (i64 i = 0; i < m; ++i) d[a + i] = op(d[a + i], pk[i]);
    }
  }
}

template <class T>
void reduce_typed(char* dst, const std::vector<const char*>& parts, i64 n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return static_cast<T>(a + b); });
    case ReduceOp::max:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return a < b ? b : a; });
    case ReduceOp::min:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return b < a ? b : a; });
    case ReduceOp::lor:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return static_cast<T>(a || b); });
    case ReduceOp::land:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return static_cast<T>(a && b); });
  }
}

template <class T>
void reduce_complex(char* dst, const std::vector<const char*>& parts, i64 n, ReduceOp op) {
  if (op != ReduceOp::sum) throw std::invalid_argument("pyshard: complex values reduce by sum only");
  reduce_parts<T>(dst, parts, n, [](const T& a, const T& b) { return a + b; });
}

bool reducible(char kind, i64 item) {
  switch (kind) {
    case 'f': return item == 4 || item == 8;
    case 'c': return item == 8 || item == 16;
    case 'i': case 'u': return item == 1 || item == 2 || item == 4 || item == 8;
    case 'b': return item == 1;
    default: return false;
  }
}

void reduce_any(char kind, i64 item, char* dst, const std::vector<const char*>& parts, i64 n,
                ReduceOp op) {
  switch (kind) {
    case 'f':
      return item == 4 ? reduce_typed<float>(dst, parts, n, op)
                       : reduce_typed<double>(dst, parts, n, op);
    case 'c':
      return item == 8 ? reduce_complex<std::complex<float>>(dst, parts, n, op)
                       : reduce_complex<std::complex<double>>(dst, parts, n, op);
    case 'i':
      if (item == 1) return reduce_typed<std::int8_t>(dst, parts, n, op);
      if (item == 2) return reduce_typed<std::int16_t>(dst, parts, n, op);
      if (item == 4) return reduce_typed<std::int32_t>(dst, parts, n, op);
      return reduce_typed<std::int64_t>(dst, parts, n, op);
    case 'u':
    case 'b':  // bool: bytes 0 and 1 (or, and)
      if (item == 1) return reduce_typed<std::uint8_t>(dst, parts, n, op);
      if (item == 2) return reduce_typed<std::uint16_t>(dst, parts, n, op);
      if (item == 4) return reduce_typed<std::uint32_t>(dst, parts, n, op);
      return reduce_typed<std::uint64_t>(dst, parts, n, op);
  }
}

}  // namespace

ShmReduceScatterStep::ShmReduceScatterStep(std::shared_ptr<NodeShm> node,
                                           std::shared_ptr<ScatterGeometry> g, char kind,
                                           ReduceOp op)
    : node_(std::move(node)), g_(std::move(g)), kind_(kind), op_(op) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  const ScatterGeometry& geo = *g_;
  if (node_->nodes() != 1 || node_->node_size() != geo.size)
    throw std::invalid_argument(
        "pyshard: a Reduce_scatter through node-shared memory needs every rank on one node");
  if (!reducible(kind_, geo.item))
    throw std::invalid_argument("pyshard: no node-shared reduction for this element type");
  if (kind_ == 'c' && op_ != ReduceOp::sum)
    throw std::invalid_argument("pyshard: complex values reduce by sum only");
  const int n = node_->node_size(), me = node_->self();
  const i64 item = geo.item;
  push_.resize(n);
  for (int idx = 0; idx < n; ++idx) {
    if (idx == me) continue;
    const Block& b = geo.pieces[node_->node_ranks()[idx]];
    DescTable& t = push_[idx];
    t.begin_block();
    describe_copy(geo.src_shape, b.start, b.ext, Shape(b.ext.size(), 0), b.ext, item, 0,
                  me * align_up(b.bytes), &t.host);
    t.end_block();
  }
  const Block& mine = geo.pieces[geo.rank];
  slot_ = align_up(mine.bytes);
  i64 off = 0;
  if (box_contiguous(geo.src_shape, mine.start, mine.ext, item, &off)) {
    own_off_ = off;
  } else {
    own_.begin_block();
    describe_copy(geo.src_shape, mine.start, mine.ext, Shape(mine.ext.size(), 0), mine.ext, item,
                  0, me * slot_, &own_.host);
    own_.end_block();
  }
  parts_.resize(n);
}

void ShmReduceScatterStep::run(const char* src, char* dst) {
  const ScatterGeometry& geo = *g_;
  const int n = node_->node_size(), me = node_->self();
  std::shared_ptr<ShmSegment> stage = node_->take(std::max<i64>(n * slot_, 1));
  char* st = stage->ptr;
  node_->exchange_all(stage.get(), 0, [&](const std::vector<char*>& bases) {
    thread_local std::vector<Cursor> cs;
    cs.clear();
    for (int idx = 0; idx < n; ++idx)
      if (bases[idx]) add_cursors(cs, push_[idx], src, bases[idx]);
    if (own_off_ < 0) add_cursors(cs, own_, src, st);
    copy_interleaved(cs, src);
  });
  for (int idx = 0; idx < n; ++idx)
    parts_[idx] = idx == me && own_off_ >= 0 ? src + own_off_ : st + idx * slot_;
  reduce_any(kind_, geo.item, dst, parts_, geo.pieces[geo.rank].bytes / geo.item, op_);
  node_->give(std::move(stage));
  auto& s = stats();
  s["shm"] += 1;
}

// ----------------------------------------------------------------------------- allreduce

namespace {

void copy_contiguous(char* dst, const char* src, i64 n) {
  if (n >= kStreamRun)
    stream_run(dst, src, static_cast<size_t>(n));
  else if (n > 0)
    std::memcpy(dst, src, static_cast<size_t>(n));
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace

ShmAllreduceStep::ShmAllreduceStep(std::shared_ptr<NodeShm> node, char kind, i64 item,
                                   ReduceOp op, Shape shape)
    : node_(std::move(node)), kind_(kind), item_(item), op_(op), shape_(std::move(shape)) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  if (node_->nodes() != 1)
    throw std::invalid_argument(
        "pyshard: an Allreduce through node-shared memory needs every rank on one node");
  if (!reducible(kind_, item_))
    throw std::invalid_argument("pyshard: no node-shared reduction for this element type");
  if (kind_ == 'c' && op_ != ReduceOp::sum)
    throw std::invalid_argument("pyshard: complex values reduce by sum only");
  const int n = node_->node_size();
  const i64 count = volume(shape_);
  for (int k = 0; k < n; ++k) {
    const i64 a = count * k / n, b = count * (k + 1) / n;
    lo_.push_back(a * item_);
    bytes_.push_back((b - a) * item_);
    slot_.push_back(align_up((b - a) * item_));
  }
  parts_.resize(n);
}

void ShmAllreduceStep::run(const char* src, char* dst) {
  const int n = node_->node_size(), me = node_->self();
  std::shared_ptr<ShmSegment> stage = node_->take(std::max<i64>(n * slot_[me], 1));
  char* st = stage->ptr;
  // 1: chunk idx of my source into slot `me` of rank idx's staging segment
  node_->exchange_all(stage.get(), 0, [&](const std::vector<char*>& bases) {
    for (int idx = 0; idx < n; ++idx)
      if (bases[idx]) copy_contiguous(bases[idx] + me * slot_[idx], src + lo_[idx], bytes_[idx]);
    store_fence();
  });
  // my chunk, reduced in rank order, into my own slot (the others read it from there)
  for (int idx = 0; idx < n; ++idx)
    parts_[idx] = idx == me ? src + lo_[me] : st + idx * slot_[me];
  reduce_any(kind_, item_, st + me * slot_[me], parts_, bytes_[me] / item_, op_);
  // 2: every reduced chunk from its owner's slot into my result
  node_->exchange_all(stage.get(), 0, [&](const std::vector<char*>& bases) {
    for (int idx = 0; idx < n; ++idx) {
      const char* from = bases[idx] ? bases[idx] + idx * slot_[idx] : st + me * slot_[me];
      copy_contiguous(dst + lo_[idx], from, bytes_[idx]);
    }
    store_fence();
  });
  node_->give(std::move(stage));
  auto& s = stats();
  s["shm"] += 1;
}

}  // namespace pyshard
