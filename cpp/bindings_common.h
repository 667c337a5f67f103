// What the binding files of pyshard._core share: host arrays as pointers and shapes, and how
// a step runs on host or device memory from Python (the GIL released while it runs).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "comm.h"
#include "memory.h"

namespace pyshard::bind {

namespace py = pybind11;

struct Buf {
  char* ptr;
  Shape shape;
  i64 item;
};

inline Buf get_buf(const py::array& a, bool writable, const char* name) {
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

inline void check_shape(const Buf& b, const Shape& want, const char* name) {
  if (b.shape != want)
    throw std::invalid_argument(std::string("pyshard: ") + name +
                                " has a shape that does not match the planned layout");
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
  step.run(s.ptr, d.ptr, host_packer());  // on the step's own transport
}

template <class StepT>
void run_device(StepT& step, std::uintptr_t src, std::uintptr_t dst, std::uintptr_t stream) {
  Packer& pk = cuda_packer();
  py::gil_scoped_release nogil;
  pk.set_stream(stream);
  step.run(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst), pk);
}

// The binding files: bindings.cpp (the module) calls the others.
void bind_bound_steps(py::module_& m);    // bindings_bound.cpp: BoundExchange, BoundAllgatherv
void bind_node_shared(py::module_& m);    // bindings_shm.cpp: the node-local transport
void bind_migrate(py::module_& m);        // bindings_migrate.cpp: rows between ranks
void bind_index(py::module_& m);          // bindings_index.cpp: rows by global index
void bind_jax(py::module_& m);            // bindings_jax.cpp: pyshard.jax's XLA FFI handler

}  // namespace pyshard::bind

namespace pyshard {
void bind_kernels_on_host(pybind11::module_& m);  // bindings_kernels.cpp: copy_box, the kernels
}
