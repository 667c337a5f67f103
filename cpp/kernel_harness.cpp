#include "kernel_harness.h"

#include <algorithm>
#include <stdexcept>

namespace pyshard {

namespace {

// Does every run of `d` lie in [0, bytes) from both ends of the strides?
bool inside(i64 off, const i64* str, const CopyDesc& d, i64 bytes) {
  i64 lo = off, hi = off + d.run;
  for (int k = 0; k < d.nd; ++k) {
    const i64 span = (d.ext[k] - 1) * str[k];
    (span < 0 ? lo : hi) += span;
  }
  return lo >= 0 && hi <= bytes;
}

int width_slot(int w) { return w == 16 ? 0 : w == 8 ? 1 : w == 4 ? 2 : w == 2 ? 3 : 4; }

}  // namespace

CopyKernelReport copy_kernel_on_host(const DescTable& t, size_t b0, size_t b1, const char* src,
                                     i64 src_bytes, char* dst, i64 dst_bytes) {
  if (b0 > t.blocks() || b1 > t.blocks())
    throw std::out_of_range("pyshard: block range outside the descriptor table");
  CopyKernelReport rep;
  if (copies_nothing(t, b0, b1)) return rep;  // as the CUDA packer: no upload, no launch
  const KernelTable k = kernel_table(t);
  const KernelLaunch l = copy_launch(k.first, k.max_runs, b0, b1);
  rep.launch = l;
  rep.table_descriptors = k.descs.size();
  rep.max_runs = k.max_runs;
  if (l.n == 0) return rep;
  const CopyDesc* descs = k.descs.data() + l.first;
  const int ptr_align = pointer_alignment(src, dst);
  for (int i = 0; i < l.n; ++i) {
    const CopyDesc& d = descs[i];
    if (d.runs > 0 &&
        (!inside(d.src_off, d.sstr, d, src_bytes) || !inside(d.dst_off, d.dstr, d, dst_bytes)))
      throw std::out_of_range("pyshard: a descriptor reaches outside the source or destination");
    rep.widths[width_slot(word_width(d.align, ptr_align))] += 1;
    rep.runs += d.runs;
    rep.max_run = std::max(rep.max_run, d.run);
  }
  for_each_thread(l, [&](const ThreadIndex& at) {
    copy_kernel_thread(descs, l.n, src, dst, ptr_align, at);
  });
  return rep;
}

}  // namespace pyshard
