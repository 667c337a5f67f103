// The exchange family's MPI point-to-point transport: one message per peer each way, the
// pattern's messages given by the operation (a redistribute's blocks, a halo's faces, a
// migration's rows, an index exchange's rows), the requests, their methods and their
// completion kept here. Every step that sends messages runs them through a PeerMessages:
// ExchangeStep's p2p algorithm and its exchanges in flight, the node transport's messages to
// other nodes, HaloStep, MigrateExchange and MigratePeers, IndexExchange. The collectives
// (MPI_Alltoallv and the rest) are the other MPI transport; node-shared memory (NodeShm) the
// third.
//
// Methods (how one start() posts the messages):
// - p2p: a fresh MPI_Irecv per receive, then MPI_Isend per send;
// - persistent: MPI_Recv_init/MPI_Send_init once per message list, MPI_Startall per start
//   (bound again only when a message changes: a buffer moved, a count changed);
// - neighbor: one neighbourhood all-to-all on a distributed-graph communicator of the peers
//   (built at the first start, collective over the communicator), persistent where the
//   library has MPI-4's MPI_Neighbor_alltoallv_init (mpi_calls.h). Byte messages only, each
//   at an offset from the receive or send base, one per peer.
// The order of a start: every receive first (a peer's message is matched as soon as it
// arrives), then the sends. PETSc's PetscSF has the same shape: a pattern set up once, then
// begin / end.
#pragma once

#include <mpi.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm.h"
#include "mpi_calls.h"

namespace pyshard {

// One message: `bytes` at `at`, to or from `peer`. With a `type` other than MPI_BYTE, one
// element of that datatype at `at` (nullptr: MPI_BOTTOM, absolute addresses), none when
// `bytes` is 0.
struct PeerMsg {
  char* at;
  i64 bytes;
  int peer;
  MPI_Datatype type = MPI_BYTE;
};

// A receive whose message had another size than its buffer, from `peer`: longer (MPI's
// MPI_ERR_TRUNCATE, always raised) or shorter (raised where set_check_sizes(true)).
// `received` and `expected` are bytes where known (-1 for a longer one: MPI truncated it).
struct MessageSizeError : std::length_error {
  int peer;
  bool longer;
  i64 received;
  i64 expected;
  MessageSizeError(int p, bool l, i64 got = -1, i64 want = -1)
      : std::length_error(
            "pyshard: the message from rank " + std::to_string(p) + " was " +
            (l ? "longer" : "shorter") + " than this rank's receive for it" +
            (got >= 0 ? " (" + std::to_string(got) + " bytes, not " + std::to_string(want) + ")"
                      : std::string()) +
            ": do the ranks disagree on the arrays (dtype, shape, layout) or run their "
            "exchanges in another order? PYSHARD_VALIDATE=1 makes every rank check the "
            "arguments first"),
        peer(p),
        longer(l),
        received(got),
        expected(want) {}
};

enum class PeerMethod { p2p = 0, persistent = 1, neighbor = 2 };

class PeerMessages : public CommUser {
 public:
  PeerMessages(std::shared_ptr<Comm> comm, int tag, PeerMethod method = PeerMethod::p2p);
  ~PeerMessages();  // completes messages still in flight (unchecked), frees what it made
  void comm_released() override;  // Comm::release(): in flight completed, requests freed
  PeerMessages(const PeerMessages&) = delete;
  PeerMessages& operator=(const PeerMessages&) = delete;

  // Post every receive, then every send, by the method. neighbor: byte messages at offsets
  // from `rbase` (receives) and `sbase` (sends).
  void start(const std::vector<PeerMsg>& recvs, const std::vector<PeerMsg>& sends,
             char* rbase = nullptr, const char* sbase = nullptr);
  // The p2p method in steps, for an operation that packs each send just before it goes:
  // post the receives, then each send as it is ready (post_send), in any order.
  void post_recvs(const std::vector<PeerMsg>& recvs);
  void post_send(const PeerMsg& m);
  // Have the messages completed? MPI_Testall (MPI_Test for one request: MPICH 5's Testall
  // reports an error on a persistent neighbourhood request): never blocks, drives progress.
  // Checked as wait() is, except the neighbourhood request's MPI_Test.
  bool test();
  // Also raise a receive whose message was shorter than its buffer (byte messages, not the
  // neighbor method): an exchange whose sender signals an error by an empty message.
  void set_check_sizes(bool on) { check_sizes_ = on; }
  // Complete every message (checked). A receive whose message was longer than its buffer
  // (MPI_ERR_TRUNCATE: a peer that sent more than this rank expects, which only an exchange
  // whose sizes are not both sides' knowledge can meet: migrate's back()) throws
  // MessageSizeError naming the peer, after every other message has completed.
  void wait();
  // Complete the receives one at a time, arrived(i) for the i-th receive of the last start,
  // then the sends. In the order posted, by MPI_Wait: MPICH 5 over TCP (UCX) completed a
  // 16 MiB exchange between two hosts in 16-20 ms by MPI_Wait or MPI_Waitall, 33-45 ms by
  // MPI_Waitany or a loop of MPI_Testsome (docs/performance.md); on one node they tied. A
  // neighbourhood all-to-all lands whole.
  template <class F>
  void wait_each(F&& arrived);
  // Complete whatever is in flight, errors ignored: the error path of an operation that is
  // about to raise, so no peer waits for this rank's messages.
  void drop();

  bool active() const { return active_; }
  PeerMethod method() const { return method_; }
  size_t receives() const { return nrecv_; }
  size_t sends() const { return nsend_; }
  const Comm& comm() const { return *comm_; }

 private:
  void free_requests();
  // the peer and bytes of each receive of this start (what errors and size checks read)
  void note_recvs(const std::vector<PeerMsg>& recvs);
  // The messages after wait()'s MPI_Wait loop or MPI_Testall answered `err`
  // (MPI_ERR_IN_STATUS: each status says): the rest completed, errors ignored, the failed
  // requests freed; then the first error thrown.
  [[noreturn]] void failed(int err, std::vector<MPI_Status>& st, const char* call);
  // check_sizes_: the receives' statuses against their sizes (after a completion)
  void check_sizes(const std::vector<MPI_Status>& st) const;
  void start_neighbor(const std::vector<PeerMsg>& recvs, const std::vector<PeerMsg>& sends,
                      char* rbase, const char* sbase);
  std::shared_ptr<Comm> comm_;
  int tag_;
  PeerMethod method_;
  std::vector<MPI_Request> reqs_;  // receives, then sends
  size_t nrecv_ = 0, nsend_ = 0;
  std::vector<int> rpeer_;  // the peer of each receive of the last start (errors name it)
  std::vector<i64> rbytes_;  // and its bytes (-1: a typed receive, not checked)
  bool check_sizes_ = false;
  std::vector<MPI_Status> statuses_;  // the last completion's (MPI fills them)
  bool active_ = false;
  bool arrived_ = false;  // test() saw every message complete
  // persistent and neighbor: what the requests are bound to
  std::vector<PeerMsg> bound_r_, bound_s_;
  const char* bound_base_[2] = {nullptr, nullptr};
  bool bound_ = false;
  MPI_Comm graph_ = MPI_COMM_NULL;
  mpi::Counts ncounts_[2];  // neighbor: receive, send counts (bytes); read until completion
  mpi::Displs ndispls_[2];
};

template <class F>
void PeerMessages::wait_each(F&& arrived) {
  if (!active_) return;
  if (arrived_ || method_ == PeerMethod::neighbor) {
    wait();
    for (size_t i = 0; i < nrecv_; ++i) arrived(i);
    return;
  }
  active_ = false;
  for (size_t k = 0; k < nrecv_; ++k) {
    mpi::wait(&reqs_[k]);
    arrived(k);
  }
  mpi::waitall(nsend_, reqs_.data() + nrecv_);
}

}  // namespace pyshard
