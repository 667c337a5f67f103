// The MPI calls pyshard makes, in one place, and how counts past 2^31-1 get through.
//
// Counts and displacements are 64-bit everywhere (MPI_Count, MPI_Aint). How a call passes
// them to MPI, by the method build_info() reports (`large_count_method()`):
//  * "native": the MPI-4 large-count forms (MPI_Alltoallv_c, ...), where the library has
//    them (MPI_VERSION >= 4: MPICH 4+, Intel MPI 2021.x).
//  * "datatype": the classic int forms, every count and displacement under the limit, and
//    derived datatypes past it. A single count past it (Alltoall, Allgather, point-to-point,
//    persistent requests) becomes one type of exactly n bytes. A v-collective (Alltoallv,
//    Allgatherv) runs as MPI_Alltoallw with a datatype per peer: MPI_BYTE with int count and
//    byte displacement where both fit, else one type of the block's bytes placed at its
//    64-bit displacement. Alltoallw and not Alltoallv because which call runs must be the same
//    on every rank while whether a displacement fits is known to one rank only (measured with
//    pip's Open MPI 5: Alltoallw of MPI_BYTE blocks as fast as Alltoallv, 4 KiB to 16 MiB).
//    Allgatherv stays MPI_Allgatherv while the whole gathered buffer fits (its counts are
//    the same on every rank). Built from MPI_BYTE, every type has its bytes' signature.
//  * reductions need their element type (MPI's predefined ops take no derived types), so
//    there the method is "split": rounds of at most the limit of elements.
// Open MPI 4 and 5 have no large-count calls (MPI 3.1): they take the datatype/split path.
//
// `set_count_limit(n)` (tests only) lowers the limit from 2^31-1 to n: calls with a count or a
// displacement above it then take the datatype/split path on every library, the MPI-4 ones
// included, so CI runs that path on small arrays.
//
// Every wrapper throws std::runtime_error naming the call when MPI returns an error.
#pragma once

#include <mpi.h>

#include <climits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "box.h"

namespace pyshard {

#if defined(MPI_VERSION) && MPI_VERSION >= 4
#define PYSHARD_LARGE_COUNT 1
#else
#define PYSHARD_LARGE_COUNT 0
#endif

using CountT = MPI_Count;
using DisplT = MPI_Aint;

inline void check_mpi(int err, const char* what) {
  if (err == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  int cls = err;
  MPI_Error_class(err, &cls);
  // a message longer than its receive: the ranks ran different exchanges here (MPI's own
  // message names neither that nor how to find it)
  const char* hint = (cls == MPI_ERR_TRUNCATE || cls == MPI_ERR_IN_STATUS)
                         ? " (a message longer than this rank expects: do the ranks disagree "
                           "on the arrays, their dtype, shape or layout? PYSHARD_VALIDATE=1 "
                           "makes every rank check them first)"
                         : "";
  throw std::runtime_error(std::string("pyshard: ") + what + " failed: " + std::string(msg, len) +
                           hint);
}

// A count as MPI_Count: every size passes (see above); negative ones are a bug upstream.
inline CountT to_count(i64 v, const char* what) {
  if (v < 0) throw std::invalid_argument(std::string("pyshard: ") + what + " is negative");
  return static_cast<CountT>(v);
}

namespace mpi {

// The largest count or displacement a classic int call is given (2^31-1 unless a test set
// it lower), and the methods in use: "native" or "datatype" for messages, "native" or
// "split" for reductions.
i64 count_limit();
void set_count_limit(i64 n);  // tests: 8 <= n <= 2^31-1
const char* large_count_method();
const char* large_count_reduce_method();
// How often each non-native way ran, by name ("alltoallw": a v-collective as MPI_Alltoallw,
// "per_peer": with a block past the limit placed by a datatype, "bytes": one type of n bytes,
// "subarray": a box built from byte runs and strides, "split": a reduction in rounds); tests
// check that theirs ran.
std::map<std::string, i64>& large_count_stats();

struct Side;  // the int arrays and datatypes one side of a classic call takes (mpi_calls.cpp)

// Per-peer counts or displacements (64-bit). What a classic call takes in their place (int
// counts and displacements, per-peer datatypes) is kept beside the counts, by the array of
// displacements it goes with, and remade only when the values change: it lives as long as
// the step's arrays do, as a nonblocking call needs (MPI reads them until it completes).
template <class T>
struct Array64 : std::vector<T> {
  using std::vector<T>::vector;
  mutable std::map<const void*, std::shared_ptr<Side>> sides;
};

using Counts = Array64<CountT>;
using Displs = Array64<DisplT>;

void alltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb, const Counts& rc,
               const Displs& rd, MPI_Comm comm);
// Nonblocking: sc, sd, rc and rd must stay alive and unchanged until `req` completes.
void ialltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb, const Counts& rc,
                const Displs& rd, MPI_Comm comm, MPI_Request* req);
void alltoall(const void* sb, void* rb, i64 block, MPI_Comm comm);
void alltoallw(const void* sb, const Counts& sc, const Displs& sd,
               const std::vector<MPI_Datatype>& st, void* rb, const Counts& rc, const Displs& rd,
               const std::vector<MPI_Datatype>& rt, MPI_Comm comm);
void allgatherv(const void* sb, CountT n, void* rb, const Counts& rc, const Displs& rd,
                MPI_Comm comm);
void allgather(const void* sb, void* rb, i64 bytes, MPI_Comm comm);

// The halo's neighbor method: a neighbourhood all-to-all of bytes on a distributed-graph
// communicator, sc/sd per out-neighbour and rc/rd per in-neighbour (alive and unchanged while
// the request is in use). Where the library has the MPI-4 calls (`neighbor_persistent()`),
// MPI_Neighbor_alltoallv_init binds a persistent request once (MPI_Start it); elsewhere
// ineighbor_alltoallv starts one now: MPI_Ineighbor_alltoallw (MPI-3: 64-bit displacements,
// a type of n bytes for a block past the limit; the same call on every rank).
bool neighbor_persistent();
void neighbor_alltoallv_init(const void* sb, const Counts& sc, const Displs& sd, void* rb,
                             const Counts& rc, const Displs& rd, MPI_Comm graph,
                             MPI_Request* req);
void ineighbor_alltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb,
                         const Counts& rc, const Displs& rd, MPI_Comm graph, MPI_Request* req);

// Reductions: counts in elements of `t`.
void reduce_scatter_block(const void* sb, void* rb, i64 n, MPI_Datatype t, MPI_Op op,
                          MPI_Comm comm);
void allreduce(const void* sb, void* rb, i64 n, MPI_Datatype t, MPI_Op op, MPI_Comm comm);
void reduce_scatter(const void* sb, void* rb, const Counts& counts, MPI_Datatype t, MPI_Op op,
                    MPI_Comm comm);

// Point-to-point messages of `n` bytes, and persistent requests (halo exchanges): bound once,
// started many times.
void isend(const void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req);
void irecv(void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req);
void send_init(const void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req);
void recv_init(void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req);

// The sparse exchange's calls (migrate, cpp/migrate.cpp: Hoefler et al.'s NBX): a synchronous
// send of small fixed-size messages, a probe for any sender's message of `tag`, and the
// nonblocking reduction that stands in for NBX's MPI_Ibarrier (it carries an error flag).
void issend_bytes(const void* p, int n, int peer, int tag, MPI_Comm comm, MPI_Request* req);
// Is a message of `tag` from any rank waiting? Then its source, and it is received (n bytes).
bool iprobe_recv(void* p, int n, int tag, MPI_Comm comm, int* source);
void iallreduce_min_i64(i64* inout, int n, MPI_Comm comm, MPI_Request* req);
// One committed datatype of byte blocks at absolute addresses (MPI_BOTTOM-relative): a
// message received with it lands in several arrays at once. MPI_DATATYPE_NULL where a block
// is past the count limit (the caller receives into a buffer instead). The caller frees it.
MPI_Datatype hindexed_bytes(const std::vector<char*>& ptrs, const std::vector<i64>& lens);
// `count` elements of datatype `t` at `p` (MPI_BOTTOM for absolute addresses).
void irecv_typed(void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                 MPI_Request* req);
void isend_typed(const void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                 MPI_Request* req);
// Receive and drop the next message of `tag` from `source`, whatever its size (blocking).
void drain(int source, int tag, MPI_Comm comm);

// A committed subarray datatype of `ext` at `start` in a C-contiguous `shape` of `item`-byte
// elements, spanning the whole array as MPI_Type_create_subarray's does (the caller frees it).
MPI_Datatype subarray(const std::vector<i64>& shape, const std::vector<i64>& start,
                      const std::vector<i64>& ext, i64 item);

// One committed datatype for several subarrays of the same C-contiguous array (a halo
// message of several boxes): a struct of the subarray types, each at displacement 0 (every
// subarray type spans the whole array and places its box itself). The caller frees it.
MPI_Datatype subarrays(const std::vector<i64>& shape, const std::vector<std::vector<i64>>& starts,
                       const std::vector<std::vector<i64>>& exts, i64 item);

// ---------------------------------------------------------------- requests, communicators,
// datatypes and the library: thin wrappers, so that every MPI call of the core is made here.
// The checked ones throw as the others do; *_unchecked ones (destructors, error paths, where
// the first error is already on its way) ignore MPI's answer.
inline void wait(MPI_Request* r) { check_mpi(MPI_Wait(r, MPI_STATUS_IGNORE), "MPI_Wait"); }
inline bool test(MPI_Request* r) {  // drives progress; unchecked (the wait that follows is)
  int done = 0;
  MPI_Test(r, &done, MPI_STATUS_IGNORE);
  return done != 0;
}
// Have all `n` requests completed (each then MPI_REQUEST_NULL)? Drives progress; checked.
inline bool testall(size_t n, MPI_Request* r) {
  int done = 0;
  check_mpi(MPI_Testall(static_cast<int>(n), r, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
  return done != 0;
}
inline void waitall(size_t n, MPI_Request* r) {
  check_mpi(MPI_Waitall(static_cast<int>(n), r, MPI_STATUSES_IGNORE), "MPI_Waitall");
}
// MPI's own answer, the statuses kept (PeerMessages reads them: a truncated receive).
inline int wait_status(MPI_Request* r, MPI_Status* st) { return MPI_Wait(r, st); }
inline int test_status(MPI_Request* r, int* done, MPI_Status* st) { return MPI_Test(r, done, st); }
inline int waitall_status(size_t n, MPI_Request* r, MPI_Status* st) {
  return MPI_Waitall(static_cast<int>(n), r, st);
}
inline int testall_status(size_t n, MPI_Request* r, int* done, MPI_Status* st) {
  return MPI_Testall(static_cast<int>(n), r, done, st);
}
inline void wait_unchecked(MPI_Request* r) { MPI_Wait(r, MPI_STATUS_IGNORE); }
// The bytes a completed receive got (its status), whatever the count.
inline i64 received_bytes(const MPI_Status& st) {
  MPI_Count n = 0;
  MPI_Get_elements_x(&st, MPI_BYTE, &n);
  return static_cast<i64>(n);
}
inline int error_class(int err) {
  int c = err;
  MPI_Error_class(err, &c);
  return c;
}
inline void waitall_unchecked(size_t n, MPI_Request* r) {
  MPI_Waitall(static_cast<int>(n), r, MPI_STATUSES_IGNORE);
}
inline void start(MPI_Request* r) { check_mpi(MPI_Start(r), "MPI_Start"); }
inline void startall(size_t n, MPI_Request* r) {
  check_mpi(MPI_Startall(static_cast<int>(n), r), "MPI_Startall");
}
inline void request_free(MPI_Request* r) { MPI_Request_free(r); }
inline void type_free(MPI_Datatype* t) { MPI_Type_free(t); }
// Has MPI been finalized (a destructor then frees nothing)?
inline bool finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

// A duplicate of the communicator of Fortran handle `fhandle` (mpi4py's py2f), returning
// errors instead of aborting; its size and rank.
MPI_Comm comm_dup(i64 fhandle, int* size, int* rank);
inline void comm_free(MPI_Comm* c) { MPI_Comm_free(c); }
// Rank r of c as a rank of MPI_COMM_WORLD (-1 where it has none): for error messages, which
// name both (a mesh dim's ranks are numbered from 0 in each row).
inline int world_rank(MPI_Comm c, int r) {
  MPI_Group g, w;
  int out = MPI_UNDEFINED;
  if (MPI_Comm_group(c, &g) != MPI_SUCCESS) return -1;
  if (MPI_Comm_group(MPI_COMM_WORLD, &w) == MPI_SUCCESS) {
    MPI_Group_translate_ranks(g, 1, &r, w, &out);
    MPI_Group_free(&w);
  }
  MPI_Group_free(&g);
  return out == MPI_UNDEFINED ? -1 : out;
}
// A distributed-graph communicator over the ranks of `comm` with these in- and out-neighbours
// (the neighbor method of peer_messages.h; the caller frees it).
MPI_Comm dist_graph(MPI_Comm comm, int rank, const std::vector<int>& sources,
                    const std::vector<int>& destinations);
// Persistent requests of `count` elements of datatype `t` (typed messages, peer_messages.h).
void send_init_typed(const void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                     MPI_Request* req);
void recv_init_typed(void* p, int count, MPI_Datatype t, int peer, int tag, MPI_Comm comm,
                     MPI_Request* req);

// The predefined type of a reduction over numpy kind `kind` ('b' bool, 'i', 'u', 'f', 'c')
// of `item` bytes, or MPI_DATATYPE_NULL (none).
MPI_Datatype reduce_type(char kind, i64 item);
// A user reduction op (MPI_Op_create), commutative where `commute`; never freed.
MPI_Op op_create(MPI_User_function* f, bool commute);

// One Allgather of a few int64 per rank: the only place pyshard learns shapes over the wire.
std::vector<i64> allgather_i64(MPI_Comm comm, int size, const std::vector<i64>& mine);

// The library: MPI_Get_library_version's text (without the NUL some libraries count in its
// length), the standard it implements (MPI_Get_version), the file it was loaded from, and
// whether it takes CUDA device pointers (1 yes, 0 no, -1 it has no way to say).
std::string library_version();
std::pair<int, int> library_standard();
std::string library_path();
int cuda_aware();

}  // namespace mpi
}  // namespace pyshard
