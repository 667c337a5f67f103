// migrate's local pass alone, against the floor's copy (docs/particles.md, "The pass alone"):
// one process, 10^6 rows in the bench's four columns (24, 24, 8 and 8 bytes a row), a
// fraction of them leaving at random. Times, median of 7 after 2 warm-ups:
//   floor   the staying bytes as one block a column by streaming stores (the bench's floor);
//   runs    migrate's pass (cpp/migrate.cpp pack_t): each run of staying rows memcpy'd a
//           column at a time, each leaver copied to its own buffer;
//   staged  the same rows copied branch-free into a small buffer per column (in L1) that is
//           streamed out whenever it fills (full lines, no read of the destination first);
//   compact the staying rows moved down in place (row by row, every column, branch-free),
//           each leaver copied to its own buffer: a result that is the input compacted. Its
//           input is restored before each pass, then 128 MiB read to push it out of the
//           caches (both untimed).
//   chunked the rows in chunks of 256: one scan of `dest` lists the chunk's staying and
//           leaving rows (branch-free), then each column in turn gathers its staying rows into
//           a small buffer with a copy compiled for the column's row size (one dispatch a
//           chunk and column, not a row: what the core can do for any columns) and streams
//           it out; each leaver copied so too. Reads each chunk's columns while they are in L1.
//   direct  chunked, but the staying rows gathered straight into the result (plain stores).
//   crun    chunked, but the chunk's runs of staying rows listed and each column's runs
//           memcpy'd in turn (the core's runs, one column's stream at a time within a chunk).
// Checks that every variant gives the same bytes (CHUNK=rows sets the chunked ones' chunk, 256). Build and run (THP=1: the buffers are
// advised to use transparent huge pages, as numpy's large arrays are; unset: 4 KiB pages, as
// node-shared memory here):
//   g++ -O3 -march=x86-64-v2 -o /tmp/mpb scripts/migrate_pass_bench.cpp && THP=1 /tmp/mpb 0.1
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using i64 = long long;

static char* buffer(size_t n) {
  const size_t huge = size_t(2) << 20, cap = (n + 64 + huge) / huge * huge;
  void* p = aligned_alloc(huge, cap);
  if (!p) std::abort();
  if (std::getenv("THP")) madvise(p, cap, MADV_HUGEPAGE);
  std::memset(p, 0, cap);  // faulted in: the timed passes write warm pages
  return static_cast<char*>(p);
}

static void stream_copy(char* d, const char* s, i64 bytes) {
  i64 t = 0;
  for (; t < bytes && (reinterpret_cast<uintptr_t>(d + t) & 15); t += 8) {
    long long v;
    std::memcpy(&v, s + t, 8);
    _mm_stream_si64(reinterpret_cast<long long*>(d + t), v);
  }
  for (; t + 16 <= bytes; t += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + t),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + t)));
  for (; t < bytes; t += 8) {
    long long v;
    std::memcpy(&v, s + t, 8);
    _mm_stream_si64(reinterpret_cast<long long*>(d + t), v);
  }
}

template <int SZ>
static void gather_rows(char* out, const char* base, const unsigned short* idx, int m) {
  for (int j = 0; j < m; ++j) std::memcpy(out + j * SZ, base + i64(idx[j]) * SZ, SZ);
}

static void gather_any(char* out, const char* base, const unsigned short* idx, int m, i64 sz) {
  switch (sz) {
    case 4: return gather_rows<4>(out, base, idx, m);
    case 8: return gather_rows<8>(out, base, idx, m);
    case 12: return gather_rows<12>(out, base, idx, m);
    case 16: return gather_rows<16>(out, base, idx, m);
    case 24: return gather_rows<24>(out, base, idx, m);
    case 32: return gather_rows<32>(out, base, idx, m);
    default:
      for (int j = 0; j < m; ++j) std::memcpy(out + j * sz, base + i64(idx[j]) * sz, sz);
  }
}

// A chunk's staying rows (dest 0) into si and its leaving rows into li, branch-free.
static void list_rows(const int* dest, int m, unsigned short* si, int& ns, unsigned short* li,
                      int& nl) {
  for (int j = 0; j < m; ++j) {
    const bool st = dest[j] == 0;
    si[ns] = static_cast<unsigned short>(j);
    li[nl] = static_cast<unsigned short>(j);
    ns += st;
    nl += !st;
  }
}

// The chunked forms: staged (gathered into a buffer in L1, streamed out) or direct.
static void chunked_pass(const int* dest, i64 n, int C, const i64* rb, char* const* src,
                         char* const* dst, char* const* leave, int R, bool staged) {
  alignas(64) static char stage[4096 * 32];
  unsigned short si[4096], li[4096];
  i64 k = 0, L = 0;
  for (i64 i0 = 0; i0 < n; i0 += R) {
    const int m = int(std::min<i64>(R, n - i0));
    int ns = 0, nl = 0;
    list_rows(&dest[i0], m, si, ns, li, nl);
    for (int c = 0; c < C; ++c) {
      const char* base = src[c] + i0 * rb[c];
      if (staged) {
        gather_any(stage, base, si, ns, rb[c]);
        stream_copy(dst[c] + k * rb[c], stage, ns * rb[c]);
      } else {
        gather_any(dst[c] + k * rb[c], base, si, ns, rb[c]);
      }
      gather_any(leave[c] + L * rb[c], base, li, nl, rb[c]);
    }
    k += ns;
    L += nl;
  }
  if (staged) _mm_sfence();
}

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int main(int argc, char** argv) {
  const i64 n = 1000000;
  constexpr int C = 4;
  const i64 rb[C] = {24, 24, 8, 8};
  const double frac = argc > 1 ? std::atof(argv[1]) : 0.1;
  const int chunk_rows = std::getenv("CHUNK") ? std::min(4096, std::atoi(std::getenv("CHUNK"))) : 256;
  char *src[C], *floor_dst[C], *runs_dst[C], *staged_dst[C], *leave[C], *work[C], *chunk_dst[C], *direct_dst[C], *crun_dst[C];
  for (int c = 0; c < C; ++c) {
    src[c] = buffer(n * rb[c]);
    for (i64 i = 0; i < n * rb[c]; ++i) src[c][i] = static_cast<char>(i * 7 + c);
    floor_dst[c] = buffer(n * rb[c]) + 16;  // numpy's large arrays: 16 bytes past a page
    runs_dst[c] = buffer(n * rb[c]) + 16;
    staged_dst[c] = buffer(n * rb[c]) + 16;
    leave[c] = buffer(n * rb[c]);
    work[c] = buffer(n * rb[c]) + 16;
    chunk_dst[c] = buffer(n * rb[c]) + 16;
    direct_dst[c] = buffer(n * rb[c]) + 16;
    crun_dst[c] = buffer(n * rb[c]) + 16;
  }
  std::vector<int> dest(n);
  std::mt19937_64 g(1);
  std::uniform_real_distribution<double> u(0, 1);
  for (i64 i = 0; i < n; ++i) dest[i] = u(g) < frac ? 1 : 0;
  const i64 stay = std::count(dest.begin(), dest.end(), 0);
  std::vector<double> tf, tr, ts, tc, tk, td, tu;
  const i64 flush_bytes = i64(128) << 20;  // read between the restore and compact: past L3
  char* flush = buffer(flush_bytes);
  long flush_sum = 0;
  for (int rep = 0; rep < 9; ++rep) {
    const double t0 = now();
    for (int c = 0; c < C; ++c) stream_copy(floor_dst[c], src[c], stay * rb[c]);
    _mm_sfence();
    const double t1 = now();
    {
      i64 k = 0, i = 0, L = 0;
      while (i < n) {
        if (dest[i] == 0) {
          i64 j = i + 1;
          while (j < n && dest[j] == 0) ++j;
          for (int c = 0; c < C; ++c)
            std::memcpy(runs_dst[c] + k * rb[c], src[c] + i * rb[c], (j - i) * rb[c]);
          k += j - i;
          i = j;
          continue;
        }
        for (int c = 0; c < C; ++c) std::memcpy(leave[c] + L * rb[c], src[c] + i * rb[c], rb[c]);
        ++L;
        ++i;
      }
    }
    const double t2 = now();
    {
      constexpr i64 S = 128;  // rows a staging buffer holds
      alignas(64) static char stage[C][S * 24];
      i64 k = 0, L = 0, ks = 0;
      for (i64 i = 0; i < n; ++i) {
        std::memcpy(stage[0] + ks * 24, src[0] + i * 24, 24);
        std::memcpy(stage[1] + ks * 24, src[1] + i * 24, 24);
        std::memcpy(stage[2] + ks * 8, src[2] + i * 8, 8);
        std::memcpy(stage[3] + ks * 8, src[3] + i * 8, 8);
        if (dest[i] != 0) {
          for (int c = 0; c < C; ++c) std::memcpy(leave[c] + L * rb[c], src[c] + i * rb[c], rb[c]);
          ++L;
        } else if (++ks == S) {
          for (int c = 0; c < C; ++c) stream_copy(staged_dst[c] + k * rb[c], stage[c], S * rb[c]);
          k += S;
          ks = 0;
        }
      }
      for (int c = 0; c < C; ++c) stream_copy(staged_dst[c] + k * rb[c], stage[c], ks * rb[c]);
      _mm_sfence();
    }
    const double t3 = now();
    for (int c = 0; c < C; ++c) std::memcpy(work[c], src[c], n * rb[c]);  // (untimed)
    for (i64 i = 0; i < flush_bytes; i += 64) flush_sum += flush[i];         // (untimed)
    const double t4 = now();
    {
      i64 k = 0, L = 0;
      for (i64 i = 0; i < n; ++i) {
        char a[24], b[24], e[8], f[8];
        std::memcpy(a, work[0] + i * 24, 24);
        std::memcpy(b, work[1] + i * 24, 24);
        std::memcpy(e, work[2] + i * 8, 8);
        std::memcpy(f, work[3] + i * 8, 8);
        std::memcpy(work[0] + k * 24, a, 24);
        std::memcpy(work[1] + k * 24, b, 24);
        std::memcpy(work[2] + k * 8, e, 8);
        std::memcpy(work[3] + k * 8, f, 8);
        std::memcpy(leave[0] + L * 24, a, 24);  // (a staying row's copy is overwritten)
        std::memcpy(leave[1] + L * 24, b, 24);
        std::memcpy(leave[2] + L * 8, e, 8);
        std::memcpy(leave[3] + L * 8, f, 8);
        k += dest[i] == 0;
        L += dest[i] != 0;
      }
    }
    const double t5 = now();
    chunked_pass(dest.data(), n, C, rb, src, chunk_dst, leave, chunk_rows, true);
    const double t6 = now();
    chunked_pass(dest.data(), n, C, rb, src, direct_dst, leave, chunk_rows, false);
    const double t7 = now();
    {
      const int R = chunk_rows;
      unsigned short rs[4097], li[4096];
      i64 k = 0, L = 0;
      for (i64 i0 = 0; i0 < n; i0 += R) {
        const int m = int(std::min<i64>(R, n - i0));
        int nr = 0, nl = 0;
        // run starts and ends as alternating edges: a row that stays after one that leaves
        // (or the chunk's start) opens a run, a leaver after a stayer closes one
        bool prev = false;
        for (int j = 0; j < m; ++j) {
          const bool st = dest[i0 + j] == 0;
          rs[nr] = static_cast<unsigned short>(j);
          nr += st != prev;
          li[nl] = static_cast<unsigned short>(j);
          nl += !st;
          prev = st;
        }
        rs[nr] = static_cast<unsigned short>(m);
        nr += prev;
        for (int c = 0; c < C; ++c) {
          const i64 b = rb[c];
          const char* base = src[c] + i0 * b;
          char* d = crun_dst[c] + k * b;
          for (int r = 0; r + 1 < nr; r += 2) {
            const i64 len = (rs[r + 1] - rs[r]) * b;
            std::memcpy(d, base + rs[r] * b, len);
            d += len;
          }
          gather_any(leave[c] + L * b, base, li, nl, b);
        }
        k += m - nl;
        L += nl;
      }
    }
    const double t8 = now();
    if (rep >= 2) {
      tu.push_back(t8 - t7);
      td.push_back(t7 - t6);
      tk.push_back(t6 - t5);
      tf.push_back(t1 - t0);
      tr.push_back(t2 - t1);
      ts.push_back(t3 - t2);
      tc.push_back(t5 - t4);
    }
  }
  if (flush_sum == 42) std::printf(" ");  // (keeps the flush's reads)
  for (int c = 0; c < C; ++c)
    if (std::memcmp(runs_dst[c], staged_dst[c], stay * rb[c]) != 0 ||
        std::memcmp(runs_dst[c], work[c], stay * rb[c]) != 0 ||
        std::memcmp(runs_dst[c], chunk_dst[c], stay * rb[c]) != 0 ||
        std::memcmp(runs_dst[c], direct_dst[c], stay * rb[c]) != 0 ||
        std::memcmp(runs_dst[c], crun_dst[c], stay * rb[c]) != 0) {
      std::printf("MISMATCH in column %d\n", c);
      return 1;
    }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2] * 1e3;
  };
  std::printf("%s pages, %.0f%% leaving: floor %.2f ms, runs %.2f ms (%.2fx), staged %.2f ms "
              "(%.2fx), compact %.2f ms (%.2fx), chunked %.2f ms (%.2fx), direct %.2f ms (%.2fx), crun %.2f ms (%.2fx)\n",
              std::getenv("THP") ? "huge" : "4 KiB",
              frac * 100, med(tf), med(tr), med(tr) / med(tf), med(ts), med(ts) / med(tf),
              med(tc), med(tc) / med(tf), med(tk), med(tk) / med(tf), med(td),
              med(td) / med(tf), med(tu), med(tu) / med(tf));
  return 0;
}
