#include "shm_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace pyshard::shm {

namespace {

// Copy n bytes with streaming (non-temporal) stores where it pays: the destination is another
// rank's result or this rank's fresh one, not read by this core soon, and a streaming store
// skips reading each destination line first (the read-for-ownership a plain store makes).
// glibc's memcpy streams only copies larger than the cache; the runs here are rows of a
// block (kilobytes). Ordered before the arrival flag by the sfence in copy_interleaved().
inline void stream_run(char* dst, const char* src, size_t n) {
#if defined(__x86_64__)
  if (n >= 256) {
    const size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    auto* d = reinterpret_cast<__m128i*>(dst);
    auto* q = reinterpret_cast<const __m128i*>(src);
    size_t k = n / 64;
    for (; k; --k, d += 4, q += 4) {
      const __m128i a = _mm_loadu_si128(q), b = _mm_loadu_si128(q + 1);
      const __m128i c = _mm_loadu_si128(q + 2), e = _mm_loadu_si128(q + 3);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
    const size_t done = n / 64 * 64;
    std::memcpy(dst + done, src + done, n - done);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// The common case of copy_interleaved: every cursor loops over the same dims (counts and
// source strides), as the blocks of a transpose for each peer and the own one do: pieces of
// the same source rows. Copied row by row, each row's pieces in turn, with one odometer.
bool same_loops(const std::vector<Cursor>& cs) {
  const CopyDesc& a = *cs[0].d;
  if (a.nd < 1) return false;
  for (const Cursor& c : cs) {
    const CopyDesc& d = *c.d;
    if (d.nd != a.nd) return false;
    for (int j = 0; j < static_cast<int>(a.nd); ++j)
      if (d.ext[j] != a.ext[j] || d.sstr[j] != a.sstr[j]) return false;
  }
  return true;
}

void copy_rows(std::vector<Cursor>& cs, const char* src) {
  const CopyDesc& a = *cs[0].d;
  const int in = static_cast<int>(a.nd) - 1;
  const i64 rows = a.ext[in], sstr = a.sstr[in];
  i64 idx[kMaxDims] = {0};
  for (i64 o = a.runs / rows; o > 0; --o) {
    const char* row = src;
    for (i64 i = 0; i < rows; ++i, row += sstr)
      for (Cursor& c : cs) {
        const CopyDesc& d = *c.d;
        const size_t n = static_cast<size_t>(d.run);
        if (d.run >= kStreamRun)
          stream_run(c.dst + c.t, row + c.s, n);
        else
          std::memcpy(c.dst + c.t, row + c.s, n);
        c.t += d.dstr[in];
      }
    for (Cursor& c : cs) c.t -= rows * c.d->dstr[in];
    // the outer dims' odometer, shared by every cursor (box.h's for_each_run walks one
    // descriptor through a callback: here one walk steps every cursor's destination)
    for (int j = in - 1; j >= 0; --j) {
      if (++idx[j] < a.ext[j]) {
        src += a.sstr[j];
        for (Cursor& c : cs) c.t += c.d->dstr[j];
        break;
      }
      src -= (a.ext[j] - 1) * a.sstr[j];
      for (Cursor& c : cs) c.t -= (a.ext[j] - 1) * c.d->dstr[j];
      idx[j] = 0;
    }
  }
}

}  // namespace

void copy_interleaved(std::vector<Cursor>& cs, const char* src) {
  if (cs.empty()) return;
  // the pieces in source order (the own piece among the peers'): a transpose's rows read from
  // left to right. Measured (200 transposes at 4 ranks, redistribute_many): 16.0 ms a call,
  // 19.5 with the own piece after the peers'
  std::sort(cs.begin(), cs.end(), [](const Cursor& a, const Cursor& b) { return a.s < b.s; });
  if (same_loops(cs)) {
    copy_rows(cs, src);
#if defined(__x86_64__)
    _mm_sfence();
#endif
    return;
  }
  bool streamed = false, more = true;
  while (more) {
    more = false;
    for (Cursor& c : cs) {
      if (c.left == 0) continue;
      const CopyDesc& d = *c.d;
      const size_t n = static_cast<size_t>(d.run);
      const bool stream = d.run >= kStreamRun;
      streamed |= stream;
      const int nd = static_cast<int>(d.nd);
      if (stream)
        stream_run(c.dst + c.t, src + c.s, n);
      else
        std::memcpy(c.dst + c.t, src + c.s, n);
      // the odometer of box.h's for_each_run, kept here on purpose: each cursor is one walk
      // suspended after each run (for_each_run runs a whole descriptor through its callback
      // at once), and this loop is the copy's inner loop (200 transposes at memcpy speed), so
      // it stays inline over the cursor's own index rather than a shared stepping function
      for (int j = nd - 1; j >= 0; --j) {
        if (++c.idx[j] < d.ext[j]) {
          c.s += d.sstr[j];
          c.t += d.dstr[j];
          break;
        }
        c.s -= (d.ext[j] - 1) * d.sstr[j];
        c.t -= (d.ext[j] - 1) * d.dstr[j];
        c.idx[j] = 0;
      }
      --c.left;
      if (c.left) more = true;
    }
  }
#if defined(__x86_64__)
  if (streamed) _mm_sfence();
#else
  (void)streamed;
#endif
}

void add_cursors(std::vector<Cursor>& cs, const DescTable& t, const char* src, char* dst) {
  for (const CopyDesc& d : t.host) {
    if (d.runs == 0) continue;
    if (d.run < 64) {
      copy_host(d, src, dst);
      continue;
    }
    Cursor c{};
    c.d = &d;
    c.dst = dst;
    c.left = d.runs;
    c.s = d.src_off;
    c.t = d.dst_off;
    cs.push_back(c);
  }
}

void copy_contiguous(char* dst, const char* src, i64 n) {
  if (n >= kStreamRun)
    stream_run(dst, src, static_cast<size_t>(n));
  else if (n > 0)
    std::memcpy(dst, src, static_cast<size_t>(n));
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace pyshard::shm
