// The reduction steps: Allreduce of a whole array, and Reduce_scatter (Reduce_scatter_block
// where the pieces are equal) with its geometry: which box of the source each member
// receives reduced.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm.h"
#include "mpi_calls.h"

namespace pyshard {

enum class ReduceOp { sum = 0, max = 1, min = 2, lor = 3, land = 4 };

MPI_Op mpi_op(ReduceOp op);
// The op to reduce `type` with on buffers in host memory: float and double max/min take user
// ops in which NaN wins (as numpy.maximum/minimum), made once; everything else the builtin
// mpi_op(op) (which device buffers under CUDA-aware MPI keep).
MPI_Op host_mpi_op(ReduceOp op, MPI_Datatype type);

// Geometry of a Reduce_scatter: pieces[i] is the box of the source that member i receives
// reduced (in elements of `item` bytes: the reduction type, float32 for float16 data).
struct ScatterGeometry {
  ScatterGeometry(int size, int rank, i64 item, Shape src_shape, Shape dst_shape,
                  const std::vector<BoxSpec>& pieces);
  int size, rank;
  i64 item;
  Shape src_shape, dst_shape;
  std::vector<Block> pieces;
  DescTable pack;  // src -> member-ordered send buffer
  bool pack_all = false;
  bool regular = true;  // every member's piece has the same size: MPI_Reduce_scatter_block
  i64 total = 0;  // bytes
  i64 workspace_bytes() const { return pack_all ? total : 0; }
  i64 staged_bytes() const { return total + pieces[rank].bytes; }
};

class AllreduceStep {
 public:
  AllreduceStep(std::shared_ptr<Comm> comm, MPI_Datatype type, i64 item, ReduceOp op,
                Shape shape, std::shared_ptr<Workspace> ws, Transport tr);
  void run(const char* src, char* dst, Packer& pk);  // on the transport it was built with
  i64 staged_bytes() const { return n_ * item_; }
  Transport transport() const { return tr_; }

 private:
  std::shared_ptr<Comm> comm_;
  MPI_Datatype type_;
  i64 item_;
  MPI_Op op_;       // on device buffers (CUDA-aware MPI): the builtin
  MPI_Op host_op_;  // on host buffers: host_mpi_op(op, type)
  i64 n_;
  std::shared_ptr<Workspace> ws_;
  Transport tr_;
};

class ReduceScatterStep {
 public:
  ReduceScatterStep(std::shared_ptr<Comm> comm, std::shared_ptr<ScatterGeometry> g,
                    MPI_Datatype type, ReduceOp op, std::shared_ptr<Workspace> ws,
                    Transport tr);
  void run(const char* src, char* dst, Packer& pk);  // on the transport it was built with
  const ScatterGeometry& geometry() const { return *g_; }
  Transport transport() const { return tr_; }

 private:
  void scatter(const char* sb, char* rb, bool host);
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<ScatterGeometry> g_;
  MPI_Datatype type_;
  MPI_Op op_;       // on device buffers (CUDA-aware MPI): the builtin
  MPI_Op host_op_;  // on host buffers: host_mpi_op(op, type)
  std::shared_ptr<Workspace> ws_;
  Transport tr_;
  mpi::Counts counts_;
};

}  // namespace pyshard
