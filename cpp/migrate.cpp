#include "migrate.h"

#include <sched.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "shm_node.h"
#include "tags.h"

namespace pyshard {

namespace {

constexpr i64 kBackHeader = 2 * sizeof(i64);

// One row of `rb` bytes: the common sizes as fixed-size copies (the compiler inlines them).
inline void copy_row(char* d, const char* s, i64 rb) {
  switch (rb) {
    case 1: *d = *s; return;
    case 2: std::memcpy(d, s, 2); return;
    case 4: std::memcpy(d, s, 4); return;
    case 8: std::memcpy(d, s, 8); return;
    case 12: std::memcpy(d, s, 12); return;
    case 16: std::memcpy(d, s, 16); return;
    case 24: std::memcpy(d, s, 24); return;
    case 32: std::memcpy(d, s, 32); return;
    default: std::memcpy(d, s, static_cast<size_t>(rb));
  }
}

template <class T>
i64 first_bad(const T* dest, i64 n, int P) {
  const auto up = static_cast<std::uint64_t>(P);
  for (i64 i = 0; i < n; ++i)
    if (static_cast<std::uint64_t>(static_cast<std::int64_t>(dest[i])) >= up) return i;
  return -1;
}

// Eight sets of counters in turn (a run of equal dests increments eight words, not one: no
// chain of store-to-load waits) and the range checked once per eight rows by their unsigned
// maximum: 1.6x faster than one set with a branch a row when most rows stay (10^6 rows at
// 10% leaving: 0.9 against 1.45 ms here; the plain loop took 2.2). Past kCountLanesMax
// ranks, one set.
constexpr int kCountLanesMax = 4096;
constexpr int kLanes = 8;

template <class T>
i64 count_t(const T* dest, i64 n, int P, i64* counts) {
  const auto up = static_cast<std::uint64_t>(P);
  auto u = [](const T& v) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(v)); };
  if (P > kCountLanesMax) {
    for (int p = 0; p < P; ++p) counts[p] = 0;
    for (i64 i = 0; i < n; ++i) {
      if (u(dest[i]) >= up) return i;
      ++counts[u(dest[i])];
    }
    return -1;
  }
  std::vector<i64> lanes(kLanes * static_cast<size_t>(P), 0);
  i64* L = lanes.data();
  i64 i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    std::uint64_t d[kLanes], hi = 0;
    for (int k = 0; k < kLanes; ++k) {
      d[k] = u(dest[i + k]);
      hi = hi > d[k] ? hi : d[k];
    }
    if (hi >= up) return first_bad(dest, n, P);
    for (int k = 0; k < kLanes; ++k) ++L[k * up + d[k]];
  }
  for (; i < n; ++i) {
    if (u(dest[i]) >= up) return i;
    ++L[u(dest[i])];
  }
  for (int p = 0; p < P; ++p) {
    i64 s = 0;
    for (int k = 0; k < kLanes; ++k) s += L[static_cast<size_t>(k) * P + p];
    counts[p] = s;
  }
  return -1;
}

// Staying rows past this many bytes in all are written with non-temporal stores: a result
// that large is not read from cache next, and streaming stores skip the read of every
// destination line that a plain store makes first (what a large memcpy saves too).
constexpr i64 kStreamMinBytes = i64(4) << 20;
// ... and only runs of at least this many bytes a column: a short run streamed leaves partly
// written lines, which the memory writes back slowly (measured: 10% of rows leaving at
// random, runs of ~9 rows, streamed every run: 3.7x the floor against 1.6x with memcpy)
constexpr i64 kStreamMinRun = 2048;

// `bytes` (a multiple of 8) from s to d (8-byte aligned) by non-temporal stores where the
// platform has them; the caller fences (stream_fence) before anyone else reads d.
inline void stream_copy(char* d, const char* s, i64 bytes) {
#if defined(__x86_64__) || defined(_M_X64)
  i64 t = 0;
  for (; t < bytes && (reinterpret_cast<std::uintptr_t>(d + t) & 15); t += 8) {
    long long v;
    std::memcpy(&v, s + t, 8);
    _mm_stream_si64(reinterpret_cast<long long*>(d + t), v);
  }
  for (; t + 16 <= bytes; t += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + t),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + t)));
  for (; t < bytes; t += 8) {
    long long v;
    std::memcpy(&v, s + t, 8);
    _mm_stream_si64(reinterpret_cast<long long*>(d + t), v);
  }
#else
  std::memcpy(d, s, static_cast<size_t>(bytes));
#endif
}

inline void stream_fence() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_sfence();
#endif
}

// Rows [from_row, from_row + rows) of every column of `from` into `to` at to_row; `stream`:
// by non-temporal stores where a column's rows are whole 8-byte words at 8-byte addresses.
inline void copy_rows(const Cols& to, i64 to_row, const Cols& from, i64 from_row, i64 rows,
                      bool stream = false) {
  for (size_t c = 0; c < to.rb.size(); ++c) {
    const i64 rb = to.rb[c];
    char* d = to.ptr[c] + to_row * rb;
    const char* s = from.ptr[c] + from_row * rb;
    const i64 bytes = rows * rb;
    if (stream && bytes >= kStreamMinRun && rb % 8 == 0 &&
        (reinterpret_cast<std::uintptr_t>(d) & 7) == 0)
      stream_copy(d, s, bytes);
    else
      std::memcpy(d, s, static_cast<size_t>(bytes));
  }
}

// Section c of peer p's block of a message buffer: off[p] + cnt[p] * (row bytes before c).
std::vector<i64> bases(const i64* off, const i64* cnt, int P, const Cols& c) {
  const size_t C = c.rb.size();
  std::vector<i64> b(static_cast<size_t>(P) * C);
  for (int p = 0; p < P; ++p) {
    i64 at = off[p];
    for (size_t k = 0; k < C; ++k) {
      b[p * C + k] = at;
      at += cnt[p] * c.rb[k];
    }
  }
  return b;
}

// Forward in one pass over the rows: runs of staying rows copied into dst from row `k0` on,
// moving rows to their peer: tgt[p * C + c] is where peer p's rows of column c go (a section
// of the message buffer, or the peer's own result in node-shared memory).
template <class T>
void pack_t(const T* dest, i64 n, int rank, const std::vector<char*>& tgt, const Cols& src,
            const Cols& dst, i64 k0, int P, i64 staying) {
  const size_t C = src.rb.size();
  const bool stream = staying * src.row_bytes() >= kStreamMinBytes;
  std::vector<i64> cur(static_cast<size_t>(P), 0);
  i64 k = k0;
  i64 i = 0;
  while (i < n) {
    if (static_cast<int>(dest[i]) == rank) {
      i64 j = i + 1;
      while (j < n && static_cast<int>(dest[j]) == rank) ++j;
      copy_rows(dst, k, src, i, j - i, stream);
      k += j - i;
      i = j;
      continue;
    }
    const auto d = static_cast<size_t>(dest[i]);
    const i64 at = cur[d]++;
    char* const* t = &tgt[d * C];
    for (size_t c = 0; c < C; ++c) {
      const i64 rb = src.rb[c];
      copy_row(t[c] + at * rb, src.ptr[c] + i * rb, rb);
    }
    ++i;
  }
  if (stream) stream_fence();
}

// In place: the leaving rows listed (a branch-free scan of dest into `holes`), then packed
// column by column (tgt as pack_t's): one column's rows at a time is one ascending stream
// for the hardware prefetcher, where a row at a time interleaves every column's.
template <class T>
void pack_leavers_t(const T* dest, i64 n, int rank, const std::vector<char*>& tgt,
                    const Cols& src, int P, std::vector<i64>& holes) {
  const size_t C = src.rb.size();
  holes.resize(static_cast<size_t>(n));
  i64* H = holes.data();
  i64 L = 0;
  for (i64 i = 0; i < n; ++i) {
    H[L] = i;
    L += static_cast<int>(dest[i]) != rank;
  }
  holes.resize(static_cast<size_t>(L));
  std::vector<i64> cur(static_cast<size_t>(P), 0), slot(static_cast<size_t>(L));
  std::vector<int> peer(static_cast<size_t>(L));
  for (i64 k = 0; k < L; ++k) {
    const int d = static_cast<int>(dest[H[k]]);
    peer[k] = d;
    slot[k] = cur[d]++;
  }
  for (size_t c = 0; c < C; ++c) {
    const i64 rb = src.rb[c];
    const char* s = src.ptr[c];
    for (i64 k = 0; k < L; ++k)
      copy_row(tgt[static_cast<size_t>(peer[k]) * C + c] + slot[k] * rb, s + H[k] * rb, rb);
  }
}

// Back in one pass over the rows: row i gets the next row of its dest's group (this rank's own
// group from `src` at row k0, the others' from `recv`). False when a group's count does not
// match (dest changed since the forward exchange).
template <class T>
bool scatter_t(const T* dest, i64 n, int rank, const i64* cnt, const std::vector<i64>& base,
               const Cols& src, i64 k0, const Cols& dst, const char* recv, int P) {
  const size_t C = dst.rb.size();
  std::vector<i64> cur(static_cast<size_t>(P), 0);
  i64 k = k0;
  i64 i = 0;
  const auto up = static_cast<std::uint64_t>(P);
  while (i < n) {
    const auto d64 = static_cast<std::uint64_t>(static_cast<std::int64_t>(dest[i]));
    if (d64 >= up) return false;
    const auto d = static_cast<int>(d64);
    if (d == rank) {
      i64 j = i + 1;
      while (j < n && static_cast<int>(dest[j]) == rank) ++j;
      if (k + (j - i) > k0 + cnt[rank]) return false;
      copy_rows(dst, i, src, k, j - i);
      k += j - i;
      i = j;
      continue;
    }
    const i64 at = cur[d]++;
    if (at >= cnt[d]) return false;
    const i64* b = &base[static_cast<size_t>(d) * C];
    for (size_t c = 0; c < C; ++c) {
      const i64 rb = dst.rb[c];
      copy_row(dst.ptr[c] + i * rb, recv + b[c] + at * rb, rb);
    }
    ++i;
  }
  for (int p = 0; p < P; ++p)
    if (p != rank && cur[p] != cnt[p]) return false;
  return k - k0 == cnt[rank];
}

std::vector<i64> exclusive_scan(const i64* v, int P, i64 scale) {
  std::vector<i64> o(static_cast<size_t>(P) + 1, 0);
  for (int p = 0; p < P; ++p) o[p + 1] = o[p] + v[p] * scale;
  return o;
}

}  // namespace

namespace {

// [count, sig] for each peer (-code in place of the count where this rank's input is bad)
void fill_peer_counts(std::vector<i64>& sb, const std::vector<int>& peers, const i64* counts,
                      i64 code, i64 sig) {
  for (size_t k = 0; k < peers.size(); ++k) {
    sb[2 * k] = code ? -code : counts[peers[k]];
    sb[2 * k + 1] = sig;
  }
}

// What the peers' [count, sig] say: their counts, the first rank at fault, a signature that
// differs
CountResult read_peer_counts(const std::vector<i64>& rb, const std::vector<int>& peers, int P,
                             int me, const i64* counts, i64 code, i64 sig) {
  CountResult r;
  r.rcounts.assign(static_cast<size_t>(P), 0);
  if (code) r.bad = static_cast<i64>(me) * 256 + code;
  for (size_t k = 0; k < peers.size(); ++k) {
    const int p = peers[k];
    if (rb[2 * k] < 0 && (r.bad < 0 || p * 256 < r.bad))
      r.bad = static_cast<i64>(p) * 256 + (-rb[2 * k]);
    if (rb[2 * k + 1] != sig && r.sig_rank < 0) {
      r.sig_mismatch = true;
      r.sig_rank = p;
    }
    r.rcounts[p] = rb[2 * k] < 0 ? 0 : rb[2 * k];
  }
  r.rcounts[me] = code ? 0 : counts[me];
  return r;
}

}  // namespace

i64 migrate_count(const void* dest, int item, i64 n, int P, i64* counts) {
  if (item == 4) return count_t(static_cast<const std::int32_t*>(dest), n, P, counts);
  return count_t(static_cast<const std::int64_t*>(dest), n, P, counts);
}

CountResult migrate_counts(const Comm& comm, int algorithm, const i64* counts, i64 code,
                           i64 sig) {
  const int P = comm.size(), me = comm.rank();
  CountResult r;
  r.rcounts.assign(static_cast<size_t>(P), 0);
  const i64 flag = code ? static_cast<i64>(me) * 256 + code : -1;
  if (algorithm == 0) {  // dense: every rank's [count, sig] in one MPI_Alltoall
    std::vector<i64> sb(2 * static_cast<size_t>(P)), rb(2 * static_cast<size_t>(P));
    for (int p = 0; p < P; ++p) {
      sb[2 * p] = code ? -code : counts[p];
      sb[2 * p + 1] = sig;
    }
    mpi::alltoall(sb.data(), rb.data(), 2 * sizeof(i64), comm.get());
    stats()["migrate_alltoall"] += 1;
    for (int p = 0; p < P; ++p) {
      if (rb[2 * p] < 0 && r.bad < 0) r.bad = static_cast<i64>(p) * 256 + (-rb[2 * p]);
      if (rb[2 * p + 1] != sig && r.sig_rank < 0) {
        r.sig_mismatch = true;
        r.sig_rank = p;
      }
      r.rcounts[p] = rb[2 * p] < 0 ? 0 : rb[2 * p];
    }
    return r;
  }
  if (algorithm != 1)  // (the given peers: MigratePeers, persistent requests)
    throw std::invalid_argument("pyshard: migrate_counts takes algorithm 0 (dense) or 1 (NBX)");
  // NBX (Hoefler, Siebert, Lumsdaine 2010): synchronous sends to the ranks that get rows; a
  // rank probes for its senders until its own sends are matched, then joins a nonblocking
  // reduction (an error flag and the signature's range: a barrier that also says whether every
  // rank's input was good); done when that reduction completes.
  const int tag = comm.next_round() % 2 ? tags::kMigrateCountOdd : tags::kMigrateCount;
  std::vector<i64> sb;
  std::vector<int> to;
  if (!code)
    for (int p = 0; p < P; ++p)
      if (p != me && counts[p] > 0) to.push_back(p);
  sb.resize(2 * to.size());
  std::vector<MPI_Request> sends(to.size(), MPI_REQUEST_NULL);
  for (size_t k = 0; k < to.size(); ++k) {
    sb[2 * k] = counts[to[k]];
    sb[2 * k + 1] = sig;
    mpi::issend_bytes(&sb[2 * k], 2 * sizeof(i64), to[k], tag, comm.get(), &sends[k]);
  }
  i64 red[3] = {code ? flag : INT64_MAX, sig, -sig};
  MPI_Request barrier = MPI_REQUEST_NULL;
  bool joined = false;
  i64 msg[2];
  int idle = 0;
  for (;;) {
    int src = -1;
    // past a short spin, a poll that finds nothing yields the core: where ranks outnumber
    // cores, the rank being waited for gets to run (measured: 4 ranks on 2 cores)
    if (++idle > 64) sched_yield();
    while (mpi::iprobe_recv(msg, 2 * sizeof(i64), tag, comm.get(), &src)) {
      idle = 0;
      r.rcounts[src] = msg[0];
      if (msg[1] != sig && r.sig_rank < 0) r.sig_rank = src;
    }
    if (!joined) {
      if (sends.empty() || mpi::testall(sends.size(), sends.data())) {
        mpi::iallreduce_min_i64(red, 3, comm.get(), &barrier);
        joined = true;
      }
    } else if (mpi::test(&barrier)) {
      break;
    }
  }
  stats()["migrate_nbx"] += 1;
  r.rcounts[me] = code ? 0 : counts[me];
  if (red[0] != INT64_MAX) r.bad = red[0];
  if (red[1] != -red[2]) r.sig_mismatch = true;
  return r;
}

MigratePeers::MigratePeers(std::shared_ptr<Comm> comm, std::vector<int> peers)
    : comm_(std::move(comm)), peers_(std::move(peers)),
      msgs_(comm_, tags::kMigratePeers, PeerMethod::persistent) {
  const size_t K = peers_.size();
  sb_.assign(2 * K, 0);
  rb_.assign(2 * K, 0);
  constexpr i64 kPair = 2 * sizeof(i64);  // two int64 as 16 bytes
  for (size_t k = 0; k < K; ++k) {
    rmsg_.push_back(PeerMsg{reinterpret_cast<char*>(&rb_[2 * k]), kPair, peers_[k]});
    smsg_.push_back(PeerMsg{reinterpret_cast<char*>(&sb_[2 * k]), kPair, peers_[k]});
  }
}

MigratePeers::~MigratePeers() = default;

CountResult MigratePeers::exchange(const i64* counts, i64 code, i64 sig) {
  const int P = comm_->size(), me = comm_->rank();
  fill_peer_counts(sb_, peers_, counts, code, sig);
  msgs_.start(rmsg_, smsg_);  // persistent: bound at the first exchange
  msgs_.wait();
  stats()["migrate_peers"] += 1;
  return read_peer_counts(rb_, peers_, P, me, counts, code, sig);
}

MigrateExchange::MigrateExchange(std::shared_ptr<Comm> comm, std::shared_ptr<NodeShm> node)
    : comm_(std::move(comm)), node_(std::move(node)),
      rows_(comm_, tags::kMigrateRows), back_rows_(comm_, tags::kMigrateBack) {
  P_ = comm_->size();
  rank_ = comm_->rank();
  if (node_) {
    if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
    local_.assign(P_, -1);
    for (int p = 0; p < P_; ++p) local_[p] = node_->local_index(p);
  }
}

MigrateExchange::~MigrateExchange() {
  if (mpi::finalized()) return;
  msgs().drop();
  for (MPI_Datatype& t : types_) mpi::type_free(&t);
}

bool MigrateExchange::on_node(int p) const { return node_ && p != rank_ && local_[p] >= 0; }

i64 MigrateExchange::table_bytes(bool back, i64 columns) const {
  const i64 N = node_ ? node_->node_size() : 0;
  const i64 words = back ? 2 * N : columns + N;
  return (words * static_cast<i64>(sizeof(i64)) + 63) / 64 * 64;
}

template <class F>
void MigrateExchange::handshake(char* block, i64 bytes, F&& copy) {
  i64 off = 0;
  ShmSegment* mine = node_->find(block, std::max<i64>(bytes, 1), &off);
  try {
    if (!mine) throw std::logic_error("pyshard: a migration's block is not in node-shared memory");
    node_->exchange_all(mine, off, std::forward<F>(copy));
  } catch (...) {  // a node peer failed: this rank's messages still complete, then it raises
    msgs().drop();
    active_ = false;
    throw;
  }
}

void MigrateExchange::post_recvs(const i64* rbytes, char* recv) {
  // point-to-point messages from the ranks with rows only, whichever count exchange ran
  // (measured: faster than an MPI_Alltoallv of the same bytes, which must also be unpacked,
  // docs/particles.md); node peers on the shm path write into this rank's memory instead
  const int P = P_;
  direct_.assign(P, false);
  msg_.clear();
  std::vector<i64> ro = exclusive_scan(rbytes, P, 1);
  for (int p = 0; p < P; ++p) {
    if (on_node(p)) direct_[p] = true;  // nothing to unpack: written in place
    if (p == rank_ || rbytes[p] == 0 || on_node(p)) continue;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    if (!back_ && !inplace_) {  // forward: the message lands in the result's columns
      std::vector<char*> at;
      std::vector<i64> len;
      for (size_t c = 0; c < dst_.rb.size(); ++c) {
        at.push_back(dst_.ptr[c] + row_off_[p] * dst_.rb[c]);
        len.push_back(rcnt_[p] * dst_.rb[c]);
      }
      t = mpi::hindexed_bytes(at, len);
    }
    if (t != MPI_DATATYPE_NULL) {
      types_.push_back(t);
      direct_[p] = true;
      msg_.push_back(PeerMsg{nullptr, rbytes[p], p, t});  // at absolute addresses
    } else {
      msg_.push_back(PeerMsg{recv + ro[p], rbytes[p], p});
    }
  }
  msgs().post_recvs(msg_);
  active_ = true;
}

void MigrateExchange::post_sends(const i64* sbytes, char* send) {
  const int P = P_;
  std::vector<i64> so = exclusive_scan(sbytes, P, 1);
  for (int p = 0; p < P; ++p)
    if (p != rank_ && sbytes[p] > 0 && !on_node(p)) {
      msgs().post_send(PeerMsg{send + so[p], sbytes[p], p});
      stats()["migrate_messages"] += 1;
    }
  if (node_) stats()[back_ ? "migrate_back_shm" : "migrate_shm"] += 1;
  else stats()[back_ ? "migrate_back_p2p" : "migrate_p2p"] += 1;
  active_ = true;
}

void MigrateExchange::keep(bool back, const void* dest, int item, i64 n, i64 sig,
                           const i64* cnt, const i64* rcnt, const Cols& src, const Cols& dst,
                           const i64* row_off, char* recv) {
  if (active_) throw std::runtime_error("pyshard: a migration is already in flight here");
  back_ = back;
  dest_ = dest;
  item_ = item;
  n_ = n;
  sig_ = sig;
  cnt_.assign(cnt, cnt + P_);
  rcnt_.assign(rcnt, rcnt + P_);
  row_off_.assign(row_off, row_off + P_);
  src_ = src;
  dst_ = dst;
  recv_ = recv;
  inplace_ = false;
}

std::vector<char*> MigrateExchange::forward_messages(const i64* cnt, const i64* rcnt,
                                                     const Cols& src, char* send,
                                                     std::vector<i64>& sbytes,
                                                     std::vector<i64>& rbytes) {
  const int P = P_;
  const size_t C = src.rb.size();
  const i64 R = src.row_bytes();
  sbytes.assign(P, 0);
  rbytes.assign(P, 0);
  for (int p = 0; p < P; ++p) {
    const bool msg = p != rank_ && !on_node(p);
    sbytes[p] = msg ? cnt[p] * R : 0;
    rbytes[p] = msg ? rcnt[p] * R : 0;
  }
  std::vector<i64> so = exclusive_scan(sbytes.data(), P, 1);
  roff_ = exclusive_scan(rbytes.data(), P, 1);
  std::vector<i64> base = bases(so.data(), cnt, P, src);
  std::vector<char*> tgt(static_cast<size_t>(P) * C, nullptr);
  for (int p = 0; p < P; ++p)
    if (sbytes[p] > 0)
      for (size_t c = 0; c < C; ++c) tgt[p * C + c] = send + base[p * C + c];
  return tgt;
}

void MigrateExchange::start_forward(const void* dest, int item, i64 n, const i64* cnt,
                                    const i64* rcnt, const Cols& src, const Cols& dst,
                                    const i64* row_off, char* send, char* recv, char* block,
                                    i64 block_bytes) {
  if (node_ && !block)
    throw std::invalid_argument("pyshard: the shm path needs the result's node-shared block");
  keep(false, dest, item, n, 0, cnt, rcnt, src, dst, row_off, recv);
  const int P = P_;
  const size_t C = src.rb.size();
  const i64 R = src.row_bytes();
  std::vector<i64> sbytes, rbytes;
  std::vector<char*> tgt = forward_messages(cnt, rcnt, src, send, sbytes, rbytes);
  auto pack = [&] {
    if (item == 4)
      pack_t(static_cast<const std::int32_t*>(dest), n, rank_, tgt, src, dst, row_off[rank_], P,
             cnt[rank_]);
    else
      pack_t(static_cast<const std::int64_t*>(dest), n, rank_, tgt, src, dst, row_off[rank_], P,
             cnt[rank_]);
  };
  post_recvs(rbytes.data(), recv);
  if (!node_) {
    pack();
    post_sends(sbytes.data(), send);
    return;
  }
  // this rank's table: where each column lies in the block, and each node peer's group
  const std::vector<int>& ranks = node_->node_ranks();
  const int N = node_->node_size(), me = node_->self();
  auto* table = reinterpret_cast<i64*>(block);
  for (size_t c = 0; c < C; ++c) table[c] = dst.ptr[c] - block;
  for (int idx = 0; idx < N; ++idx) table[C + idx] = row_off[ranks[idx]];
  std::vector<char> lost;  // rows for a node peer whose block could not be mapped
  handshake(block, block_bytes, [&](const std::vector<char*>& at) {
    for (int idx = 0; idx < N; ++idx) {
      const int p = ranks[idx];
      if (p == rank_ || cnt[p] == 0) continue;
      if (!at[idx]) {  // every rank of the node raises after the handshake
        lost.resize(static_cast<size_t>(std::max<i64>(static_cast<i64>(lost.size()), cnt[p] * R)));
        for (size_t c = 0; c < C; ++c) tgt[p * C + c] = lost.data();
        continue;
      }
      const auto* t = reinterpret_cast<const i64*>(at[idx]);
      for (size_t c = 0; c < C; ++c)
        tgt[p * C + c] = at[idx] + t[c] + t[C + me] * src.rb[c];
    }
    pack();
    post_sends(sbytes.data(), send);
  });
}

void MigrateExchange::start_inplace(const void* dest, int item, i64 n, const i64* cnt,
                                    const i64* rcnt, const Cols& cols, i64 cap, char* send,
                                    char* recv) {
  if (node_)
    throw std::invalid_argument("pyshard: an in-place migration takes the message path");
  const int P = P_;
  i64 m = 0;
  for (int p = 0; p < P; ++p) m += rcnt[p];
  if (m > cap || n > cap)
    throw std::invalid_argument("pyshard: an in-place migration's columns have room for " +
                                std::to_string(cap) + " rows, not " + std::to_string(m));
  const std::vector<i64> zero(static_cast<size_t>(P), 0);
  keep(false, dest, item, n, 0, cnt, rcnt, cols, cols, zero.data(), recv);
  inplace_ = true;
  std::vector<i64> sbytes, rbytes;
  std::vector<char*> tgt = forward_messages(cnt, rcnt, cols, send, sbytes, rbytes);
  post_recvs(rbytes.data(), recv);
  if (item == 4)
    pack_leavers_t(static_cast<const std::int32_t*>(dest), n, rank_, tgt, cols, P, holes_);
  else
    pack_leavers_t(static_cast<const std::int64_t*>(dest), n, rank_, tgt, cols, P, holes_);
  post_sends(sbytes.data(), send);
}

void MigrateExchange::fill_holes() {
  const int P = P_;
  const size_t C = dst_.rb.size();
  const auto L = static_cast<i64>(holes_.size());
  const i64* H = holes_.data();
  i64 a = 0;  // rows that arrive
  for (int p = 0; p < P; ++p)
    if (p != rank_) a += rcnt_[p];
  // arrival k goes to the k-th hole, past the holes to row n + (k - L)
  i64 prefix = 0;  // row bytes of the columns before c
  for (size_t c = 0; c < C; ++c) {
    const i64 rb = dst_.rb[c];
    char* col = dst_.ptr[c];
    i64 k = 0;
    for (int p = 0; p < P; ++p) {
      if (p == rank_ || rcnt_[p] == 0) continue;
      const char* s = recv_ + roff_[p] + rcnt_[p] * prefix;
      const i64 r = rcnt_[p];
      const i64 in_holes = std::max<i64>(0, std::min(r, L - k));
      for (i64 j = 0; j < in_holes; ++j) copy_row(col + H[k + j] * rb, s + j * rb, rb);
      if (r > in_holes)  // the rest in one block past row n
        std::memcpy(col + (n_ + k + in_holes - L) * rb, s + in_holes * rb,
                    static_cast<size_t>((r - in_holes) * rb));
      k += r;
    }
    prefix += rb;
  }
  if (a >= L) return;
  // fewer arrived than left: the staying rows from row m on fill the holes left, in order
  const i64 m = n_ - L + a;
  auto tail = [&](const auto* dest) {
    i64 h = a;
    for (i64 i = m; i < n_; ++i) {
      if (static_cast<int>(dest[i]) != rank_) continue;
      for (size_t c = 0; c < C; ++c) {
        const i64 rb = dst_.rb[c];
        copy_row(dst_.ptr[c] + H[h] * rb, dst_.ptr[c] + i * rb, rb);
      }
      ++h;
    }
  };
  if (item_ == 4)
    tail(static_cast<const std::int32_t*>(dest_));
  else
    tail(static_cast<const std::int64_t*>(dest_));
}

void MigrateExchange::start_back(const void* dest, int item, i64 n, const i64* cnt,
                                 const i64* rcnt, const Cols& src, const Cols& dst,
                                 const i64* row_off, char* send, char* recv, i64 sig,
                                 i64 recv_bytes) {
  const i64 H = node_ ? table_bytes(true, 0) : 0;
  keep(true, dest, item, n, sig, cnt, rcnt, src, dst, row_off, recv + H);
  const int P = P_;
  const i64 R = src.row_bytes();
  std::vector<i64> sbytes(P), rbytes(P);
  for (int p = 0; p < P; ++p) {  // a header [signature, error code] leads each section
    sbytes[p] = p == rank_ || rcnt[p] == 0 || on_node(p) ? 0 : kBackHeader + rcnt[p] * R;
    rbytes[p] = p == rank_ || cnt[p] == 0 ? 0 : kBackHeader + cnt[p] * dst.row_bytes();
  }
  std::vector<i64> so = exclusive_scan(sbytes.data(), P, 1);
  roff_ = exclusive_scan(rbytes.data(), P, 1);
  // each group is contiguous per column in src: one memcpy per column and peer
  const size_t C = src.rb.size();
  // a section: the header, then the rows (where they fit: a peer whose columns differ gets
  // the header only, and raises on its signature)
  auto put = [&](char* to, i64 cap, int p) {
    const i64 head[2] = {sig, 0};
    std::memcpy(to, head, kBackHeader);
    if (kBackHeader + rcnt[p] * R > cap) return;
    i64 at = kBackHeader;
    for (size_t c = 0; c < C; ++c) {
      const i64 bytes = rcnt[p] * src.rb[c];
      std::memcpy(to + at, src.ptr[c] + row_off[p] * src.rb[c], static_cast<size_t>(bytes));
      at += bytes;
    }
  };
  for (int p = 0; p < P; ++p)
    if (sbytes[p] > 0) put(send + so[p], sbytes[p], p);
  post_recvs(rbytes.data(), recv_);
  post_sends(sbytes.data(), send);
  if (node_) node_back(recv, recv_bytes, rbytes.data(), put);
}

template <class F>
void MigrateExchange::node_back(char* block, i64 bytes, const i64* rbytes, F&& put) {
  // this rank's table: per node peer, where its section lies in the block and its bytes
  const std::vector<int>& ranks = node_->node_ranks();
  const int N = node_->node_size(), me = node_->self();
  const i64 H = table_bytes(true, 0);
  auto* table = reinterpret_cast<i64*>(block);
  for (int idx = 0; idx < N; ++idx) {
    table[2 * idx] = H + roff_[ranks[idx]];
    table[2 * idx + 1] = rbytes[ranks[idx]];
  }
  handshake(block, bytes, [&](const std::vector<char*>& at) {
    for (int idx = 0; idx < N; ++idx) {
      const int p = ranks[idx];
      if (p == rank_ || rcnt_[p] == 0 || !at[idx]) continue;
      const auto* t = reinterpret_cast<const i64*>(at[idx]);
      if (t[2 * me + 1] < kBackHeader) continue;  // (the counts agree: never)
      put(at[idx] + t[2 * me], t[2 * me + 1], p);
    }
  });
}

void MigrateExchange::back_error(const i64* cnt, const i64* rcnt, i64 sig, i64 code,
                                 char* recv, i64 recv_bytes) {
  if (active_) throw std::runtime_error("pyshard: a migration is already in flight here");
  if (node_ && !recv)
    throw std::invalid_argument("pyshard: the shm path needs this rank's node-shared block");
  // this rank's values are bad: each rank it owes rows gets a header with the error code, and
  // what the others send back is received and dropped, so that no rank waits for it
  const int P = P_;
  const i64 head[2] = {sig, code};
  PeerMessages heads(comm_, tags::kMigrateBack);
  std::vector<PeerMsg> to;
  for (int p = 0; p < P; ++p)
    if (p != rank_ && rcnt[p] > 0 && !on_node(p))
      to.push_back(PeerMsg{reinterpret_cast<char*>(const_cast<i64*>(head)), kBackHeader, p});
  heads.start({}, to);
  if (node_) {
    back_ = true;
    cnt_.assign(cnt, cnt + P);
    rcnt_.assign(rcnt, rcnt + P);
    std::vector<i64> rbytes(P);  // room for the headers only: the rows are dropped
    for (int p = 0; p < P; ++p) rbytes[p] = p == rank_ || cnt[p] == 0 ? 0 : kBackHeader;
    roff_ = exclusive_scan(rbytes.data(), P, 1);
    node_back(recv, recv_bytes, rbytes.data(),
              [&](char* to, i64, int) { std::memcpy(to, head, kBackHeader); });
    // (a throw completes `heads` in its destructor, errors ignored)
  }
  for (int p = 0; p < P; ++p)
    if (p != rank_ && cnt[p] > 0 && !on_node(p)) mpi::drain(p, tags::kMigrateBack, comm_->get());
  heads.wait();
}

// A message of another size than its receive: the exchange ends here. In back(), a peer's
// values wider than this rank's (the sizes are not both sides' knowledge there): the
// ValueError naming it; elsewhere (never: the counts agree) the error as it is.
void MigrateExchange::message_size(const MessageSizeError& e) {
  active_ = false;
  for (MPI_Datatype& t : types_) mpi::type_free(&t);
  types_.clear();
  if (!back_) throw e;
  throw std::invalid_argument("pyshard: back(): rank " + std::to_string(e.peer) +
                              "'s values have other columns (keys, dtypes or trailing "
                              "shapes) than this rank's (its rows are wider)");
}

bool MigrateExchange::test() {
  if (!active_) return true;
  try {
    return msgs().test();
  } catch (const MessageSizeError& e) {
    message_size(e);
  }
}

void MigrateExchange::wait() {
  if (!active_) return;
  try {
    msgs().wait();
  } catch (const MessageSizeError& e) {
    message_size(e);
  }
  active_ = false;
  for (MPI_Datatype& t : types_) mpi::type_free(&t);
  types_.clear();
  const int P = P_;
  if (!back_ && inplace_) {
    fill_holes();
    return;
  }
  if (!back_) {
    const size_t C = dst_.rb.size();
    for (int p = 0; p < P; ++p) {
      if (p == rank_ || rcnt_[p] == 0 || direct_[p]) continue;
      i64 at = roff_[p];
      for (size_t c = 0; c < C; ++c) {
        const i64 bytes = rcnt_[p] * dst_.rb[c];
        std::memcpy(dst_.ptr[c] + row_off_[p] * dst_.rb[c], recv_ + at,
                    static_cast<size_t>(bytes));
        at += bytes;
      }
    }
    return;
  }
  // every header first: a peer whose values were bad, or whose columns differ
  int bad_peer = -1, sig_peer = -1;
  i64 bad_code = 0;
  for (int p = 0; p < P; ++p) {
    if (p == rank_ || cnt_[p] == 0) continue;
    i64 head[2];
    std::memcpy(head, recv_ + roff_[p], kBackHeader);
    if (head[1] != 0 && bad_peer < 0) {
      bad_peer = p;
      bad_code = head[1];
    }
    if (head[1] == 0 && head[0] != sig_ && sig_peer < 0) sig_peer = p;
  }
  if (bad_peer >= 0)
    throw std::invalid_argument("pyshard: back(): rank " + std::to_string(bad_peer) +
                                "'s values were bad (code " + std::to_string(bad_code) +
                                "; its own error names them)");
  if (sig_peer >= 0)
    throw std::invalid_argument("pyshard: back(): rank " + std::to_string(sig_peer) +
                                "'s values have other columns (keys, dtypes or trailing "
                                "shapes) than this rank's");
  std::vector<i64> cnt_others(cnt_), off(roff_);
  cnt_others[rank_] = 0;
  for (int p = 0; p < P; ++p) off[p] += kBackHeader;
  std::vector<i64> base = bases(off.data(), cnt_others.data(), P, dst_);
  const bool ok =
      item_ == 4
          ? scatter_t(static_cast<const std::int32_t*>(dest_), n_, rank_, cnt_.data(), base,
                      src_, row_off_[rank_], dst_, recv_, P)
          : scatter_t(static_cast<const std::int64_t*>(dest_), n_, rank_, cnt_.data(), base,
                      src_, row_off_[rank_], dst_, recv_, P);
  if (!ok)
    throw std::runtime_error(
        "pyshard: back(): dest changed since the migration (its counts per rank differ); "
        "keep dest unchanged until back() returns");
}

}  // namespace pyshard
