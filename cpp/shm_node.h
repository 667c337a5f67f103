// The node-local transport of one communicator (shm.h has the overview): its node peers'
// control slots, this rank's pool of result segments, the peers' segments mapped here, and
// the handshake of one call (exchange_all: publish, wait for the peers, copy, arrive).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/uio.h>

#include "comm.h"
#include "pool.h"
#include "shm_segment.h"

namespace pyshard {

class NodeShm {
 public:
  // The transport of `comm` (no MPI call): `node_ranks` are the comm ranks of this rank's
  // node (in order; the mesh's node map says which, pyshard/_shm.py) and `mesh_ranks` their
  // ranks in the mesh, whose control segments `ctl` has mapped; this communicator uses slot
  // page `slot` of each. `nodes`: how many nodes the communicator spans; `oversubscribed`:
  // some node has more of its ranks than cores; `spin_long`: this node has a core per rank
  // (waits spin longer before they sleep). Where some rank of this node could not map its
  // peers' segments (NodeCtl::healthy, the same answer on every rank of the node), the
  // transport is not usable if the communicator is this one node (every rank takes MPI), and
  // otherwise this node's ranks reach each other through MPI messages within it.
  NodeShm(std::shared_ptr<Comm> comm, std::shared_ptr<NodeCtl> ctl, int slot,
          std::vector<int> node_ranks, const std::vector<int>& mesh_ranks, int nodes,
          bool oversubscribed, bool spin_long);
  ~NodeShm();
  NodeShm(const NodeShm&) = delete;
  NodeShm& operator=(const NodeShm&) = delete;

  bool usable() const { return usable_; }
  const std::string& why_not() const { return why_; }
  int node_size() const { return static_cast<int>(node_ranks_.size()); }
  int nodes() const { return nodes_; }
  // some node of the communicator has more of its ranks than cores (the same on every rank)
  bool oversubscribed() const { return oversubscribed_; }
  // the node index of comm rank r among this rank's node peers, or -1 (another node)
  int local_index(int r) const { return local_of_[r]; }
  const std::vector<int>& node_ranks() const { return node_ranks_; }
  int self() const { return me_; }  // this rank's node index
  // "rank R of this communicator (world rank W)", node index idx: for error messages
  std::string who(int idx) const;

  // A result buffer of at least n bytes in this rank's shared memory.
  std::shared_ptr<ShmSegment> take(i64 n);
  void give(std::shared_ptr<ShmSegment> s);
  // The live segment of this rank that holds [p, p + n), or null; *off: p's offset in it.
  ShmSegment* find(const char* p, i64 n, i64* off);
  // Cached free segments' bytes and count; the pool's limit
  i64 held() const;
  void set_limit(i64 bytes);
  void release();  // free the cached segments and the control mappings (Mesh.free)

  // One call: publish this rank's destination; once every on-node peer has published its
  // own, `copy(bases)` (bases[idx]: node peer idx's destination, mapped here; this rank's
  // entry null) writes all of this rank's blocks, walking the source once for all of them
  // (copy_interleaved in shm_copy.cpp); then mark each peer arrived and wait for every peer to
  // have arrived here. A rank that cannot map a peer's destination copies the rest, says so
  // in its slot, and every rank of the node throws std::runtime_error once the handshake is
  // done (no rank is left waiting; a step's MPI requests are completed by its caller).
  template <class F>
  void exchange_all(ShmSegment* mine, i64 off, F&& copy);
  // The same for a step whose ranks may each publish a destination in private memory
  // (`mine` null: `priv`; only where cma() and cma_enabled()): bases[idx] is null for a
  // peer that did, and remote(idx) its address, which copy() writes through write_remote().
  // A peer publishing private memory to exchange_all fails the call on every rank.
  // `priv_bytes`: the private destination's length (what peers may write there).
  template <class F>
  void exchange_into(ShmSegment* mine, i64 off, char* priv, i64 priv_bytes, F&& copy);
  // Does [at, at + bytes) lie in node peer idx's segment as this call's copy() sees it
  // mapped (bases[idx] plus an offset)? remote_fits: does [0, end) lie in its private
  // destination? False, with the call failed on every rank of the node, where it does not:
  // the ranks disagree on the arrays (a shape, dtype or plan that differs between ranks),
  // and copy() must write nothing there (it would write past the peer's segment).
  bool fits(int idx, const char* at, i64 bytes);
  bool remote_fits(int idx, i64 end);
  // Node peer idx's published destination disagrees with this rank's plan (`why`): the call
  // fails on every rank of the node, as fits() fails it; copy() writes nothing for it.
  void disagree(int idx, const std::string& why);
  // Every rank of this node can write into its node peers' private memory (NodeCtl::cma).
  bool cma() const { return cma_; }
  // Node peer idx's private destination in this call (0: none)
  std::uint64_t remote(int idx) const { return remote_[idx]; }
  // Write the nl local pieces, `bytes` in all, into node peer idx's memory at the nr remote
  // pieces (process_vm_writev). False, with the call failed on every rank of the node (as a
  // segment that cannot be mapped), where the kernel refused or wrote less.
  bool write_remote(int idx, const iovec* l, size_t nl, const iovec* r, size_t nr, i64 bytes);

  // One call that only trades where each rank's segment lies (a halo array's padded block,
  // shm_halo.h): publish `mine` at `off`; once every node peer has published its own,
  // f(idx, pid, fd, cap, off) for each (false: it could not be used, told to the node as in
  // exchange_all); then arrive and wait as exchange_all does, and throw on every rank of
  // the node where one rank failed.
  template <class F>
  void trade(ShmSegment* mine, i64 off, F&& f);

  // A new segment of this rank's that is not the pool's (its owner frees it), with an id
  // no other segment of this rank's has.
  std::shared_ptr<ShmSegment> make_segment(i64 n);
  // The same, sparse: shared with node peers only at `shared` (ShmSegment's sparse form).
  std::shared_ptr<ShmSegment> make_segment(i64 n, const std::vector<std::pair<i64, i64>>& shared);
  // How long waits spin before they sleep (long where every rank of the node has a core).
  int spin() const { return spin_; }

  i64 mapped_bytes() const;

 private:
  struct PeerMap {
    std::uint64_t id = 0;
    char* ptr = nullptr;
    i64 cap = 0;
    std::uint64_t used = 0;
  };
  char* map_peer(int idx, const ShmSlot& s);  // null where it cannot be mapped (why_ says)
  void check_failed();  // after a handshake: throws on every rank where one rank failed
  ShmSlot& slot(int idx) { return *reinterpret_cast<ShmSlot*>(ctl_[idx]); }
  void wait_epoch(int idx, std::uint64_t e);
  void publish(ShmSegment* mine, i64 off);
  void publish_private(char* p, i64 bytes);
  void overflow(int idx, i64 past);  // fits()'s failure, told to the node
  template <class F>
  void handshake(F& copy, bool allow_private);  // the part of exchange_all after publish
  void wait_arrivals();
  void arrive(int idx);
  void arrive_all();  // arrive at every node peer, then say so in this rank's `done` word
  template <class C, class W>
  void wait_for(ShmSlot& s, C done, W what);  // what(): the waited-for, for the timeout
  void signal(ShmSlot& s);

  std::shared_ptr<Comm> comm_;
  std::shared_ptr<NodeCtl> ctl_owner_;
  bool usable_ = false;
  std::string why_;
  int nodes_ = 1;
  int me_ = 0;  // my index among node_ranks_
  std::vector<int> node_ranks_;  // comm ranks of my node, in node order
  std::vector<int> local_of_;    // comm rank -> node index or -1
  std::vector<char*> ctl_;       // control page of each node peer (mine included)
  std::vector<std::vector<PeerMap>> maps_;  // per node peer: its segments mapped here
  std::vector<char*> bases_;                // exchange_all's destinations
  std::vector<std::uint64_t> remote_;       // ... and those in node peers' private memory
  std::vector<const char*> seg_lo_;         // ... and, per peer, the segment's mapping
  std::vector<i64> seg_cap_;                // ... and its bytes (or the private length)
  std::vector<std::int64_t> pids_;          // node peers' process ids
  bool cma_ = false;
  std::uint64_t epoch_ = 0, clock_ = 0, next_id_ = 1;
  mutable std::mutex mu_;
  struct Unref {  // a kept segment goes with its last reference
    void operator()(std::shared_ptr<ShmSegment>&, i64) const {}
  };
  // freed results kept for reuse (a loop over many arrays): 256 of them, 512 MiB
  BestFitPool<std::shared_ptr<ShmSegment>, Unref> free_{256, i64(512) << 20};
  std::vector<std::weak_ptr<ShmSegment>> live_;  // handed out (find())
  void publish_ids();  // the slot's ids table from live_ and free_ (mu_ held)
  int spin_ = 64;
  bool oversubscribed_ = false;  // spins before sleeping: long when every rank of the node has a core
};

// Wait until done(): spin a little, then sleep on the slot's futex word until it changes.
// Serve the folds through node-shared memory this process has in flight (shm_halo.cpp):
// every node-shared wait does, so that a fold in flight whose peers wait here (for a
// handshake this rank reached first) is read and its owner's wait() can return.
void serve_folds_in_flight();

// Tests only: the next node-shared handshake of this process sleeps `seconds` between its
// writes and its arrivals (a rank stopped there: its peers' wait for arrivals must name it).
void stall_next_arrival(double seconds);

template <class C, class W>
void NodeShm::wait_for(ShmSlot& s, C done, W what) {
  spin_then_sleep(s.seq, s.sleepers, spin_, [&] {
    if (done()) return true;
    serve_folds_in_flight();
    return done();
  }, what);
}

template <class F>
void NodeShm::exchange_all(ShmSegment* mine, i64 off, F&& copy) {
  if (!usable_) throw std::runtime_error("pyshard: node-shared memory was released (mesh.free())");
  ++epoch_;
  publish(mine, off);
  handshake(copy, false);
}

template <class F>
void NodeShm::exchange_into(ShmSegment* mine, i64 off, char* priv, i64 priv_bytes, F&& copy) {
  if (!usable_) throw std::runtime_error("pyshard: node-shared memory was released (mesh.free())");
  ++epoch_;
  if (mine) {
    publish(mine, off);
  } else {
    if (!cma_) throw std::logic_error("pyshard: a private destination without cross-memory attach");
    publish_private(priv, priv_bytes);
  }
  handshake(copy, true);
}

template <class F>
void NodeShm::handshake(F& copy, bool allow_private) {
  const int n = node_size();
  bases_.assign(n, nullptr);
  remote_.assign(n, 0);
  seg_lo_.assign(n, nullptr);
  seg_cap_.assign(n, 0);
  for (int k = 1; k < n; ++k) {
    const int idx = (me_ + k) % n;
    wait_epoch(idx, epoch_);
    ShmSlot& s = slot(idx);
    if (s.dst_addr != 0) {  // its destination is its private memory
      if (allow_private && cma_) {
        remote_[idx] = s.dst_addr;
        seg_cap_[idx] = s.dst_cap;
      } else {
        why_ = "a node peer published a private destination to a step that cannot write it";
        slot(me_).failed.store(epoch_, std::memory_order_relaxed);
      }
      continue;
    }
    char* p = map_peer(idx, s);
    if (p) {
      bases_[idx] = p + s.dst_off;
      seg_lo_[idx] = p;
      seg_cap_[idx] = s.dst_cap;
    } else {  // told to the node in this call's handshake: every rank raises below
      slot(me_).failed.store(epoch_, std::memory_order_relaxed);
    }
  }
  copy(static_cast<const std::vector<char*>&>(bases_));
  arrive_all();
  wait_arrivals();
  check_failed();
}

template <class F>
void NodeShm::trade(ShmSegment* mine, i64 off, F&& f) {
  if (!usable_) throw std::runtime_error("pyshard: node-shared memory was released");
  ++epoch_;
  publish(mine, off);
  const int n = node_size();
  for (int k = 1; k < n; ++k) {
    const int idx = (me_ + k) % n;
    wait_epoch(idx, epoch_);
    ShmSlot& s = slot(idx);
    if (!f(idx, s.pid, s.dst_fd, s.dst_cap, s.dst_off))
      slot(me_).failed.store(epoch_, std::memory_order_relaxed);
  }
  arrive_all();
  wait_arrivals();
  check_failed();
}

}  // namespace pyshard
