/* A PMPI shim for tests/mpi/test_first_call.py and test_migrate_pmpi.py: counts every MPI collective (data movement,
 * barriers and communicator constructors) and point-to-point call of the process, by name.
 * Built by the test with the MPI library's own mpicc and loaded into the ranks with
 * LD_PRELOAD, so that it counts the calls of mpi4py and of pyshard's core alike.
 * pyshard_pmpi_counts(buf, n) writes "name count\n" lines into buf. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#define MAXN 96
static const char* names[MAXN];
static long counts[MAXN];
static int nnames;

static void bump(const char* name) {
  for (int i = 0; i < nnames; ++i)
    if (names[i] == name || strcmp(names[i], name) == 0) {
      ++counts[i];
      return;
    }
  if (nnames < MAXN) {
    names[nnames] = name;
    counts[nnames++] = 1;
  }
}

int pyshard_pmpi_counts(char* buf, int n) {
  int at = 0;
  buf[0] = 0;
  for (int i = 0; i < nnames && at < n; ++i)
    at += snprintf(buf + at, (size_t)(n - at), "%s %ld\n", names[i], counts[i]);
  return at;
}

#define W(name, params, args)  \
  int MPI_##name params {      \
    bump(#name);               \
    return PMPI_##name args;   \
  }

typedef const void* CV;
typedef MPI_Datatype T;

/* collectives */
W(Barrier, (MPI_Comm c), (c))
W(Ibarrier, (MPI_Comm c, MPI_Request* r), (c, r))
W(Bcast, (void* b, int n, T t, int root, MPI_Comm c), (b, n, t, root, c))
W(Gather, (CV s, int sn, T st, void* r, int rn, T rt, int root, MPI_Comm c),
  (s, sn, st, r, rn, rt, root, c))
W(Gatherv, (CV s, int sn, T st, void* r, const int* rn, const int* d, T rt, int root, MPI_Comm c),
  (s, sn, st, r, rn, d, rt, root, c))
W(Scatter, (CV s, int sn, T st, void* r, int rn, T rt, int root, MPI_Comm c),
  (s, sn, st, r, rn, rt, root, c))
W(Allgather, (CV s, int sn, T st, void* r, int rn, T rt, MPI_Comm c), (s, sn, st, r, rn, rt, c))
W(Allgatherv, (CV s, int sn, T st, void* r, const int* rn, const int* d, T rt, MPI_Comm c),
  (s, sn, st, r, rn, d, rt, c))
W(Alltoall, (CV s, int sn, T st, void* r, int rn, T rt, MPI_Comm c), (s, sn, st, r, rn, rt, c))
W(Alltoallv, (CV s, const int* sn, const int* sd, T st, void* r, const int* rn, const int* rd,
              T rt, MPI_Comm c),
  (s, sn, sd, st, r, rn, rd, rt, c))
W(Alltoallw, (CV s, const int* sn, const int* sd, const T* st, void* r, const int* rn,
              const int* rd, const T* rt, MPI_Comm c),
  (s, sn, sd, st, r, rn, rd, rt, c))
W(Reduce, (CV s, void* r, int n, T t, MPI_Op o, int root, MPI_Comm c), (s, r, n, t, o, root, c))
W(Allreduce, (CV s, void* r, int n, T t, MPI_Op o, MPI_Comm c), (s, r, n, t, o, c))
W(Reduce_scatter, (CV s, void* r, const int* n, T t, MPI_Op o, MPI_Comm c), (s, r, n, t, o, c))
W(Reduce_scatter_block, (CV s, void* r, int n, T t, MPI_Op o, MPI_Comm c), (s, r, n, t, o, c))
W(Scan, (CV s, void* r, int n, T t, MPI_Op o, MPI_Comm c), (s, r, n, t, o, c))
W(Exscan, (CV s, void* r, int n, T t, MPI_Op o, MPI_Comm c), (s, r, n, t, o, c))
W(Iallreduce, (CV s, void* r, int n, T t, MPI_Op o, MPI_Comm c, MPI_Request* q),
  (s, r, n, t, o, c, q))
W(Ialltoallv, (CV s, const int* sn, const int* sd, T st, void* r, const int* rn, const int* rd,
               T rt, MPI_Comm c, MPI_Request* q),
  (s, sn, sd, st, r, rn, rd, rt, c, q))
W(Iallgatherv, (CV s, int sn, T st, void* r, const int* rn, const int* d, T rt, MPI_Comm c,
                MPI_Request* q),
  (s, sn, st, r, rn, d, rt, c, q))
W(Ireduce_scatter, (CV s, void* r, const int* n, T t, MPI_Op o, MPI_Comm c, MPI_Request* q),
  (s, r, n, t, o, c, q))
W(Neighbor_alltoallv, (CV s, const int* sn, const int* sd, T st, void* r, const int* rn,
                       const int* rd, T rt, MPI_Comm c),
  (s, sn, sd, st, r, rn, rd, rt, c))
W(Neighbor_alltoallw, (CV s, const int* sn, const MPI_Aint* sd, const T* st, void* r,
                       const int* rn, const MPI_Aint* rd, const T* rt, MPI_Comm c),
  (s, sn, sd, st, r, rn, rd, rt, c))
/* communicator constructors (collective) */
W(Comm_dup, (MPI_Comm c, MPI_Comm* n), (c, n))
W(Comm_split, (MPI_Comm c, int color, int key, MPI_Comm* n), (c, color, key, n))
W(Comm_split_type, (MPI_Comm c, int ty, int key, MPI_Info i, MPI_Comm* n), (c, ty, key, i, n))
W(Comm_create, (MPI_Comm c, MPI_Group g, MPI_Comm* n), (c, g, n))
W(Cart_create, (MPI_Comm c, int nd, const int* d, const int* p, int re, MPI_Comm* n),
  (c, nd, d, p, re, n))
W(Cart_sub, (MPI_Comm c, const int* keep, MPI_Comm* n), (c, keep, n))
W(Dist_graph_create_adjacent, (MPI_Comm c, int in, const int* s, const int* sw, int out,
                               const int* d, const int* dw, MPI_Info i, int re, MPI_Comm* n),
  (c, in, s, sw, out, d, dw, i, re, n))
/* point-to-point */
W(Send, (CV b, int n, T t, int d, int tag, MPI_Comm c), (b, n, t, d, tag, c))
W(Recv, (void* b, int n, T t, int s, int tag, MPI_Comm c, MPI_Status* st), (b, n, t, s, tag, c, st))
W(Isend, (CV b, int n, T t, int d, int tag, MPI_Comm c, MPI_Request* r), (b, n, t, d, tag, c, r))
W(Irecv, (void* b, int n, T t, int s, int tag, MPI_Comm c, MPI_Request* r),
  (b, n, t, s, tag, c, r))
W(Issend, (CV b, int n, T t, int d, int tag, MPI_Comm c, MPI_Request* r), (b, n, t, d, tag, c, r))
W(Iprobe, (int s, int tag, MPI_Comm c, int* f, MPI_Status* st), (s, tag, c, f, st))
W(Probe, (int s, int tag, MPI_Comm c, MPI_Status* st), (s, tag, c, st))
W(Start, (MPI_Request* r), (r))
W(Startall, (int n, MPI_Request* r), (n, r))

#if defined(MPI_VERSION) && MPI_VERSION >= 4
/* the MPI-4 large-count forms */
W(Allgather_c, (CV s, MPI_Count sn, T st, void* r, MPI_Count rn, T rt, MPI_Comm c),
  (s, sn, st, r, rn, rt, c))
W(Allgatherv_c, (CV s, MPI_Count sn, T st, void* r, const MPI_Count* rn, const MPI_Aint* d, T rt,
                 MPI_Comm c),
  (s, sn, st, r, rn, d, rt, c))
W(Alltoall_c, (CV s, MPI_Count sn, T st, void* r, MPI_Count rn, T rt, MPI_Comm c),
  (s, sn, st, r, rn, rt, c))
W(Alltoallv_c, (CV s, const MPI_Count* sn, const MPI_Aint* sd, T st, void* r, const MPI_Count* rn,
                const MPI_Aint* rd, T rt, MPI_Comm c),
  (s, sn, sd, st, r, rn, rd, rt, c))
W(Allreduce_c, (CV s, void* r, MPI_Count n, T t, MPI_Op o, MPI_Comm c), (s, r, n, t, o, c))
W(Reduce_scatter_c, (CV s, void* r, const MPI_Count* n, T t, MPI_Op o, MPI_Comm c),
  (s, r, n, t, o, c))
W(Reduce_scatter_block_c, (CV s, void* r, MPI_Count n, T t, MPI_Op o, MPI_Comm c),
  (s, r, n, t, o, c))
W(Ialltoallv_c, (CV s, const MPI_Count* sn, const MPI_Aint* sd, T st, void* r,
                 const MPI_Count* rn, const MPI_Aint* rd, T rt, MPI_Comm c, MPI_Request* q),
  (s, sn, sd, st, r, rn, rd, rt, c, q))
W(Isend_c, (CV b, MPI_Count n, T t, int d, int tag, MPI_Comm c, MPI_Request* r),
  (b, n, t, d, tag, c, r))
W(Irecv_c, (void* b, MPI_Count n, T t, int s, int tag, MPI_Comm c, MPI_Request* r),
  (b, n, t, s, tag, c, r))
#endif
