// The node-local transport: ranks of one node exchange through node-shared memory instead of
// MPI messages. A sender copies each block once, from where it lies in its source shard
// straight to where it belongs in the receiver's result, which lives in node-shared memory;
// ranks on other nodes are reached through MPI point-to-point messages as before.
//
// Memory: every rank owns its segments (Linux memfd: anonymous, never a name in /dev/shm, so
// a killed job leaves nothing behind); a peer maps one by opening /proc/<pid>/fd/<fd> of its
// owner. A rank's results come from its own pool of segments (one result per segment, kept
// for reuse when the result is freed, bounded in bytes and count).
//
// Ordering, per call on a communicator (calls run in the same order on every rank): a
// receiver publishes where its result lies and bumps its epoch; a sender waits for its
// on-node peers' epochs, copies its blocks in, and bumps each peer's arrival counter; a
// receiver returns once every on-node peer has arrived. No MPI call and no node-wide barrier.
// A peer cannot publish its next call's result before this rank has arrived in this one, so a
// published destination stays valid until this rank's copies are done.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm.h"
#include "geometry.h"
#include "memory.h"
#include "pool.h"
#include "reduce.h"

namespace pyshard {

// One memfd segment of this process, mapped read-write; unmapped and closed with the last
// reference (a result array may outlive the transport that made it).
struct ShmSegment {
  ShmSegment(i64 bytes, std::uint64_t id);
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
  bool connect(int me, const std::vector<int>& ranks, const std::vector<std::int64_t>& pids,
               const std::vector<std::int64_t>& fds, bool fail);
  // Slot page `slot` of mesh rank r (this rank's or a connected peer's), or null.
  char* page(int r, int slot) const;
  // Has every one of `ranks` (connected peers, this rank included) mapped all its node
  // peers? Waits until each has published its state (they are in or past Mesh()).
  bool healthy(const std::vector<int>& ranks) const;
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
  // (copy_interleaved in shm.cpp); then mark each peer arrived and wait for every peer to
  // have arrived here. A rank that cannot map a peer's destination copies the rest, says so
  // in its slot, and every rank of the node throws std::runtime_error once the handshake is
  // done (no rank is left waiting; a step's MPI requests are completed by its caller).
  template <class F>
  void exchange_all(ShmSegment* mine, i64 off, F&& copy);

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
  void wait_arrivals();
  void arrive(int idx);
  template <class C>
  void wait_for(ShmSlot& s, C done);
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

void shm_pause();
void futex_wait(std::atomic<std::uint32_t>* w, std::uint32_t v);
void futex_wake(std::atomic<std::uint32_t>* w);

// Wait until done(): spin a little, then sleep on the slot's futex word until it changes.
template <class C>
void NodeShm::wait_for(ShmSlot& s, C done) {
  for (int i = 0; i < spin_; ++i) {
    if (done()) return;
    shm_pause();
  }
  while (true) {
    const std::uint32_t q = s.seq.load(std::memory_order_acquire);
    if (done()) return;
    s.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!done()) futex_wait(&s.seq, q);
    s.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

template <class F>
void NodeShm::exchange_all(ShmSegment* mine, i64 off, F&& copy) {
  ++epoch_;
  publish(mine, off);
  const int n = node_size();
  bases_.assign(n, nullptr);
  for (int k = 1; k < n; ++k) {
    const int idx = (me_ + k) % n;
    wait_epoch(idx, epoch_);
    ShmSlot& s = slot(idx);
    char* p = map_peer(idx, s);
    if (p) {
      bases_[idx] = p + s.dst_off;
    } else {  // told to the node in this call's handshake: every rank raises below
      slot(me_).failed.store(epoch_, std::memory_order_relaxed);
    }
  }
  copy(static_cast<const std::vector<char*>&>(bases_));
  for (int k = 1; k < n; ++k) arrive((me_ + k) % n);
  wait_arrivals();
  check_failed();
}

// The exchange step on the node-local transport (host memory).
class ShmExchangeStep {
 public:
  // pushes: per block sent (peer, src start, the peer's destination shape, start there,
  // extent); recvs: per block received (peer, dst start, extent); local: this rank's own.
  ShmExchangeStep(std::shared_ptr<Comm> comm, std::shared_ptr<NodeShm> node, i64 item,
                  Shape src_shape, Shape dst_shape,
                  const std::vector<std::tuple<int, Shape, Shape, Shape, Shape>>& pushes,
                  const std::vector<BlockSpec>& recvs, const std::vector<LocalSpec>& local,
                  std::shared_ptr<Workspace> ws);
  void run(const char* src, char* dst);
  // as every step runs (host memory only: the node transport replaces MPI's)
  void run(const char* src, char* dst, Packer&, Transport) { run(src, dst); }

  // The phases of run(), for a fused step (ShmFusedStep) that runs many in one handshake:
  // post: post the receives from peers on other nodes, pack and send the blocks for them
  // (p2p.h), in `work` (off_bytes() of it), filling n_requests() of `reqs`; copy_all: the
  // blocks for the node peers and this rank's own; complete: wait for those messages,
  // unpacking each received block from `work` into `target` as it lands.
  i64 off_bytes() const { return off_send_ + off_recv_; }
  size_t n_requests() const { return off_sends_.size() + off_recvs_.size(); }
  void post(const char* src, char* work, MPI_Request* reqs);
  // every node peer's block (bases[idx]) and this rank's own (into target), walking the
  // source once for all of them (see copy_interleaved in shm.cpp)
  void copy_all(const char* src, const std::vector<char*>& bases, char* target) const;
  void complete(const char* work, char* target, MPI_Request* reqs) const;
  i64 dst_bytes() const { return dst_bytes_; }
  NodeShm& node() const { return *node_; }
  const Shape& src_shape() const { return src_shape_; }
  const Shape& dst_shape() const { return dst_shape_; }
  i64 workspace_bytes() const { return off_send_ + off_recv_; }
  i64 node_peers() const { return node_->node_size() - 1; }
  i64 mpi_peers() const { return static_cast<i64>(off_sends_.size() + off_recvs_.size()); }

 private:
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<NodeShm> node_;
  std::shared_ptr<Workspace> ws_;
  i64 item_;
  Shape src_shape_, dst_shape_;
  i64 dst_bytes_;
  std::vector<DescTable> push_;  // per node peer index: src -> that peer's destination
  DescTable local_;              // src -> my destination
  // peers on other nodes: packed into the workspace, sent; received there, unpacked
  struct Msg {
    int peer;
    i64 off, bytes;
  };
  std::vector<Msg> off_sends_, off_recvs_;
  DescTable off_pack_, off_unpack_;
  i64 off_send_ = 0, off_recv_ = 0;
  std::vector<MPI_Request> reqs_;
};

// Many exchanges on one communicator in one handshake (redistribute_many): every rank's
// results of the batch lie in one segment of its node-shared memory, array k of rank r at
// offsets[k][r] (computed from the layouts by every rank alike), so a sender writes each
// array's block for a node peer straight into that peer's result, and every node peer is
// waited for once per batch instead of once per array.
class ShmFusedStep {
 public:
  ShmFusedStep(std::shared_ptr<NodeShm> node, std::vector<std::shared_ptr<ShmExchangeStep>> parts,
               std::vector<std::vector<i64>> offsets, std::shared_ptr<Workspace> ws);
  // srcs: one source per part; dst: the start of this rank's batch, in its node-shared memory
  void run(const std::vector<const char*>& srcs, char* dst);
  size_t parts() const { return parts_.size(); }
  const ShmExchangeStep& part(size_t k) const { return *parts_[k]; }
  i64 offset(size_t k) const { return mine_[k]; }  // array k's offset in this rank's batch
  i64 bytes() const { return bytes_; }              // this rank's batch, in bytes
  i64 workspace_bytes() const { return off_; }

 private:
  std::shared_ptr<NodeShm> node_;
  std::vector<std::shared_ptr<ShmExchangeStep>> parts_;
  std::vector<std::vector<i64>> peer_off_;  // per node peer index: array k's offset there
  std::vector<i64> mine_, work_off_;
  i64 bytes_ = 0, off_ = 0;
  size_t nreq_ = 0;
  std::shared_ptr<Workspace> ws_;
  std::vector<MPI_Request> reqs_;
  std::vector<char*> at_;  // the node peers' destinations of one array
};

// Reduce_scatter on the node-local transport (host memory, every rank of the communicator on
// one node): each rank copies its piece for every node peer once, straight from its source
// into that peer's staging segment (a slot per sender, from the peer's pool), then sums its
// own piece and the staged ones into its result, in rank order, one pass over them. MPI's
// Reduce_scatter moves every byte through its shared-memory cells (two copies) before it is
// reduced. `kind`: the element type of the reduction ('f' float32/64, 'c' complex64/128, 'i'
// signed, 'u' unsigned, 'b' bool as bytes), with the geometry's item size.
class ShmReduceScatterStep {
 public:
  ShmReduceScatterStep(std::shared_ptr<NodeShm> node, std::shared_ptr<ScatterGeometry> g,
                       char kind, ReduceOp op);
  void run(const char* src, char* dst);
  void run(const char* src, char* dst, Packer&, Transport) { run(src, dst); }
  const ScatterGeometry& geometry() const { return *g_; }

 private:
  std::shared_ptr<NodeShm> node_;
  std::shared_ptr<ScatterGeometry> g_;
  char kind_;
  ReduceOp op_;
  std::vector<DescTable> push_;  // per node peer index: my piece for it -> my slot there
  DescTable own_;                // my own piece -> my slot here, where it is not contiguous
  i64 own_off_ = -1;             // my own piece's offset in the source, where it is
  i64 slot_ = 0;                 // bytes of a slot in my staging segment
  std::vector<const char*> parts_;
};

// Allreduce on the node-local transport (host memory, every rank of the communicator on one
// node), as a reduce-scatter and a gather over the flat array split into one chunk per rank:
// each rank copies chunk k of its source into rank k's staging segment; rank k reduces chunk
// k (its own part and the staged ones, in rank order) into its staging segment; then every
// rank copies each reduced chunk from its owner's segment into its result. Two handshakes,
// each byte copied twice, where MPI's Allreduce moves it through shared-memory cells at every
// step of its algorithm.
class ShmAllreduceStep {
 public:
  ShmAllreduceStep(std::shared_ptr<NodeShm> node, char kind, i64 item, ReduceOp op, Shape shape);
  void run(const char* src, char* dst);
  void run(const char* src, char* dst, Packer&, Transport) { run(src, dst); }
  const Shape& shape() const { return shape_; }

 private:
  std::shared_ptr<NodeShm> node_;
  char kind_;
  i64 item_;
  ReduceOp op_;
  Shape shape_;
  std::vector<i64> lo_, bytes_, slot_;  // per node index: chunk start (bytes), size, slot size
  std::vector<const char*> parts_;
};

}  // namespace pyshard
