// What every step shares: the communicator the core owns, how one call runs (packer,
// transport, workspace pool), and the per-process count of the collectives that ran.
#pragma once

#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "memory.h"

namespace pyshard {

// Collectives run in this process by name ("alltoallv", "p2p", ...), plus "staged" (steps
// that went through host bounce buffers) and "device_direct" (steps whose MPI call took GPU
// memory).
std::map<std::string, i64>& stats();

// Count one collective `name` of a step that ran with packer `pk` over transport `tr`.
void count_call(const char* name, const Packer& pk, Transport tr);

// An MPI communicator owned by the core (a duplicate: independent of Python object lifetimes).
class Comm {
 public:
  explicit Comm(i64 fortran_handle);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  MPI_Comm get() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 0;
  int rank_ = 0;
};

// One Allgather of a few int64 per rank (counted as "allgather"): the only place pyshard
// learns shapes over the wire.
std::vector<i64> allgather_i64(const Comm& comm, const std::vector<i64>& mine);

// The transport the steps of each memory kind take (set from Python, _backend.py: host
// arrays direct; GPU arrays direct with a CUDA-aware MPI, else staged).
Transport transport_of(Mem mem);
void set_transport(Mem mem, Transport t);

// How one call runs: the packer of the array's memory, the transport, the shared pool.
struct Exec {
  Packer& pk;
  Transport tr;
  Workspace& ws;
};

}  // namespace pyshard
