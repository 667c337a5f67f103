// pyshard._core.copy_kernel_on_host: the host harness of the CUDA copy kernel
// (kernel_harness.h) for the tests, on descriptor tables built as the steps build them:
// from boxes (describe_copy, one table block per list of boxes) or from a geometry's tables.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "bindings_common.h"
#include "halo.h"
#include "kernel_harness.h"
#include "shm_copy.h"
#include "steps.h"

namespace py = pybind11;

namespace pyshard {

namespace {

struct Bytes {
  char* ptr;
  i64 n;
};

// The bytes of a C-contiguous array from byte `offset` on (to make misaligned pointers).
Bytes bytes_of(const py::array& a, i64 offset, bool writable, const char* name) {
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string("pyshard: ") + name + " must be C-contiguous");
  if (writable && !a.writeable())
    throw std::invalid_argument(std::string("pyshard: ") + name + " must be writable");
  const i64 n = static_cast<i64>(a.nbytes());
  if (offset < 0 || offset > n)
    throw std::out_of_range(std::string("pyshard: ") + name + " offset outside the buffer");
  return {static_cast<char*>(const_cast<void*>(a.data())) + offset, n - offset};
}

py::object run(const DescTable& t, const py::array& src, py::array& dst,
               std::optional<size_t> b1_, size_t b0, i64 src_offset, i64 dst_offset,
               bool kernel) {
  const Bytes s = bytes_of(src, src_offset, false, "source");
  const Bytes d = bytes_of(dst, dst_offset, true, "destination");
  const size_t b1 = b1_ ? *b1_ : t.blocks();
  if (!kernel) {  // the host packer, as the steps run it on host arrays: the oracle
    if (b0 > t.blocks() || b1 > t.blocks())
      throw std::out_of_range("pyshard: block range outside the descriptor table");
    py::gil_scoped_release nogil;
    host_packer().copy(t, b0, b1, s.ptr, d.ptr);
    return py::none();
  }
  CopyKernelReport r;
  {
    py::gil_scoped_release nogil;
    r = copy_kernel_on_host(t, b0, b1, s.ptr, s.n, d.ptr, d.n);
  }
  py::dict out;
  out["launched"] = r.launch.n > 0;
  out["grid"] = py::make_tuple(r.launch.grid_x, r.launch.grid_y);
  out["block"] = r.launch.block_x;
  out["threads"] = r.launch.threads();
  out["first"] = r.launch.first;
  out["descriptors"] = r.launch.n;
  out["table_descriptors"] = r.table_descriptors;
  out["max_runs"] = r.max_runs;
  out["runs"] = r.runs;
  out["max_run"] = r.max_run;
  py::dict widths;
  const int w[5] = {16, 8, 4, 2, 1};
  for (int i = 0; i < 5; ++i) widths[py::int_(w[i])] = r.widths[i];
  out["widths"] = widths;
  return std::move(out);
}

Shape shape_of(const py::handle& h) { return h.cast<Shape>(); }

// blocks: one list of boxes per table block; a box is (src_shape, src_start, dst_shape,
// dst_start, extent) or the same plus (src_base, dst_base) byte offsets.
DescTable table_from_boxes(const py::sequence& blocks, i64 item) {
  if (item <= 0) throw std::invalid_argument("pyshard: itemsize must be positive");
  DescTable t;
  for (const py::handle& blk : blocks) {
    t.begin_block();
    for (const py::handle& bx : blk.cast<py::sequence>()) {
      const py::sequence box = bx.cast<py::sequence>();
      if (box.size() != 5 && box.size() != 7)
        throw std::invalid_argument(
            "pyshard: a box is (src_shape, src_start, dst_shape, dst_start, extent"
            "[, src_base, dst_base])");
      const Shape ss = shape_of(box[0]), s0 = shape_of(box[1]), ds = shape_of(box[2]),
                  d0 = shape_of(box[3]), ext = shape_of(box[4]);
      const size_t nd = ext.size();
      if (ss.size() != nd || s0.size() != nd || ds.size() != nd || d0.size() != nd)
        throw std::invalid_argument("pyshard: a box's shapes and starts disagree in rank");
      const i64 sb = box.size() == 7 ? box[5].cast<i64>() : 0;
      const i64 db = box.size() == 7 ? box[6].cast<i64>() : 0;
      describe_copy(ss, s0, ds, d0, ext, item, sb, db, &t.host);
    }
    t.end_block();
  }
  t.begin_block();  // as the geometries: an empty table has blocks() == 0
  return t;
}

template <class G>
const DescTable& table_of(const G& g, const std::string& name);

template <>
const DescTable& table_of(const ExchangeGeometry& g, const std::string& name) {
  if (name == "pack") return g.pack;
  if (name == "unpack") return g.unpack;
  if (name == "local") return g.local;
  throw std::invalid_argument("pyshard: an ExchangeGeometry's tables: pack, unpack, local");
}

template <>
const DescTable& table_of(const GatherGeometry& g, const std::string& name) {
  if (name == "unpack") return g.unpack;
  throw std::invalid_argument("pyshard: a GatherGeometry's table: unpack");
}

template <>
const DescTable& table_of(const ScatterGeometry& g, const std::string& name) {
  if (name == "pack") return g.pack;
  throw std::invalid_argument("pyshard: a ScatterGeometry's table: pack");
}

template <>
const DescTable& table_of(const HaloGeometry& g, const std::string& name) {
  if (name == "pack") return g.pack;
  if (name == "unpack") return g.unpack;
  if (name == "unpack_packed") return g.unpack_packed;
  if (name == "local") return g.local;
  if (name == "local_unpack") return g.local_unpack;
  throw std::invalid_argument(
      "pyshard: a HaloGeometry's tables: pack, unpack, unpack_packed, local, local_unpack");
}

// The fold-combine kernel on the host (kernel=True) or the host fold (fold_combine: the
// oracle), over blocks [b0, b1) of `t`; dst may be src itself (same=True: a fold's wraps).
py::object run_combine(const DescTable& t, int kind, int op, const py::array& src,
                       py::array& dst, std::optional<size_t> b1_, size_t b0, bool same,
                       bool kernel) {
  if (kind < -1 || kind > 11) throw std::invalid_argument("pyshard: unknown fold element kind");
  if (op < 0 || op > 2) throw std::invalid_argument("pyshard: unknown fold op");
  const Bytes d = bytes_of(dst, 0, true, "destination");
  const Bytes s = same ? d : bytes_of(src, 0, false, "source");
  const size_t b1 = b1_ ? *b1_ : t.blocks();
  const auto k = static_cast<FoldKind>(kind);
  const auto o = static_cast<FoldOp>(op);
  if (!kernel) {
    if (b0 > t.blocks() || b1 > t.blocks())
      throw std::out_of_range("pyshard: block range outside the descriptor table");
    py::gil_scoped_release nogil;
    fold_combine(k, o, t, b0, b1, s.ptr, d.ptr);
    return py::none();
  }
  i64 launches;
  {
    py::gil_scoped_release nogil;
    launches = combine_kernel_on_host(k, o, t, b0, b1, s.ptr, s.n, d.ptr, d.n);
  }
  return py::int_(launches);
}

template <class G>
void def_geometry(py::module_& m) {
  m.def(
      "copy_kernel_on_host",
      [](const G& g, const std::string& table, const py::array& src, py::array& dst,
         size_t b0, std::optional<size_t> b1, i64 src_offset, i64 dst_offset, bool kernel) {
        return run(table_of(g, table), src, dst, b1, b0, src_offset, dst_offset, kernel);
      },
      py::arg("geometry"), py::arg("table"), py::arg("src"), py::arg("dst"), py::arg("b0") = 0,
      py::arg("b1") = py::none(), py::arg("src_offset") = 0, py::arg("dst_offset") = 0,
      py::arg("kernel") = true);
  m.def(
      "combine_kernel_on_host",
      [](const G& g, const std::string& table, int kind, int op, const py::array& src,
         py::array& dst, size_t b0, std::optional<size_t> b1, bool same, bool kernel) {
        return run_combine(table_of(g, table), kind, op, src, dst, b1, b0, same, kernel);
      },
      py::arg("geometry"), py::arg("table"), py::arg("kind"), py::arg("op"), py::arg("src"),
      py::arg("dst"), py::arg("b0") = 0, py::arg("b1") = py::none(), py::arg("same") = false,
      py::arg("kernel") = true);
}

using bind::Buf;
using bind::get_buf;
using bind::check_shape;

// Copy a box with the host packer through descriptors (`offsets`: through run_offsets, the
// index math of the CUDA kernels), for local steps and tests.
void py_copy_box(const py::array& src, const Shape& sstart, py::array& dst, const Shape& dstart,
                 const Shape& ext, bool offsets) {
  Buf s = get_buf(src, false, "source");
  Buf d = get_buf(dst, true, "destination");
  const size_t nd = ext.size();
  if (s.item != d.item || s.shape.size() != nd || d.shape.size() != nd || sstart.size() != nd ||
      dstart.size() != nd)
    throw std::invalid_argument("pyshard: copy_box arguments disagree in rank or itemsize");
  for (size_t k = 0; k < nd; ++k)
    if (ext[k] < 0 || sstart[k] < 0 || dstart[k] < 0 || sstart[k] + ext[k] > s.shape[k] ||
        dstart[k] + ext[k] > d.shape[k])
      throw std::out_of_range("pyshard: copy_box box outside the array");
  std::vector<CopyDesc> descs;
  describe_copy(s.shape, sstart, d.shape, dstart, ext, s.item, 0, 0, &descs);
  py::gil_scoped_release nogil;
  if (offsets) descs = split_runs(descs, 64);  // exercise chunked runs as the GPU sees them
  for (const CopyDesc& c : descs) {
    if (!offsets) {
      copy_host(c, s.ptr, d.ptr);
      continue;
    }
    for (i64 r = 0; r < c.runs; ++r) {
      i64 so, to;
      run_offsets(c, r, &so, &to);
      std::memcpy(d.ptr + to, s.ptr + so, static_cast<size_t>(c.run));
    }
  }
}

// dst = src, both C-contiguous with the same byte count, by streaming (non-temporal) stores
// where the copy is long (shm::copy_contiguous, as the node transport writes its results):
// the floor of the benches, the fastest copy of the same bytes on this machine, where glibc's
// memcpy streams only past its threshold (114 MiB on a VM that reports a 300 MiB L3).
void py_stream_copy(const py::array& src, py::array& dst) {
  Buf s = get_buf(src, false, "source");
  Buf d = get_buf(dst, true, "destination");
  const i64 n = static_cast<i64>(src.nbytes());
  if (n != static_cast<i64>(dst.nbytes()))
    throw std::invalid_argument("pyshard: stream_copy: source and destination sizes differ");
  py::gil_scoped_release nogil;
  shm::copy_contiguous(d.ptr, s.ptr, n);
  shm::store_fence();
}

}  // namespace

void bind_kernels_on_host(py::module_& m) {
  m.def("stream_copy", &py_stream_copy, py::arg("src"), py::arg("dst"));
  m.def("copy_box", &py_copy_box, py::arg("src"), py::arg("src_start"), py::arg("dst"),
        py::arg("dst_start"), py::arg("extent"), py::arg("offsets") = false);
  def_geometry<ExchangeGeometry>(m);
  def_geometry<GatherGeometry>(m);
  def_geometry<ScatterGeometry>(m);
  def_geometry<HaloGeometry>(m);
  m.def(
      "halo_copy_local",
      [](const HaloGeometry& g, const py::array& src, py::array& dst) {
        Buf s = get_buf(src, false, "source");
        Buf d = get_buf(dst, true, "destination");
        check_shape(s, g.shape, "the source");
        check_shape(d, g.shape, "the destination");
        py::gil_scoped_release nogil;
        g.copy_local(host_packer(), s.ptr, d.ptr);
      },
      py::arg("geometry"), py::arg("src"), py::arg("dst"),
      "Copy a halo geometry's local boxes from src to dst (padded arrays of its shape) as an "
      "update copies its wraps; for the bench's copy floor.");
  m.def(
      "copy_kernel_on_host",
      [](const py::sequence& blocks, i64 itemsize, const py::array& src, py::array& dst,
         size_t b0, std::optional<size_t> b1, i64 src_offset, i64 dst_offset, bool kernel) {
        const DescTable t = table_from_boxes(blocks, itemsize);
        return run(t, src, dst, b1, b0, src_offset, dst_offset, kernel);
      },
      py::arg("blocks"), py::arg("itemsize"), py::arg("src"), py::arg("dst"), py::arg("b0") = 0,
      py::arg("b1") = py::none(), py::arg("src_offset") = 0, py::arg("dst_offset") = 0,
      py::arg("kernel") = true,
      "Run the CUDA copy kernel's body on the host over its whole launch grid: blocks [b0, b1) "
      "of a descriptor table (from boxes, or a geometry's 'pack'/'unpack'/'local' table), from "
      "src + src_offset to dst + dst_offset (bytes), with the device table and grid the CUDA "
      "packer would use; returns what was launched. kernel=False: the host packer instead.");
  m.def(
      "combine_kernel_on_host",
      [](const py::sequence& blocks, i64 itemsize, int kind, int op, const py::array& src,
         py::array& dst, size_t b0, std::optional<size_t> b1, bool same, bool kernel) {
        const DescTable t = table_from_boxes(blocks, itemsize);
        return run_combine(t, kind, op, src, dst, b1, b0, same, kernel);
      },
      py::arg("blocks"), py::arg("itemsize"), py::arg("kind"), py::arg("op"), py::arg("src"),
      py::arg("dst"), py::arg("b0") = 0, py::arg("b1") = py::none(), py::arg("same") = false,
      py::arg("kernel") = true,
      "Run the CUDA fold-combine kernel's body (combine_kernel.h) on the host: dst = op(dst, "
      "src) over blocks [b0, b1) of a descriptor table (from boxes, or a geometry's table), "
      "one launch a descriptor in table order, as the CUDA packer runs a fold; same=True "
      "combines within dst (src is ignored: a fold's wraps). kind: FoldKind (0 float32, 1 "
      "float64, 2-9 int8..uint64, 10 complex64, 11 complex128), op: 0 sum, 1 max, 2 min. "
      "Returns the launches; kernel=False runs the host fold instead (the oracle).");
}

}  // namespace pyshard
