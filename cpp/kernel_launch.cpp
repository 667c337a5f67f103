#include "kernel_launch.h"

#include <algorithm>

namespace pyshard {

KernelTable kernel_table(const DescTable& t) {
  KernelTable k;
  k.first.push_back(0);
  for (size_t b = 0; b < t.blocks(); ++b) {
    std::vector<CopyDesc> blk(t.host.begin() + t.first[b], t.host.begin() + t.first[b + 1]);
    for (const CopyDesc& d : split_runs(blk, kRunChunk)) {
      k.descs.push_back(d);
      k.max_runs = std::max(k.max_runs, d.runs);
    }
    k.first.push_back(k.descs.size());
  }
  return k;
}

KernelLaunch copy_launch(const std::vector<size_t>& first, i64 max_runs, size_t b0, size_t b1) {
  KernelLaunch l;
  if (b1 <= b0) return l;
  const size_t d0 = first[b0], d1 = first[b1];
  const int n = static_cast<int>(d1 - d0);
  l.first = d0;
  l.n = n;
  if (n == 0) return l;
  // enough warps for the longest descriptor's runs, but about 4096 blocks in all at most
  const i64 warps_needed = std::max<i64>(1, max_runs);
  const int gx = static_cast<int>(std::min<i64>((warps_needed * 32 + kThreads - 1) / kThreads,
                                                std::max(1, 4096 / std::min(n, 4096))));
  l.grid_x = std::max(gx, 1);
  l.grid_y = std::min(n, 65535);
  l.block_x = kThreads;
  return l;
}

KernelLaunch combine_launch(const CopyDesc& d) {
  KernelLaunch l;
  if (d.runs <= 0 || d.run <= 0) return l;
  l.n = 1;
  const i64 blocks = (d.runs * 32 + kThreads - 1) / kThreads;
  l.grid_x = static_cast<int>(std::min<i64>(std::max<i64>(blocks, 1), 4096));
  l.grid_y = 1;
  l.block_x = kThreads;
  return l;
}

}  // namespace pyshard
