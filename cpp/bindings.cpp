// pyshard._core: the pybind11 bindings of the steps, geometries, packers and workspace pool.
#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fused.h"
#include "halo.h"
#include "shm.h"
#include "steps.h"
#include "tags.h"

namespace pyshard {
void bind_kernels_on_host(pybind11::module_& m);  // bindings_kernels.cpp
}

namespace py = pybind11;
using namespace pyshard;

// The MPI the core is compiled against, from its mpi.h (Intel MPI's and MVAPICH's headers
// define MPICH's macros too, with MPICH's version: look for theirs first).
#define PYSHARD_STR2(x) #x
#define PYSHARD_STR(x) PYSHARD_STR2(x)
#if defined(I_MPI_VERSION)
#define PYSHARD_BUILT_WITH "Intel MPI " I_MPI_VERSION
#elif defined(MVAPICH2_VERSION)
#define PYSHARD_BUILT_WITH "MVAPICH2 " MVAPICH2_VERSION
#elif defined(MVAPICH_VERSION)
#define PYSHARD_BUILT_WITH "MVAPICH " MVAPICH_VERSION
#elif defined(MPICH_VERSION)
#define PYSHARD_BUILT_WITH "MPICH " MPICH_VERSION
#elif defined(OMPI_MAJOR_VERSION)
#define PYSHARD_BUILT_WITH                                                               \
  "Open MPI " PYSHARD_STR(OMPI_MAJOR_VERSION) "." PYSHARD_STR(OMPI_MINOR_VERSION) "." \
      PYSHARD_STR(OMPI_RELEASE_VERSION)
#else
#define PYSHARD_BUILT_WITH "MPI " PYSHARD_STR(MPI_VERSION) "." PYSHARD_STR(MPI_SUBVERSION)
#endif
#ifndef PYSHARD_MPI_COMPILER
#define PYSHARD_MPI_COMPILER ""
#endif
#ifndef PYSHARD_MPI_LIBRARIES
#define PYSHARD_MPI_LIBRARIES ""
#endif

// The same, readable from the file when the module does not load (an MPI library missing
// or different at run time): pyshard/_mpi.py looks for this line in the shared object.
extern "C" __attribute__((used, visibility("default"))) const char pyshard_build_mpi[] =
    "PYSHARD-BUILD-MPI: " PYSHARD_BUILT_WITH "; mpicc " PYSHARD_MPI_COMPILER "; libraries "
    PYSHARD_MPI_LIBRARIES "\n";

namespace {

Transport g_transport[2] = {Transport::direct, Transport::staged};

struct Buf {
  char* ptr;
  Shape shape;
  i64 item;
};

Buf get_buf(const py::array& a, bool writable, const char* name) {
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string("pyshard: ") + name + " must be C-contiguous");
  if (writable && !a.writeable())
    throw std::invalid_argument(std::string("pyshard: ") + name + " must be writable");
  Buf b;
  b.ptr = static_cast<char*>(const_cast<void*>(a.data()));
  b.item = a.itemsize();
  b.shape.assign(a.shape(), a.shape() + a.ndim());
  return b;
}

void check_shape(const Buf& b, const Shape& want, const char* name) {
  if (b.shape != want)
    throw std::invalid_argument(std::string("pyshard: ") + name +
                                " has a shape that does not match the planned layout");
}

MPI_Datatype mpi_type(const py::dtype& dt) {
  const char k = dt.kind();
  const auto n = dt.itemsize();
  if (k == 'b') return MPI_C_BOOL;
  if (k == 'i') return n == 1 ? MPI_INT8_T : n == 2 ? MPI_INT16_T : n == 4 ? MPI_INT32_T : MPI_INT64_T;
  if (k == 'u')
    return n == 1 ? MPI_UINT8_T : n == 2 ? MPI_UINT16_T : n == 4 ? MPI_UINT32_T : MPI_UINT64_T;
  if (k == 'f' && n == 4) return MPI_FLOAT;
  if (k == 'f' && n == 8) return MPI_DOUBLE;
  if (k == 'c' && n == 8) return MPI_C_FLOAT_COMPLEX;
  if (k == 'c' && n == 16) return MPI_C_DOUBLE_COMPLEX;
  throw std::invalid_argument("pyshard: no MPI reduction type for dtype " +
                              std::string(py::str(dt)));
}

// Host arrays: shapes checked here; device pointers: the Python layer checked the arrays.
template <class StepT>
void run_host(StepT& step, const py::array& src, py::array& dst, const Shape* sshape,
              const Shape* dshape) {
  Buf s = get_buf(src, false, "source");
  Buf d = get_buf(dst, true, "destination");
  if (sshape) check_shape(s, *sshape, "source");
  if (dshape) check_shape(d, *dshape, "destination");
  py::gil_scoped_release nogil;
  step.run(s.ptr, d.ptr, host_packer(), g_transport[0]);
}

template <class StepT>
void run_device(StepT& step, std::uintptr_t src, std::uintptr_t dst, std::uintptr_t stream) {
  Packer& pk = cuda_packer();
  py::gil_scoped_release nogil;
  pk.set_stream(stream);
  step.run(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst), pk,
           g_transport[1]);
}

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

// A result buffer from the pool: numpy views it through the buffer protocol; when the last
// array over it goes, the memory returns to the pool (already faulted in).
struct PooledBuffer {
  char* ptr = nullptr;
  i64 cap = 0;
  i64 n = 0;
  explicit PooledBuffer(i64 bytes) : n(bytes) { ptr = ResultPool::get().take(bytes, &cap); }
  ~PooledBuffer() { ResultPool::get().give(ptr, cap); }
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
};

// A result buffer in node-shared memory (the node-local transport's pool): when the last
// array over it goes, the segment returns to the pool of the transport that made it (or is
// unmapped, if that transport was released).
struct ShmBuffer {
  std::shared_ptr<ShmSegment> seg;
  std::weak_ptr<NodeShm> pool;
  i64 n = 0;
  ShmBuffer(std::shared_ptr<NodeShm> node, i64 bytes) : pool(node), n(bytes) {
    seg = node->take(bytes);
  }
  ~ShmBuffer() {
    if (auto p = pool.lock()) p->give(std::move(seg));
  }
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;
};

// A cached redistribute's one call (ShardedArray.redistribute's fast path): a host step that
// runs straight into its output, bound to the result's dtype and shape. Calling it with the
// source and `out` (or None) allocates the result (from the result pool when large), runs the
// step and returns the result; it returns None, having done nothing, when an argument is not
// what the binding expects (not a plain C-contiguous numpy array of the dtype and shape, a
// read-only `out` or one overlapping the source), and the caller takes the general path,
// which says what is wrong. What runs, and its counts, are the step's, fixed by the layouts:
// these checks only decide who allocates. The call is a METH_FASTCALL function (`fn`), not a
// pybind11 method: no argument conversion, no allocation besides the result's.
struct BoundBase {
  virtual ~BoundBase() = default;
  virtual py::object call(PyObject* src, PyObject* out) = 0;
  i64 calls = 0;  // calls that ran here (for tests)
};

template <class StepT>
struct BoundStep : BoundBase {
  py::object owner;  // the step's Python object, which keeps `step` alive
  StepT* step;
  py::dtype dtype;
  std::vector<Py_intptr_t> src_shape, dst_shape;
  i64 nbytes = 0;
  bool pooled = false;

  BoundStep(py::object o, py::dtype dt, bool pool)
      : owner(std::move(o)), step(owner.cast<StepT*>()), dtype(std::move(dt)), pooled(pool) {
    const auto& g = step->geometry();
    src_shape.assign(g.src_shape.begin(), g.src_shape.end());
    dst_shape.assign(g.dst_shape.begin(), g.dst_shape.end());
    nbytes = dtype.itemsize();
    for (auto e : dst_shape) nbytes *= e;
  }

  // `h` as a plain, C-contiguous numpy array of this dtype and `shape`, or nullptr.
  const py::detail::PyArray_Proxy* plain(PyObject* h, const std::vector<Py_intptr_t>& shape) const {
    const auto& api = py::detail::npy_api::get();
    if (Py_TYPE(h) != api.PyArray_Type_) return nullptr;
    const auto* a = py::detail::array_proxy(h);
    if (!(a->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_) ||
        a->nd != static_cast<int>(shape.size()) ||
        !std::equal(shape.begin(), shape.end(), a->dimensions))
      return nullptr;
    if (a->descr != dtype.ptr() && !api.PyArray_EquivTypes_(a->descr, dtype.ptr())) return nullptr;
    return a;
  }

  py::object result() const {
    const auto& api = py::detail::npy_api::get();
    const int nd = static_cast<int>(dst_shape.size());
    if (!pooled) {
      PyObject* r = api.PyArray_NewFromDescr_(api.PyArray_Type_, dtype.inc_ref().ptr(), nd,
                                              dst_shape.data(), nullptr, nullptr, 0, nullptr);
      if (!r) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(r);
    }
    auto* pb = new PooledBuffer(nbytes);
    py::object base = py::cast(pb, py::return_value_policy::take_ownership);
    const int flags = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ |
                      py::detail::npy_api::NPY_ARRAY_ALIGNED_ |
                      py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    PyObject* r = api.PyArray_NewFromDescr_(api.PyArray_Type_, dtype.inc_ref().ptr(), nd,
                                            dst_shape.data(), nullptr, pb->ptr, flags, nullptr);
    if (!r) throw py::error_already_set();
    auto arr = py::reinterpret_steal<py::object>(r);
    if (api.PyArray_SetBaseObject_(r, base.release().ptr()) != 0) throw py::error_already_set();
    return arr;
  }

  py::object call(PyObject* src, PyObject* out) override {
    const auto* s = plain(src, src_shape);
    if (!s) return py::none();
    py::object res;
    char* dp;
    if (out == Py_None) {
      res = result();
      dp = py::detail::array_proxy(res.ptr())->data;
    } else {
      const auto* d = plain(out, dst_shape);
      if (!d || !(d->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_)) return py::none();
      i64 sbytes = dtype.itemsize();
      for (auto e : src_shape) sbytes *= e;
      if (nbytes && sbytes && d->data < s->data + sbytes && s->data < d->data + nbytes)
        return py::none();  // overlaps the source
      res = py::reinterpret_borrow<py::object>(out);
      dp = d->data;
    }
    const char* sp = s->data;
    {
      py::gil_scoped_release nogil;  // a collective: other threads run while it waits
      step->run(sp, dp, host_packer(), g_transport[0]);
    }
    ++calls;
    return res;
  }
};

// fn(src, out): the binding's call, `self` a capsule of its BoundBase.
PyObject* bound_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "a bound step takes (src, out)");
    return nullptr;
  }
  auto* b = static_cast<BoundBase*>(PyCapsule_GetPointer(self, "pyshard.BoundBase"));
  if (!b) return nullptr;
  try {
    return b->call(args[0], args[1]).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::invalid_argument& e) {  // as pybind11 translates them
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::out_of_range& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

void release_owner(PyObject* cap) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(cap)));
}

PyMethodDef bound_call_def = {"bound_step", reinterpret_cast<PyCFunction>(bound_call),
                              METH_FASTCALL, "Run the bound step: (src, out) -> result or None"};

template <class StepT>
void bind_bound(py::module_& m, const char* name) {
  py::class_<BoundStep<StepT>>(m, name)
      .def(py::init<py::object, py::dtype, bool>(), py::arg("step"), py::arg("dtype"),
           py::arg("pooled"))
      .def("__call__",
           [](BoundStep<StepT>& b, py::handle src, py::handle out) {
             return b.call(src.ptr(), out.ptr());
           },
           py::arg("src"), py::arg("out").none(true))
      // the same call as a builtin function (one vectorcall, no pybind11 dispatch); it keeps
      // this object alive through its capsule
      .def_property_readonly("fn",
                             [](py::object self) {
                               auto* b = static_cast<BoundBase*>(self.cast<BoundStep<StepT>*>());
                               auto cap = py::reinterpret_steal<py::object>(
                                   PyCapsule_New(b, "pyshard.BoundBase", release_owner));
                               if (!cap) throw py::error_already_set();
                               PyCapsule_SetContext(cap.ptr(), self.inc_ref().ptr());
                               PyObject* f = PyCFunction_New(&bound_call_def, cap.ptr());
                               if (!f) throw py::error_already_set();
                               return py::reinterpret_steal<py::object>(f);
                             })
      .def_readonly("calls", &BoundStep<StepT>::calls);
}
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "pyshard C++ core: block geometry, packers per memory kind, the MPI steps of a plan";
  m.attr("__version__") = PYSHARD_VERSION;
  m.attr("large_count") = bool(PYSHARD_LARGE_COUNT);  // the MPI-4 large-count calls are built in
  m.attr("built_with") = PYSHARD_BUILT_WITH;
  m.attr("built_with_compiler") = PYSHARD_MPI_COMPILER;
  m.attr("max_dims") = kMaxDims;
  m.attr("HALO_TAG") = tags::kHalo;  // pyshard/halo.py's tag (cpp/tags.h)

  py::enum_<Algorithm>(m, "Algorithm")
      .value("alltoallv", Algorithm::alltoallv)
      .value("alltoall", Algorithm::alltoall)
      .value("p2p", Algorithm::p2p)
      .value("alltoallw", Algorithm::alltoallw);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum)
      .value("max", ReduceOp::max)
      .value("min", ReduceOp::min)
      .value("lor", ReduceOp::lor)
      .value("land", ReduceOp::land);
  py::enum_<Mem>(m, "Mem").value("host", Mem::host).value("cuda", Mem::cuda);
  py::enum_<Transport>(m, "Transport")
      .value("direct", Transport::direct)
      .value("staged", Transport::staged);

  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm")
      .def(py::init<i64>(), py::arg("fortran_handle"))
      .def_property_readonly("size", &Comm::size)
      .def_property_readonly("rank", &Comm::rank);

  py::class_<Workspace, std::shared_ptr<Workspace>>(m, "Workspace")
      .def(py::init<>())
      .def("trim", &Workspace::trim, py::arg("keep"))
      .def("release", &Workspace::release)
      .def_property_readonly("held", &Workspace::held);

  py::class_<ExchangeGeometry, std::shared_ptr<ExchangeGeometry>>(m, "ExchangeGeometry")
      .def(py::init<int, i64, Shape, Shape, const std::vector<BlockSpec>&,
                    const std::vector<BlockSpec>&, const std::vector<LocalSpec>&, Algorithm,
                    i64>(),
           py::arg("size"), py::arg("itemsize"), py::arg("src_shape"), py::arg("dst_shape"),
           py::arg("sends"), py::arg("recvs"), py::arg("local"),
           py::arg("algorithm") = Algorithm::alltoallv, py::arg("pad_bytes") = 0)
      .def_property_readonly("workspace_bytes", &ExchangeGeometry::workspace_bytes)
      .def_property_readonly("staged_bytes", &ExchangeGeometry::staged_bytes)
      .def_readonly("packs", &ExchangeGeometry::pack_all)
      .def_readonly("unpacks", &ExchangeGeometry::unpack_all)
      .def_readonly("algorithm", &ExchangeGeometry::algo)
      .def_property_readonly("descriptors", [](const ExchangeGeometry& g) {
        return g.pack.host.size() + g.unpack.host.size() + g.local.host.size();
      });

  py::class_<GatherGeometry, std::shared_ptr<GatherGeometry>>(m, "GatherGeometry")
      .def(py::init<int, int, i64, Shape, Shape, const std::vector<BoxSpec>&>(), py::arg("size"),
           py::arg("rank"), py::arg("itemsize"), py::arg("src_shape"), py::arg("dst_shape"),
           py::arg("recvs"))
      .def_property_readonly("workspace_bytes", &GatherGeometry::workspace_bytes)
      .def_property_readonly("staged_bytes", &GatherGeometry::staged_bytes)
      .def_readonly("unpacks", &GatherGeometry::unpack_all)
      .def_readonly("regular", &GatherGeometry::regular);

  py::class_<ScatterGeometry, std::shared_ptr<ScatterGeometry>>(m, "ScatterGeometry")
      .def(py::init<int, int, i64, Shape, Shape, const std::vector<BoxSpec>&>(), py::arg("size"),
           py::arg("rank"), py::arg("itemsize"), py::arg("src_shape"), py::arg("dst_shape"),
           py::arg("pieces"))
      .def_property_readonly("workspace_bytes", &ScatterGeometry::workspace_bytes)
      .def_property_readonly("staged_bytes", &ScatterGeometry::staged_bytes)
      .def_readonly("packs", &ScatterGeometry::pack_all)
      .def_readonly("regular", &ScatterGeometry::regular);

  py::class_<PendingExchange>(m, "PendingExchange")
      .def(py::init<>())
      .def_readonly("active", &PendingExchange::active);

  py::class_<ExchangeStep>(m, "ExchangeStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<ExchangeGeometry>,
                    std::shared_ptr<Workspace>, bool>(),
           py::arg("comm"), py::arg("geometry"), py::arg("workspace"),
           py::arg("nonblocking") = false)
      .def("run",
           [](ExchangeStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           })
      .def("run_device", &run_device<ExchangeStep>)
      .def("start",
           [](ExchangeStep& s, const py::array& a, py::array& b, PendingExchange& p) {
             Buf src = get_buf(a, false, "source");
             Buf dst = get_buf(b, true, "destination");
             check_shape(src, s.geometry().src_shape, "source");
             check_shape(dst, s.geometry().dst_shape, "destination");
             py::gil_scoped_release nogil;
             s.start(src.ptr, dst.ptr, host_packer(), g_transport[0], p);
           })
      .def("complete",
           [](ExchangeStep& s, PendingExchange& p) {
             py::gil_scoped_release nogil;
             s.complete(p, host_packer());
           })
      .def("start_device",
           [](ExchangeStep& s, std::uintptr_t src, std::uintptr_t dst, std::uintptr_t stream,
              PendingExchange& p) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.start(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst), pk,
                     g_transport[1], p);
           })
      .def("complete_device",
           [](ExchangeStep& s, PendingExchange& p, std::uintptr_t stream) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.complete(p, pk);
           })
      .def_property_readonly("algorithm", [](ExchangeStep& s) { return s.geometry().algo; })
      .def_property_readonly("packs", [](ExchangeStep& s) { return s.geometry().pack_all; })
      .def_property_readonly("unpacks", [](ExchangeStep& s) { return s.geometry().unpack_all; })
      .def_property_readonly("workspace_bytes",
                             [](ExchangeStep& s) { return s.geometry().workspace_bytes(); })
      .def_property_readonly("staged_bytes",
                             [](ExchangeStep& s) { return s.geometry().staged_bytes(); });

  bind_bound<ExchangeStep>(m, "BoundExchange");

  py::class_<AllgathervStep>(m, "AllgathervStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<GatherGeometry>,
                    std::shared_ptr<Workspace>>())
      .def("run",
           [](AllgathervStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           })
      .def("run_device", &run_device<AllgathervStep>)
      .def_property_readonly("unpacks", [](AllgathervStep& s) { return s.geometry().unpack_all; })
      .def_property_readonly("workspace_bytes",
                             [](AllgathervStep& s) { return s.geometry().workspace_bytes(); })
      .def_property_readonly("staged_bytes",
                             [](AllgathervStep& s) { return s.geometry().staged_bytes(); });
  bind_bound<AllgathervStep>(m, "BoundAllgatherv");

  py::class_<AllreduceStep>(m, "AllreduceStep")
      .def(py::init([](std::shared_ptr<Comm> c, const py::dtype& dt, ReduceOp op, Shape shape,
                       std::shared_ptr<Workspace> ws) {
        return std::make_unique<AllreduceStep>(std::move(c), mpi_type(dt), dt.itemsize(), op,
                                               std::move(shape), std::move(ws));
      }))
      .def("run", [](AllreduceStep& s, const py::array& a,
                     py::array& b) { run_host(s, a, b, nullptr, nullptr); })
      .def("run_device", &run_device<AllreduceStep>)
      .def_property_readonly("workspace_bytes", [](AllreduceStep&) { return i64(0); })
      .def_property_readonly("staged_bytes", &AllreduceStep::staged_bytes);

  py::class_<ReduceScatterStep>(m, "ReduceScatterStep")
      .def(py::init([](std::shared_ptr<Comm> c, std::shared_ptr<ScatterGeometry> g,
                       const py::dtype& dt, ReduceOp op, std::shared_ptr<Workspace> ws) {
        return std::make_unique<ReduceScatterStep>(std::move(c), std::move(g), mpi_type(dt), op,
                                                   std::move(ws));
      }))
      .def("run",
           [](ReduceScatterStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           })
      .def("run_device", &run_device<ReduceScatterStep>)
      .def_property_readonly("packs", [](ReduceScatterStep& s) { return s.geometry().pack_all; })
      .def_property_readonly("workspace_bytes",
                             [](ReduceScatterStep& s) { return s.geometry().workspace_bytes(); })
      .def_property_readonly("staged_bytes",
                             [](ReduceScatterStep& s) { return s.geometry().staged_bytes(); });

  py::class_<FusedGeometry, std::shared_ptr<FusedGeometry>>(m, "FusedGeometry")
      .def(py::init<const std::vector<std::shared_ptr<ExchangeGeometry>>&>(), py::arg("parts"))
      .def_readonly("send_bytes", &FusedGeometry::send_ws)
      .def_readonly("recv_bytes", &FusedGeometry::recv_ws)
      .def_readonly("max_block", &FusedGeometry::max_block)
      .def_property_readonly("arrays", [](const FusedGeometry& g) { return g.parts.size(); });
  py::class_<FusedExchangeStep>(m, "FusedExchangeStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<FusedGeometry>,
                    std::shared_ptr<Workspace>, bool>(),
           py::arg("comm"), py::arg("geometry"), py::arg("workspace"),
           py::arg("nonblocking") = false)
      .def("run",
           [](FusedExchangeStep& s, const std::vector<py::array>& srcs,
              std::vector<py::array>& dsts) {
             const FusedGeometry& g = s.geometry();
             if (srcs.size() != g.parts.size() || dsts.size() != g.parts.size())
               throw std::invalid_argument("pyshard: one source and one result per array");
             std::vector<const char*> sp;
             std::vector<char*> dp;
             for (size_t a = 0; a < srcs.size(); ++a) {
               Buf b = get_buf(srcs[a], false, "a source");
               Buf d = get_buf(dsts[a], true, "a result");
               check_shape(b, g.parts[a]->src_shape, "a source");
               check_shape(d, g.parts[a]->dst_shape, "a result");
               sp.push_back(b.ptr);
               dp.push_back(d.ptr);
             }
             py::gil_scoped_release nogil;
             s.run(sp, dp, host_packer(), g_transport[0]);
           })
      .def("run_device",
           [](FusedExchangeStep& s, const std::vector<std::uintptr_t>& srcs,
              const std::vector<std::uintptr_t>& dsts, std::uintptr_t stream) {
             std::vector<const char*> sp;
             std::vector<char*> dp;
             for (auto v : srcs) sp.push_back(reinterpret_cast<const char*>(v));
             for (auto v : dsts) dp.push_back(reinterpret_cast<char*>(v));
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.run(sp, dp, pk, g_transport[1]);
           })
      .def_property_readonly("workspace_bytes", [](FusedExchangeStep& s) {
        return s.geometry().send_ws + s.geometry().recv_ws;
      })
      .def_property_readonly("staged_bytes", [](FusedExchangeStep& s) {
        return s.geometry().send_ws + s.geometry().recv_ws;
      });

  py::enum_<HaloMethod>(m, "HaloMethod")
      .value("persistent", HaloMethod::persistent)
      .value("p2p", HaloMethod::p2p)
      .value("datatype", HaloMethod::datatype)
      .value("neighbor", HaloMethod::neighbor);
  py::class_<HaloGeometry, std::shared_ptr<HaloGeometry>>(m, "HaloGeometry")
      .def(py::init<i64, Shape, const std::vector<PeerBoxes>&, const std::vector<PeerBoxes>&,
                    const std::vector<LocalSpec>&>(),
           py::arg("itemsize"), py::arg("shape"), py::arg("sends"), py::arg("recvs"),
           py::arg("local"))
      .def_readonly("send_bytes", &HaloGeometry::send_bytes)
      .def_readonly("recv_bytes", &HaloGeometry::recv_bytes)
      .def_readonly("local_bytes", &HaloGeometry::local_bytes)
      .def_property_readonly("in_place",
                             [](const HaloGeometry& g) {
                               int n = 0;
                               for (const HaloMessage& m : g.recvs) n += m.contiguous;
                               return n;
                             })
      .def_property_readonly("descriptors", [](const HaloGeometry& g) {
        return g.pack.host.size() + g.unpack.host.size() + g.local.host.size();
      });
  py::class_<HaloStep>(m, "HaloStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<HaloGeometry>, HaloMethod, int>(),
           py::arg("comm"), py::arg("geometry"), py::arg("method"), py::arg("tag"))
      .def("start",
           [](HaloStep& s, py::array& a) {
             Buf b = get_buf(a, true, "the padded array");
             check_shape(b, s.geometry().shape, "the padded array");
             py::gil_scoped_release nogil;
             s.start(b.ptr, host_packer(), g_transport[0]);
           })
      .def("wait",
           [](HaloStep& s, py::array& a) {
             Buf b = get_buf(a, true, "the padded array");
             check_shape(b, s.geometry().shape, "the padded array");
             py::gil_scoped_release nogil;
             s.wait(b.ptr, host_packer(), g_transport[0]);
           })
      .def("update",
           [](HaloStep& s, py::array& a) {
             Buf b = get_buf(a, true, "the padded array");
             check_shape(b, s.geometry().shape, "the padded array");
             py::gil_scoped_release nogil;
             s.start(b.ptr, host_packer(), g_transport[0]);
             s.wait(b.ptr, host_packer(), g_transport[0]);
           })
      .def("start_device",
           [](HaloStep& s, std::uintptr_t p, std::uintptr_t stream) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.start(reinterpret_cast<char*>(p), pk, g_transport[1]);
           })
      .def("wait_device",
           [](HaloStep& s, std::uintptr_t p, std::uintptr_t stream) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.wait(reinterpret_cast<char*>(p), pk, g_transport[1]);
           })
      .def_property_readonly("active", &HaloStep::active)
      .def_property_readonly("method", &HaloStep::method)
      .def_property_readonly("buffer_bytes", &HaloStep::buffer_bytes);

  py::class_<NodeCtl, std::shared_ptr<NodeCtl>>(m, "NodeCtl")
      .def(py::init<int, bool>(), py::arg("slots"), py::arg("fail") = false,
           "This rank's control segment (no MPI call): ok and why say whether it can be shared.")
      .def_property_readonly("ok", &NodeCtl::ok)
      .def_property_readonly("why", &NodeCtl::why)
      .def_property_readonly("fd", &NodeCtl::fd)
      .def_property_readonly("slots", &NodeCtl::slots)
      .def("connect", &NodeCtl::connect, py::arg("me"), py::arg("ranks"), py::arg("pids"),
           py::arg("fds"), py::arg("fail") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("release", &NodeCtl::release);

  py::class_<NodeShm, std::shared_ptr<NodeShm>>(m, "NodeShm")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<NodeCtl>, int, std::vector<int>,
                    const std::vector<int>&, int, bool, bool>(),
           py::arg("comm"), py::arg("ctl"), py::arg("slot"), py::arg("node_ranks"),
           py::arg("mesh_ranks"), py::arg("nodes"), py::arg("oversubscribed"),
           py::arg("spin_long"), py::call_guard<py::gil_scoped_release>(),
           "The node-local transport of comm, from the mesh's node map (no MPI call).")
      .def_property_readonly("usable", &NodeShm::usable)
      .def_property_readonly("why_not", &NodeShm::why_not)
      .def_property_readonly("node_size", &NodeShm::node_size)
      .def_property_readonly("nodes", &NodeShm::nodes)
      .def_property_readonly("oversubscribed", &NodeShm::oversubscribed)
      .def_property_readonly("node_ranks", &NodeShm::node_ranks)
      .def_property_readonly("held", &NodeShm::held)
      .def_property_readonly("mapped_bytes", &NodeShm::mapped_bytes)
      .def("set_limit", &NodeShm::set_limit, py::arg("bytes"))
      .def("release", &NodeShm::release);

  py::class_<ShmBuffer>(m, "ShmBuffer", py::buffer_protocol())
      .def(py::init<std::shared_ptr<NodeShm>, i64>(), py::arg("node"), py::arg("nbytes"))
      .def_buffer([](ShmBuffer& b) {
        return py::buffer_info(b.seg->ptr, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {b.n}, {1}, false);
      });

  py::class_<ShmExchangeStep, std::shared_ptr<ShmExchangeStep>>(m, "ShmExchangeStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<NodeShm>, i64, Shape, Shape,
                    const std::vector<std::tuple<int, Shape, Shape, Shape, Shape>>&,
                    const std::vector<BlockSpec>&, const std::vector<LocalSpec>&,
                    std::shared_ptr<Workspace>>(),
           py::arg("comm"), py::arg("node"), py::arg("item"), py::arg("src_shape"),
           py::arg("dst_shape"), py::arg("pushes"), py::arg("recvs"), py::arg("local"),
           py::arg("workspace"))
      .def("run",
           [](ShmExchangeStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.src_shape(), &s.dst_shape());
           })
      .def_property_readonly("algorithm", [](ShmExchangeStep&) { return std::string("shm"); })
      .def_property_readonly("node_peers", &ShmExchangeStep::node_peers)
      .def_property_readonly("mpi_peers", &ShmExchangeStep::mpi_peers)
      .def_property_readonly("workspace_bytes", &ShmExchangeStep::workspace_bytes)
      .def_property_readonly("staged_bytes", &ShmExchangeStep::workspace_bytes);

  py::class_<ShmReduceScatterStep>(m, "ShmReduceScatterStep")
      .def(py::init([](std::shared_ptr<NodeShm> node, std::shared_ptr<ScatterGeometry> g,
                       const py::dtype& dt, ReduceOp op) {
             if (dt.itemsize() != g->item)
               throw std::invalid_argument("pyshard: the reduction type's size is not the geometry's");
             return std::make_unique<ShmReduceScatterStep>(std::move(node), std::move(g),
                                                           dt.kind(), op);
           }),
           py::arg("node"), py::arg("geometry"), py::arg("dtype"), py::arg("op"))
      .def("run",
           [](ShmReduceScatterStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           })
      .def_property_readonly("algorithm", [](ShmReduceScatterStep&) { return std::string("shm"); })
      .def_property_readonly("workspace_bytes", [](ShmReduceScatterStep&) { return i64(0); })
      .def_property_readonly("staged_bytes", [](ShmReduceScatterStep&) { return i64(0); });

  py::class_<ShmAllreduceStep>(m, "ShmAllreduceStep")
      .def(py::init([](std::shared_ptr<NodeShm> node, const py::dtype& dt, ReduceOp op,
                       Shape shape) {
             return std::make_unique<ShmAllreduceStep>(std::move(node), dt.kind(), dt.itemsize(),
                                                       op, std::move(shape));
           }),
           py::arg("node"), py::arg("dtype"), py::arg("op"), py::arg("shape"))
      .def("run",
           [](ShmAllreduceStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.shape(), &s.shape());
           })
      .def_property_readonly("algorithm", [](ShmAllreduceStep&) { return std::string("shm"); })
      .def_property_readonly("workspace_bytes", [](ShmAllreduceStep&) { return i64(0); })
      .def_property_readonly("staged_bytes", [](ShmAllreduceStep&) { return i64(0); });

  py::class_<ShmFusedStep>(m, "ShmFusedStep")
      .def(py::init<std::shared_ptr<NodeShm>, std::vector<std::shared_ptr<ShmExchangeStep>>,
                    std::vector<std::vector<i64>>, std::shared_ptr<Workspace>>(),
           py::arg("node"), py::arg("parts"), py::arg("offsets"), py::arg("workspace"))
      .def("run",
           [](ShmFusedStep& s, const std::vector<py::array>& srcs, py::array& batch) {
             if (srcs.size() != s.parts())
               throw std::invalid_argument("pyshard: one source per fused array");
             Buf d = get_buf(batch, true, "the batch");
             if (d.shape.size() != 1 || d.item != 1 || d.shape[0] < s.bytes())
               throw std::invalid_argument("pyshard: the batch is a uint8 array of its bytes");
             std::vector<const char*> sp;
             for (size_t a = 0; a < srcs.size(); ++a) {
               Buf b = get_buf(srcs[a], false, "a source");
               check_shape(b, s.part(a).src_shape(), "a source");
               sp.push_back(b.ptr);
             }
             py::gil_scoped_release nogil;
             s.run(sp, d.ptr);
           })
      .def("offset", &ShmFusedStep::offset, py::arg("k"))
      .def_property_readonly("bytes", &ShmFusedStep::bytes)
      .def_property_readonly("workspace_bytes", &ShmFusedStep::workspace_bytes);

  py::class_<PooledBuffer>(m, "PooledBuffer", py::buffer_protocol())
      .def(py::init<i64>(), py::arg("nbytes"))
      .def_buffer([](PooledBuffer& b) {
        return py::buffer_info(b.ptr, 1, py::format_descriptor<std::uint8_t>::format(), 1, {b.n},
                               {1}, false);
      });
  m.def("result_pool_held", []() { return ResultPool::get().held(); });
  m.def("result_pool_clear", []() { ResultPool::get().clear(); });
  m.def(
      "set_result_pool_limit", [](i64 bytes) { ResultPool::get().set_limit(bytes); },
      py::arg("bytes"));
  m.def(
      "allgather_i64",
      [](const std::shared_ptr<Comm>& comm, const std::vector<i64>& values) {
        py::gil_scoped_release nogil;
        return allgather_i64(*comm, values);
      },
      py::arg("comm"), py::arg("values"));
  m.def("copy_box", &py_copy_box, py::arg("src"), py::arg("src_start"), py::arg("dst"),
        py::arg("dst_start"), py::arg("extent"), py::arg("offsets") = false);
  bind_kernels_on_host(m);  // copy_kernel_on_host: the CUDA kernels run on the host
  m.def(
      "device_pack",
      [](const ExchangeGeometry& g, std::uintptr_t src, std::uintptr_t dst, std::uintptr_t stream) {
        Packer& pk = cuda_packer();
        py::gil_scoped_release nogil;
        pk.set_stream(stream);
        pk.copy_all(g.pack, reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst));
        pk.finish();
      },
      py::arg("geometry"), py::arg("src"), py::arg("dst"), py::arg("stream") = 0,
      "Pack every send block of `geometry` from device array `src` into device buffer `dst` "
      "(at least geometry.staged_bytes) with one kernel launch on `stream`; for benchmarks.");
  m.def("stats", []() { return stats(); });
  m.def("reset_stats", []() { stats().clear(); });
  m.def("library_version", &mpi::library_version);
  m.def("library_standard", &mpi::library_standard);
  m.def("large_count_method", &mpi::large_count_method);
  m.def("large_count_reduce_method", &mpi::large_count_reduce_method);
  m.def("count_limit", &mpi::count_limit);
  m.def("large_count_stats", []() { return mpi::large_count_stats(); });
  m.def("reset_large_count_stats", []() { mpi::large_count_stats().clear(); });
  m.def("set_count_limit", &mpi::set_count_limit, py::arg("n"),
        "Tests only: counts and displacements above n (>= 8) take the datatype/split path "
        "that MPI libraries without large-count calls take past 2^31-1.");
  m.def("library_path", &mpi::library_path);
  m.def(
      "set_transport", [](Mem mem, Transport t) { g_transport[static_cast<int>(mem)] = t; },
      py::arg("mem"), py::arg("transport"));
  m.def(
      "transport", [](Mem mem) { return g_transport[static_cast<int>(mem)]; }, py::arg("mem"));
  m.def("cuda_built", &cuda_built);
  m.def("cuda_build_version", &cuda_build_version);
  m.def("cuda_device_present", &cuda_device_present);
  m.def("cuda_aware_mpi", &mpi::cuda_aware);
}
