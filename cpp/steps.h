// The collective steps of a plan. Python computes every count from layouts that all ranks
// share; a step only moves bytes. Each step is built once from its geometry (pure data, also
// built by the planner to report workspace sizes) and run many times on any memory kind:
// pack -> wait -> MPI -> unpack, staging through host bounce buffers when the transport says
// so (heFFTe's reshape `apply`, cuDecomp's transposes).
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "memory.h"
#include "mpi_calls.h"

namespace pyshard {

enum class Algorithm { alltoallv = 0, alltoall = 1, p2p = 2, alltoallw = 3 };
enum class ReduceOp { sum = 0, max = 1, min = 2, lor = 3, land = 4 };

const char* algorithm_name(Algorithm a);

// Collectives run in this process by name ("alltoallv", "p2p", ...), plus "staged" (steps
// that went through host bounce buffers) and "device_direct" (steps whose MPI call took GPU
// memory).
std::map<std::string, i64>& stats();

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

// How one call runs: the packer of the array's memory, the transport, the shared pool.
struct Exec {
  Packer& pk;
  Transport tr;
  Workspace& ws;
};

using BlockSpec = std::tuple<int, Shape, Shape>;  // (peer, start, extent)
using LocalSpec = std::tuple<Shape, Shape, Shape>;  // (src start, dst start, extent)
using BoxSpec = std::tuple<Shape, Shape>;  // (start, extent)

// Geometry of an exchange (Alltoallv and its alternatives) on a communicator of `size`.
// sends/recvs: at most one block per peer, never this rank; local: copied directly.
struct ExchangeGeometry {
  ExchangeGeometry(int size, i64 item, Shape src_shape, Shape dst_shape,
                   const std::vector<BlockSpec>& sends, const std::vector<BlockSpec>& recvs,
                   const std::vector<LocalSpec>& local, Algorithm algo, i64 pad);
  int size;
  i64 item;
  Shape src_shape, dst_shape;
  Algorithm algo;
  i64 pad;
  std::vector<Block> sends, recvs;
  DescTable pack, unpack, local;  // src -> send workspace, recv workspace -> dst, src -> dst
  bool pack_all = false, unpack_all = false;  // Alltoallv: stage every block (one base pointer)
  i64 send_ws = 0, recv_ws = 0;  // packed workspace bytes (4 KiB aligned blocks)
  // bytes of the pack/unpack workspace the direct host path allocates, and what a staged
  // call needs in the array's memory and in host bounce buffers
  i64 workspace_bytes() const;
  i64 staged_bytes() const { return send_ws + recv_ws; }
};

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

class ExchangeStep {
 public:
  ExchangeStep(std::shared_ptr<Comm> comm, std::shared_ptr<ExchangeGeometry> g,
               std::shared_ptr<Workspace> ws, bool nonblocking);
  ~ExchangeStep();
  ExchangeStep(const ExchangeStep&) = delete;
  ExchangeStep& operator=(const ExchangeStep&) = delete;
  void run(const char* src, char* dst, Packer& pk, Transport tr);
  const ExchangeGeometry& geometry() const { return *g_; }

 private:
  void direct(const char* src, char* dst, Packer& pk);
  void staged(const char* src, char* dst, Packer& pk);
  void host_nonblocking(const char* sb, char* rb, const char* src, char* dst);
  void p2p(const char* src, char* dst, char* work, Packer& pk, bool staged);
  void build_types();

  std::shared_ptr<Comm> comm_;
  std::shared_ptr<ExchangeGeometry> g_;
  std::shared_ptr<Workspace> ws_;
  bool nonblocking_;
  mpi::Counts scounts_, rcounts_;
  mpi::Displs sdispls_, rdispls_;  // into the packed workspace
  mpi::Displs sdirect_, rdirect_;  // into the arrays (when nothing is packed)
  std::vector<MPI_Datatype> wstypes_, wrtypes_;
  mpi::Counts wscounts_, wrcounts_;
  mpi::Displs wdispls_;
};

class AllgathervStep {
 public:
  AllgathervStep(std::shared_ptr<Comm> comm, std::shared_ptr<GatherGeometry> g,
                 std::shared_ptr<Workspace> ws);
  void run(const char* src, char* dst, Packer& pk, Transport tr);
  const GatherGeometry& geometry() const { return *g_; }

 private:
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<GatherGeometry> g_;
  std::shared_ptr<Workspace> ws_;
  mpi::Counts counts_;
  mpi::Displs packed_, direct_;
};

class AllreduceStep {
 public:
  AllreduceStep(std::shared_ptr<Comm> comm, MPI_Datatype type, i64 item, ReduceOp op,
                Shape shape, std::shared_ptr<Workspace> ws);
  void run(const char* src, char* dst, Packer& pk, Transport tr);
  i64 staged_bytes() const { return n_ * item_; }

 private:
  std::shared_ptr<Comm> comm_;
  MPI_Datatype type_;
  i64 item_;
  MPI_Op op_;
  i64 n_;
  std::shared_ptr<Workspace> ws_;
};

class ReduceScatterStep {
 public:
  ReduceScatterStep(std::shared_ptr<Comm> comm, std::shared_ptr<ScatterGeometry> g,
                    MPI_Datatype type, ReduceOp op, std::shared_ptr<Workspace> ws);
  void run(const char* src, char* dst, Packer& pk, Transport tr);
  const ScatterGeometry& geometry() const { return *g_; }

 private:
  void scatter(const char* sb, char* rb);
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<ScatterGeometry> g_;
  MPI_Datatype type_;
  MPI_Op op_;
  std::shared_ptr<Workspace> ws_;
  mpi::Counts counts_;
};

MPI_Op mpi_op(ReduceOp op);

}  // namespace pyshard
