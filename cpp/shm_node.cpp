#include "shm_node.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "mpi_calls.h"

namespace pyshard {

namespace {
constexpr size_t kMapsPerPeer = 32;  // a peer's segments kept mapped here (LRU)
}  // namespace

using shm::errno_text;
using shm::map_foreign;
using shm::page_up;

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
  pids_.assign(nn, 0);
  for (int i = 0; i < nn; ++i) {
    ctl_[i] = ctl_owner_->page(i == me_ ? my_mesh_rank : mesh_ranks[i], slot);
    if (!ctl_[i]) throw std::invalid_argument("pyshard: NodeShm: a slot page is not mapped");
    pids_[i] = reinterpret_cast<ShmSlot*>(ctl_[i])->pid;
  }
  // the same answer on every rank of the node (each published what it found in connect)
  cma_ = nn > 1 && ctl_owner_->cma(mesh_ranks);
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

std::shared_ptr<ShmSegment> NodeShm::make_segment(i64 n) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::make_shared<ShmSegment>(page_up(n), next_id_++);
}

std::shared_ptr<ShmSegment> NodeShm::make_segment(i64 n,
                                                  const std::vector<std::pair<i64, i64>>& shared) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::make_shared<ShmSegment>(page_up(n), next_id_++, shared);
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

void NodeShm::signal(ShmSlot& s) { bump_and_wake(s.seq, s.sleepers); }

void NodeShm::publish(ShmSegment* mine, i64 off) {
  ShmSlot& s = slot(me_);
  s.dst_id = mine->id;
  s.dst_fd = mine->fd;
  s.dst_cap = mine->cap;
  s.dst_off = off;
  s.dst_addr = 0;
  s.epoch.store(epoch_, std::memory_order_release);
  signal(s);
}

void NodeShm::publish_private(char* p, i64 bytes) {
  ShmSlot& s = slot(me_);
  s.dst_id = 0;
  s.dst_cap = bytes;
  s.dst_off = 0;
  s.dst_addr = reinterpret_cast<std::uint64_t>(p);
  s.epoch.store(epoch_, std::memory_order_release);
  signal(s);
}

bool NodeShm::write_remote(int idx, const iovec* l, size_t nl, const iovec* r, size_t nr,
                           i64 bytes) {
  const ssize_t got = ::process_vm_writev(static_cast<pid_t>(pids_[idx]), l, nl, r, nr, 0);
  if (got == static_cast<ssize_t>(bytes)) return true;
  why_ = got < 0 ? errno_text("writing into a node peer's memory (process_vm_writev)")
                 : "writing into a node peer's memory (process_vm_writev): " +
                       std::to_string(got) + " of " + std::to_string(bytes) + " bytes written";
  slot(me_).failed.store(epoch_, std::memory_order_relaxed);
  return false;
}

bool NodeShm::fits(int idx, const char* at, i64 bytes) {
  const char* lo = seg_lo_[idx];
  if (lo && at >= lo && bytes >= 0 && (at - lo) + bytes <= seg_cap_[idx]) return true;
  overflow(idx, lo && at >= lo ? (at - lo) + bytes - seg_cap_[idx] : bytes);
  return false;
}

bool NodeShm::remote_fits(int idx, i64 end) {
  if (remote_[idx] != 0 && end <= seg_cap_[idx]) return true;
  overflow(idx, end - seg_cap_[idx]);
  return false;
}

void NodeShm::disagree(int idx, const std::string& why) {
  (void)idx;
  why_ = why;
  slot(me_).failed.store(epoch_, std::memory_order_relaxed);
}

void NodeShm::overflow(int idx, i64 past) {
  why_ = "this rank's block for node rank " + std::to_string(idx) + " (rank " +
         std::to_string(node_ranks_[idx]) + ") ends " + std::to_string(past) +
         " bytes past that rank's destination: the ranks disagree on the arrays (a shape, "
         "dtype or plan that differs between ranks); nothing was written there";
  slot(me_).failed.store(epoch_, std::memory_order_relaxed);
}

void NodeShm::wait_epoch(int idx, std::uint64_t e) {
  ShmSlot& s = slot(idx);
  wait_for(s, [&] { return s.epoch.load(std::memory_order_acquire) >= e; }, [&] {
    return who(idx) + " to publish its side of a node-shared exchange";
  });
}

std::string NodeShm::who(int idx) const {
  const int r = node_ranks_[idx];
  const int w = mpi::world_rank(comm_->get(), r);
  return "rank " + std::to_string(r) + " of this communicator" +
         (w >= 0 && w != r ? " (world rank " + std::to_string(w) + ")" : std::string());
}

void NodeShm::arrive(int idx) {
  ShmSlot& s = slot(idx);
  s.arrived.fetch_add(1, std::memory_order_acq_rel);
  signal(s);
}

namespace {
std::atomic<double> g_stall{0.0};  // stall_next_arrival
}  // namespace

void stall_next_arrival(double seconds) { g_stall.store(seconds); }

void NodeShm::arrive_all() {
  // (the tests' hook costs a relaxed load of a process-local word, not a read-modify-write)
  if (g_stall.load(std::memory_order_relaxed) > 0) {
    const double stall = g_stall.exchange(0.0);
    if (stall > 0) std::this_thread::sleep_for(std::chrono::duration<double>(stall));
  }
  const int n = node_size();
  for (int k = 1; k < n; ++k) arrive((me_ + k) % n);
  slot(me_).done.store(epoch_, std::memory_order_release);
}

void NodeShm::check_failed() {
  for (int i = 0; i < node_size(); ++i)
    if (slot(i).failed.load(std::memory_order_relaxed) == epoch_)
      throw std::runtime_error("pyshard: node-shared memory: node rank " + std::to_string(i) +
                               " could not write a peer's result (" +
                               (i == me_ ? why_ : std::string("see that rank's error")) + ")");
}

void NodeShm::wait_arrivals() {
  const std::uint64_t want = epoch_ * static_cast<std::uint64_t>(node_size() - 1);
  ShmSlot& s = slot(me_);
  wait_for(s, [&] { return s.arrived.load(std::memory_order_acquire) >= want; }, [&] {
    // the peers that have not made this call's arrivals (each says so in its `done` word)
    std::string late;
    for (int i = 0; i < node_size(); ++i) {
      if (i == me_ || slot(i).done.load(std::memory_order_acquire) >= epoch_) continue;
      late += (late.empty() ? "" : ", ") + who(i);
    }
    if (late.empty()) late = "the other ranks of this node";
    return late + " to finish writing its side of a node-shared exchange";
  });
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


}  // namespace pyshard
