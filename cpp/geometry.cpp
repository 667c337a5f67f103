#include "geometry.h"

#include <algorithm>

namespace pyshard {

i64 volume(const Shape& ext) {
  i64 v = 1;
  for (i64 e : ext) v *= e;
  return v;
}

bool box_contiguous(const Shape& shape, const Shape& start, const Shape& ext, i64 item,
                    i64* offset) {
  const int nd = static_cast<int>(shape.size());
  i64 off = 0, stride = item;
  for (int k = nd - 1; k >= 0; --k) {
    off += start[k] * stride;
    stride *= shape[k];
  }
  *offset = off;
  if (volume(ext) == 0) return true;
  // the first dim (from the outside) whose extent is > 1; every dim after it must be whole
  int k = 0;
  while (k < nd && ext[k] == 1) ++k;
  for (int j = k + 1; j < nd; ++j)
    if (ext[j] != shape[j]) return false;
  return true;
}

namespace {

i64 alignment_of(i64 v) {
  for (i64 a : {16, 8, 4, 2})
    if (v % a == 0) return a;
  return 1;
}

struct Loop {
  i64 ext, sstr, dstr;
};

void emit(const std::vector<Loop>& loops, i64 soff, i64 doff, i64 run,
          std::vector<CopyDesc>* out) {
  if (static_cast<int>(loops.size()) > kMaxDims) {  // split the outermost looped dim
    std::vector<Loop> inner(loops.begin() + 1, loops.end());
    for (i64 i = 0; i < loops[0].ext; ++i)
      emit(inner, soff + i * loops[0].sstr, doff + i * loops[0].dstr, run, out);
    return;
  }
  CopyDesc d{};
  d.src_off = soff;
  d.dst_off = doff;
  d.run = run;
  d.nd = static_cast<i64>(loops.size());
  d.runs = 1;
  i64 a = alignment_of(run) < alignment_of(soff) ? alignment_of(run) : alignment_of(soff);
  a = std::min(a, alignment_of(doff));
  for (size_t k = 0; k < loops.size(); ++k) {
    d.ext[k] = loops[k].ext;
    d.sstr[k] = loops[k].sstr;
    d.dstr[k] = loops[k].dstr;
    d.runs *= loops[k].ext;
    a = std::min({a, alignment_of(loops[k].sstr), alignment_of(loops[k].dstr)});
  }
  d.align = a;
  out->push_back(d);
}

}  // namespace

void describe_copy(const Shape& sshape, const Shape& sstart, const Shape& dshape,
                   const Shape& dstart, const Shape& ext, i64 item, i64 sbase, i64 dbase,
                   std::vector<CopyDesc>* out) {
  const int nd = static_cast<int>(ext.size());
  for (i64 e : ext)
    if (e == 0) return;
  std::vector<i64> sstr(nd), dstr(nd);
  i64 s = item, t = item;
  for (int k = nd - 1; k >= 0; --k) {
    sstr[k] = s;
    dstr[k] = t;
    s *= sshape[k];
    t *= dshape[k];
  }
  i64 soff = sbase, doff = dbase;
  for (int k = 0; k < nd; ++k) {
    soff += sstart[k] * sstr[k];
    doff += dstart[k] * dstr[k];
  }
  // the innermost contiguous run: trailing dims whole on both sides, plus the next one
  i64 run = item;
  int k = nd - 1;
  for (; k >= 0; --k) {
    run *= ext[k];
    if (ext[k] != sshape[k] || ext[k] != dshape[k]) break;
  }
  // dims [0, k) are looped; extent-1 dims drop out
  std::vector<Loop> loops;
  for (int j = 0; j < k; ++j) {
    if (ext[j] == 1) continue;
    loops.push_back({ext[j], sstr[j], dstr[j]});
  }
  // merge a dim into the one inside it when both sides step over exactly that inner dim
  std::vector<Loop> m2;
  for (int j = static_cast<int>(loops.size()) - 1; j >= 0; --j) {
    const Loop& l = loops[j];
    if (!m2.empty()) {
      Loop& in = m2.back();
      if (l.sstr == in.sstr * in.ext && l.dstr == in.dstr * in.ext) {
        in.ext *= l.ext;
        continue;
      }
    }
    m2.push_back(l);
  }
  std::reverse(m2.begin(), m2.end());
  // a looped dim whose stride equals the run on both sides extends the run
  while (!m2.empty() && m2.back().sstr == run && m2.back().dstr == run) {
    run *= m2.back().ext;
    m2.pop_back();
  }
  emit(m2, soff, doff, run, out);
}

std::vector<CopyDesc> split_runs(const std::vector<CopyDesc>& in, i64 chunk) {
  std::vector<CopyDesc> out;
  out.reserve(in.size());
  for (const CopyDesc& d : in) {
    if (d.run <= chunk || d.nd >= kMaxDims) {
      out.push_back(d);
      continue;
    }
    const i64 n = d.run / chunk, rem = d.run - n * chunk;
    CopyDesc c = d;
    c.ext[c.nd] = n;
    c.sstr[c.nd] = chunk;
    c.dstr[c.nd] = chunk;
    c.nd += 1;
    c.run = chunk;
    c.runs = d.runs * n;
    c.align = std::min(d.align, alignment_of(chunk));
    out.push_back(c);
    if (rem) {
      CopyDesc r = d;
      r.src_off += n * chunk;
      r.dst_off += n * chunk;
      r.run = rem;
      r.align = std::min(d.align, alignment_of(rem));
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace pyshard
