#include "halo.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <complex>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "combine_kernel.h"
#include "device_fold.h"
#include "peer_messages.h"

namespace pyshard {

namespace {

// Messages of `in` with their packed offsets; a descriptor block per message copying its
// boxes between the padded array and the packed buffer (to_buffer: array -> buffer).
std::vector<HaloMessage> describe_messages(const std::vector<PeerBoxes>& in, const Shape& shape,
                                           i64 item, bool to_buffer, DescTable* table,
                                           DescTable* packed_only, i64* total) {
  std::vector<HaloMessage> out;
  i64 off = 0;
  for (const auto& pb : in) {
    HaloMessage m;
    m.peer = std::get<0>(pb);
    m.off = off;
    const auto& boxes = std::get<1>(pb);
    for (const auto& b : boxes) {
      m.bytes += volume(std::get<1>(b)) * item;
      m.starts.push_back(std::get<0>(b));
      m.exts.push_back(std::get<1>(b));
    }
    if (boxes.size() == 1)
      m.contiguous = box_contiguous(shape, std::get<0>(boxes[0]), std::get<1>(boxes[0]), item,
                                    &m.array_off);
    table->begin_block();
    if (packed_only) packed_only->begin_block();
    i64 at = m.off;
    for (const auto& b : boxes) {
      const Shape& start = std::get<0>(b);
      const Shape& ext = std::get<1>(b);
      for (size_t k = 0; k < ext.size(); ++k)
        if (ext.size() != shape.size() || start[k] < 0 || ext[k] < 0 ||
            start[k] + ext[k] > shape[k])
          throw std::out_of_range("pyshard: a halo box lies outside the padded array");
      const Shape zero(ext.size(), 0);
      if (to_buffer)
        describe_copy(shape, start, ext, zero, ext, item, 0, at, &table->host);
      else
        describe_copy(ext, zero, shape, start, ext, item, at, 0, &table->host);
      if (packed_only && !m.contiguous)
        describe_copy(ext, zero, shape, start, ext, item, at, 0, &packed_only->host);
      at += volume(ext) * item;
    }
    table->end_block();
    if (packed_only) packed_only->end_block();
    off = align_up(off + m.bytes);
    out.push_back(m);
  }
  table->begin_block();  // an empty table still has blocks() == 0
  if (packed_only) packed_only->begin_block();
  *total = off;
  return out;
}

// The fold's combine on the host: dst = op(dst, src) element by element over the blocks
// [b0, b1) of table `t`, descriptor by descriptor, run by run, in order (serial: two
// contributions to one cell always combine in the same order). The element rules (sums that
// wrap around, max/min where NaN wins) are the combine kernel's DevSum, DevMax and DevMin:
// one definition for the host and the device folds and the scatter (combine_kernel.h).

// One run: n elements of `s` combined into `o` (never overlapping: a ghost box and an
// interior box, or a buffer and the array). Aligned runs go through typed restrict pointers,
// which the compiler vectorizes (a fold of 4096^2 float64 wraps took 1.75x the update's copy
// element by element through memcpy); others element by element.
template <class T, class F>
inline void combine_run(char* o, const char* s, i64 n, F f) {
  if (reinterpret_cast<std::uintptr_t>(o) % alignof(T) == 0 &&
      reinterpret_cast<std::uintptr_t>(s) % alignof(T) == 0) {
    T* __restrict po = reinterpret_cast<T*>(o);
    const T* __restrict ps = reinterpret_cast<const T*>(s);
    for (i64 k = 0; k < n; ++k) po[k] = f(po[k], ps[k]);
    return;
  }
  for (i64 k = 0; k < n; ++k) {
    T a, v;
    std::memcpy(&a, o + k * sizeof(T), sizeof(T));
    std::memcpy(&v, s + k * sizeof(T), sizeof(T));
    a = f(a, v);
    std::memcpy(o + k * sizeof(T), &a, sizeof(T));
  }
}

// N elements at o combined with those at s: through typed pointers where both are aligned
// (the compiler keeps them in registers: through the memcpy'd local arrays below it stored
// and reloaded each one on the stack, about half a 2-D w4 fold's time), else by memcpy.
template <class T, i64 N, class F>
inline void combine_n(char* o, const char* s, F f) {
  if ((reinterpret_cast<std::uintptr_t>(o) | reinterpret_cast<std::uintptr_t>(s)) %
          alignof(T) == 0) {
    T* __restrict po = reinterpret_cast<T*>(o);
    const T* __restrict ps = reinterpret_cast<const T*>(s);
    for (i64 k = 0; k < N; ++k) po[k] = f(po[k], ps[k]);
    return;
  }
  T a[N], v[N];
  std::memcpy(a, o, sizeof a);
  std::memcpy(v, s, sizeof v);
  for (i64 k = 0; k < N; ++k) a[k] = f(a[k], v[k]);
  std::memcpy(o, a, sizeof a);
}

// Short runs of a fixed length (the periodic wrap of a thin face: a few elements per run)
// with a constant trip count, as copy_host's fixed-size copies (box.h).
template <class T, i64 N, class F>
inline void combine_runs_of(const CopyDesc& d, const char* src, char* dst, F f) {
  for_each_run(d, [&](i64 so, i64 to) { combine_n<T, N>(dst + to, src + so, f); });
}

template <class T, class F>
void combine_blocks(const DescTable& t, size_t b0, size_t b1, const char* src, char* dst,
                    F f) {
  for (size_t b = b0; b < b1 && b < t.blocks(); ++b)
    for (size_t i = t.first[b]; i < t.first[b + 1]; ++i) {
      const CopyDesc& d = t.host[i];
      const i64 n = d.run / static_cast<i64>(sizeof(T));
      switch (n) {
        case 1: combine_runs_of<T, 1>(d, src, dst, f); continue;
        case 2: combine_runs_of<T, 2>(d, src, dst, f); continue;
        case 4: combine_runs_of<T, 4>(d, src, dst, f); continue;
        case 8: combine_runs_of<T, 8>(d, src, dst, f); continue;
        default: break;
      }
      for_each_run(d, [&](i64 so, i64 to) { combine_run<T>(dst + to, src + so, n, f); });
    }
}

template <class T>
void combine_typed(FoldOp op, const DescTable& t, size_t b0, size_t b1, const char* src,
                   char* dst) {
  if (op == FoldOp::sum) {
    combine_blocks<T>(t, b0, b1, src, dst, DevSum<T>{});
    return;
  }
  if constexpr (std::is_arithmetic_v<T>) {
    if (op == FoldOp::max)
      combine_blocks<T>(t, b0, b1, src, dst, DevMax<T>{});
    else
      combine_blocks<T>(t, b0, b1, src, dst, DevMin<T>{});
  } else {
    throw std::invalid_argument("pyshard: fold max/min on complex data");
  }
}

}  // namespace

void fold_combine(FoldKind kind, FoldOp op, const DescTable& t, size_t b0, size_t b1,
                  const char* src, char* dst) {
  switch (kind) {
    case FoldKind::f32: return combine_typed<float>(op, t, b0, b1, src, dst);
    case FoldKind::f64: return combine_typed<double>(op, t, b0, b1, src, dst);
    case FoldKind::i8: return combine_typed<std::int8_t>(op, t, b0, b1, src, dst);
    case FoldKind::i16: return combine_typed<std::int16_t>(op, t, b0, b1, src, dst);
    case FoldKind::i32: return combine_typed<std::int32_t>(op, t, b0, b1, src, dst);
    case FoldKind::i64: return combine_typed<std::int64_t>(op, t, b0, b1, src, dst);
    case FoldKind::u8: return combine_typed<std::uint8_t>(op, t, b0, b1, src, dst);
    case FoldKind::u16: return combine_typed<std::uint16_t>(op, t, b0, b1, src, dst);
    case FoldKind::u32: return combine_typed<std::uint32_t>(op, t, b0, b1, src, dst);
    case FoldKind::u64: return combine_typed<std::uint64_t>(op, t, b0, b1, src, dst);
    case FoldKind::c64: return combine_typed<std::complex<float>>(op, t, b0, b1, src, dst);
    case FoldKind::c128: return combine_typed<std::complex<double>>(op, t, b0, b1, src, dst);
    case FoldKind::none: return;
  }
  throw std::invalid_argument("pyshard: unknown fold element kind");
}

namespace {

// The runs of descriptors ds[0..k) of one shape, walked together: each combined with f; N
// elements a run where N > 0 (a thin face's wrap: constant-size loads the compiler inlines),
// else the descriptor's run.
template <class T, i64 N, class F>
void combine_together_n(const CopyDesc* const* ds, size_t k, const char* src, char* dst, F f) {
  constexpr size_t kMax = 8;
  const CopyDesc& d = *ds[0];
  i64 delta[kMax][2];
  for (size_t j = 0; j < k; ++j) {
    delta[j][0] = ds[j]->src_off - d.src_off;
    delta[j][1] = ds[j]->dst_off - d.dst_off;
  }
  const i64 n = d.run / static_cast<i64>(sizeof(T));
  if constexpr (N > 0) {
    if (d.nd == 1) {  // a 2-D array's wraps (one run a row): a plain loop, all in registers
      const i64 ss = d.sstr[0], ts = d.dstr[0], rows = d.ext[0];
      const char* s0 = src + d.src_off;
      char* t0 = dst + d.dst_off;
      for (i64 i = 0; i < rows; ++i, s0 += ss, t0 += ts)
        for (size_t j = 0; j < k; ++j) {
          T* o = reinterpret_cast<T*>(t0 + delta[j][1]);
          const T* v = reinterpret_cast<const T*>(s0 + delta[j][0]);
          for (i64 e = 0; e < N; ++e) o[e] = f(o[e], v[e]);
        }
      return;
    }
  }
  for_each_run(d, [&](i64 so, i64 to) {
    for (size_t j = 0; j < k; ++j) {
      char* o = dst + to + delta[j][1];
      const char* s = src + so + delta[j][0];
      if constexpr (N > 0) {
        combine_n<T, N>(o, s, f);
      } else {
        combine_run<T>(o, s, n, f);
      }
    }
  });
}

template <class T, class F>
void combine_together(const CopyDesc* const* ds, size_t k, const char* src, char* dst, F f) {
  switch (ds[0]->run / static_cast<i64>(sizeof(T))) {
    case 1: return combine_together_n<T, 1>(ds, k, src, dst, f);
    case 2: return combine_together_n<T, 2>(ds, k, src, dst, f);
    case 4: return combine_together_n<T, 4>(ds, k, src, dst, f);
    case 8: return combine_together_n<T, 8>(ds, k, src, dst, f);
    default: return combine_together_n<T, 0>(ds, k, src, dst, f);
  }
}

template <class T>
void combine_wraps_typed(FoldOp op, const DescTable& t,
                         const std::vector<std::vector<size_t>>& groups, char* arr) {
  std::vector<const CopyDesc*> ds;
  for (const auto& grp : groups) {
    ds.clear();
    for (size_t i : grp) ds.push_back(&t.host[i]);
    for (size_t at = 0; at < ds.size(); at += 8) {
      const size_t k = std::min<size_t>(8, ds.size() - at);
      if (op == FoldOp::sum) {
        combine_together<T>(ds.data() + at, k, arr, arr, DevSum<T>{});
      } else if constexpr (std::is_arithmetic_v<T>) {
        if (op == FoldOp::max)
          combine_together<T>(ds.data() + at, k, arr, arr, DevMax<T>{});
        else
          combine_together<T>(ds.data() + at, k, arr, arr, DevMin<T>{});
      } else {
        throw std::invalid_argument("pyshard: fold max/min on complex data");
      }
    }
  }
}

bool boxes_meet(const std::pair<Shape, Shape>& a, const std::pair<Shape, Shape>& b) {
  for (size_t k = 0; k < a.first.size(); ++k)
    if (a.first[k] >= b.first[k] + b.second[k] || b.first[k] >= a.first[k] + a.second[k])
      return false;
  return true;
}

}  // namespace

std::vector<std::vector<size_t>> wrap_groups(const DescTable& t,
                                             const std::vector<std::pair<Shape, Shape>>& dsts) {
  std::vector<std::vector<size_t>> out;
  bool apart = true;
  for (size_t i = 0; i < dsts.size() && apart; ++i)
    for (size_t j = i + 1; j < dsts.size() && apart; ++j)
      if (boxes_meet(dsts[i], dsts[j])) apart = false;
  for (size_t i = 0; i < t.host.size(); ++i) {
    auto g = apart ? std::find_if(out.begin(), out.end(),
                                  [&](const auto& grp) {
                                    return same_walk(t.host[grp[0]], t.host[i]);
                                  })
                   : out.end();
    if (g == out.end())
      out.push_back({i});
    else
      g->push_back(i);
  }
  return out;
}

void fold_combine_wraps(FoldKind kind, FoldOp op, const DescTable& t,
                        const std::vector<std::vector<size_t>>& groups, char* arr) {
  if (groups.size() == t.host.size()) {  // nothing to walk together: the blocks in order
    fold_combine(kind, op, t, 0, t.blocks(), arr, arr);
    return;
  }
  switch (kind) {
    case FoldKind::f32: return combine_wraps_typed<float>(op, t, groups, arr);
    case FoldKind::f64: return combine_wraps_typed<double>(op, t, groups, arr);
    case FoldKind::i8: return combine_wraps_typed<std::int8_t>(op, t, groups, arr);
    case FoldKind::i16: return combine_wraps_typed<std::int16_t>(op, t, groups, arr);
    case FoldKind::i32: return combine_wraps_typed<std::int32_t>(op, t, groups, arr);
    case FoldKind::i64: return combine_wraps_typed<std::int64_t>(op, t, groups, arr);
    case FoldKind::u8: return combine_wraps_typed<std::uint8_t>(op, t, groups, arr);
    case FoldKind::u16: return combine_wraps_typed<std::uint16_t>(op, t, groups, arr);
    case FoldKind::u32: return combine_wraps_typed<std::uint32_t>(op, t, groups, arr);
    case FoldKind::u64: return combine_wraps_typed<std::uint64_t>(op, t, groups, arr);
    case FoldKind::c64: return combine_wraps_typed<std::complex<float>>(op, t, groups, arr);
    case FoldKind::c128: return combine_wraps_typed<std::complex<double>>(op, t, groups, arr);
    case FoldKind::none: return;
  }
  throw std::invalid_argument("pyshard: unknown fold element kind");
}

namespace {

i64 kind_size(FoldKind k) {
  switch (k) {
    case FoldKind::i8: case FoldKind::u8: return 1;
    case FoldKind::i16: case FoldKind::u16: return 2;
    case FoldKind::f32: case FoldKind::i32: case FoldKind::u32: return 4;
    case FoldKind::f64: case FoldKind::i64: case FoldKind::u64: case FoldKind::c64: return 8;
    case FoldKind::c128: return 16;
    default: return 0;
  }
}

}  // namespace

HaloGeometry::HaloGeometry(i64 item_, Shape shape_, const std::vector<PeerBoxes>& sends_,
                           const std::vector<PeerBoxes>& recvs_,
                           const std::vector<LocalSpec>& local_, bool reverse_, int local_at_)
    : reverse(reverse_), local_at(local_at_), item(item_), shape(std::move(shape_)) {
  sends = describe_messages(sends_, shape, item, true, &pack, nullptr, &send_bytes);
  recvs = describe_messages(recvs_, shape, item, false, &unpack, &unpack_packed, &recv_bytes);
  if (reverse) {
    if (local_at < 0 || local_at > static_cast<int>(recvs.size()))
      throw std::invalid_argument("pyshard: a fold's local_at outside its messages");
    for (HaloMessage& m : recvs) m.contiguous = false;  // they combine: never in place
    // this rank's own wraps combine straight from its ghost boxes into its interior at
    // wait() (one block; the ghost cells are not written while a fold is in flight)
    local.begin_block();
    local_unpack.begin_block();
    for (const auto& t : local_) {
      describe_copy(shape, std::get<0>(t), shape, std::get<1>(t), std::get<2>(t), item, 0, 0,
                    &local_unpack.host);
      local_bytes += volume(std::get<2>(t)) * item;
    }
    local.end_block();
    local_unpack.end_block();
    std::vector<std::pair<Shape, Shape>> dsts;
    for (const auto& t : local_) dsts.emplace_back(std::get<1>(t), std::get<2>(t));
    local_unpack_groups = wrap_groups(local_unpack, dsts);
    return;
  }
  for (const auto& t : local_) {
    local.begin_block();
    describe_copy(shape, std::get<0>(t), shape, std::get<1>(t), std::get<2>(t), item, 0, 0,
                  &local.host);
    local.end_block();
    local_bytes += volume(std::get<2>(t)) * item;
  }
  local.begin_block();
  for (size_t i = 0; i < local.host.size(); ++i) {
    auto g = std::find_if(local_groups.begin(), local_groups.end(), [&](const auto& grp) {
      return same_walk(local.host[grp[0]], local.host[i]);
    });
    if (g == local_groups.end())
      local_groups.push_back({i});
    else
      g->push_back(i);
  }
}

void HaloGeometry::copy_local(Packer& pk, const char* src, char* dst) const {
  if (pk.kind() != Mem::host) {
    pk.copy_all(local, src, dst);
    return;
  }
  std::vector<const CopyDesc*> ds;
  for (const auto& grp : local_groups) {
    ds.clear();
    for (size_t i : grp) ds.push_back(&local.host[i]);
    copy_host_together(ds.data(), ds.size(), src, dst);
  }
}

namespace {
PeerMethod peer_method(HaloMethod m) {
  switch (m) {
    case HaloMethod::p2p: return PeerMethod::p2p;
    case HaloMethod::neighbor: return PeerMethod::neighbor;
    default: return PeerMethod::persistent;  // persistent, datatype
  }
}
}  // namespace

HaloStep::HaloStep(std::shared_ptr<Comm> comm, std::shared_ptr<HaloGeometry> g,
                   HaloMethod method, int tag, Transport tr)
    : comm_(comm), g_(std::move(g)), method_(method), tr_(tr),
      msgs_(std::move(comm), tag, peer_method(method)) {
  if (method_ == HaloMethod::datatype && tr_ != Transport::direct)
    throw std::invalid_argument(
        "pyshard: the datatype halo method takes host arrays on the direct transport");
  for (const auto* v : {&g_->sends, &g_->recvs})
    for (const HaloMessage& m : *v)
      if (m.peer < 0 || m.peer >= comm_->size())
        throw std::invalid_argument("pyshard: a halo peer outside the communicator");
}

HaloStep::~HaloStep() {
  if (mpi::finalized()) return;
  msgs_.drop();  // started and dropped: complete it, so the peers' messages are matched
  for (MPI_Datatype& t : types_)
    if (t != MPI_BYTE) mpi::type_free(&t);
}

// The messages of one exchange on the packed buffers `sb` and `rb` (a receive that is one
// run of the array lands there when `in_place`), started by the step's method.
void HaloStep::post(char* arr, char* sb, char* rb, bool in_place) {
  const HaloGeometry& g = *g_;
  rmsg_.clear();
  smsg_.clear();
  for (const HaloMessage& m : g.recvs)
    rmsg_.push_back(PeerMsg{in_place && m.contiguous ? arr + m.array_off : rb + m.off, m.bytes,
                            m.peer});
  for (const HaloMessage& m : g.sends) smsg_.push_back(PeerMsg{sb + m.off, m.bytes, m.peer});
  msgs_.start(rmsg_, smsg_, rb, sb);
}

// The datatype method: the messages are the boxes of the padded array itself, one MPI
// datatype each (made once); a fold's receives land in the buffer (they combine at wait()).
void HaloStep::post_typed(char* arr) {
  const HaloGeometry& g = *g_;
  if (types_.empty())
    for (const auto* v : {&g.recvs, &g.sends})
      for (const HaloMessage& m : *v)
        types_.push_back(m.bytes ? mpi::subarrays(g.shape, m.starts, m.exts, g.item) : MPI_BYTE);
  rmsg_.clear();
  smsg_.clear();
  size_t i = 0;
  for (const HaloMessage& m : g.recvs) {
    if (g.reverse)
      rmsg_.push_back(PeerMsg{work_ + m.off, m.bytes, m.peer});
    else
      rmsg_.push_back(PeerMsg{arr, m.bytes, m.peer, types_[i]});
    ++i;
  }
  for (const HaloMessage& m : g.sends) smsg_.push_back(PeerMsg{arr, m.bytes, m.peer, types_[i++]});
  msgs_.start(rmsg_, smsg_);
}

void HaloStep::start(char* arr, Packer& pk) {
  if (active_)
    throw std::logic_error("pyshard: halo start() called again before wait()");
  const HaloGeometry& g = *g_;
  if (method_ == HaloMethod::datatype) {
    if (pk.kind() != Mem::host)
      throw std::invalid_argument(
          "pyshard: the datatype halo method takes host arrays on the direct transport");
    if (g.reverse) {  // typed sends from the ghost boxes, receives into the buffer
      work_ = ws_.work(pk, g.recv_bytes);
      post_typed(arr);
      active_ = true;
      return;
    }
    post_typed(arr);  // receives and sends first: the wrap copies overlap them
    g.copy_local(pk, arr, arr);
    active_ = true;
    return;
  }
  const bool staged = tr_ == Transport::staged;
  const i64 S = g.send_bytes, R = g.recv_bytes;
  char* work = ws_.work(pk, S + R);  // in the array's memory
  work_ = work;
  // One pass (one kernel launch on a GPU) for every peer, then MPI. Packing each message
  // just before its send and unpacking each as it arrives (MPI_Waitany) was no faster at 2
  // ranks and 15-30x slower at 4 ranks on 2 cores (busy-polling ranks starve each other
  // between the calls; docs/performance.md).
  char* bounce = staged ? ws_.bounce(pk, S + R) : nullptr;
  pk.copy_all(g.pack, arr, work);
  if (!g.reverse)  // (a fold combines its own wraps at wait())
    g.copy_local(pk, arr, arr);  // periodic wrap onto this rank: interior -> ghosts
  if (staged) pk.to_host(bounce, work, S);
  pk.sync();  // MPI reads the packed bytes next
  post(arr, staged ? bounce : work, staged ? bounce + S : work + S,
       !staged && !g.reverse && method_ != HaloMethod::neighbor);
  active_ = true;
}

void HaloStep::wait(char* arr, Packer& pk, FoldOp op, FoldKind kind) {
  if (!active_) throw std::logic_error("pyshard: halo wait() called without start()");
  const HaloGeometry& g = *g_;
  if (g.reverse) {
    if (kind != FoldKind::none && (kind_size(kind) == 0 || g.item != kind_size(kind)))
      throw std::invalid_argument("pyshard: a fold's element kind does not fit the array");
    active_ = false;
    const i64 S = method_ == HaloMethod::datatype ? 0 : g.send_bytes, R = g.recv_bytes;
    char* work = work_;
    waitall();
    if (tr_ == Transport::staged) pk.from_host(work + S, ws_.bounce(pk, S + R) + S, R);
    if (kind != FoldKind::none && pk.kind() == Mem::host) {
      // the fixed order: messages by peer rank, this rank's own copies at its rank's place
      const size_t at = static_cast<size_t>(g.local_at);
      fold_combine(kind, op, g.unpack, 0, at, work + S, arr);
      fold_combine_wraps(kind, op, g.local_unpack, g.local_unpack_groups, arr);
      fold_combine(kind, op, g.unpack, at, g.unpack.blocks(), work + S, arr);
    } else if (kind != FoldKind::none) {  // on the device, in the same order (device_fold.h)
      const size_t at = static_cast<size_t>(g.local_at);
      device_fold_combine(pk, kind, op, g.unpack, 0, at, work + S, arr);
      device_fold_combine(pk, kind, op, g.local_unpack, 0, g.local_unpack.blocks(), arr, arr);
      device_fold_combine(pk, kind, op, g.unpack, at, g.unpack.blocks(), work + S, arr);
    }
    if (counted_) count_call("halo_fold", pk, tr_);
    pk.finish();
    return;
  }
  active_ = false;
  if (method_ == HaloMethod::datatype) {
    waitall();
    if (counted_) count_call("halo", pk, tr_);
    return;
  }
  const i64 S = g.send_bytes, R = g.recv_bytes;
  char* work = ws_.work(pk, S + R);
  waitall();
  if (tr_ == Transport::staged) {
    pk.from_host(work + S, ws_.bounce(pk, S + R) + S, R);
    pk.copy_all(g.unpack, work + S, arr);
  } else if (method_ == HaloMethod::neighbor) {
    pk.copy_all(g.unpack, work + S, arr);  // nothing landed in place
  } else {
    pk.copy_all(g.unpack_packed, work + S, arr);  // contiguous messages landed in place
  }
  if (counted_) count_call("halo", pk, tr_);
  pk.finish();
}

bool HaloStep::test() { return !active_ || msgs_.test(); }

void HaloStep::waitall() { msgs_.wait(); }

}  // namespace pyshard
