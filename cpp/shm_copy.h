// The node-local transport's copy loops: many blocks over one source copied row by row in
// lockstep (copy_interleaved), streaming stores for long runs, contiguous chunks.
#pragma once

#include <vector>

#include "geometry.h"

namespace pyshard::shm {

// Runs of at least kStreamRun bytes are copied by streaming stores, shorter ones by plain
// stores. Measured: streaming runs of 1-2 KiB (200 transposes at 2 ranks) took 10.0 ms where
// plain stores took 6.6 (the partial lines at both ends of each run); the 8192^2 transpose's
// 8 and 16 KiB runs gain from it.
constexpr i64 kStreamRun = 4096;

// One block of copy_interleaved: a descriptor, its destination base and where it stands.
struct Cursor {
  const CopyDesc* d;
  char* dst;
  i64 left;  // runs still to copy
  i64 s, t;
  i64 idx[kMaxDims];
};

// Several descriptors over one source, copied in lockstep: a run of each in turn, then the
// next run of each. The blocks of a transpose for each peer read the same source rows (each a
// different piece of every row), so each row is read from memory once, in order (the
// prefetcher's pattern), instead of once per destination with a stride. Measured (200
// transposes' blocks, one core): 5.2 ms for 55 MiB, as fast as one memcpy of as many bytes
// (5.1); 8.4 in chunks of 64 KiB of source rows for each destination in turn.
// Each destination is written with streaming stores for runs of at least kStreamRun bytes,
// fenced before it returns.
void copy_interleaved(std::vector<Cursor>& cs, const char* src);

// Add the descriptors of `t` (into `dst`) to `cs`; those of short runs (a few elements: the
// fixed-size copies of copy_host are faster) are copied here and now instead.
void add_cursors(std::vector<Cursor>& cs, const DescTable& t, const char* src, char* dst);

// n contiguous bytes (streaming stores for long ones; store_fence() before they are read)
void copy_contiguous(char* dst, const char* src, i64 n);
void store_fence();

}  // namespace pyshard::shm
