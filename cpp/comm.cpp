#include "comm.h"

#include <algorithm>

#include "mpi_calls.h"

namespace pyshard {

std::map<std::string, i64>& stats() {
  static std::map<std::string, i64> s;
  return s;
}

void count_call(const char* name, const Packer& pk, Transport tr) {
  auto& s = stats();
  s[name] += 1;
  if (tr == Transport::staged)
    s["staged"] += 1;
  else if (pk.kind() == Mem::cuda)
    s["device_direct"] += 1;
}

Comm::Comm(i64 fhandle) { comm_ = mpi::comm_dup(fhandle, &size_, &rank_); }

Comm::~Comm() { release(); }

void Comm::release() {
  const bool live = !mpi::finalized();
  if (live)
    for (CommUser* u : users_) u->comm_released();
  users_.clear();
  if (live && comm_ != MPI_COMM_NULL) mpi::comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

void Comm::forget(CommUser* u) {
  users_.erase(std::remove(users_.begin(), users_.end(), u), users_.end());
}

std::vector<i64> allgather_i64(const Comm& comm, const std::vector<i64>& mine) {
  std::vector<i64> all = mpi::allgather_i64(comm.get(), comm.size(), mine);
  stats()["allgather"] += 1;
  return all;
}

}  // namespace pyshard
