// The Allgatherv step (Allgather where every member's block has the same size) and its
// geometry: every member sends its whole source array; the blocks land in boxes of the
// destination.
#pragma once

#include <memory>
#include <vector>

#include "comm.h"
#include "mpi_calls.h"

namespace pyshard {

// Geometry of an Allgatherv: every member sends its whole (contiguous) source array;
// recvs[i] is where member i's block lands in the destination.
struct GatherGeometry {
  GatherGeometry(int size, int rank, i64 item, Shape src_shape, Shape dst_shape,
                 const std::vector<BoxSpec>& recvs);
  int size, rank;
  i64 item;
  Shape src_shape, dst_shape;
  std::vector<Block> blocks;  // ws_off: packed position; array_off: position in dst
  DescTable unpack;           // packed receive buffer -> dst
  bool unpack_all = false;
  bool regular = true;  // every member's block has the same size: MPI_Allgather
  i64 total = 0;
  i64 workspace_bytes() const { return unpack_all ? total : 0; }
  i64 staged_bytes() const { return total + blocks[rank].bytes; }
};

class AllgathervStep {
 public:
  AllgathervStep(std::shared_ptr<Comm> comm, std::shared_ptr<GatherGeometry> g,
                 std::shared_ptr<Workspace> ws, Transport tr);
  void run(const char* src, char* dst, Packer& pk);  // on the transport it was built with
  const GatherGeometry& geometry() const { return *g_; }
  Transport transport() const { return tr_; }

 private:
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<GatherGeometry> g_;
  std::shared_ptr<Workspace> ws_;
  Transport tr_;
  mpi::Counts counts_;
  mpi::Displs packed_, direct_;
};

}  // namespace pyshard
