// Rows read and accumulated by global index: the setup exchange and IndexExchange (see
// index_exchange.h).
#include "index_exchange.h"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "combine_kernel.h"  // DevSum, DevMax, DevMin: the fold's element rules
#include "migrate.h"
#include "peer_messages.h"
#include "shm_node.h"
#include "tags.h"

namespace pyshard {

namespace {

// One row of rb bytes; the common sizes as fixed-size copies the compiler inlines.
inline void copy_row(char* dst, const char* src, i64 rb) {
  switch (rb) {
    case 8: std::memcpy(dst, src, 8); return;
    case 16: std::memcpy(dst, src, 16); return;
    case 32: std::memcpy(dst, src, 32); return;
    case 64: std::memcpy(dst, src, 64); return;
    default: std::memcpy(dst, src, static_cast<size_t>(rb));
  }
}

// One row of a scatter combined into its destination, dst = F(dst, src) element by element,
// by the fold's element rules (combine_kernel.h: sums wrap around, NaN wins in max and min).
// (Rows of a constant element count, unrolled, were no faster: the loop waits on memory.)
template <class T, class F>
struct RowCombine {
  static inline void row(char* dst, const char* src, i64 rb) {
    const F f{};
    const i64 n = rb / static_cast<i64>(sizeof(T));
    for (i64 e = 0; e < n; ++e) {
      T a, v;
      std::memcpy(&a, dst + e * sizeof(T), sizeof(T));
      std::memcpy(&v, src + e * sizeof(T), sizeof(T));
      a = f(a, v);
      std::memcpy(dst + e * sizeof(T), &a, sizeof(T));
    }
  }
};

struct Replace {
  static inline void row(char* dst, const char* src, i64 rb) { copy_row(dst, src, rb); }
};

template <class T, class G>
void by_op(IndexOp op, G&& g) {
  if (op == IndexOp::sum) return g(RowCombine<T, DevSum<T>>{});
  if constexpr (std::is_arithmetic_v<T>) {
    if (op == IndexOp::max) return g(RowCombine<T, DevMax<T>>{});
    return g(RowCombine<T, DevMin<T>>{});
  } else {
    throw std::invalid_argument("pyshard: scatter max/min on complex data");
  }
}

// Calls f with the combiner of (kind, op): the switch runs once per call, not once per row.
template <class F>
void with_combiner(FoldKind kind, IndexOp op, F&& f) {
  if (op == IndexOp::replace) return f(Replace{});
  switch (kind) {
    case FoldKind::f32: return by_op<float>(op, f);
    case FoldKind::f64: return by_op<double>(op, f);
    case FoldKind::i8: return by_op<std::int8_t>(op, f);
    case FoldKind::i16: return by_op<std::int16_t>(op, f);
    case FoldKind::i32: return by_op<std::int32_t>(op, f);
    case FoldKind::i64: return by_op<std::int64_t>(op, f);
    case FoldKind::u8: return by_op<std::uint8_t>(op, f);
    case FoldKind::u16: return by_op<std::uint16_t>(op, f);
    case FoldKind::u32: return by_op<std::uint32_t>(op, f);
    case FoldKind::u64: return by_op<std::uint64_t>(op, f);
    case FoldKind::c64: return by_op<std::complex<float>>(op, f);
    case FoldKind::c128: return by_op<std::complex<double>>(op, f);
    case FoldKind::none: break;
  }
  throw std::invalid_argument("pyshard: scatter: no host combine for this element type");
}

}  // namespace

IndexRequests index_requests(const std::shared_ptr<Comm>& comm, int algorithm,
                             const i64* counts, i64 code, i64 sig, const i64* req, i64 own) {
  const int P = comm->size(), me = comm->rank();
  CountResult c = migrate_counts(*comm, algorithm, counts, code, sig);
  stats()["index_setup"] += 1;
  IndexRequests r;
  r.rcounts = c.rcounts;
  r.rcounts[me] = 0;
  r.bad = c.bad;
  r.sig_mismatch = c.sig_mismatch;
  r.sig_rank = c.sig_rank;
  if (r.bad >= 0 || r.sig_mismatch || code) return r;  // every rank raises (no list exchange)
  i64 total = 0;
  for (int p = 0; p < P; ++p) total += r.rcounts[p];
  r.rows.reset(new i64[static_cast<size_t>(std::max<i64>(total, 1))]);
  r.n_rows = total;
  std::vector<PeerMsg> recvs, sends;
  i64 at = 0;
  for (int p = 0; p < P; ++p) {
    if (r.rcounts[p] > 0)
      recvs.push_back(PeerMsg{reinterpret_cast<char*>(r.rows.get() + at), r.rcounts[p] * 8, p});
    at += r.rcounts[p];
  }
  at = 0;
  for (int p = 0; p < P; ++p) {
    if (p == me) {
      at += own;
    } else if (counts[p] > 0) {
      sends.push_back(PeerMsg{reinterpret_cast<char*>(const_cast<i64*>(req + at)), counts[p] * 8, p});
      at += counts[p];
    }
  }
  PeerMessages msgs(comm, tags::kIndexSetup);
  msgs.start(recvs, sends);
  msgs.wait();
  return r;
}

IndexExchange::IndexExchange(std::shared_ptr<Comm> comm, std::vector<int> rpeer,
                             std::vector<i64> rcount, std::vector<i64> slot,
                             std::vector<i64> self_rows, std::vector<int> opeer,
                             std::vector<i64> ooff, std::vector<i64> own_rows, i64 n_local,
                             PeerMethod method, std::shared_ptr<NodeShm> node)
    : comm_(std::move(comm)), node_(std::move(node)), rpeer_(std::move(rpeer)), rcount_(std::move(rcount)),
      slot_(std::move(slot)), self_rows_(std::move(self_rows)), opeer_(std::move(opeer)),
      ooff_(std::move(ooff)), own_rows_(std::move(own_rows)), n_local_(n_local),
      fwd_(comm_, tags::kIndex, method), rev_(comm_, tags::kIndexReverse, method) {
  const int P = comm_->size(), me = comm_->rank();
  rev_.set_check_sizes(true);  // a reader whose values were bad sends empty messages
  fwd_.set_check_sizes(true);  // an owner whose rows are narrower (ranks that disagree)
  if (node_) {
    if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
    local_.assign(P, -1);
    for (int p = 0; p < P; ++p) local_[p] = node_->local_index(p);
  }
  if (rpeer_.size() != rcount_.size() || ooff_.size() != opeer_.size() + 1 ||
      (ooff_.empty() ? 0 : ooff_.back()) != static_cast<i64>(own_rows_.size()))
    throw std::invalid_argument("pyshard: IndexExchange: inconsistent group tables");
  roff_.assign(rpeer_.size() + 1, 0);
  for (size_t j = 0; j < rpeer_.size(); ++j) {
    if (rpeer_[j] < 0 || rpeer_[j] >= P || rpeer_[j] == me || rcount_[j] < 0 ||
        (j && rpeer_[j] <= rpeer_[j - 1]))
      throw std::invalid_argument("pyshard: IndexExchange: bad reader groups");
    roff_[j + 1] = roff_[j] + rcount_[j];
  }
  rtotal_ = roff_.back();
  const i64 S = static_cast<i64>(self_rows_.size());
  // the row checks as one min/max pass each (vectorised: no branch a row)
  auto in_range = [this](const std::vector<i64>& v) {
    i64 lo = 0, hi = 0;
    for (i64 r : v) {
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    return lo >= 0 && (v.empty() || hi < n_local_);
  };
  if (!in_range(self_rows_)) throw std::invalid_argument("pyshard: IndexExchange: bad self row");
  if (!in_range(own_rows_)) throw std::invalid_argument("pyshard: IndexExchange: bad own row");
  // first occurrences, and the reader groups that land in the output as one run
  std::vector<char> seen(static_cast<size_t>(rtotal_ + S), 0);
  first_.assign(slot_.size(), 0);
  rdirect_.assign(rpeer_.size(), -1);
  std::vector<i64> hits(rpeer_.size(), 0), start(rpeer_.size(), -1);
  std::vector<char> run(rpeer_.size(), 1);
  size_t j = 0;  // the reader group of the last slot: sorted indices stay in it for a run
  for (size_t k = 0; k < slot_.size(); ++k) {
    const i64 s = slot_[k];
    if (s < 0 || s >= rtotal_ + S) throw std::invalid_argument("pyshard: IndexExchange: bad slot");
    first_[k] = !seen[s];
    seen[s] = 1;
    if (s < rtotal_) {
      if (s < roff_[j] || s >= roff_[j + 1])
        j = static_cast<size_t>(std::upper_bound(roff_.begin(), roff_.end(), s) - roff_.begin() -
                                1);
      if (hits[j] == 0) start[j] = static_cast<i64>(k);
      if (s != roff_[j] + hits[j] || static_cast<i64>(k) != start[j] + hits[j]) run[j] = 0;
      ++hits[j];
    }
  }
  // (the neighbor method sends and receives every group through the buffers)
  const bool direct = method != PeerMethod::neighbor;
  // (a node peer's group lands in R, where the owner writes it, unless the result follows a
  // block of node-shared memory: then a group that is one run lands in the result itself)
  ndirect_.assign(rpeer_.size(), -1);
  for (size_t j = 0; j < rpeer_.size(); ++j) {
    const bool one_run = run[j] && hits[j] == rcount_[j] && rcount_[j] > 0;
    if (!on_node(rpeer_[j])) {
      if (direct && one_run) rdirect_[j] = start[j];
    } else if (one_run) {
      ndirect_[j] = start[j];
    } else {
      nd_all_ = false;
    }
  }
  skip_.assign(slot_.size(), 0);
  for (size_t j = 0; j < rpeer_.size(); ++j)
    if (rdirect_[j] >= 0)
      std::fill(skip_.begin() + rdirect_[j], skip_.begin() + rdirect_[j] + rcount_[j], 1);
  if (node_) {
    skipn_ = skip_;
    for (size_t j = 0; j < rpeer_.size(); ++j)
      if (ndirect_[j] >= 0)
        std::fill(skipn_.begin() + ndirect_[j], skipn_.begin() + ndirect_[j] + rcount_[j], 1);
  }
  odirect_.assign(opeer_.size(), -1);
  for (size_t i = 0; i < opeer_.size(); ++i) {
    if (opeer_[i] < 0 || opeer_[i] >= P || opeer_[i] == me || (i && opeer_[i] <= opeer_[i - 1]))
      throw std::invalid_argument("pyshard: IndexExchange: bad owner groups");
    const i64 a = ooff_[i], b = ooff_[i + 1];
    bool asc = b > a;
    for (i64 t = a + 1; t < b && asc; ++t) asc = own_rows_[t] == own_rows_[t - 1] + 1;
    if (asc && direct) odirect_[i] = own_rows_[a];
  }
  // owner groups and this rank, ascending: the reverse's combine order
  bool placed = false;
  for (size_t i = 0; i < opeer_.size(); ++i) {
    if (!placed && opeer_[i] > me) {
      order_.push_back(-1);
      placed = true;
    }
    order_.push_back(static_cast<i64>(i));
  }
  if (!placed) order_.push_back(-1);
}

IndexExchange::~IndexExchange() {
  if (mpi::finalized()) return;
  fwd_.drop();  // messages in flight may still land in the block
  rev_.drop();
  if (block_) node_->give(std::move(block_));
}

i64 IndexExchange::table_bytes() const {
  return node_ ? (static_cast<i64>(node_->node_size()) * 16 + 63) / 64 * 64 : 0;
}

i64 IndexExchange::node_groups_in() const {
  i64 n = 0;
  for (int p : rpeer_) n += on_node(p);
  return n;
}

i64 IndexExchange::node_groups_out() const {
  i64 n = 0;
  for (int p : opeer_) n += on_node(p);
  return n;
}

i64 IndexExchange::gather_block_bytes(i64 rb) const {
  if (!node_) return 0;
  const i64 r = nd_all_ ? 0 : rtotal_ * rb;  // R here only where a node group lands in it
  return (table_bytes() + r + 63) / 64 * 64;
}

i64 IndexExchange::node_groups_direct() const {
  i64 n = 0;
  for (i64 s : ndirect_) n += s >= 0;
  return n;
}

char* IndexExchange::node_block(i64 bytes) {
  const i64 need = table_bytes() + std::max<i64>(bytes, 1);
  if (!block_ || block_->cap < need) {
    if (block_) node_->give(std::move(block_));
    block_ = node_->take(need);
  }
  return block_->ptr;
}

// One direction's node handshake: this rank's table at `off` in `seg` (per node peer i, two
// words: where that peer's group lands here, in bytes from the table, or -1 where none
// does, and the group's bytes: at(j) and inlen(j) for the node peers of `in`), then, once
// every node peer has published its own, put(k, dst) for each node peer out[k], dst where
// that peer's table says this rank's group goes, len(k) bytes. Each peer's table is checked
// first against this rank's plan (the bytes it expects from this rank, none included, are
// the bytes this rank has for it; the group fits its segment): ranks that disagree on the
// rows (plans that differ, or started in different orders) fail the call on every rank of
// the node, nothing written. A failed handshake completes this exchange's messages, then
// raises (on every rank of the node).
template <class At, class InLen, class Put, class Len>
void IndexExchange::node_exchange(ShmSegment* seg, i64 off, const std::vector<int>& in, At&& at,
                                  InLen&& inlen, const std::vector<int>& out, Put&& put,
                                  Len&& len, bool bad) {
  const int n = node_->node_size();
  auto* t = reinterpret_cast<i64*>(seg->ptr + off);
  std::fill(t, t + 2 * n, -1);
  for (size_t j = 0; j < in.size(); ++j)
    if (on_node(in[j])) {
      t[2 * local_[in[j]]] = at(j);
      t[2 * local_[in[j]] + 1] = inlen(j);
    }
  const int me = node_->self();
  if (bad) t[2 * me] = kBadMark;  // (its own entry, else unused) this rank puts nothing
  mine_.assign(static_cast<size_t>(n), -1);  // this rank's group for each node peer: k
  for (size_t k = 0; k < out.size(); ++k)
    if (on_node(out[k])) mine_[static_cast<size_t>(local_[out[k]])] = static_cast<i64>(k);
  try {
    node_->exchange_all(seg, off, [&](const std::vector<char*>& base) {
      for (size_t j = 0; j < in.size(); ++j) {  // a node peer whose values were bad
        const int q = in[j];
        if (!on_node(q) || !base[local_[q]]) continue;
        if (reinterpret_cast<const i64*>(base[local_[q]])[2 * local_[q]] == kBadMark &&
            (bad_peer_ < 0 || q < bad_peer_))
          bad_peer_ = q;
      }
      bool agree = true;
      for (int i = 0; i < n && !bad; ++i) {  // what each node peer expects from this rank
        if (i == me || !base[i]) continue;
        const i64* pt = reinterpret_cast<const i64*>(base[i]);
        if (pt[2 * i] == kBadMark) continue;  // a bad peer: nothing is written to it
        const i64 k = mine_[static_cast<size_t>(i)];
        const i64 wants = pt[2 * me] >= 0 ? pt[2 * me + 1] : 0;
        const i64 has = k >= 0 ? len(static_cast<size_t>(k)) : 0;
        if (wants != has) {
          agree = false;
          node_->disagree(i, "node rank " + std::to_string(i) + " (rank " +
                                 std::to_string(node_->node_ranks()[i]) + ") expects " +
                                 std::to_string(wants) + " bytes of rows from this rank, whose "
                                 "plan has " + std::to_string(has) + " for it: the ranks run "
                                 "different gather plans here (plans in flight started in "
                                 "different orders?); nothing was written");
        }
      }
      if (bad || !agree) return;
      for (size_t k = 0; k < out.size(); ++k) {
        const int q = out[k];
        if (!on_node(q) || !base[local_[q]]) continue;
        if (reinterpret_cast<const i64*>(base[local_[q]])[2 * local_[q]] == kBadMark) continue;
        const i64 to = reinterpret_cast<const i64*>(base[local_[q]])[2 * me];
        if (to >= 0 && node_->fits(local_[q], base[local_[q]] + to, len(k)))  // (agreeing: always)
          put(k, base[local_[q]] + to);
      }
    });
  } catch (...) {
    fwd_.drop();
    rev_.drop();
    active_ = false;
    throw;
  }
}

void IndexExchange::start_forward(const char* x, i64 rb, char* out, char* block, bool bad) {
  if (active_) throw std::runtime_error("pyshard: an index exchange is already in flight");
  bad_ = bad;
  bad_peer_ = -1;
  const size_t nr = rpeer_.size(), no = opeer_.size();
  // R: where the owners' rows land (this rank's node-shared block on the node path)
  ShmSegment* seg = nullptr;
  i64 seg_off = 0;
  char* table = nullptr;
  skip_now_ = &skip_;
  if (node_ && block) {  // the caller's block, the result after it in the same segment
    const i64 head = gather_block_bytes(rb);
    i64 out_off = 0;
    seg = node_->find(block, std::max<i64>(head, 1), &seg_off);
    if (!seg || node_->find(out, std::max<i64>(size() * rb, 1), &out_off) != seg ||
        out_off < seg_off + head)
      throw std::invalid_argument(
          "pyshard: a gather's block and result are not one region of node-shared memory");
    table = block;
    if (nd_all_) {
      rbuf_.resize(static_cast<size_t>(rtotal_ * rb));
      R_ = rbuf_.data();
    } else {
      R_ = table + table_bytes();
    }
    skip_now_ = &skipn_;
  } else if (node_) {
    table = node_block(rtotal_ * rb);
    seg = block_.get();
    R_ = table + table_bytes();
  } else {
    rbuf_.resize(static_cast<size_t>(rtotal_ * rb));
    R_ = rbuf_.data();
  }
  obuf_.resize(static_cast<size_t>(rows_out() * rb));
  O_ = obuf_.data();
  rmsg_.clear();
  smsg_.clear();
  for (size_t j = 0; j < nr; ++j) {
    if (on_node(rpeer_[j])) continue;
    char* at = rdirect_[j] >= 0 ? out + rdirect_[j] * rb : R_ + roff_[j] * rb;
    rmsg_.push_back(PeerMsg{at, rcount_[j] * rb, rpeer_[j]});
  }
  for (size_t i = 0; i < no; ++i) {
    if (on_node(opeer_[i])) continue;
    const i64 a = ooff_[i], b = ooff_[i + 1];
    const char* from;
    if (bad) {  // an empty message, which each reader reports
      smsg_.push_back(PeerMsg{O_, 0, opeer_[i]});
      continue;
    }
    if (odirect_[i] >= 0) {
      from = x + odirect_[i] * rb;
    } else {
      char* o = O_ + a * rb;
      for (i64 t = a; t < b; ++t) copy_row(o + (t - a) * rb, x + own_rows_[t] * rb, rb);
      from = o;
    }
    smsg_.push_back(PeerMsg{const_cast<char*>(from), (b - a) * rb, opeer_[i]});
  }
  fwd_.start(rmsg_, smsg_, R_, O_);
  active_ = true;
  reverse_ = false;
  if (node_) {  // each node reader's rows, straight from x into its R (or its result)
    const bool into_out = skip_now_ == &skipn_;
    auto at = [&](size_t j) {
      if (into_out && ndirect_[j] >= 0) return static_cast<i64>(out - table) + ndirect_[j] * rb;
      return table_bytes() + roff_[j] * rb;
    };
    node_exchange(seg, seg_off, rpeer_, at, [&](size_t j) { return rcount_[j] * rb; }, opeer_,
                  [&](size_t i, char* dst) {
      for (i64 t = ooff_[i]; t < ooff_[i + 1]; ++t)
        copy_row(dst + (t - ooff_[i]) * rb, x + own_rows_[t] * rb, rb);
    }, [&](size_t i) { return (ooff_[i + 1] - ooff_[i]) * rb; }, bad);
  }
  // the rows this rank reads of its own: x -> out, once
  for (size_t k = 0; k < slot_.size() && !bad; ++k)
    if (slot_[k] >= rtotal_)
      copy_row(out + static_cast<i64>(k) * rb, x + self_rows_[slot_[k] - rtotal_] * rb, rb);
  stats()["index_messages"] += static_cast<i64>(smsg_.size());
  x_ = x;
  out_ = out;
  rb_ = rb;
}

void IndexExchange::start_reverse(const char* values, i64 rb, char* into, FoldKind kind,
                                  IndexOp op, bool bad) {
  if (active_) throw std::runtime_error("pyshard: an index exchange is already in flight");
  bad_ = bad;
  bad_peer_ = -1;
  if (op != IndexOp::replace && kind == FoldKind::none)
    throw std::invalid_argument("pyshard: scatter: no host combine for this element type");
  if ((op == IndexOp::max || op == IndexOp::min) &&
      (kind == FoldKind::c64 || kind == FoldKind::c128))
    throw std::invalid_argument("pyshard: scatter max/min on complex data");
  kind_ = kind;
  op_ = op;
  const size_t nr = rpeer_.size(), no = opeer_.size();
  const i64 S = static_cast<i64>(self_rows_.size());
  rbuf_.resize(static_cast<size_t>(rtotal_ * rb));
  R_ = rbuf_.data();
  // O: where the readers' groups land (this rank's node-shared block on the node path)
  char* table = nullptr;
  if (node_) {
    table = node_block(rows_out() * rb);
    O_ = table + table_bytes();
  } else {
    obuf_.resize(static_cast<size_t>(rows_out() * rb));
    O_ = obuf_.data();
  }
  sbuf_.resize(static_cast<size_t>(S * rb));
  rmsg_.clear();
  smsg_.clear();
  for (size_t i = 0; i < no; ++i)
    if (!on_node(opeer_[i]))
      rmsg_.push_back(PeerMsg{O_ + ooff_[i] * rb, (ooff_[i + 1] - ooff_[i]) * rb, opeer_[i]});
  // p2p: the receives go before the reduction below (the owners' rows may arrive during it)
  const bool steps = rev_.method() == PeerMethod::p2p;
  if (steps) rev_.post_recvs(rmsg_);
  active_ = true;
  reverse_ = true;
  // R and S reduced from the values in the order of k (groups sent from the values skipped)
  if (!bad) with_combiner(kind, op, [&](auto C) {
    for (size_t k = 0; k < slot_.size(); ++k) {
      const i64 s = slot_[k];
      char* dst;
      if (s >= rtotal_) {
        dst = sbuf_.data() + (s - rtotal_) * rb;
      } else {
        if (skip_[k]) continue;
        dst = R_ + s * rb;
      }
      const char* v = values + static_cast<i64>(k) * rb;
      if (first_[k])
        copy_row(dst, v, rb);
      else
        C.row(dst, v, rb);
    }
  });
  auto group = [&](size_t j) {
    return rdirect_[j] >= 0 ? values + rdirect_[j] * rb : R_ + roff_[j] * rb;
  };
  for (size_t j = 0; j < nr; ++j)  // bad values: an empty message, which the owner reports
    if (!on_node(rpeer_[j]))
      smsg_.push_back(PeerMsg{const_cast<char*>(group(j)), bad ? 0 : rcount_[j] * rb, rpeer_[j]});
  if (steps) {
    for (const PeerMsg& m : smsg_) rev_.post_send(m);
  } else {
    rev_.start(rmsg_, smsg_, O_, R_);
  }
  if (node_)  // each combined group for a node owner, straight into its O
    node_exchange(block_.get(), 0, opeer_, [&](size_t i) { return table_bytes() + ooff_[i] * rb; },
                  [&](size_t i) { return (ooff_[i + 1] - ooff_[i]) * rb; }, rpeer_,
                  [&](size_t j, char* dst) {
      std::memcpy(dst, group(j), static_cast<size_t>(rcount_[j] * rb));
    }, [&](size_t j) { return rcount_[j] * rb; }, bad);
  stats()["index_messages"] += static_cast<i64>(smsg_.size());
  out_ = into;
  rb_ = rb;
}

bool IndexExchange::test() {
  if (!active_) return true;
  try {
    return reverse_ ? rev_.test() : fwd_.test();
  } catch (const MessageSizeError& e) {  // completed; wait() reports it
    if (e.longer || e.received != 0) throw;  // not the empty mark: ranks that disagree
    if (bad_peer_ < 0 || e.peer < bad_peer_) bad_peer_ = e.peer;
    return true;
  }
}

void IndexExchange::wait() {
  if (!active_) return;
  active_ = false;
  try {
    (reverse_ ? rev_ : fwd_).wait();
  } catch (const MessageSizeError& e) {  // an empty message: that peer's values (x) were bad
    if (e.longer || e.received != 0) throw;  // not the empty mark: ranks that disagree
    if (bad_peer_ < 0 || e.peer < bad_peer_) bad_peer_ = e.peer;
  }
  if (bad_) return;  // this rank's own values (x) were bad: the caller raises
  if (bad_peer_ >= 0)
    throw std::invalid_argument(
        reverse_ ? "pyshard: scatter: rank " + std::to_string(bad_peer_) +
                       "'s values or into were bad (its own error says which); nothing was "
                       "combined into this rank's rows"
                 : "pyshard: gather: rank " + std::to_string(bad_peer_) +
                       "'s x could not be used (its own error names it); this rank's result "
                       "was not completed");
  const i64 rb = rb_;
  if (!reverse_) {
    const std::vector<char>& skip = *skip_now_;
    for (size_t k = 0; k < slot_.size(); ++k) {
      const i64 s = slot_[k];
      if (s >= rtotal_ || skip[k]) continue;
      copy_row(out_ + static_cast<i64>(k) * rb, R_ + s * rb, rb);
    }
    return;
  }
  with_combiner(kind_, op_, [&](auto C) {
    for (i64 g : order_) {
      const i64* rows;
      const char* src;
      i64 n;
      if (g < 0) {
        rows = self_rows_.data();
        src = sbuf_.data();
        n = static_cast<i64>(self_rows_.size());
      } else {
        rows = own_rows_.data() + ooff_[g];
        src = O_ + ooff_[g] * rb;
        n = ooff_[g + 1] - ooff_[g];
      }
      char* out = out_;
      for (i64 t = 0; t < n; ++t) C.row(out + rows[t] * rb, src + t * rb, rb);
    }
  });
}

}  // namespace pyshard
