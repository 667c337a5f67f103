// What every step shares: the communicator the core owns and the per-process count of the
// collectives that ran. A step's transport is its own (a constructor argument: the one its
// route chose in pyshard/route.py), not a setting of the process.
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

// An object holding MPI resources made on a Comm (persistent requests, which keep the
// communicator alive past its MPI_Comm_free; a graph communicator made from it): while it
// lives it is registered with the Comm, whose release() has it free them first.
class CommUser {
 public:
  virtual void comm_released() = 0;

 protected:
  ~CommUser() = default;
};

// An MPI communicator owned by the core (a duplicate: independent of Python object lifetimes).
class Comm {
 public:
  explicit Comm(i64 fortran_handle);
  ~Comm();
  // Frees the communicator now (Mesh.free(), collective), after its users' resources: the
  // steps and plans that keep this Comm must not run again (their Python objects check the
  // mesh first).
  void release();
  void adopt(CommUser* u) { users_.push_back(u); }  // (from its constructor)
  void forget(CommUser* u);                         // (from its destructor)
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  MPI_Comm get() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  // The number of NBX count rounds run on this communicator before this one (then counted):
  // every rank runs the same rounds on it in the same order, so the parity agrees across
  // ranks. (A count keyed on the MPI_Comm handle would not: handles are rank-local values,
  // reused after a free in each rank's own order.)
  i64 next_round() const { return rounds_++; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 0;
  int rank_ = 0;
  mutable i64 rounds_ = 0;
  std::vector<CommUser*> users_;
};

// One Allgather of a few int64 per rank (counted as "allgather"): the only place pyshard
// learns shapes over the wire.
std::vector<i64> allgather_i64(const Comm& comm, const std::vector<i64>& mine);

}  // namespace pyshard
