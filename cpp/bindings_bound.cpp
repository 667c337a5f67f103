// pyshard._core's fast path of a cached redistribute: BoundExchange and BoundAllgatherv.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <new>
#include <stdexcept>
#include <vector>

#include "bindings_common.h"
#include "buffers.h"
#include "steps.h"

namespace pyshard::bind {

namespace {

// A cached redistribute's one call (ShardedArray.redistribute's fast path): a host step that
// runs straight into its output, bound to the result's dtype and shape. Calling it with the
// source and `out` (or None) allocates the result (from the result pool when large), runs the
// step and returns the result; it returns None, having done nothing, when an argument is not
// what the binding expects (not a plain C-contiguous numpy array of the dtype and shape, a
// read-only `out` or one overlapping the source), and the caller takes the general path,
// which says what is wrong. What runs, and its counts, are the step's, fixed by the layouts:
// these checks only decide who allocates. The call is a METH_FASTCALL function (`fn`), not a
// pybind11 method: no argument conversion, no allocation besides the result's.
//
// Public pybind11 API only: measured against the former reads of numpy's struct through
// py::detail (npy_api, array_proxy) at 2 ranks on a 64x64 float32 S(0)->S(1), a declined
// call took 97-120 ns with either and a whole call 3.9-4.8 us with either (the MPI call's).
// The source must be exactly a numpy.ndarray (no subclass), as before.
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
  py::object ndarray_type = py::module_::import("numpy").attr("ndarray");
  PyTypeObject* ndarray = reinterpret_cast<PyTypeObject*>(ndarray_type.ptr());

  BoundStep(py::object o, py::dtype dt, bool pool)
      : owner(std::move(o)), step(owner.cast<StepT*>()), dtype(std::move(dt)), pooled(pool) {
    const auto& g = step->geometry();
    src_shape.assign(g.src_shape.begin(), g.src_shape.end());
    dst_shape.assign(g.dst_shape.begin(), g.dst_shape.end());
    nbytes = dtype.itemsize();
    for (auto e : dst_shape) nbytes *= e;
  }

  // `h` as a plain (exactly numpy.ndarray), C-contiguous array of this dtype and `shape`, or
  // false; *data: its data. `writable`: only a writable one.
  bool plain(PyObject* h, const std::vector<Py_intptr_t>& shape, bool writable,
             char** data) const {
    if (Py_TYPE(h) != ndarray) return false;
    auto a = py::reinterpret_borrow<py::array>(h);
    if (!(a.flags() & py::array::c_style) || a.ndim() != static_cast<py::ssize_t>(shape.size()) ||
        !std::equal(shape.begin(), shape.end(), a.shape()))
      return false;
    const py::dtype dt = a.dtype();
    if (!dt.is(dtype) && !dt.equal(dtype)) return false;
    if (writable && !a.writeable()) return false;
    *data = static_cast<char*>(const_cast<void*>(a.data()));
    return true;
  }

  // A fresh C-contiguous result (over a pooled buffer, which the array keeps alive, when
  // `pooled`); *data: its data.
  py::object result(char** data) const {
    if (!pooled) {
      py::array r(dtype, dst_shape);
      *data = static_cast<char*>(r.mutable_data());
      return std::move(r);
    }
    auto* pb = new PooledBuffer(nbytes);
    py::object base = py::cast(pb, py::return_value_policy::take_ownership);
    py::array r(dtype, dst_shape, {}, pb->ptr, base);
    *data = pb->ptr;
    return std::move(r);
  }

  py::object call(PyObject* src, PyObject* out) override {
    char* sp = nullptr;
    if (!plain(src, src_shape, false, &sp)) return py::none();
    py::object res;
    char* dp = nullptr;
    if (out == Py_None) {
      res = result(&dp);
    } else {
      if (!plain(out, dst_shape, true, &dp)) return py::none();
      i64 sbytes = dtype.itemsize();
      for (auto e : src_shape) sbytes *= e;
      if (nbytes && sbytes && dp < sp + sbytes && sp < dp + nbytes)
        return py::none();  // overlaps the source
      res = py::reinterpret_borrow<py::object>(out);
    }
    {
      py::gil_scoped_release nogil;  // a collective: other threads run while it waits
      step->run(sp, dp, host_packer());
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

void bind_bound_steps(py::module_& m) {
  bind_bound<ExchangeStep>(m, "BoundExchange");
  bind_bound<AllgathervStep>(m, "BoundAllgatherv");
}

}  // namespace pyshard::bind
