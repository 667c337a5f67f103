// Rows that move between ranks (pyshard.migrate): each row of a set of columns goes to the rank
// its `dest` names. The counts first (one MPI_Alltoall, Hoefler et al.'s NBX, or messages to
// a known set of peers), then one message per peer that holds every column's rows of it.
//
// A message's layout: the rows it carries, column after column (column c's rows contiguous at
// count * (row bytes of the columns before c)), so that a receiver copies each column's rows
// into place with one memcpy.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm.h"
#include "mpi_calls.h"
#include "peer_messages.h"

namespace pyshard {
class NodeShm;
}

namespace pyshard {

// The columns of one side: a base pointer and the bytes of one row, per column.
struct Cols {
  std::vector<char*> ptr;
  std::vector<i64> rb;
  i64 row_bytes() const {
    i64 r = 0;
    for (i64 b : rb) r += b;
    return r;
  }
};

// The rows of `dest` (int32 or int64, `item` bytes) per rank in counts[0..P); the index of the
// first entry outside [0, P), or -1. No MPI call.
i64 migrate_count(const void* dest, int item, i64 n, int P, i64* counts);

// The counts' error flag and column signature travel with them: a rank whose input is bad
// sends -code as its count. What every rank learns from the count exchange.
struct CountResult {
  std::vector<i64> rcounts;  // rows from each rank (P)
  i64 bad = -1;              // rank * 256 + code of the first rank at fault, or -1
  bool sig_mismatch = false;  // some rank's columns differ from this rank's
  i64 sig_rank = -1;          // a rank whose signature differs (where known), or -1
};

// The count exchange. `counts` per rank (ignored where code != 0), `code` this rank's error
// (0: none), `sig` its columns' signature. algorithm: 0 dense (MPI_Alltoall of [count, sig]
// per rank), 1 NBX (MPI_Issend of [count, sig] to each rank it sends rows to, probes, and an
// MPI_Iallreduce of [error, sig, -sig] in place of the MPI_Ibarrier). The given peers' exchange
// is MigratePeers (persistent requests).
CountResult migrate_counts(const Comm& comm, int algorithm, const i64* counts, i64 code,
                           i64 sig);

// The count exchange with given peers (`migrate(..., peers=)`), by persistent requests made
// once for the peer set: each call fills the send buffer, starts them all and waits. A PIC
// code's neighbour set is the same every step, so the requests are built once.
class MigratePeers {
 public:
  MigratePeers(std::shared_ptr<Comm> comm, std::vector<int> peers);
  ~MigratePeers();
  MigratePeers(const MigratePeers&) = delete;
  MigratePeers& operator=(const MigratePeers&) = delete;
  // As migrate_counts with algorithm 2 (peers).
  CountResult exchange(const i64* counts, i64 code, i64 sig);
  const std::vector<int>& peers() const { return peers_; }
  int comm_size() const { return comm_->size(); }

 private:
  std::shared_ptr<Comm> comm_;
  std::vector<int> peers_;
  std::vector<i64> sb_, rb_;
  PeerMessages msgs_;  // persistent: one [count, signature] pair each way per peer
  std::vector<PeerMsg> rmsg_, smsg_;
};

// One exchange of rows, forward (each row to its dest) or back (each received row to where it
// came from). Holds the requests and the per-peer arrays a nonblocking exchange needs.
//
// With a node transport (`node`, the communicator's NodeShm), rows between ranks of one node
// go through node-shared memory in the same pass that packs the others (the "shm" path):
// - forward, the result's columns lie in one block of this rank's node-shared memory whose
//   first bytes are a table (kShmTable): per column its byte offset in the block, then per
//   node peer the first row of that peer's group. Each rank publishes its block (one
//   NodeShm::exchange_all handshake), and writes every row for a node peer straight into
//   that peer's result, reading the peer's table; rows for other nodes go by messages.
// - back, `recv` is such a block: per node peer the byte offset of its section (the MPI
//   message layout: a [signature, error code] header, then the rows column after column),
//   which that peer writes; wait() reads it as it reads the messages.
// Every rank of the node takes part in the handshake, once per call (back_error too).
class MigrateExchange {
 public:
  // Point-to-point messages to and from the ranks that have rows for each other; forward,
  // each arriving message lands in the result's columns (one derived datatype a peer).
  explicit MigrateExchange(std::shared_ptr<Comm> comm,
                           std::shared_ptr<NodeShm> node = nullptr);
  ~MigrateExchange();
  MigrateExchange(const MigrateExchange&) = delete;
  MigrateExchange& operator=(const MigrateExchange&) = delete;

  // Forward: the rows of `src` (n rows) whose dest is another rank packed into `send` and
  // sent; those that stay copied into `dst` at row row_off[rank]; receives of the others'
  // rows into `recv` posted. cnt: rows to each rank; rcnt: rows from each rank.
  // With a node transport, `block` (bytes) is the node-shared block holding dst's columns.
  void start_forward(const void* dest, int item, i64 n, const i64* cnt, const i64* rcnt,
                     const Cols& src, const Cols& dst, const i64* row_off, char* send,
                     char* recv, char* block = nullptr, i64 block_bytes = 0);
  // Forward in place (pyshard.migrate(..., inplace=True); the message path, no node
  // transport): `cols` (n valid rows, room for `cap`) are both source and result. The leaving
  // rows are packed into `send` (their rows recorded as holes) and sent, receives into `recv`
  // posted; wait() puts arrivals (by source rank, each in its source's order) into the holes in
  // increasing order, then past row n, and where fewer arrive than leave moves the last
  // staying rows (from row m on, in order) into the holes left, so rows [0, m) are the result.
  // The staying rows below m do not move. Throws if m > cap.
  void start_inplace(const void* dest, int item, i64 n, const i64* cnt, const i64* rcnt,
                     const Cols& cols, i64 cap, char* send, char* recv);
  // Back (always point-to-point: the counts are known, no collective): `src` holds rcnt[s] rows from each rank s at row_off[s] (what forward gave); each
  // group goes back to its rank, and `dst` (n rows) gets every row at its original index.
  // With a node transport, `recv` (recv_bytes) is this rank's node-shared block: the table
  // (table_bytes), then the sections.
  void start_back(const void* dest, int item, i64 n, const i64* cnt, const i64* rcnt,
                  const Cols& src, const Cols& dst, const i64* row_off, char* send, char* recv,
                  i64 sig, i64 recv_bytes = 0);
  // Back where this rank's values are bad: headers carrying `code` to the ranks it owes rows,
  // and the rows they send back received and dropped (blocking), so no rank waits for it.
  // With a node transport, `recv` (recv_bytes) is this rank's node-shared block (its node
  // peers still write into it, and it writes headers into theirs).
  void back_error(const i64* cnt, const i64* rcnt, i64 sig, i64 code, char* recv = nullptr,
                  i64 recv_bytes = 0);
  // The bytes of the table at the start of a node-shared block: forward (C columns) or back.
  i64 table_bytes(bool back, i64 columns) const;
  // Completes the messages and copies the received rows into place. Throws if `dest` changed
  // between forward and back.
  void wait();
  // Have this exchange's messages completed? MPI_Testall: never blocks, drives progress;
  // wait() then only unpacks. (The node handshake, on the shm path, ran when it started.)
  bool test();
  // A message of another size than its receive (test/wait): ends the exchange, then throws.
  [[noreturn]] void message_size(const MessageSizeError& e);
  bool active() const { return active_; }

 private:
  // what wait() reads, for forward or back
  void keep(bool back, const void* dest, int item, i64 n, i64 sig, const i64* cnt,
            const i64* rcnt, const Cols& src, const Cols& dst, const i64* row_off, char* recv);
  // receives from (sends to) the ranks that are not node peers on the shm path
  void post_recvs(const i64* rbytes, char* recv);
  void post_sends(const i64* sbytes, char* send);
  PeerMessages& msgs() { return back_ ? back_rows_ : rows_; }
  // back's node handshake: this rank's table of sections (offset, bytes) per node peer, then
  // put(section, bytes, p) into each node peer p's block that is owed rows
  template <class F>
  void node_back(char* block, i64 bytes, const i64* rbytes, F&& put);
  // The node handshake around `copy(bases)`; completes this rank's messages if it throws.
  template <class F>
  void handshake(char* block, i64 bytes, F&& copy);
  bool on_node(int p) const;  // p shares this rank's node (and goes through its memory)
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<NodeShm> node_;
  std::vector<int> local_;  // comm rank -> node index or -1 (node_ only)
  void fill_holes();  // wait() of an in-place forward
  // forward's message layout: bytes to and from each peer reached by messages (roff_ set),
  // and where each peer's rows of each column go in `send` (tgt[p * C + c])
  std::vector<char*> forward_messages(const i64* cnt, const i64* rcnt, const Cols& src,
                                      char* send, std::vector<i64>& sbytes,
                                      std::vector<i64>& rbytes);
  bool active_ = false;
  bool back_ = false;
  bool inplace_ = false;
  std::vector<i64> holes_;  // in place: the rows that left, increasing
  int P_ = 0, rank_ = 0;
  // what wait() needs
  const void* dest_ = nullptr;
  int item_ = 8;
  i64 n_ = 0;
  i64 sig_ = 0;
  std::vector<i64> cnt_, rcnt_, row_off_, roff_;
  Cols src_, dst_;
  char* recv_ = nullptr;
  PeerMessages rows_, back_rows_;    // forward's messages, back's (p2p)
  std::vector<PeerMsg> msg_;
  std::vector<MPI_Datatype> types_;  // receives straight into the result's columns
  std::vector<bool> direct_;         // per peer: received that way (no unpack)
};

}  // namespace pyshard
