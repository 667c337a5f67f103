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
// It reads numpy's array struct and calls numpy's C API through pybind11's py::detail (the
// npy_api table and array_proxy), which is not pybind11's public API, on purpose: the
// public py::array gives the same facts only through calls that cost more than this whole
// check on a small array (py::array::check_ accepts subclasses, so the exact-type test
// needs the type object anyway; dtype() and shape() make new references and vectors;
// py::array(dtype, shape, ptr, base) builds shape and stride vectors and a C-contiguous
// stride list for every result). The binding exists to make a repeated small call cheap
// (bench --cases small); if pybind11 changes these internals, this is the one place to
// follow.
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
      step->run(sp, dp, host_packer(), transport_of(Mem::host));
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
