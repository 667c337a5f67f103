#include "mpi_calls.h"

#include <dlfcn.h>

#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_Query_cuda_support
#endif
#endif

#include <algorithm>
#include <mutex>
#include <numeric>

namespace pyshard {
namespace mpi {

namespace {

i64 g_limit = INT_MAX;

bool native() { return PYSHARD_LARGE_COUNT && g_limit == INT_MAX; }

void note(const char* how) { large_count_stats()[how] += 1; }

int as_int(i64 v) { return static_cast<int>(v); }

// An owned derived datatype, freed when it goes (never a predefined one).
struct Type {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  Type() = default;
  Type(Type&& o) noexcept : t(o.t) { o.t = MPI_DATATYPE_NULL; }
  Type& operator=(Type&& o) noexcept {
    if (this != &o) {
      reset();
      t = o.t;
      o.t = MPI_DATATYPE_NULL;
    }
    return *this;
  }
  Type(const Type&) = delete;
  Type& operator=(const Type&) = delete;
  ~Type() { reset(); }
  void reset() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (t != MPI_DATATYPE_NULL && !finalized) MPI_Type_free(&t);
    t = MPI_DATATYPE_NULL;
  }
  MPI_Datatype release() {
    MPI_Datatype x = t;
    t = MPI_DATATYPE_NULL;
    return x;
  }
};

Type commit(Type t) {
  check_mpi(MPI_Type_commit(&t.t), "MPI_Type_commit");
  return t;
}

// `a` at byte displacement `da` and `b` at `db`, one of each.
Type join(MPI_Datatype a, MPI_Aint da, MPI_Datatype b, MPI_Aint db) {
  int lens[2] = {1, 1};
  MPI_Aint disp[2] = {da, db};
  MPI_Datatype types[2] = {a, b};
  Type t;
  check_mpi(MPI_Type_create_struct(2, lens, disp, types, &t.t), "MPI_Type_create_struct");
  return t;
}

// `n` consecutive copies of `inner` (extent `ext` bytes) with every count under the limit:
// blocks of `limit` copies (recursively), then the rest.
Type contiguous(i64 n, MPI_Datatype inner, i64 ext) {
  const i64 L = g_limit;
  Type t;
  if (n <= L) {
    check_mpi(MPI_Type_contiguous(as_int(n), inner, &t.t), "MPI_Type_contiguous");
    return t;
  }
  Type block;
  check_mpi(MPI_Type_contiguous(as_int(L), inner, &block.t), "MPI_Type_contiguous");
  Type body = contiguous(n / L, block.t, L * ext);
  const i64 r = n % L;
  if (r == 0) return body;
  Type tail;
  check_mpi(MPI_Type_contiguous(as_int(r), inner, &tail.t), "MPI_Type_contiguous");
  return join(body.t, 0, tail.t, static_cast<MPI_Aint>((n - r) * ext));
}

// `n` copies of `inner`, `stride` bytes apart, every count under the limit.
Type hvector(i64 n, i64 stride, MPI_Datatype inner) {
  const i64 L = g_limit;
  Type t;
  if (n <= L) {
    check_mpi(MPI_Type_create_hvector(as_int(n), 1, stride, inner, &t.t),
              "MPI_Type_create_hvector");
    return t;
  }
  Type block;
  check_mpi(MPI_Type_create_hvector(as_int(L), 1, stride, inner, &block.t),
            "MPI_Type_create_hvector");
  Type body = hvector(n / L, L * stride, block.t);
  const i64 r = n % L;
  if (r == 0) return body;
  Type tail;
  check_mpi(MPI_Type_create_hvector(as_int(r), 1, stride, inner, &tail.t),
            "MPI_Type_create_hvector");
  return join(body.t, 0, tail.t, static_cast<MPI_Aint>((n - r) * stride));
}

// `t` at byte displacement `d`, committed (for MPI_Alltoallw, whose int displacements
// cannot say where a block past 2 GiB starts).
Type placed(MPI_Datatype t, i64 d) {
  int len = 1;
  MPI_Aint disp = static_cast<MPI_Aint>(d);
  Type out;
  check_mpi(MPI_Type_create_struct(1, &len, &disp, &t, &out.t), "MPI_Type_create_struct");
  return commit(std::move(out));
}

// A committed type of exactly `n` contiguous bytes (extent n), kept for the life of the
// process and shared: persistent and nonblocking requests may hold it.
MPI_Datatype bytes_type(i64 n) {
  static std::mutex mu;
  static std::map<i64, MPI_Datatype> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  MPI_Datatype t = commit(contiguous(n, MPI_BYTE, 1)).release();
  cache[n] = t;
  return t;
}

i64 extent_of(MPI_Datatype t) {
  MPI_Aint lb = 0, ext = 0;
  check_mpi(MPI_Type_get_extent(t, &lb, &ext), "MPI_Type_get_extent");
  return static_cast<i64>(ext);
}

template <class A>
i64 max_of(const A& v) {
  i64 m = 0;
  for (auto x : v) m = std::max<i64>(m, static_cast<i64>(x));
  return m;
}

const char* cptr(const void* p, i64 off) { return static_cast<const char*>(p) + off; }
char* ptr(void* p, i64 off) { return static_cast<char*>(p) + off; }

// One reduction of `n` elements of `t` in rounds of at most the limit: fn(offset in bytes,
// elements) per round, in the same order on every rank.
template <class F>
void rounds(i64 n, MPI_Datatype t, F fn) {
  note("split");
  const i64 L = g_limit, e = extent_of(t);
  for (i64 off = 0; off < n; off += L) fn(off * e, std::min(L, n - off));
}

}  // namespace

// One side of a classic call in place of 64-bit counts `c` at displacements `d`: per peer an
// int count and byte displacement of MPI_BYTE where both fit, else count 1 at displacement 0
// of a type of the block's bytes placed at its displacement.
// With `aint` (neighbourhood all-to-all-w, whose displacements are MPI_Aint): the
// displacements stay as they are, and a block past the limit is count 1 of a type of its bytes.
struct Side {
  std::vector<i64> c, d;  // the values it was made from
  bool aint = false;
  std::vector<int> n, disp;
  std::vector<MPI_Datatype> types;
  std::vector<Type> own;  // the placed types
  bool placed = false;    // some block needed one
};

namespace {

// The Side of (c, d) (d null: displacements 0), kept in c by d and remade when the values
// change.
const Side& side(const Counts& c, const Displs* d, bool aint = false) {
  std::shared_ptr<Side>& slot = c.sides[d];
  const size_t P = c.size();
  auto dv = [&](size_t p) { return d ? static_cast<i64>((*d)[p]) : i64(0); };
  bool same = slot && slot->c.size() == P && slot->aint == aint;
  for (size_t p = 0; same && p < P; ++p) same = slot->c[p] == c[p] && slot->d[p] == dv(p);
  if (same) return *slot;
  auto s = std::make_shared<Side>();
  s->aint = aint;
  for (size_t p = 0; p < P; ++p) {
    const i64 n = c[p], at = dv(p);
    s->c.push_back(n);
    s->d.push_back(at);
    if (aint) {
      s->n.push_back(n <= g_limit ? as_int(n) : 1);
      s->types.push_back(n <= g_limit ? MPI_BYTE : bytes_type(n));
      s->placed = s->placed || n > g_limit;
    } else if (n == 0 || (n <= g_limit && at <= g_limit)) {
      s->n.push_back(as_int(n));
      s->disp.push_back(n == 0 ? 0 : as_int(at));
      s->types.push_back(MPI_BYTE);
    } else {
      Type span = contiguous(n, MPI_BYTE, 1);
      s->own.push_back(placed(span.t, at));
      s->n.push_back(1);
      s->disp.push_back(0);
      s->types.push_back(s->own.back().t);
      s->placed = true;
    }
  }
  slot = s;
  return *slot;
}

}  // namespace

std::map<std::string, i64>& large_count_stats() {
  static std::map<std::string, i64> s;
  return s;
}

i64 count_limit() { return g_limit; }

void set_count_limit(i64 n) {
  if (n < 8 || n > INT_MAX)
    throw std::invalid_argument("pyshard: the count limit must lie in [8, 2^31-1]");
  g_limit = n;
}

const char* large_count_method() { return native() ? "native" : "datatype"; }
const char* large_count_reduce_method() { return native() ? "native" : "split"; }

void alltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb, const Counts& rc,
               const Displs& rd, MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Alltoallv_c(sb, sc.data(), sd.data(), MPI_BYTE, rb, rc.data(), rd.data(),
                              MPI_BYTE, comm),
              "MPI_Alltoallv");
    return;
  }
#endif
  const Side& s = side(sc, &sd);
  const Side& r = side(rc, &rd);
  note("alltoallw");
  if (s.placed || r.placed) note("per_peer");
  check_mpi(MPI_Alltoallw(sb, s.n.data(), s.disp.data(), s.types.data(), rb, r.n.data(),
                          r.disp.data(), r.types.data(), comm),
            "MPI_Alltoallv (as MPI_Alltoallw)");
}

void ialltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb, const Counts& rc,
                const Displs& rd, MPI_Comm comm, MPI_Request* req) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Ialltoallv_c(sb, sc.data(), sd.data(), MPI_BYTE, rb, rc.data(), rd.data(),
                               MPI_BYTE, comm, req),
              "MPI_Ialltoallv");
    return;
  }
#endif
  const Side& s = side(sc, &sd);  // kept in sc and rc: MPI reads them until completion
  const Side& r = side(rc, &rd);
  note("alltoallw");
  if (s.placed || r.placed) note("per_peer");
  check_mpi(MPI_Ialltoallw(sb, s.n.data(), s.disp.data(), s.types.data(), rb, r.n.data(),
                           r.disp.data(), r.types.data(), comm, req),
            "MPI_Ialltoallv (as MPI_Ialltoallw)");
}

bool neighbor_persistent() { return native(); }

void neighbor_alltoallv_init(const void* sb, const Counts& sc, const Displs& sd, void* rb,
                             const Counts& rc, const Displs& rd, MPI_Comm graph,
                             MPI_Request* req) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Neighbor_alltoallv_init_c(sb, sc.data(), sd.data(), MPI_BYTE, rb, rc.data(),
                                            rd.data(), MPI_BYTE, graph, MPI_INFO_NULL, req),
              "MPI_Neighbor_alltoallv_init");
    return;
  }
#endif
  (void)sb, (void)sc, (void)sd, (void)rb, (void)rc, (void)rd, (void)graph, (void)req;
  throw std::logic_error("pyshard: no persistent neighbourhood collectives in this MPI");
}

void ineighbor_alltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb,
                         const Counts& rc, const Displs& rd, MPI_Comm graph, MPI_Request* req) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Ineighbor_alltoallv_c(sb, sc.data(), sd.data(), MPI_BYTE, rb, rc.data(),
                                        rd.data(), MPI_BYTE, graph, req),
              "MPI_Ineighbor_alltoallv");
    return;
  }
#endif
  const Side& s = side(sc, &sd, true);  // kept in sc and rc: MPI reads them until completion
  const Side& r = side(rc, &rd, true);
  note("neighbor_alltoallw");
  if (s.placed || r.placed) note("bytes");
  check_mpi(MPI_Ineighbor_alltoallw(sb, s.n.data(), sd.data(), s.types.data(), rb, r.n.data(),
                                    rd.data(), r.types.data(), graph, req),
            "MPI_Ineighbor_alltoallv (as MPI_Ineighbor_alltoallw)");
}

void alltoall(const void* sb, void* rb, i64 block, MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Alltoall_c(sb, block, MPI_BYTE, rb, block, MPI_BYTE, comm), "MPI_Alltoall");
    return;
  }
#endif
  if (block <= g_limit) {
    check_mpi(MPI_Alltoall(sb, as_int(block), MPI_BYTE, rb, as_int(block), MPI_BYTE, comm),
              "MPI_Alltoall");
    return;
  }
  note("bytes");
  MPI_Datatype t = bytes_type(block);  // extent `block`: slot p at p * block
  check_mpi(MPI_Alltoall(sb, 1, t, rb, 1, t, comm), "MPI_Alltoall");
}

void alltoallw(const void* sb, const Counts& sc, const Displs& sd,
               const std::vector<MPI_Datatype>& st, void* rb, const Counts& rc, const Displs& rd,
               const std::vector<MPI_Datatype>& rt, MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Alltoallw_c(sb, sc.data(), sd.data(), st.data(), rb, rc.data(), rd.data(),
                              rt.data(), comm),
              "MPI_Alltoallw");
    return;
  }
#endif
  const Side& s = side(sc, &sd);
  const Side& r = side(rc, &rd);
  if (!s.placed && !r.placed) {
    check_mpi(MPI_Alltoallw(sb, s.n.data(), s.disp.data(), st.data(), rb, r.n.data(),
                            r.disp.data(), rt.data(), comm),
              "MPI_Alltoallw");
    return;
  }
  // count copies of each peer's type, at its displacement: one type per peer, count 1
  note("per_peer");
  const size_t P = sc.size();
  std::vector<Type> own;
  own.reserve(2 * P);
  std::vector<MPI_Datatype> st2(P, MPI_BYTE), rt2(P, MPI_BYTE);
  std::vector<int> scn(P, 0), rcn(P, 0), zero(P, 0);
  for (size_t p = 0; p < P; ++p) {
    if (sc[p] > 0) {
      Type span = contiguous(sc[p], st[p], extent_of(st[p]));
      own.push_back(placed(span.t, sd[p]));
      st2[p] = own.back().t;
      scn[p] = 1;
    }
    if (rc[p] > 0) {
      Type span = contiguous(rc[p], rt[p], extent_of(rt[p]));
      own.push_back(placed(span.t, rd[p]));
      rt2[p] = own.back().t;
      rcn[p] = 1;
    }
  }
  check_mpi(MPI_Alltoallw(sb, scn.data(), zero.data(), st2.data(), rb, rcn.data(), zero.data(),
                          rt2.data(), comm),
            "MPI_Alltoallw");
}

void allgatherv(const void* sb, CountT n, void* rb, const Counts& rc, const Displs& rd,
                MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Allgatherv_c(sb, n, MPI_BYTE, rb, rc.data(), rd.data(), MPI_BYTE, comm),
              "MPI_Allgatherv");
    return;
  }
#endif
  // decided from the counts, the same on every member: while the gathered buffer fits, so
  // does every displacement in it
  i64 total = 0;
  for (auto c : rc) total += c;
  const Side& r = side(rc, &rd);
  if (total <= g_limit) {
    if (r.placed) throw std::logic_error("pyshard: an Allgatherv block lies outside its buffer");
    check_mpi(MPI_Allgatherv(sb, as_int(n), MPI_BYTE, rb, r.n.data(), r.disp.data(), MPI_BYTE,
                             comm),
              "MPI_Allgatherv");
    return;
  }
  // as MPI_Alltoallw: this rank's block to every member, each block received at its 64-bit
  // displacement
  note("alltoallw");
  if (r.placed) note("per_peer");
  const size_t P = rc.size();
  Type mine;
  if (n > 0) mine = commit(contiguous(n, MPI_BYTE, 1));
  std::vector<MPI_Datatype> st(P, n > 0 ? mine.t : MPI_BYTE);
  std::vector<int> scn(P, n > 0 ? 1 : 0), zero(P, 0);
  check_mpi(MPI_Alltoallw(sb, scn.data(), zero.data(), st.data(), rb, r.n.data(), r.disp.data(),
                          r.types.data(), comm),
            "MPI_Allgatherv (as MPI_Alltoallw)");
}

void allgather(const void* sb, void* rb, i64 bytes, MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Allgather_c(sb, bytes, MPI_BYTE, rb, bytes, MPI_BYTE, comm), "MPI_Allgather");
    return;
  }
#endif
  if (bytes <= g_limit) {
    check_mpi(MPI_Allgather(sb, as_int(bytes), MPI_BYTE, rb, as_int(bytes), MPI_BYTE, comm),
              "MPI_Allgather");
    return;
  }
  note("bytes");
  MPI_Datatype t = bytes_type(bytes);  // extent `bytes`: block p at p * bytes
  check_mpi(MPI_Allgather(sb, 1, t, rb, 1, t, comm), "MPI_Allgather");
}

void reduce_scatter_block(const void* sb, void* rb, i64 n, MPI_Datatype t, MPI_Op op,
                          MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Reduce_scatter_block_c(sb, rb, n, t, op, comm), "MPI_Reduce_scatter_block");
    return;
  }
#endif
  if (n <= g_limit) {
    check_mpi(MPI_Reduce_scatter_block(sb, rb, as_int(n), t, op, comm),
              "MPI_Reduce_scatter_block");
    return;
  }
  // split: member p's piece reduced onto p (MPI_Reduce), in rounds
  int P = 0;
  MPI_Comm_size(comm, &P);
  const i64 e = extent_of(t);
  for (int p = 0; p < P; ++p)
    rounds(n, t, [&](i64 off, i64 c) {
      check_mpi(MPI_Reduce(cptr(sb, p * n * e + off), ptr(rb, off), as_int(c), t, op, p, comm),
                "MPI_Reduce");
    });
}

void allreduce(const void* sb, void* rb, i64 n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Allreduce_c(sb, rb, n, t, op, comm), "MPI_Allreduce");
    return;
  }
#endif
  if (n <= g_limit) {
    check_mpi(MPI_Allreduce(sb, rb, as_int(n), t, op, comm), "MPI_Allreduce");
    return;
  }
  rounds(n, t, [&](i64 off, i64 c) {
    const void* s = sb == MPI_IN_PLACE ? MPI_IN_PLACE : cptr(sb, off);
    check_mpi(MPI_Allreduce(s, ptr(rb, off), as_int(c), t, op, comm), "MPI_Allreduce");
  });
}

void reduce_scatter(const void* sb, void* rb, const Counts& counts, MPI_Datatype t, MPI_Op op,
                    MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  if (native()) {
    check_mpi(MPI_Reduce_scatter_c(sb, rb, counts.data(), t, op, comm), "MPI_Reduce_scatter");
    return;
  }
#endif
  if (max_of(counts) <= g_limit) {
    check_mpi(MPI_Reduce_scatter(sb, rb, side(counts, nullptr).n.data(), t, op, comm),
              "MPI_Reduce_scatter");
    return;
  }
  // split: member p's piece reduced onto p (MPI_Reduce), in rounds
  const i64 e = extent_of(t);
  i64 at = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    rounds(counts[p], t, [&](i64 off, i64 c) {
      check_mpi(MPI_Reduce(cptr(sb, at * e + off), ptr(rb, off), as_int(c), t, op,
                           static_cast<int>(p), comm),
                "MPI_Reduce");
    });
    at += counts[p];
  }
}

// One message of n bytes: n MPI_BYTEs, or one type of exactly n bytes past the limit.
#if PYSHARD_LARGE_COUNT
#define PYSHARD_P2P(call, name, buf, ...)                                          \
  if (native()) {                                                                  \
    check_mpi(call##_c(buf, n, MPI_BYTE, __VA_ARGS__), name);                      \
    return;                                                                        \
  }                                                                                \
  if (n <= g_limit)                                                                \
    check_mpi(call(buf, as_int(n), MPI_BYTE, __VA_ARGS__), name);                  \
  else {                                                                           \
    note("bytes");                                                                 \
    check_mpi(call(buf, 1, bytes_type(n), __VA_ARGS__), name);                     \
  }
#else
#define PYSHARD_P2P(call, name, buf, ...)                                          \
  if (n <= g_limit)                                                                \
    check_mpi(call(buf, as_int(n), MPI_BYTE, __VA_ARGS__), name);                  \
  else {                                                                           \
    note("bytes");                                                                 \
    check_mpi(call(buf, 1, bytes_type(n), __VA_ARGS__), name);                     \
  }
#endif

void isend(const void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  PYSHARD_P2P(MPI_Isend, "MPI_Isend", p, peer, tag, comm, req)
}

void irecv(void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  PYSHARD_P2P(MPI_Irecv, "MPI_Irecv", p, peer, tag, comm, req)
}

void send_init(const void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  PYSHARD_P2P(MPI_Send_init, "MPI_Send_init", p, peer, tag, comm, req)
}

void recv_init(void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  PYSHARD_P2P(MPI_Recv_init, "MPI_Recv_init", p, peer, tag, comm, req)
}

#undef PYSHARD_P2P

void issend_bytes(const void* p, int n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  check_mpi(MPI_Issend(p, n, MPI_BYTE, peer, tag, comm, req), "MPI_Issend");
}

bool iprobe_recv(void* p, int n, int tag, MPI_Comm comm, int* source) {
  int flag = 0;
  MPI_Status st;
  check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, &flag, &st), "MPI_Iprobe");
  if (!flag) return false;
  *source = st.MPI_SOURCE;
  check_mpi(MPI_Recv(p, n, MPI_BYTE, st.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
  return true;
}

MPI_Datatype hindexed_bytes(const std::vector<char*>& ptrs, const std::vector<i64>& lens) {
  std::vector<int> bl;
  std::vector<MPI_Aint> at;
  for (size_t k = 0; k < ptrs.size(); ++k) {
    if (lens[k] > g_limit) return MPI_DATATYPE_NULL;
    if (lens[k] == 0) continue;
    MPI_Aint a;
    check_mpi(MPI_Get_address(ptrs[k], &a), "MPI_Get_address");
    bl.push_back(static_cast<int>(lens[k]));
    at.push_back(a);
  }
  MPI_Datatype t;
  check_mpi(MPI_Type_create_hindexed(static_cast<int>(bl.size()), bl.data(), at.data(), MPI_BYTE,
                                     &t),
            "MPI_Type_create_hindexed");
  check_mpi(MPI_Type_commit(&t), "MPI_Type_commit");
  return t;
}

void irecv_typed(void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                 MPI_Request* req) {
  check_mpi(MPI_Irecv(p, count, t, peer, tag, comm, req), "MPI_Irecv");
}

void isend_typed(const void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                 MPI_Request* req) {
  check_mpi(MPI_Isend(p, count, t, peer, tag, comm, req), "MPI_Isend");
}

void drain(int source, int tag, MPI_Comm comm) {
  MPI_Status st;
  check_mpi(MPI_Probe(source, tag, comm, &st), "MPI_Probe");
  MPI_Count n = 0;
  check_mpi(MPI_Get_elements_x(&st, MPI_BYTE, &n), "MPI_Get_elements_x");
  std::vector<char> sink(static_cast<size_t>(n) + 1);
  if (n <= g_limit) {
    check_mpi(MPI_Recv(sink.data(), static_cast<int>(n), MPI_BYTE, source, tag, comm,
                       MPI_STATUS_IGNORE),
              "MPI_Recv");
  } else {
    check_mpi(MPI_Recv(sink.data(), 1, bytes_type(static_cast<i64>(n)), source, tag, comm,
                       MPI_STATUS_IGNORE),
              "MPI_Recv");
  }
}

void iallreduce_min_i64(i64* inout, int n, MPI_Comm comm, MPI_Request* req) {
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, inout, n, MPI_INT64_T, MPI_MIN, comm, req),
            "MPI_Iallreduce");
}

MPI_Datatype subarray(const std::vector<i64>& shape, const std::vector<i64>& start,
                      const std::vector<i64>& ext, i64 item) {
  const int nd = static_cast<int>(shape.size());
  if (nd == 0) return commit(contiguous(item, MPI_BYTE, 1)).release();
#if PYSHARD_LARGE_COUNT
  if (native()) {
    Type elem;
    check_mpi(MPI_Type_contiguous(as_int(item), MPI_BYTE, &elem.t), "MPI_Type_contiguous");
    std::vector<MPI_Count> sz(shape.begin(), shape.end()), sub(ext.begin(), ext.end()),
        st(start.begin(), start.end());
    Type t;
    check_mpi(MPI_Type_create_subarray_c(nd, sz.data(), sub.data(), st.data(), MPI_ORDER_C,
                                         elem.t, &t.t),
              "MPI_Type_create_subarray");
    return commit(std::move(t)).release();
  }
#endif
  if (item <= g_limit && max_of(shape) <= g_limit) {
    Type elem;
    check_mpi(MPI_Type_contiguous(as_int(item), MPI_BYTE, &elem.t), "MPI_Type_contiguous");
    std::vector<int> sz, sub, st;
    for (int k = 0; k < nd; ++k) {
      sz.push_back(as_int(shape[k]));
      sub.push_back(as_int(ext[k]));
      st.push_back(as_int(start[k]));
    }
    Type t;
    check_mpi(MPI_Type_create_subarray(nd, sz.data(), sub.data(), st.data(), MPI_ORDER_C,
                                       elem.t, &t.t),
              "MPI_Type_create_subarray");
    return commit(std::move(t)).release();
  }
  // Past the limit: the box as byte runs and byte strides (the trailing dims the box covers
  // whole join the innermost run), placed at its offset and resized to span the whole array.
  note("subarray");
  std::vector<i64> stride(nd);
  i64 s = item;
  for (int k = nd - 1; k >= 0; --k) {
    stride[k] = s;
    s *= shape[k];
  }
  const i64 total = s;
  int d0 = nd - 1;
  while (d0 > 0 && ext[d0] == shape[d0]) --d0;
  Type t = contiguous(ext[d0] * stride[d0], MPI_BYTE, 1);
  for (int k = d0 - 1; k >= 0; --k) t = hvector(ext[k], stride[k], t.t);
  i64 off = 0;
  for (int k = 0; k < nd; ++k) off += start[k] * stride[k];
  int len = 1;
  MPI_Aint disp = static_cast<MPI_Aint>(off);
  Type at;
  check_mpi(MPI_Type_create_struct(1, &len, &disp, &t.t, &at.t), "MPI_Type_create_struct");
  Type whole;
  check_mpi(MPI_Type_create_resized(at.t, 0, static_cast<MPI_Aint>(total), &whole.t),
            "MPI_Type_create_resized");
  return commit(std::move(whole)).release();
}

MPI_Datatype subarrays(const std::vector<i64>& shape, const std::vector<std::vector<i64>>& starts,
                       const std::vector<std::vector<i64>>& exts, i64 item) {
  if (starts.size() == 1) return subarray(shape, starts[0], exts[0], item);
  std::vector<MPI_Datatype> parts;
  for (size_t i = 0; i < starts.size(); ++i)
    parts.push_back(subarray(shape, starts[i], exts[i], item));
  std::vector<int> lens(parts.size(), 1);
  std::vector<MPI_Aint> disp(parts.size(), 0);
  MPI_Datatype t;
  check_mpi(MPI_Type_create_struct(static_cast<int>(parts.size()), lens.data(), disp.data(),
                                   parts.data(), &t),
            "MPI_Type_create_struct");
  for (auto& p : parts) MPI_Type_free(&p);
  check_mpi(MPI_Type_commit(&t), "MPI_Type_commit");
  return t;
}

// ---------------------------------------------------------------- communicators, the library

MPI_Comm comm_dup(i64 fhandle, int* size, int* rank) {
  MPI_Comm base = MPI_Comm_f2c(static_cast<MPI_Fint>(fhandle));
  MPI_Comm c = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(base, &c), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  MPI_Comm_size(c, size);
  MPI_Comm_rank(c, rank);
  return c;
}

MPI_Comm dist_graph(MPI_Comm comm, int rank, const std::vector<int>& sources,
                    const std::vector<int>& destinations) {
  // built on a copy without the mesh's Cartesian topology (same ranks): Open MPI 5.0 fails
  // neighbourhood collectives on a graph made from a Cartesian communicator (MPI_ERR_ARG, or
  // a crash in its argument checks)
  MPI_Comm plain = MPI_COMM_NULL, graph = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm, 0, rank, &plain), "MPI_Comm_split");
  const int err = MPI_Dist_graph_create_adjacent(
      plain, static_cast<int>(sources.size()), sources.data(), MPI_UNWEIGHTED,
      static_cast<int>(destinations.size()), destinations.data(), MPI_UNWEIGHTED, MPI_INFO_NULL,
      0, &graph);
  MPI_Comm_free(&plain);
  check_mpi(err, "MPI_Dist_graph_create_adjacent");
  return graph;
}

void send_init_typed(const void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                     MPI_Request* req) {
  check_mpi(MPI_Send_init(p, count, t, peer, tag, comm, req), "MPI_Send_init");
}

void recv_init_typed(void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                     MPI_Request* req) {
  check_mpi(MPI_Recv_init(p, count, t, peer, tag, comm, req), "MPI_Recv_init");
}

MPI_Op op_create(MPI_User_function* f, bool commute) {
  MPI_Op op = MPI_OP_NULL;
  check_mpi(MPI_Op_create(f, commute ? 1 : 0, &op), "MPI_Op_create");
  return op;
}

MPI_Datatype reduce_type(char k, i64 n) {
  if (k == 'b') return MPI_C_BOOL;
  if (k == 'i') return n == 1 ? MPI_INT8_T : n == 2 ? MPI_INT16_T : n == 4 ? MPI_INT32_T : MPI_INT64_T;
  if (k == 'u')
    return n == 1 ? MPI_UINT8_T : n == 2 ? MPI_UINT16_T : n == 4 ? MPI_UINT32_T : MPI_UINT64_T;
  if (k == 'f' && n == 4) return MPI_FLOAT;
  if (k == 'f' && n == 8) return MPI_DOUBLE;
  if (k == 'c' && n == 8) return MPI_C_FLOAT_COMPLEX;
  if (k == 'c' && n == 16) return MPI_C_DOUBLE_COMPLEX;
  return MPI_DATATYPE_NULL;
}

std::vector<i64> allgather_i64(MPI_Comm comm, int size, const std::vector<i64>& mine) {
  std::vector<i64> all(mine.size() * static_cast<size_t>(size));
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                          static_cast<int>(mine.size()), MPI_INT64_T, comm),
            "MPI_Allgather");
  return all;
}

std::string library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<size_t>(len));
  const size_t nul = s.find('\0');
  if (nul != std::string::npos) s.erase(nul);
  return s;
}

std::pair<int, int> library_standard() {
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return {major, minor};
}

std::string library_path() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&MPI_Get_library_version), &info) && info.dli_fname)
    return info.dli_fname;
  return "";
}

int cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() ? 1 : 0;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int v = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &v) != MPI_SUCCESS) return -1;
  return v ? 1 : 0;
#else
  return -1;
#endif
}

}  // namespace mpi
}  // namespace pyshard
