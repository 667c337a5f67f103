// The reductions of the node-local transport (shm.h has the overview), every rank of the
// communicator on one node: Reduce_scatter and Allreduce through node-shared staging segments.
#pragma once

#include <memory>
#include <vector>

#include "memory.h"
#include "reduce.h"
#include "shm_node.h"

namespace pyshard {

// Reduce_scatter on the node-local transport (host memory, every rank of the communicator on
// one node): each rank copies its piece for every node peer once, straight from its source
// into that peer's staging segment (a slot per sender, from the peer's pool), then sums its
// own piece and the staged ones into its result, in rank order, one pass over them. MPI's
// Reduce_scatter moves every byte through its shared-memory cells (two copies) before it is
// reduced. `kind`: the element type of the reduction ('f' float32/64, 'c' complex64/128, 'i'
// signed, 'u' unsigned, 'b' bool as bytes), with the geometry's item size.
class ShmReduceScatterStep {
 public:
  ShmReduceScatterStep(std::shared_ptr<NodeShm> node, std::shared_ptr<ScatterGeometry> g,
                       char kind, ReduceOp op);
  void run(const char* src, char* dst);
  void run(const char* src, char* dst, Packer&) { run(src, dst); }
  const ScatterGeometry& geometry() const { return *g_; }

 private:
  std::shared_ptr<NodeShm> node_;
  std::shared_ptr<ScatterGeometry> g_;
  char kind_;
  ReduceOp op_;
  std::vector<DescTable> push_;  // per node peer index: my piece for it -> my slot there
  DescTable own_;                // my own piece -> my slot here, where it is not contiguous
  i64 own_off_ = -1;             // my own piece's offset in the source, where it is
  i64 slot_ = 0;                 // bytes of a slot in my staging segment
  std::vector<const char*> parts_;
};

// Allreduce on the node-local transport (host memory, every rank of the communicator on one
// node), as a reduce-scatter and a gather over the flat array split into one chunk per rank:
// each rank copies chunk k of its source into rank k's staging segment; rank k reduces chunk
// k (its own part and the staged ones, in rank order) into its staging segment; then every
// rank copies each reduced chunk from its owner's segment into its result. Two handshakes,
// each byte copied twice, where MPI's Allreduce moves it through shared-memory cells at every
// step of its algorithm.
class ShmAllreduceStep {
 public:
  ShmAllreduceStep(std::shared_ptr<NodeShm> node, char kind, i64 item, ReduceOp op, Shape shape);
  void run(const char* src, char* dst);
  void run(const char* src, char* dst, Packer&) { run(src, dst); }
  const Shape& shape() const { return shape_; }

 private:
  std::shared_ptr<NodeShm> node_;
  char kind_;
  i64 item_;
  ReduceOp op_;
  Shape shape_;
  std::vector<i64> lo_, bytes_, slot_;  // per node index: chunk start (bytes), size, slot size
  std::vector<const char*> parts_;
};

}  // namespace pyshard
