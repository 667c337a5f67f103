// The node-local transport's memory (shm.h has the overview): memfd segments of this process,
// a peer's mapped through /proc/<pid>/fd/<fd>, the control segments (NodeCtl) whose pages
// hold each rank's ShmSlot, and the futex words ranks wait on.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "box.h"

namespace pyshard {

namespace shm {
constexpr i64 kPage = 4096;
inline i64 page_up(i64 n) { return (std::max<i64>(n, 1) + kPage - 1) / kPage * kPage; }
std::string errno_text(const char* what);  // what: strerror(errno)
// Map `cap` bytes of another process's memfd, or null (errno set); `populate`: fault every
// page in now (false for a sparse segment, whose holes must stay unallocated).
char* map_foreign(std::int64_t pid, std::int64_t fd, i64 cap, bool populate = true);
}  // namespace shm

// One memfd segment of this process, mapped read-write; unmapped and closed with the last
// reference (a result array may outlive the transport that made it).
struct ShmSegment {
  ShmSegment(i64 bytes, std::uint64_t id);
  // A sparse segment (a halo array's, shm_halo.h): this process's view is private anonymous
  // memory (transparent huge pages where the kernel gives them to anonymous memory but not
  // to shared memory, as Debian's defaults do) except at `shared`, page-aligned (offset,
  // length) ranges mapped from the memfd at the same offsets; node peers map the whole memfd
  // (map_foreign, populate false) and touch only those ranges, so its holes stay unallocated.
  ShmSegment(i64 bytes, std::uint64_t id, const std::vector<std::pair<i64, i64>>& shared);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  int fd = -1;
  char* ptr = nullptr;
  i64 cap = 0;
  std::uint64_t id = 0;
};

// What a rank publishes, in its control segment (one page, mapped by every node peer).
struct alignas(64) ShmSlot {
  std::atomic<std::uint64_t> epoch;    // calls published by the owner
  std::uint64_t dst_id;                // the segment holding this call's result
  std::int64_t dst_fd, dst_cap, dst_off;
  std::int64_t pid;
  // this call's result in the owner's private memory (0: in the segment above): node peers
  // write into it by cross-memory attach (process_vm_writev; NodeCtl::cma)
  std::uint64_t dst_addr;
  // the last call in which the owner could not map a node peer's result (0: none): every
  // rank of the node raises after that call's handshake
  std::atomic<std::uint64_t> failed;
  alignas(64) std::atomic<std::uint64_t> arrived;  // senders done, summed over all calls
  // bumped after every change of this slot; ranks waiting for a change sleep on it (futex)
  // once a short spin has not seen it, so that ranks outnumbering the cores yield the CPU
  std::atomic<std::uint32_t> seq;
  std::atomic<std::uint32_t> sleepers;
  // the owner's segments that exist (handed out or kept for reuse), so that a peer can unmap
  // the ones gone; nids > kMaxIds: too many to list (peers keep their mappings, LRU-bounded)
  static constexpr std::uint32_t kMaxIds = 240;
  std::atomic<std::uint32_t> nids;
  std::atomic<std::uint64_t> ids[kMaxIds];
  // the last call whose arrivals the owner has made (its writes into every node peer done):
  // a rank whose wait for arrivals times out names the peers whose word is behind
  alignas(64) std::atomic<std::uint64_t> done;
};

// This rank's control segment, made when a Mesh is built, and its node peers' (mapped once
// their pids and fds are known from the mesh's one Allgather; pyshard/_shm.py). Page 0 is the
// header (state: 0 while setting up, 1 once every node peer's segment is mapped here, 2 where
// one could not be); page 1 + k is the ShmSlot of the mesh's k-th communicator. No MPI call.
class NodeCtl {
 public:
  // Makes the segment and checks that it can be opened again through /proc/<pid>/fd (as a
  // peer will). Never throws: ok() and why() say how it went; `fail` (a test hook) fails it.
  NodeCtl(int slots, bool fail);
  ~NodeCtl();
  NodeCtl(const NodeCtl&) = delete;
  NodeCtl& operator=(const NodeCtl&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::int64_t fd() const { return mine_ ? mine_->fd : -1; }
  int slots() const { return slots_; }
  // Map the segments of the node peers (mesh ranks `ranks`, with their pids and fds; this
  // rank's own entry is skipped), then publish the header state. False where one could not
  // be mapped (`fail`, a test hook, pretends so).
  // `no_cma` (a test hook) pretends that cross-memory attach is refused here (cma()).
  bool connect(int me, const std::vector<int>& ranks, const std::vector<std::int64_t>& pids,
               const std::vector<std::int64_t>& fds, bool fail, bool no_cma = false);
  // Slot page `slot` of mesh rank r (this rank's or a connected peer's), or null.
  char* page(int r, int slot) const;
  // Has every one of `ranks` (connected peers, this rank included) mapped all its node
  // peers? Waits until each has published its state (they are in or past Mesh()).
  bool healthy(const std::vector<int>& ranks) const;
  // Can every one of `ranks` (connected, this rank included) write into its node peers'
  // private memory by cross-memory attach (process_vm_writev)? Each rank tried it on each
  // peer it mapped (connect), so every rank of the node gets the same answer. Call after
  // healthy() is true.
  bool cma(const std::vector<int>& ranks) const;
  // Unmap the peers' segments, and close this one once every peer has tried to map it.
  void release();

 private:
  int slots_ = 0, me_ = -1, expect_ = 0;  // expect_: peers that will map this segment
  bool ok_ = false;
  std::string why_;
  std::shared_ptr<ShmSegment> mine_;
  std::vector<std::pair<int, char*>> peers_;  // mesh rank, its segment mapped here
  i64 bytes_ = 0;
};

// Waiting: a pause between spins, and sleeping on a futex word until it is not `v` (10 ms at
// most: a safety net, not the wake-up path) / waking every sleeper on it.
void shm_pause();
void futex_wait(std::atomic<std::uint32_t>* w, std::uint32_t v);
void futex_wake(std::atomic<std::uint32_t>* w);

// The bound on every wait for a node peer (PYSHARD_PEER_TIMEOUT, seconds; set from Python):
// a peer that died or stopped between two steps makes the waiting ranks raise instead of
// hanging. peer_timed_out throws std::runtime_error (RuntimeError in Python) naming what the
// rank waited for.
double peer_timeout();
void set_peer_timeout(double seconds);
[[noreturn]] void peer_timed_out(const std::string& what);

// Whether a rank takes cross-memory attach for a private destination where its node can
// (PYSHARD_CMA; set from Python). Each rank decides for its own destination, and its peers
// follow what it publishes, so ranks may differ.
bool cma_enabled();
void set_cma_enabled(bool on);

// Yama's ptrace_scope 1 (Ubuntu's default) lets a process attach only to its descendants, so
// ranks (siblings under mpiexec) could not write into each other by process_vm_writev. Where
// `scope_file` (/proc/sys/kernel/yama/ptrace_scope) says anything but 0, this process lets
// any process of its user attach (prctl PR_SET_PTRACER_ANY: what scope 0 allows; Open MPI's
// shared-memory transport does the same for its single copy). 0: nothing needed (no such
// file, or scope 0); 1: set; -errno: prctl refused (no Yama in this kernel, scope 2 or 3).
int allow_peer_attach(const std::string& scope_file);

// Wait until done(): `spin` short pauses, then sleep on the word `seq` (bumped by whoever
// changes what done() reads: bump_and_wake) until it changes; `sleepers` counts the sleepers.
// Past peer_timeout() seconds of sleeping: peer_timed_out(what()).
template <class C, class W>
void spin_then_sleep(std::atomic<std::uint32_t>& seq, std::atomic<std::uint32_t>& sleepers,
                     int spin, C done, W what) {
  for (int i = 0; i < spin; ++i) {
    if (done()) return;
    shm_pause();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const double bound = peer_timeout();
  while (true) {
    const std::uint32_t q = seq.load(std::memory_order_acquire);
    if (done()) return;
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!done()) futex_wait(&seq, q);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > bound &&
        !done())
      peer_timed_out(what());
  }
}

inline void bump_and_wake(std::atomic<std::uint32_t>& seq, std::atomic<std::uint32_t>& sleepers) {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&seq);
}

}  // namespace pyshard
