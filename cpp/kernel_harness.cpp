#include "kernel_harness.h"

#include <algorithm>
#include <stdexcept>

#include "combine_kernel.h"

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

i64 combine_kernel_on_host(FoldKind kind, FoldOp op, const DescTable& t, size_t b0, size_t b1,
                           const char* src, i64 src_bytes, char* dst, i64 dst_bytes) {
  if (b0 > t.blocks() || b1 > t.blocks())
    throw std::out_of_range("pyshard: block range outside the descriptor table");
  if (!with_fold_type(kind, op, [](auto, auto) {}))
    throw std::invalid_argument("pyshard: the combine kernel has no combine for this element "
                                "kind and op");
  if (b1 <= b0) return 0;
  const size_t d0 = t.first[b0], d1 = t.first[b1];
  for (size_t i = d0; i < d1; ++i) {
    const CopyDesc& d = t.host[i];
    if (d.runs > 0 &&
        (!inside(d.src_off, d.sstr, d, src_bytes) || !inside(d.dst_off, d.dstr, d, dst_bytes)))
      throw std::out_of_range("pyshard: a descriptor reaches outside the source or destination");
  }
  i64 launches = 0;
  for (size_t i = d0; i < d1; ++i) {
    const CopyDesc& d = t.host[i];
    const KernelLaunch l = combine_launch(d);
    if (l.n == 0) continue;
    ++launches;
    with_fold_type(kind, op, [&](auto tag, auto f) {
      using T = typename decltype(tag)::type;
      for_each_thread(l, [&](const ThreadIndex& at) {
        combine_kernel_thread<T>(d, src, dst, f, at);
      });
    });
  }
  return launches;
}

}  // namespace pyshard
