#include "reduce.h"

#include <mutex>
#include <stdexcept>

#include "sym_minmax.h"  // SymMax, SymMin: NaN wins, the same bits in any order

namespace pyshard {

namespace {

// MPI's builtin MPI_MAX / MPI_MIN leave NaN to the comparison's order (MPICH's keeps or drops
// a NaN depending on which rank holds it and the algorithm's pairing), so float and double
// max/min on host buffers reduce through these user ops instead: a NaN anywhere gives NaN,
// as numpy.maximum.reduce does, and ties (+0 and -0, two NaNs) break the same way whatever
// the pairing, so that every rank gets the same bits. Other types and device buffers keep
// the builtin.
template <class T, class F>
void nan_op_typed(void* in, void* inout, int n) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  F f;
  for (int i = 0; i < n; ++i) b[i] = f(a[i], b[i]);
}

template <template <class> class F>
void nan_op(void* in, void* inout, int* len, MPI_Datatype* dt) {
  if (*dt == MPI_FLOAT)
    nan_op_typed<float, F<float>>(in, inout, *len);
  else if (*dt == MPI_DOUBLE)
    nan_op_typed<double, F<double>>(in, inout, *len);
  // host_mpi_op() hands these ops float and double only
}

MPI_Op nan_max_op = MPI_OP_NULL, nan_min_op = MPI_OP_NULL;
std::once_flag nan_ops_made;

void make_nan_ops() {
  nan_max_op = mpi::op_create(&nan_op<SymMax>, true);
  nan_min_op = mpi::op_create(&nan_op<SymMin>, true);
}

}  // namespace

MPI_Op host_mpi_op(ReduceOp op, MPI_Datatype type) {
  if ((op == ReduceOp::max || op == ReduceOp::min) && (type == MPI_FLOAT || type == MPI_DOUBLE)) {
    std::call_once(nan_ops_made, make_nan_ops);
    return op == ReduceOp::max ? nan_max_op : nan_min_op;
  }
  return mpi_op(op);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::lor:
      return MPI_LOR;
    case ReduceOp::land:
      return MPI_LAND;
  }
  throw std::invalid_argument("pyshard: unknown reduction op");
}

ScatterGeometry::ScatterGeometry(int size_, int rank_, i64 item_, Shape src_shape_,
                                 Shape dst_shape_, const std::vector<BoxSpec>& in)
    : size(size_),
      rank(rank_),
      item(item_),
      src_shape(std::move(src_shape_)),
      dst_shape(std::move(dst_shape_)) {
  if (static_cast<int>(in.size()) != size)
    throw std::invalid_argument("pyshard: Reduce_scatter needs one piece per member");
  for (int p = 0; p < size; ++p) {
    Block b{p, std::get<0>(in[p]), std::get<1>(in[p])};
    b.bytes = volume(b.ext) * item;
    if (!box_contiguous(src_shape, b.start, b.ext, item, &b.array_off) || b.array_off != total)
      pack_all = true;
    b.ws_off = total;
    total += b.bytes;
    pack.begin_block();
    describe_copy(src_shape, b.start, b.ext, Shape(b.ext.size(), 0), b.ext, item, 0, b.ws_off,
                  &pack.host);
    pack.end_block();
    pieces.push_back(std::move(b));
  }
  if (volume(dst_shape) * item != pieces[rank].bytes)
    throw std::invalid_argument("pyshard: Reduce_scatter piece of this rank != its output");
  for (const Block& b : pieces)
    if (b.bytes != pieces[0].bytes) regular = false;
}


AllreduceStep::AllreduceStep(std::shared_ptr<Comm> comm, MPI_Datatype type, i64 item,
                             ReduceOp op, Shape shape, std::shared_ptr<Workspace> ws,
                             Transport tr)
    : comm_(std::move(comm)),
      type_(type),
      item_(item),
      op_(mpi_op(op)),
      host_op_(host_mpi_op(op, type)),
      n_(volume(shape)),
      ws_(std::move(ws)),
      tr_(tr) {}

void AllreduceStep::run(const char* src, char* dst, Packer& pk) {
  if (tr_ == Transport::staged) {
    char* bounce = ws_->bounce(pk, n_ * item_);
    pk.to_host(bounce, src, n_ * item_);
    pk.sync();
    mpi::allreduce(MPI_IN_PLACE, bounce, n_, type_, host_op_, comm_->get());
    pk.from_host(dst, bounce, n_ * item_);
  } else {
    pk.sync();
    mpi::allreduce(src, dst, n_, type_, pk.kind() == Mem::host ? host_op_ : op_, comm_->get());
  }
  count_call("allreduce", pk, tr_);
  pk.finish();
}

ReduceScatterStep::ReduceScatterStep(std::shared_ptr<Comm> comm,
                                     std::shared_ptr<ScatterGeometry> g, MPI_Datatype type,
                                     ReduceOp op, std::shared_ptr<Workspace> ws, Transport tr)
    : comm_(std::move(comm)),
      g_(std::move(g)),
      type_(type),
      op_(mpi_op(op)),
      host_op_(host_mpi_op(op, type)),
      ws_(std::move(ws)),
      tr_(tr) {
  if (g_->size != comm_->size() || g_->rank != comm_->rank())
    throw std::invalid_argument("pyshard: geometry for another communicator");
  for (const Block& b : g_->pieces) counts_.push_back(to_count(b.bytes / g_->item, "a count"));
}

void ReduceScatterStep::scatter(const char* sb, char* rb, bool host) {
  MPI_Op op = host ? host_op_ : op_;
  if (g_->regular)
    mpi::reduce_scatter_block(sb, rb, counts_[0], type_, op, comm_->get());
  else
    mpi::reduce_scatter(sb, rb, counts_, type_, op, comm_->get());
}

void ReduceScatterStep::run(const char* src, char* dst, Packer& pk) {
  const ScatterGeometry& g = *g_;
  const char* from = src;
  if (g.pack_all) {
    char* work = ws_->work(pk, g.total);
    pk.copy_all(g.pack, src, work);
    from = work;
  }
  if (tr_ == Transport::staged) {
    char* bounce = ws_->bounce(pk, g.staged_bytes());
    pk.to_host(bounce, from, g.total);
    pk.sync();
    scatter(bounce, bounce + g.total, true);
    pk.from_host(dst, bounce + g.total, g.pieces[g.rank].bytes);
  } else {
    pk.sync();
    scatter(from, dst, pk.kind() == Mem::host);
  }
  count_call(g.regular ? "reduce_scatter_block" : "reduce_scatter", pk, tr_);
  pk.finish();
}

}  // namespace pyshard
