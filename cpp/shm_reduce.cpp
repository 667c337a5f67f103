#include "shm_reduce.h"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "combine_kernel.h"
#include "comm.h"
#include "shm_copy.h"
#include "sym_minmax.h"

namespace pyshard {

using shm::add_cursors;
using shm::copy_contiguous;
using shm::copy_interleaved;
using shm::Cursor;
using shm::store_fence;

namespace {

// dst = parts[0] op parts[1] op ... (in that order, for each element), in chunks that stay in
// L1 so that each part is read once and dst written once.
template <class T, class Op>
void reduce_parts(char* dst, const std::vector<const char*>& parts, i64 n, Op op) {
  constexpr i64 kB = 2048;
  T* d = reinterpret_cast<T*>(dst);
  for (i64 a = 0; a < n; a += kB) {
    const i64 m = std::min(kB, n - a);
    const T* p0 = reinterpret_cast<const T*>(parts[0]) + a;
    if (parts.size() == 1) {
      std::memcpy(d + a, p0, static_cast<size_t>(m) * sizeof(T));
      continue;
    }
    const T* p1 = reinterpret_cast<const T*>(parts[1]) + a;
    for (i64 i = 0; i < m; ++i) d[a + i] = op(p0[i], p1[i]);
    for (size_t k = 2; k < parts.size(); ++k) {
      const T* pk = reinterpret_cast<const T*>(parts[k]) + a;
      for (i64 i = 0; i < m; ++i) d[a + i] = op(d[a + i], pk[i]);
    }
  }
}

template <class T>
void reduce_typed(char* dst, const std::vector<const char*>& parts, i64 n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return reduce_parts<T>(dst, parts, n, DevSum<T>());  // integers wrap around, as numpy
    case ReduceOp::max:  // NaN wins, ties as the MPI path breaks them (sym_minmax.h)
      return reduce_parts<T>(dst, parts, n, SymMax<T>());
    case ReduceOp::min:
      return reduce_parts<T>(dst, parts, n, SymMin<T>());
    case ReduceOp::lor:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return static_cast<T>(a || b); });
    case ReduceOp::land:
      return reduce_parts<T>(dst, parts, n, [](T a, T b) { return static_cast<T>(a && b); });
  }
}

template <class T>
void reduce_complex(char* dst, const std::vector<const char*>& parts, i64 n, ReduceOp op) {
  if (op != ReduceOp::sum) throw std::invalid_argument("pyshard: complex values reduce by sum only");
  reduce_parts<T>(dst, parts, n, [](const T& a, const T& b) { return a + b; });
}

bool reducible(char kind, i64 item) {
  switch (kind) {
    case 'f': return item == 4 || item == 8;
    case 'c': return item == 8 || item == 16;
    case 'i': case 'u': return item == 1 || item == 2 || item == 4 || item == 8;
    case 'b': return item == 1;
    default: return false;
  }
}

void reduce_any(char kind, i64 item, char* dst, const std::vector<const char*>& parts, i64 n,
                ReduceOp op) {
  switch (kind) {
    case 'f':
      return item == 4 ? reduce_typed<float>(dst, parts, n, op)
                       : reduce_typed<double>(dst, parts, n, op);
    case 'c':
      return item == 8 ? reduce_complex<std::complex<float>>(dst, parts, n, op)
                       : reduce_complex<std::complex<double>>(dst, parts, n, op);
    case 'i':
      if (item == 1) return reduce_typed<std::int8_t>(dst, parts, n, op);
      if (item == 2) return reduce_typed<std::int16_t>(dst, parts, n, op);
      if (item == 4) return reduce_typed<std::int32_t>(dst, parts, n, op);
      return reduce_typed<std::int64_t>(dst, parts, n, op);
    case 'u':
    case 'b':  // bool: bytes 0 and 1 (or, and)
      if (item == 1) return reduce_typed<std::uint8_t>(dst, parts, n, op);
      if (item == 2) return reduce_typed<std::uint16_t>(dst, parts, n, op);
      if (item == 4) return reduce_typed<std::uint32_t>(dst, parts, n, op);
      return reduce_typed<std::uint64_t>(dst, parts, n, op);
  }
}

}  // namespace

ShmReduceScatterStep::ShmReduceScatterStep(std::shared_ptr<NodeShm> node,
                                           std::shared_ptr<ScatterGeometry> g, char kind,
                                           ReduceOp op)
    : node_(std::move(node)), g_(std::move(g)), kind_(kind), op_(op) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  const ScatterGeometry& geo = *g_;
  if (node_->nodes() != 1 || node_->node_size() != geo.size)
    throw std::invalid_argument(
        "pyshard: a Reduce_scatter through node-shared memory needs every rank on one node");
  if (!reducible(kind_, geo.item))
    throw std::invalid_argument("pyshard: no node-shared reduction for this element type");
  if (kind_ == 'c' && op_ != ReduceOp::sum)
    throw std::invalid_argument("pyshard: complex values reduce by sum only");
  const int n = node_->node_size(), me = node_->self();
  const i64 item = geo.item;
  push_.resize(n);
  for (int idx = 0; idx < n; ++idx) {
    if (idx == me) continue;
    const Block& b = geo.pieces[node_->node_ranks()[idx]];
    DescTable& t = push_[idx];
    t.begin_block();
    describe_copy(geo.src_shape, b.start, b.ext, Shape(b.ext.size(), 0), b.ext, item, 0,
                  me * align_up(b.bytes), &t.host);
    t.end_block();
  }
  const Block& mine = geo.pieces[geo.rank];
  slot_ = align_up(mine.bytes);
  i64 off = 0;
  if (box_contiguous(geo.src_shape, mine.start, mine.ext, item, &off)) {
    own_off_ = off;
  } else {
    own_.begin_block();
    describe_copy(geo.src_shape, mine.start, mine.ext, Shape(mine.ext.size(), 0), mine.ext, item,
                  0, me * slot_, &own_.host);
    own_.end_block();
  }
  parts_.resize(n);
}

void ShmReduceScatterStep::run(const char* src, char* dst) {
  const ScatterGeometry& geo = *g_;
  const int n = node_->node_size(), me = node_->self();
  std::shared_ptr<ShmSegment> stage = node_->take(std::max<i64>(n * slot_, 1));
  char* st = stage->ptr;
  node_->exchange_all(stage.get(), 0, [&](const std::vector<char*>& bases) {
    thread_local std::vector<Cursor> cs;
    cs.clear();
    for (int idx = 0; idx < n; ++idx)
      if (bases[idx]) add_cursors(cs, push_[idx], src, bases[idx]);
    if (own_off_ < 0) add_cursors(cs, own_, src, st);
    copy_interleaved(cs, src);
  });
  for (int idx = 0; idx < n; ++idx)
    parts_[idx] = idx == me && own_off_ >= 0 ? src + own_off_ : st + idx * slot_;
  reduce_any(kind_, geo.item, dst, parts_, geo.pieces[geo.rank].bytes / geo.item, op_);
  node_->give(std::move(stage));
  auto& s = stats();
  s["shm"] += 1;
}

// ----------------------------------------------------------------------------- allreduce

ShmAllreduceStep::ShmAllreduceStep(std::shared_ptr<NodeShm> node, char kind, i64 item,
                                   ReduceOp op, Shape shape)
    : node_(std::move(node)), kind_(kind), item_(item), op_(op), shape_(std::move(shape)) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  if (node_->nodes() != 1)
    throw std::invalid_argument(
        "pyshard: an Allreduce through node-shared memory needs every rank on one node");
  if (!reducible(kind_, item_))
    throw std::invalid_argument("pyshard: no node-shared reduction for this element type");
  if (kind_ == 'c' && op_ != ReduceOp::sum)
    throw std::invalid_argument("pyshard: complex values reduce by sum only");
  const int n = node_->node_size();
  const i64 count = volume(shape_);
  for (int k = 0; k < n; ++k) {
    const i64 a = count * k / n, b = count * (k + 1) / n;
    lo_.push_back(a * item_);
    bytes_.push_back((b - a) * item_);
    slot_.push_back(align_up((b - a) * item_));
  }
  parts_.resize(n);
}

void ShmAllreduceStep::run(const char* src, char* dst) {
  const int n = node_->node_size(), me = node_->self();
  std::shared_ptr<ShmSegment> stage = node_->take(std::max<i64>(n * slot_[me], 1));
  char* st = stage->ptr;
  // 1: chunk idx of my source into slot `me` of rank idx's staging segment
  node_->exchange_all(stage.get(), 0, [&](const std::vector<char*>& bases) {
    for (int idx = 0; idx < n; ++idx)
      if (bases[idx]) copy_contiguous(bases[idx] + me * slot_[idx], src + lo_[idx], bytes_[idx]);
    store_fence();
  });
  // my chunk, reduced in rank order, into my own slot (the others read it from there)
  for (int idx = 0; idx < n; ++idx)
    parts_[idx] = idx == me ? src + lo_[me] : st + idx * slot_[me];
  reduce_any(kind_, item_, st + me * slot_[me], parts_, bytes_[me] / item_, op_);
  // 2: every reduced chunk from its owner's slot into my result
  node_->exchange_all(stage.get(), 0, [&](const std::vector<char*>& bases) {
    for (int idx = 0; idx < n; ++idx) {
      const char* from = bases[idx] ? bases[idx] + idx * slot_[idx] : st + me * slot_[me];
      copy_contiguous(dst + lo_[idx], from, bytes_[idx]);
    }
    store_fence();
  });
  node_->give(std::move(stage));
  auto& s = stats();
  s["shm"] += 1;
}

}  // namespace pyshard
