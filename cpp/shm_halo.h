// Halo updates and folds through node-shared memory (pyshard/halo.py chooses them through
// pyshard/route.py): the padded arrays of a halo array live in node-shared memory
// (HaloBuffer: one memfd segment per rank, not the pool's), so each ghost cell is copied
// once, straight from its owner's interior into the ghost region (an update), or combined
// once from the ghost region straight into the owner's interior (a fold). Peers on other
// nodes keep MPI messages in the same step (an inner HaloStep, persistent requests); the
// periodic wraps onto this rank's own block stay local copies.
//
// The handshake, per halo array, in counters after each rank's padded array (HaloCtl), with
// no MPI call and no node-wide barrier:
// - update k: start() sets entered = k; for each node peer it sends to, it waits until that
//   peer's entered >= k (the peer is in its k-th start: its ghost cells are free to write),
//   copies its interior boxes into the peer's ghost boxes and bumps the peer's `pushed`;
//   then it returns, so the caller may write the interior at once (nothing reads it later).
//   wait() waits until `pushed` counts every node peer that sends here, k times over.
// - fold k: start_fold() sets fentered = k (the ghost cells hold their contributions; the
//   caller does not write them in flight); wait() combines, in the fixed order (messages by
//   peer rank, this rank's own wraps at its own place), from each node peer's ghost boxes
//   once that peer's fentered >= k (then bumps its `pulled`: done reading it) and from the
//   MPI messages of the others, into the interior; then waits until `pulled` counts every
//   node peer that reads its ghosts, k times over, so that the caller may write them again.
// - folds in flight waited in different orders on different ranks (which the docs allow):
//   a fold's final wait depends on its peers reaching their own wait of that array. So every
//   wait of a halo step through node-shared memory also serves the other folds this process
//   has in flight (a registry of them): where a node peer of such a fold has entered it and
//   its ghosts are not read yet, they are copied into a private stage of that fold and the
//   peer's `pulled` bumped at once; that fold's wait() then combines from the stage, in the
//   same order, so the result is the same bit for bit. (Each peer's share is claimed once,
//   by the fold's own wait or by a helper, through an atomic state.)
// Waits spin briefly, then sleep on the owner's futex word (ranks that outnumber the cores
// yield them). The first exchange of an array trades where each rank's buffer lies in one
// handshake of the node transport (NodeShm::trade), every rank of the mesh taking part.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "halo.h"
#include "shm_node.h"

namespace pyshard {

// The counters of one rank's halo buffer, in its segment after the padded array (zero when
// made: a new memfd's pages are).
struct HaloCtl {
  alignas(64) std::atomic<std::uint64_t> entered;   // updates the owner has started
  alignas(64) std::atomic<std::uint64_t> fentered;  // folds the owner has started
  alignas(64) std::atomic<std::uint64_t> pushed;    // node peers' pushes here, all updates
  alignas(64) std::atomic<std::uint64_t> pulled;    // node peers done reading its ghosts
  alignas(64) std::atomic<std::uint32_t> seq;       // bumped after each change (futex)
  std::atomic<std::uint32_t> sleepers;
  // what the owner's padded array is (written when the buffer is made, before any peer maps
  // it): its bytes and a hash of its shape and element size, which each node peer checks
  // against the shape its own plan gives that rank before its first copy (ranks that
  // disagree on the halo array would write past it)
  alignas(64) std::int64_t bytes;
  std::uint64_t shape_hash;
};

// The hash HaloCtl::shape_hash holds (FNV-1a over the dims and the element size).
std::uint64_t halo_shape_hash(const Shape& shape, i64 item);

// A halo array's padded block in node-shared memory, and its node peers' (mapped at its first
// exchange). Python views it through the buffer protocol (bindings_shm.cpp).
class HaloBuffer {
 public:
  // `bytes` of padded array (`shape` of `item`-byte elements); `shared`: the boxes (start,
  // extent) node peers write or read, its ghost boxes of node peers' messages. Where they
  // touch at most half its pages, only those pages are node-shared memory and the rest is
  // private (huge pages where the kernel gives them: the wraps' strided copies walk every
  // row); else (or with no shape) the whole array is.
  HaloBuffer(std::shared_ptr<NodeShm> node, i64 bytes, const Shape& shape = {}, i64 item = 0,
             const std::vector<std::pair<Shape, Shape>>& shared = {});
  // The node-shared bytes of the padded array (its size where all of it is).
  i64 shared_bytes() const { return shared_bytes_; }
  ~HaloBuffer();
  HaloBuffer(const HaloBuffer&) = delete;
  HaloBuffer& operator=(const HaloBuffer&) = delete;
  char* data() const { return seg_->ptr; }
  i64 bytes() const { return bytes_; }
  HaloCtl& ctl() const { return *reinterpret_cast<HaloCtl*>(seg_->ptr + ctl_off_); }
  NodeShm& node() const { return *node_; }
  // Map the node peers' buffers (a handshake of the node transport; every rank of the
  // communicator calls it in the same call); a no-op once done.
  void connect();
  char* peer(int idx) const { return peers_[idx].first; }
  HaloCtl& peer_ctl(int idx) const {
    return *reinterpret_cast<HaloCtl*>(peers_[idx].first + ctl_off_of_[idx]);
  }
  // "rank R of the node to <doing>" for node peer `idx`: what a timed-out wait names
  std::string peer_what(int idx, const char* doing) const {
    return node_->who(idx) + " (of this mesh's node) to " + doing;
  }
  // Wait until done(), sleeping on `c`'s futex word after a short spin; bump `c` and wake its
  // sleepers.
  template <class C, class W>
  void wait_for(HaloCtl& c, C done, W what) const;  // what(): the waited-for (timeout)
  static void signal(HaloCtl& c);
  std::uint64_t updates = 0, folds = 0;  // exchanges of this buffer so far (the k above)

 private:
  std::shared_ptr<NodeShm> node_;
  std::shared_ptr<ShmSegment> seg_;
  i64 bytes_ = 0, ctl_off_ = 0, shared_bytes_ = 0;
  bool connected_ = false;
  std::vector<std::pair<char*, i64>> peers_;  // per node peer: its segment mapped here, cap
  std::vector<i64> ctl_off_of_;               // where its counters lie in it
};

// One node peer's share of an exchange: (its comm rank, its padded shape, per box the start
// in this rank's padded array, the start in the peer's, the extent). An update copies
// here -> there (this rank's interior into the peer's ghosts), a fold combines there -> here.
using HaloPeer = std::tuple<int, Shape, std::vector<LocalSpec>>;
// A fold's combine order: (0, i) the i-th message of the MPI part, (1, j) node peer j of
// `peers`, (2, 0) this rank's own wraps.
using FoldEntry = std::pair<int, int>;

class ShmHaloStep {
 public:
  // `mpi`: the geometry of the messages to and from peers on other nodes (and, for an
  // update, this rank's wrap copies), run by an inner HaloStep (persistent requests) on
  // `comm` with `tag`; `peers`: the node peers this rank sends to (an update) or reads the
  // ghosts of (a fold); `waiters`: how many node peers send here (an update) or read this
  // rank's ghosts (a fold). A fold also takes its combine order and this rank's wraps
  // (ghost start, interior start, extent).
  ShmHaloStep(std::shared_ptr<Comm> comm, std::shared_ptr<HaloBuffer> buf,
              std::shared_ptr<HaloGeometry> mpi, int tag, const std::vector<HaloPeer>& peers,
              int waiters, bool reverse, std::vector<FoldEntry> order,
              const std::vector<LocalSpec>& wraps);
  ~ShmHaloStep();
  // Serve every fold in flight of this process (help_folds' work), from any wait of the
  // node transport (serve_folds_in_flight in shm_node.h).
  static void serve_all();
  ShmHaloStep(const ShmHaloStep&) = delete;
  ShmHaloStep& operator=(const ShmHaloStep&) = delete;
  void start();
  void wait(FoldOp op = FoldOp::sum, FoldKind kind = FoldKind::none);
  bool active() const { return active_; }
  bool reverse() const { return reverse_; }
  const Shape& shape() const { return shape_; }
  const char* data() const { return buf_->data(); }
  int node_peers() const { return static_cast<int>(peers_.size()); }
  int waiters() const { return waiters_; }
  int mpi_peers() const;
  i64 node_bytes() const { return node_bytes_; }

 private:
  void push_all(std::uint64_t k);
  // The peers' padded arrays as this rank's plan has them, against what each peer wrote in
  // its counters (once, after the buffers are mapped): std::runtime_error where they differ.
  void check_peers();
  // Copy every node peer's ghosts this fold (in flight) still has to read and may read now
  // into its stage, releasing that peer; with the registry's lock held.
  void prepull();
  // Serve the other folds in flight of this process (see above): a no-op where there are
  // none, or where another thread serves them now.
  void help_folds() const;
  void enlist();
  void delist();
  // wait_for with help_folds() between the checks
  template <class C, class W>
  void wait_helping(HaloCtl& c, C done, W what) const;

  std::shared_ptr<HaloBuffer> buf_;
  std::shared_ptr<HaloGeometry> g_;
  std::unique_ptr<HaloStep> mpi_;
  bool reverse_;
  Shape shape_;
  struct Peer {
    int idx;        // node index
    Shape pshape;   // its padded array, as this rank's plan has it
    DescTable t;    // one block: here -> there (update) or there -> here (fold)
    // a fold's stage (used where a helper read this peer's ghosts ahead of wait()): its
    // ghost boxes packed in box order, the copies there -> stage and stage -> here
    DescTable stage_in, stage_out;
    i64 stage_bytes = 0;
    std::vector<char> stage;
    // this fold's share of the peer: 0 not read, 1 a helper copying it, 2 read by wait(),
    // 3 in the stage (a unique_ptr: atomics do not move)
    std::unique_ptr<std::atomic<int>> state = std::make_unique<std::atomic<int>>(0);
  };
  std::vector<Peer> peers_;
  int waiters_;
  std::vector<FoldEntry> order_;
  DescTable wraps_;  // fold: ghost -> interior of this rank's own block
  std::vector<std::vector<size_t>> wrap_groups_;
  i64 node_bytes_ = 0;
  std::uint64_t k_ = 0;  // the exchange in flight
  bool active_ = false;
  bool checked_ = false;   // check_peers() done
  bool enlisted_ = false;  // in the registry of folds in flight
  std::vector<int> todo_;
};

template <class C, class W>
void HaloBuffer::wait_for(HaloCtl& c, C done, W what) const {
  spin_then_sleep(c.seq, c.sleepers, node_->spin(), done, what);
}

template <class C, class W>
void ShmHaloStep::wait_helping(HaloCtl& c, C done, W what) const {
  buf_->wait_for(c, [&] {
    if (done()) return true;
    help_folds();
    return done();
  }, what);
}

}  // namespace pyshard
