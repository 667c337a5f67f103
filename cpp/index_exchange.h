// Rows read and accumulated by global index (pyshard.unstructured): a fixed pattern of
// point-to-point messages between this rank and the ranks it reads rows from (owners) or
// whose rows it owns (readers), built once from the plan's index lists and run many times
// forward (gather: the owners' rows into each reader's result, in the order of its indices)
// and in reverse (scatter: each reader's values combined into the owners' rows).
//
// The pattern, on this rank:
// - reader side: per owner j (ascending rank, this rank excluded), u[j] distinct rows, in the
//   order the owner sends them; their concatenation is the reader buffer R. Per output row k
//   (the position in this rank's indices), slot[k]: the row in R, or R's length + s for the
//   s-th distinct row this rank reads of its own (self_rows[s], a local row number).
// - owner side: per reader q (ascending rank, this rank excluded), the local rows it reads
//   (own_rows[ooff[i]..ooff[i+1]), distinct), in the order it receives them; their
//   concatenation is the owner buffer O.
//
// With a node transport (`node`: the communicator's NodeShm), the groups between ranks of one
// node go through node-shared memory instead of messages: R (forward) and O (reverse) lie in
// a block of this rank's node-shared memory led by a table (per node peer, where its group
// lands, or -1); in one handshake (NodeShm::exchange_all) each owner copies its rows for a
// node reader straight from x into that reader's R (forward: one copy per ghost byte, no
// pack), and each reader its combined group into the owner's O (reverse). Groups with ranks
// on other nodes stay messages. The order rule and every result are the same.
//
// Forward: O packed from x (a group that is one ascending run of rows is sent from x itself),
// one message per reader; R received (a group whose output rows are one run, in slot order,
// lands in the result itself); the rows this rank reads of its own copied x -> out once.
// Reverse: R (and the self rows S) reduced from the values in the order of k (first
// occurrence copied, the next combined); one message per owner (a group that is one run of
// distinct output rows is sent from the values themselves); O received; then every group is
// combined into its rows of `into` in ascending rank order, this rank's own at its place: the
// order rule that makes a scatter bit-reproducible whatever the path.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm.h"
#include "halo.h"  // FoldKind: the element types the host combine runs in
#include "mpi_calls.h"
#include "peer_messages.h"

namespace pyshard {

class NodeShm;
struct ShmSegment;

// How a scatter combines: sum, max, min (NaN wins, as numpy's), replace (the last in the
// order rule wins).
enum class IndexOp { sum = 0, max = 1, min = 2, replace = 3 };

// What the setup exchange gives: per rank the rows it reads from this rank (rcounts) and the
// rows themselves (global indices, rank after rank), with the error flag and the signature.
struct IndexRequests {
  std::vector<i64> rcounts;
  std::unique_ptr<i64[]> rows;  // n_rows entries, not zeroed first (every one is received)
  i64 n_rows = 0;
  i64 bad = -1;
  bool sig_mismatch = false;
  i64 sig_rank = -1;
};

// The setup: `counts[p]` rows this rank reads from rank p (its own entry 0), `req` those rows
// (global indices) owner after owner, with `own` rows of this rank's own at its place in that
// order (not sent: the distinct indices as they are, no copy without them); the counts by
// `algorithm` (0 MPI_Alltoall, 1 NBX: no collective over all ranks but a nonblocking
// reduction of the error and signature), with this rank's error `code` and signature `sig`;
// then the rows by one message per pair.
IndexRequests index_requests(const std::shared_ptr<Comm>& comm, int algorithm,
                             const i64* counts, i64 code, i64 sig, const i64* req, i64 own = 0);

class IndexExchange {
 public:
  IndexExchange(std::shared_ptr<Comm> comm, std::vector<int> rpeer, std::vector<i64> rcount,
                std::vector<i64> slot, std::vector<i64> self_rows, std::vector<int> opeer,
                std::vector<i64> ooff, std::vector<i64> own_rows, i64 n_local,
                PeerMethod method = PeerMethod::p2p, std::shared_ptr<NodeShm> node = nullptr);
  ~IndexExchange();
  IndexExchange(const IndexExchange&) = delete;
  IndexExchange(IndexExchange&&) = delete;
  IndexExchange& operator=(const IndexExchange&) = delete;

  // Gather: `out` (slot.size() rows of `rb` bytes) gets x's rows (n_local rows) in the order
  // of the indices. wait() completes it. With a node transport, `block` may lead a region of
  // this rank's node-shared memory (one live segment) of gather_block_bytes(rb) bytes that
  // `out` follows in the same segment: then node owners write each reader group that lands
  // as one run straight into `out` (no copy at wait()), and the table and R lie in `block`.
  // bad: this rank's x cannot be used (x is not read): it still takes part, sending each
  // reader an empty message (on the node path a mark in its table, writing nothing), so
  // that every reader of its rows raises at wait() instead of waiting; its own wait()
  // returns without unpacking and the caller raises its own error.
  void start_forward(const char* x, i64 rb, char* out, char* block = nullptr, bool bad = false);
  // The bytes `block` needs before `out` (a multiple of 64; 0 without a node transport).
  i64 gather_block_bytes(i64 rb) const;
  // reader groups from node peers that land in the result itself where it follows a block
  i64 node_groups_direct() const;
  // Scatter: the values (slot.size() rows) combined into `into` (n_local rows) by `op` in
  // element type `kind` (replace: any). wait() completes it.
  // `bad`: this rank's values were bad (the caller raises after wait()): it takes part in
  // the exchange without values (an empty message to each owner, a mark in its node table,
  // nothing put into node owners' blocks), so every owner it sends to raises at its wait()
  // naming it, and combines nothing; no rank waits for a message that does not come.
  void start_reverse(const char* values, i64 rb, char* into, FoldKind kind, IndexOp op,
                     bool bad = false);
  // True once every message has completed (drives progress; wait() then only unpacks).
  bool test();
  PeerMethod method() const { return fwd_.method(); }
  void wait();
  bool active() const { return active_; }

  i64 messages_out() const { return static_cast<i64>(rpeer_.size()); }
  i64 rows_in() const { return rtotal_; }
  i64 rows_out() const { return ooff_.empty() ? 0 : ooff_.back(); }
  i64 self_rows() const { return static_cast<i64>(self_rows_.size()); }
  // groups through node-shared memory (node peers read from, node peers served)
  i64 node_groups_in() const;
  i64 node_groups_out() const;
  bool on_node_transport() const { return node_ != nullptr; }
  const std::shared_ptr<NodeShm>& node() const { return node_; }
  i64 size() const { return static_cast<i64>(slot_.size()); }
  i64 n_local() const { return n_local_; }

 private:
  bool on_node(int p) const { return node_ && local_[p] >= 0 && p != comm_->rank(); }
  // this rank's block of node-shared memory for `bytes` of rows after the table; its rows
  char* node_block(i64 bytes);
  i64 table_bytes() const;
  // one direction's node handshake (index_exchange.cpp)
  // (table: the start of `seg`'s region at `off`; at(j): where in group j lands, in bytes
  // from the table, and inlen(j) its bytes)
  template <class At, class InLen, class Put, class Len>
  void node_exchange(ShmSegment* seg, i64 off, const std::vector<int>& in, At&& at,
                     InLen&& inlen, const std::vector<int>& out, Put&& put, Len&& len,
                     bool bad = false);
  std::vector<i64> mine_;  // node_exchange: this rank's group for each node peer, or -1
  static constexpr i64 kBadMark = -2;  // a node table's own entry: this rank's values were bad
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<NodeShm> node_;
  std::vector<int> local_;  // comm rank -> node index or -1 (node_ only)
  std::shared_ptr<ShmSegment> block_;
  std::vector<int> rpeer_;
  std::vector<i64> rcount_, roff_;   // reader groups: rows, first row in R
  std::vector<i64> slot_;            // per output row
  std::vector<i64> self_rows_;
  std::vector<int> opeer_;
  std::vector<i64> ooff_, own_rows_;
  i64 n_local_ = 0, rtotal_ = 0;
  std::vector<i64> rdirect_;  // per reader group: the output row it lands at as one run, or -1
  std::vector<i64> odirect_;  // per owner group: its first local row when one ascending run, or -1
  std::vector<i64> ndirect_;  // per reader group from a node peer: as rdirect_, or -1
  bool nd_all_ = true;        // every node peer's reader group is in ndirect_
  std::vector<char> skip_;    // per output row: in a reader group that lands as one run
  std::vector<char> skipn_;   // the same, node groups in ndirect_ included (a gather's block)
  const std::vector<char>* skip_now_ = &skip_;  // the gather in flight's
  std::vector<char> first_;   // per output row: the first occurrence of its slot
  std::vector<i64> order_;    // owner groups and this rank (-1), ascending rank
  std::vector<char> rbuf_, obuf_, sbuf_;
  char* R_ = nullptr;  // the exchange in flight's R and O: private, or in block_
  char* O_ = nullptr;
  PeerMessages fwd_, rev_;  // gather's messages, scatter's (each its own pattern of peers)
  std::vector<PeerMsg> rmsg_, smsg_;
  bool active_ = false, reverse_ = false;
  bool bad_ = false;    // the exchange in flight: this rank's values (or x) were bad
  int bad_peer_ = -1;   // the lowest peer rank whose values (scatter) or x (gather) were bad
  const char* x_ = nullptr;
  char* out_ = nullptr;
  i64 rb_ = 0;
  FoldKind kind_ = FoldKind::none;
  IndexOp op_ = IndexOp::sum;
};

}  // namespace pyshard
