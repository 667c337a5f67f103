// The exchange step (Alltoallv and its alternatives: padded Alltoall, point-to-point,
// Alltoallw with MPI datatypes) and its geometry: every rank sends at most one box of its
// source array to each peer and receives at most one box of its destination from each.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm.h"
#include "mpi_calls.h"
#include "peer_messages.h"

namespace pyshard {

enum class Algorithm { alltoallv = 0, alltoall = 1, p2p = 2, alltoallw = 3 };

const char* algorithm_name(Algorithm a);

// Geometry of an exchange (Alltoallv and its alternatives) on a communicator of `size`.
// sends/recvs: at most one block per peer, never this rank; local: copied directly.
struct ExchangeGeometry {
  ExchangeGeometry(int size, i64 item, Shape src_shape, Shape dst_shape,
                   const std::vector<BlockSpec>& sends, const std::vector<BlockSpec>& recvs,
                   const std::vector<LocalSpec>& local, Algorithm algo, i64 pad);
  int size;
  i64 item;
  Shape src_shape, dst_shape;
  Algorithm algo;
  i64 pad;
  std::vector<Block> sends, recvs;
  DescTable pack, unpack, local;  // src -> send workspace, recv workspace -> dst, src -> dst
  bool pack_all = false, unpack_all = false;  // Alltoallv: stage every block (one base pointer)
  i64 send_ws = 0, recv_ws = 0;  // packed workspace bytes (4 KiB aligned blocks)
  // bytes of the pack/unpack workspace the direct host path allocates, and what a staged
  // call needs in the array's memory and in host bounce buffers
  i64 workspace_bytes() const;
  i64 staged_bytes() const { return send_ws + recv_ws; }
};

// An exchange in flight (ShardedArray.redistribute(..., wait=False)): its own buffers and
// requests, so that other steps, which share the mesh's workspace pool, may run before it
// completes. Reused by later calls once complete.
struct PendingExchange {
  Workspace ws;
  std::unique_ptr<PeerMessages> msgs;  // p2p (made by the first start on a communicator)
  std::vector<MPI_Request> reqs;       // alltoallv: one Ialltoallv
  const char* src = nullptr;
  char* dst = nullptr;
  bool active = false;
  bool arrived = false;  // every message completed (by test()); complete() only unpacks
};

// Every step runs on the transport it was built with (`tr`: direct, or staged through host
// bounce buffers), whichever memory kind's packer a call brings.
class ExchangeStep {
 public:
  ExchangeStep(std::shared_ptr<Comm> comm, std::shared_ptr<ExchangeGeometry> g,
               std::shared_ptr<Workspace> ws, Transport tr, bool nonblocking);
  ~ExchangeStep();
  ExchangeStep(const ExchangeStep&) = delete;
  ExchangeStep& operator=(const ExchangeStep&) = delete;
  void run(const char* src, char* dst, Packer& pk);
  // Split in two (alltoallv and p2p algorithms): start packs, copies this rank's own block
  // and posts the messages (MPI_Ialltoallv, or MPI_Irecv/MPI_Isend); complete waits and
  // unpacks. `src` and `dst` must stay alive and untouched in between.
  void start(const char* src, char* dst, Packer& pk, PendingExchange& p);
  void complete(PendingExchange& p, Packer& pk);
  // Have the messages of `p` completed? MPI_Testall on its requests: never blocks, drives
  // progress; once true, complete() only unpacks.
  bool test(PendingExchange& p);
  const ExchangeGeometry& geometry() const { return *g_; }
  Transport transport() const { return tr_; }

 private:
  void direct(const char* src, char* dst, Packer& pk);
  void staged(const char* src, char* dst, Packer& pk);
  void host_nonblocking(const char* sb, char* rb, const char* src, char* dst);
  void p2p(const char* src, char* dst, char* work, Packer& pk, bool staged);
  void build_types();
  template <class Ready, class Pack>
  void post_p2p(PeerMessages& msgs, const char* sbase, char* rbase, const char* src, char* dst,
                bool staged, Ready&& ready, Pack&& pack);

  std::shared_ptr<Comm> comm_;
  std::shared_ptr<ExchangeGeometry> g_;
  std::shared_ptr<Workspace> ws_;
  Transport tr_;
  bool nonblocking_;
  mpi::Counts scounts_, rcounts_;
  mpi::Displs sdispls_, rdispls_;  // into the packed workspace
  mpi::Displs sdirect_, rdirect_;  // into the arrays (when nothing is packed)
  std::vector<MPI_Datatype> wstypes_, wrtypes_;
  mpi::Counts wscounts_, wrcounts_;
  mpi::Displs wdispls_;
  std::vector<size_t> order_;       // p2p: the sends in order of distance from this rank
  PeerMessages msgs_;               // p2p: the messages of run()
  std::vector<PeerMsg> rmsg_;
};

}  // namespace pyshard
