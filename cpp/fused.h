// Many arrays' exchanges on one communicator fused into one collective (redistribute_many):
// one message per peer holding every array's block for that peer, in array order. Each array
// packs into, and unpacks from, its part of the shared buffers with descriptor tables of its
// own (built once from its ExchangeGeometry); this rank's own blocks are copied locally while
// the exchange runs. The same packers and transports as a single exchange.
#pragma once

#include <memory>
#include <vector>

#include "exchange.h"

namespace pyshard {

struct FusedGeometry {
  explicit FusedGeometry(const std::vector<std::shared_ptr<ExchangeGeometry>>& parts);
  int size;
  std::vector<std::shared_ptr<ExchangeGeometry>> parts;
  std::vector<DescTable> pack, unpack;  // per array: src -> send buffer, recv buffer -> dst
  mpi::Counts scounts, rcounts;         // bytes per peer
  mpi::Displs sdispls, rdispls;
  i64 send_ws = 0, recv_ws = 0;
  i64 max_block = 0;  // the largest message (bytes), for the nonblocking choice
};

class FusedExchangeStep {
 public:
  FusedExchangeStep(std::shared_ptr<Comm> comm, std::shared_ptr<FusedGeometry> g,
                    std::shared_ptr<Workspace> ws, Transport tr, bool nonblocking);
  // on the transport it was built with
  void run(const std::vector<const char*>& srcs, const std::vector<char*>& dsts, Packer& pk);
  const FusedGeometry& geometry() const { return *g_; }
  Transport transport() const { return tr_; }

 private:
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<FusedGeometry> g_;
  std::shared_ptr<Workspace> ws_;
  Transport tr_;
  bool nonblocking_;
};

}  // namespace pyshard
