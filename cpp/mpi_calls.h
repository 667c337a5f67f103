// The MPI calls pyshard makes, in one place: the MPI-4 large-count forms (MPI_Alltoallv_c,
// ...) where the library has them, the int forms with an overflow check where it does not.
// Every wrapper throws std::runtime_error naming the call when MPI returns an error.
#pragma once

#include <mpi.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "box.h"

namespace pyshard {

#if defined(MPI_VERSION) && MPI_VERSION >= 4
#define PYSHARD_LARGE_COUNT 1
using CountT = MPI_Count;
using DisplT = MPI_Aint;
#else
#define PYSHARD_LARGE_COUNT 0
using CountT = int;
using DisplT = int;
#endif

inline void check_mpi(int err, const char* what) {
  if (err == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  throw std::runtime_error(std::string("pyshard: ") + what + " failed: " + std::string(msg, len));
}

inline CountT to_count(i64 v, const char* what) {
#if !PYSHARD_LARGE_COUNT
  if (v > INT_MAX)
    throw std::overflow_error(std::string("pyshard: ") + what +
                              " exceeds 2^31-1 and this MPI has no large-count calls");
#else
  (void)what;
#endif
  return static_cast<CountT>(v);
}

#if PYSHARD_LARGE_COUNT
#define PYSHARD_MPI(name) name##_c
#else
#define PYSHARD_MPI(name) name
#endif

namespace mpi {

using Counts = std::vector<CountT>;
using Displs = std::vector<DisplT>;

inline void alltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb,
                      const Counts& rc, const Displs& rd, MPI_Comm comm) {
  check_mpi(PYSHARD_MPI(MPI_Alltoallv)(sb, sc.data(), sd.data(), MPI_BYTE, rb, rc.data(),
                                       rd.data(), MPI_BYTE, comm),
            "MPI_Alltoallv");
}

inline void ialltoallv(const void* sb, const Counts& sc, const Displs& sd, void* rb,
                       const Counts& rc, const Displs& rd, MPI_Comm comm, MPI_Request* req) {
  check_mpi(PYSHARD_MPI(MPI_Ialltoallv)(sb, sc.data(), sd.data(), MPI_BYTE, rb, rc.data(),
                                        rd.data(), MPI_BYTE, comm, req),
            "MPI_Ialltoallv");
}

inline void alltoall(const void* sb, void* rb, i64 block, MPI_Comm comm) {
  const CountT n = to_count(block, "a padded block");
  check_mpi(PYSHARD_MPI(MPI_Alltoall)(sb, n, MPI_BYTE, rb, n, MPI_BYTE, comm), "MPI_Alltoall");
}

inline void alltoallw(const void* sb, const Counts& sc, const Displs& sd,
                      const std::vector<MPI_Datatype>& st, void* rb, const Counts& rc,
                      const Displs& rd, const std::vector<MPI_Datatype>& rt, MPI_Comm comm) {
#if PYSHARD_LARGE_COUNT
  check_mpi(MPI_Alltoallw_c(sb, sc.data(), sd.data(), st.data(), rb, rc.data(), rd.data(),
                            rt.data(), comm),
            "MPI_Alltoallw");
#else
  std::vector<int> sdi(sd.begin(), sd.end()), rdi(rd.begin(), rd.end());
  check_mpi(MPI_Alltoallw(sb, sc.data(), sdi.data(), st.data(), rb, rc.data(), rdi.data(),
                          rt.data(), comm),
            "MPI_Alltoallw");
#endif
}

inline void allgatherv(const void* sb, CountT n, void* rb, const Counts& rc, const Displs& rd,
                       MPI_Comm comm) {
  check_mpi(PYSHARD_MPI(MPI_Allgatherv)(sb, n, MPI_BYTE, rb, rc.data(), rd.data(), MPI_BYTE, comm),
            "MPI_Allgatherv");
}

inline void allgather(const void* sb, void* rb, i64 bytes, MPI_Comm comm) {
  const CountT n = to_count(bytes, "a gather count");
  check_mpi(PYSHARD_MPI(MPI_Allgather)(sb, n, MPI_BYTE, rb, n, MPI_BYTE, comm), "MPI_Allgather");
}

inline void reduce_scatter_block(const void* sb, void* rb, i64 n, MPI_Datatype t, MPI_Op op,
                                 MPI_Comm comm) {
  check_mpi(PYSHARD_MPI(MPI_Reduce_scatter_block)(sb, rb, to_count(n, "a reduce count"), t, op,
                                                  comm),
            "MPI_Reduce_scatter_block");
}

inline void allreduce(const void* sb, void* rb, i64 n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  check_mpi(PYSHARD_MPI(MPI_Allreduce)(sb, rb, to_count(n, "a reduce count"), t, op, comm),
            "MPI_Allreduce");
}

inline void reduce_scatter(const void* sb, void* rb, const Counts& counts, MPI_Datatype t,
                           MPI_Op op, MPI_Comm comm) {
  check_mpi(PYSHARD_MPI(MPI_Reduce_scatter)(sb, rb, counts.data(), t, op, comm),
            "MPI_Reduce_scatter");
}

inline void isend(const void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  check_mpi(PYSHARD_MPI(MPI_Isend)(p, to_count(n, "a message"), MPI_BYTE, peer, tag, comm, req),
            "MPI_Isend");
}

inline void irecv(void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  check_mpi(PYSHARD_MPI(MPI_Irecv)(p, to_count(n, "a message"), MPI_BYTE, peer, tag, comm, req),
            "MPI_Irecv");
}

// Persistent point-to-point requests (halo exchanges): bound once, started many times.
inline void send_init(const void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  check_mpi(PYSHARD_MPI(MPI_Send_init)(p, to_count(n, "a message"), MPI_BYTE, peer, tag, comm,
                                       req),
            "MPI_Send_init");
}

inline void recv_init(void* p, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
  check_mpi(PYSHARD_MPI(MPI_Recv_init)(p, to_count(n, "a message"), MPI_BYTE, peer, tag, comm,
                                       req),
            "MPI_Recv_init");
}

// A committed subarray datatype of `ext` at `start` in a C-contiguous `shape` of `item`-byte
// elements (the caller frees it).
inline MPI_Datatype subarray(const std::vector<i64>& shape, const std::vector<i64>& start,
                             const std::vector<i64>& ext, i64 item) {
  const int nd = static_cast<int>(shape.size());
  MPI_Datatype elem, t;
  check_mpi(MPI_Type_contiguous(static_cast<int>(item), MPI_BYTE, &elem), "MPI_Type_contiguous");
  if (nd == 0) {
    check_mpi(MPI_Type_commit(&elem), "MPI_Type_commit");
    return elem;
  }
#if PYSHARD_LARGE_COUNT
  std::vector<MPI_Count> sz(shape.begin(), shape.end()), sub(ext.begin(), ext.end()),
      st(start.begin(), start.end());
  check_mpi(
      MPI_Type_create_subarray_c(nd, sz.data(), sub.data(), st.data(), MPI_ORDER_C, elem, &t),
      "MPI_Type_create_subarray");
#else
  std::vector<int> sz, sub, st;
  for (int k = 0; k < nd; ++k) {
    sz.push_back(static_cast<int>(to_count(shape[k], "an extent")));
    sub.push_back(static_cast<int>(ext[k]));
    st.push_back(static_cast<int>(start[k]));
  }
  check_mpi(MPI_Type_create_subarray(nd, sz.data(), sub.data(), st.data(), MPI_ORDER_C, elem, &t),
            "MPI_Type_create_subarray");
#endif
  MPI_Type_free(&elem);
  check_mpi(MPI_Type_commit(&t), "MPI_Type_commit");
  return t;
}

// One committed datatype for several subarrays of the same C-contiguous array (a halo
// message of several boxes): a struct of the subarray types, each at displacement 0 (every
// subarray type spans the whole array and places its box itself). The caller frees it.
inline MPI_Datatype subarrays(const std::vector<i64>& shape,
                              const std::vector<std::vector<i64>>& starts,
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

}  // namespace mpi
}  // namespace pyshard
