#include "comm.h"

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

Comm::Comm(i64 fhandle) {
  MPI_Comm base = MPI_Comm_f2c(static_cast<MPI_Fint>(fhandle));
  check_mpi(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_rank(comm_, &rank_);
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace pyshard
