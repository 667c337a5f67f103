// The exchange steps of the node-local transport (shm.h has the overview): one array's
// (ShmExchangeStep) and many arrays' in one handshake (ShmFusedStep).
#pragma once

#include <mpi.h>

#include <memory>
#include <tuple>
#include <vector>

#include "comm.h"
#include "geometry.h"
#include "memory.h"
#include "peer_messages.h"
#include "shm_node.h"

namespace pyshard {

// The exchange step on the node-local transport (host memory).
class ShmExchangeStep {
 public:
  // pushes: per block sent (peer, src start, the peer's destination shape, start there,
  // extent); recvs: per block received (peer, dst start, extent); local: this rank's own.
  // attach: node peers may write into a private destination of this rank's by cross-memory
  // attach (where the node can): the blocks come in runs long enough for it
  // (pyshard.geometry.attach_runs, from the layouts).
  ShmExchangeStep(std::shared_ptr<Comm> comm, std::shared_ptr<NodeShm> node, i64 item,
                  Shape src_shape, Shape dst_shape,
                  const std::vector<std::tuple<int, Shape, Shape, Shape, Shape>>& pushes,
                  const std::vector<BlockSpec>& recvs, const std::vector<LocalSpec>& local,
                  std::shared_ptr<Workspace> ws, bool attach = false);
  void run(const char* src, char* dst);
  // as every step runs (host memory only: the node transport replaces MPI's)
  void run(const char* src, char* dst, Packer&) { run(src, dst); }

  // The phases of run(), for a fused step (ShmFusedStep) that runs many in one handshake:
  // post: post the receives from peers on other nodes, pack and send the blocks for them
  // (its PeerMessages, p2p), in `work` (off_bytes() of it); copy_all: the blocks for the node
  // peers and this rank's own; complete: wait for those messages, unpacking each received
  // block from `work` into `target` as it lands; drop: complete them on an error path.
  i64 off_bytes() const { return off_send_ + off_recv_; }
  void post(const char* src, char* work);
  void drop() { off_.drop(); }
  // every node peer's block (bases[idx]) and this rank's own (into target), walking the
  // source once for all of them (see copy_interleaved in shm_copy.cpp)
  void copy_all(const char* src, const std::vector<char*>& bases, char* target) const;
  void complete(const char* work, char* target);
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
  std::vector<i64> push_end_;    // ... whose bytes (the peer's destination) it writes within
  DescTable local_;              // src -> my destination
  // peers on other nodes: packed into the workspace, sent; received there, unpacked
  struct Msg {
    int peer;
    i64 off, bytes;
  };
  std::vector<Msg> off_sends_, off_recvs_;
  DescTable off_pack_, off_unpack_;
  // the blocks node peers write, from a segment to a destination in private memory (out=)
  DescTable node_recv_;
  // push_ as runs (source offset, offset in the peer's destination, bytes), those adjacent on
  // both sides merged, for writes into a peer's private memory (NodeShm::cma only)
  struct Run {
    i64 s, t, n;
  };
  std::vector<std::vector<Run>> runs_;
  bool attach_ = false;  // node peers may write into a private destination (attach)
  void write_remote(int idx, const char* src, std::uint64_t base) const;
  i64 off_send_ = 0, off_recv_ = 0;
  PeerMessages off_;  // the messages to and from other nodes
  std::vector<PeerMsg> msg_;
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
  std::shared_ptr<Workspace> ws_;
  std::vector<char*> at_;  // the node peers' destinations of one array
};

}  // namespace pyshard
