// Block geometry and the pack/unpack index math, shared by the host packer and the CUDA
// kernels: this header compiles with a host compiler and with nvcc.
//
// A copy of an N-D box between two C-contiguous arrays is described by one `CopyDesc`: the
// trailing dims that are whole on both sides collapse into one contiguous run of bytes, dims
// whose strides line up merge, dims of extent 1 drop out, and what is left is at most
// kMaxDims looped dims with byte strides on each side. Run `r` of a descriptor starts at the
// offsets `run_offsets(d, r)`; the host walks the runs with an odometer (`for_each_run`), a
// CUDA warp takes one run at a time. Descriptors are built once per planned step.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define PYSHARD_HD __host__ __device__
#else
#define PYSHARD_HD
#endif

namespace pyshard {

using i64 = std::int64_t;

constexpr int kMaxDims = 6;

struct CopyDesc {
  i64 src_off;  // byte offset of run 0 in the source
  i64 dst_off;  // byte offset of run 0 in the destination
  i64 run;      // bytes per contiguous run
  i64 runs;     // number of runs: the product of ext[0..nd)
  i64 nd;       // looped dims, outermost first
  i64 align;    // largest of 16, 8, 4, 2, 1 dividing run, both offsets and every stride
  i64 ext[kMaxDims];
  i64 sstr[kMaxDims];  // byte strides of the looped dims in the source
  i64 dstr[kMaxDims];  // ... and in the destination
};

// Byte offsets of run `r` of `d` in the source and the destination.
PYSHARD_HD inline void run_offsets(const CopyDesc& d, i64 r, i64* so, i64* to) {
  i64 s = d.src_off, t = d.dst_off;
  for (int k = static_cast<int>(d.nd) - 1; k >= 0; --k) {
    const i64 q = r / d.ext[k];
    const i64 i = r - q * d.ext[k];
    r = q;
    s += i * d.sstr[k];
    t += i * d.dstr[k];
  }
  *so = s;
  *to = t;
}

// Call f(src_offset, dst_offset) for every run of `d`, in order (host odometer: no division).
template <class F>
inline void for_each_run(const CopyDesc& d, F&& f) {
  if (d.runs == 0) return;
  if (d.nd == 0) {
    f(d.src_off, d.dst_off);
    return;
  }
  if (d.nd == 1) {
    i64 s = d.src_off, t = d.dst_off;
    for (i64 i = 0; i < d.ext[0]; ++i, s += d.sstr[0], t += d.dstr[0]) f(s, t);
    return;
  }
  if (d.nd == 2) {  // a 3-D face: the common case after 1, as plain nested loops
    i64 s0 = d.src_off, t0 = d.dst_off;
    for (i64 i = 0; i < d.ext[0]; ++i, s0 += d.sstr[0], t0 += d.dstr[0]) {
      i64 s = s0, t = t0;
      for (i64 j = 0; j < d.ext[1]; ++j, s += d.sstr[1], t += d.dstr[1]) f(s, t);
    }
    return;
  }
  i64 idx[kMaxDims] = {0};
  const int nd = static_cast<int>(d.nd);
  i64 s = d.src_off, t = d.dst_off;
  while (true) {
    f(s, t);
    int j = nd - 1;
    for (; j >= 0; --j) {
      if (++idx[j] < d.ext[j]) {
        s += d.sstr[j];
        t += d.dstr[j];
        break;
      }
      s -= (d.ext[j] - 1) * d.sstr[j];
      t -= (d.ext[j] - 1) * d.dstr[j];
      idx[j] = 0;
    }
    if (j < 0) return;
  }
}

// The host copy of one descriptor. Short runs of a fixed size (a column of a row-major array,
// a periodic wrap of a thin face: one element per run) copy with a constant-size memcpy that
// the compiler inlines into one load and store: a libc call per 8-byte run cost 5.5 ns, 4x
// the copy itself (a 192x192x2 float32 face: 204 us -> see docs/performance.md).
template <size_t N>
inline void copy_runs_of(const CopyDesc& d, const char* src, char* dst) {
  for_each_run(d, [&](i64 s, i64 t) { std::memcpy(dst + t, src + s, N); });
}

inline void copy_host(const CopyDesc& d, const char* src, char* dst) {
  switch (d.run) {
    case 1: return copy_runs_of<1>(d, src, dst);
    case 2: return copy_runs_of<2>(d, src, dst);
    case 4: return copy_runs_of<4>(d, src, dst);
    case 8: return copy_runs_of<8>(d, src, dst);
    case 12: return copy_runs_of<12>(d, src, dst);
    case 16: return copy_runs_of<16>(d, src, dst);
    case 24: return copy_runs_of<24>(d, src, dst);
    case 32: return copy_runs_of<32>(d, src, dst);
    default: break;
  }
  const size_t n = static_cast<size_t>(d.run);
  for_each_run(d, [&](i64 s, i64 t) { std::memcpy(dst + t, src + s, n); });
}

// Descriptors of one shape (the same looped dims, extents, strides and run) walked by one
// odometer, a run of each in turn. The periodic wraps of a thin face onto a rank itself (the
// low ghosts from the high interior and the high ghosts from the low) touch the same rows,
// far apart (a row each, of a large array): walked together each row's pages and lines are
// fetched once instead of once per box.
inline bool same_walk(const CopyDesc& a, const CopyDesc& b) {
  if (a.nd != b.nd || a.run != b.run || a.runs != b.runs) return false;
  for (i64 k = 0; k < a.nd; ++k)
    if (a.ext[k] != b.ext[k] || a.sstr[k] != b.sstr[k] || a.dstr[k] != b.dstr[k]) return false;
  return true;
}

template <size_t N, class G>
inline void copy_together_of(const CopyDesc& d, const G& delta, size_t k, const char* src,
                             char* dst) {
  for_each_run(d, [&](i64 s, i64 t) {
    for (size_t j = 0; j < k; ++j) std::memcpy(dst + t + delta[j][1], src + s + delta[j][0], N);
  });
}

// The k descriptors ds[0..k) (same_walk of each other), from src to dst.
inline void copy_host_together(const CopyDesc* const* ds, size_t k, const char* src,
                               char* dst) {
  constexpr size_t kMax = 8;
  if (k == 1 || k > kMax) {
    for (size_t j = 0; j < k; ++j) copy_host(*ds[j], src, dst);
    return;
  }
  const CopyDesc& d = *ds[0];
  i64 delta[kMax][2];
  for (size_t j = 0; j < k; ++j) {
    delta[j][0] = ds[j]->src_off - d.src_off;
    delta[j][1] = ds[j]->dst_off - d.dst_off;
  }
  switch (d.run) {
    case 4: return copy_together_of<4>(d, delta, k, src, dst);
    case 8: return copy_together_of<8>(d, delta, k, src, dst);
    case 16: return copy_together_of<16>(d, delta, k, src, dst);
    case 32: return copy_together_of<32>(d, delta, k, src, dst);
    default: break;
  }
  const size_t n = static_cast<size_t>(d.run);
  for_each_run(d, [&](i64 s, i64 t) {
    for (size_t j = 0; j < k; ++j) std::memcpy(dst + t + delta[j][1], src + s + delta[j][0], n);
  });
}

}  // namespace pyshard
