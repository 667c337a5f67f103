// Block geometry of a planned step, computed once when the step is built: which box of the
// local array goes to (or comes from) which peer, whether it is one contiguous run, and the
// descriptor tables (box.h) that the packers copy from. Plain data, no MPI, no CUDA.
#pragma once

#include <memory>
#include <tuple>
#include <vector>

#include "box.h"

namespace pyshard {

using Shape = std::vector<i64>;

i64 volume(const Shape& ext);

// Round up to a multiple of 4 KiB: packed blocks start page-aligned in the workspace
// (MPICH copies them faster).
inline i64 align_up(i64 v) { return (v + 4095) & ~i64(4095); }

// A large block at an offset that is not a multiple of 64 bytes is staged through the
// page-aligned workspace: MPICH moved a misaligned 64 MiB block 1.5x slower than an aligned
// one (38 vs 25 ms), more than the extra copy costs.
inline bool misaligned(i64 offset, i64 bytes) { return bytes >= (i64(1) << 20) && offset % 64 != 0; }

// Is the box one contiguous run of the C-contiguous array `shape`? Its byte offset either way.
bool box_contiguous(const Shape& shape, const Shape& start, const Shape& ext, i64 item,
                    i64* offset);

// Append descriptors for copying box `ext` at `sstart` of a C-contiguous `sshape` array into
// the box at `dstart` of a C-contiguous `dshape` array; offsets are relative to the two
// arrays' bases plus `sbase` / `dbase` bytes. An empty box appends nothing; a box with more
// than kMaxDims looped dims after merging is split along its outer dims.
void describe_copy(const Shape& sshape, const Shape& sstart, const Shape& dshape,
                   const Shape& dstart, const Shape& ext, i64 item, i64 sbase, i64 dbase,
                   std::vector<CopyDesc>* out);

// Split runs longer than `chunk` bytes into chunks (an extra looped dim), so that a CUDA warp
// never copies more than `chunk` bytes per run; a remainder becomes its own descriptor.
std::vector<CopyDesc> split_runs(const std::vector<CopyDesc>& in, i64 chunk);

// A descriptor table: the host copy, and (once uploaded by a device packer) a device copy.
struct DescTable {
  std::vector<CopyDesc> host;
  std::vector<size_t> first;  // first[i]..first[i+1]: the descriptors of block i
  // the device copy (runs split for the kernel), uploaded on first use by a device packer
  mutable std::shared_ptr<void> device;
  mutable std::vector<size_t> device_first;
  mutable i64 device_max_runs = 0;
  size_t blocks() const { return first.empty() ? 0 : first.size() - 1; }
  void begin_block() {
    if (first.empty()) first.push_back(0);
  }
  void end_block() { first.push_back(host.size()); }
};

// How Python hands block lists to the geometries.
using BlockSpec = std::tuple<int, Shape, Shape>;  // (peer, start, extent)
using LocalSpec = std::tuple<Shape, Shape, Shape>;  // (src start, dst start, extent)
using BoxSpec = std::tuple<Shape, Shape>;  // (start, extent)

// One block of an exchange: a peer (rank in the step's communicator), the box in this rank's
// local array, its bytes, where it sits in the array when contiguous, and where it sits in the
// packed workspace.
struct Block {
  int peer;
  Shape start;
  Shape ext;
  i64 bytes = 0;
  i64 array_off = 0;
  bool contiguous = false;
  i64 ws_off = 0;
};

}  // namespace pyshard
