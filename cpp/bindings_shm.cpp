// pyshard._core's bindings of the node-local transport (cpp/shm.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings_common.h"
#include "buffers.h"
#include "shm.h"
#include "shm_halo.h"

namespace pyshard::bind {

namespace {
// A step through node-shared memory runs on the padded array of its own buffer only.
void check_padded(const ShmHaloStep& s, py::array& a) {
  Buf b = get_buf(a, true, "the padded array");
  check_shape(b, s.shape(), "the padded array");
  if (b.ptr != s.data())
    throw std::invalid_argument(
        "pyshard: a halo step through node-shared memory runs on its own padded array");
}
}  // namespace

void bind_node_shared(py::module_& m) {
  py::class_<NodeCtl, std::shared_ptr<NodeCtl>>(m, "NodeCtl")
      .def(py::init<int, bool>(), py::arg("slots"), py::arg("fail") = false,
           "This rank's control segment (no MPI call): ok and why say whether it can be shared.")
      .def_property_readonly("ok", &NodeCtl::ok)
      .def_property_readonly("why", &NodeCtl::why)
      .def_property_readonly("fd", &NodeCtl::fd)
      .def_property_readonly("slots", &NodeCtl::slots)
      .def("connect", &NodeCtl::connect, py::arg("me"), py::arg("ranks"), py::arg("pids"),
           py::arg("fds"), py::arg("fail") = false, py::arg("no_cma") = false,
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
      .def_property_readonly("cma", &NodeShm::cma,
                             "every rank of the node can write into its peers' private memory "
                             "(process_vm_writev)")
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

  py::class_<HaloBuffer, std::shared_ptr<HaloBuffer>>(m, "HaloBuffer", py::buffer_protocol())
      .def(py::init<std::shared_ptr<NodeShm>, i64, const Shape&, i64,
                    const std::vector<std::pair<Shape, Shape>>&>(),
           py::arg("node"), py::arg("nbytes"), py::arg("shape") = Shape{}, py::arg("item") = 0,
           py::arg("shared") = std::vector<std::pair<Shape, Shape>>{},
           "A halo array's padded block in node-shared memory (a segment of its own); with "
           "its shape, item size and the boxes node peers reach (start, extent), only their "
           "pages where they are at most half of it.")
      .def_property_readonly("nbytes", &HaloBuffer::bytes)
      .def_property_readonly("shared_bytes", &HaloBuffer::shared_bytes)
      .def_buffer([](HaloBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {b.bytes()}, {1}, false);
      });

  py::class_<ShmHaloStep>(m, "ShmHaloStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<HaloBuffer>,
                    std::shared_ptr<HaloGeometry>, int, const std::vector<HaloPeer>&, int, bool,
                    std::vector<FoldEntry>, const std::vector<LocalSpec>&>(),
           py::arg("comm"), py::arg("buffer"), py::arg("mpi"), py::arg("tag"), py::arg("peers"),
           py::arg("waiters"), py::arg("reverse") = false,
           py::arg("order") = std::vector<FoldEntry>{},
           py::arg("wraps") = std::vector<LocalSpec>{})
      .def("start",
           [](ShmHaloStep& s, py::array& a) {
             check_padded(s, a);
             py::gil_scoped_release nogil;
             s.start();
           },
           py::arg("padded"))
      .def("wait",
           [](ShmHaloStep& s, py::array& a) {
             check_padded(s, a);
             py::gil_scoped_release nogil;
             s.wait();
           },
           py::arg("padded"))
      .def("update",
           [](ShmHaloStep& s, py::array& a) {
             check_padded(s, a);
             py::gil_scoped_release nogil;
             s.start();
             s.wait();
           },
           py::arg("padded"))
      .def("fold_wait",
           [](ShmHaloStep& s, py::array& a, int op, int kind) {
             check_padded(s, a);
             py::gil_scoped_release nogil;
             s.wait(static_cast<FoldOp>(op), static_cast<FoldKind>(kind));
           },
           py::arg("padded"), py::arg("op"), py::arg("kind"))
      .def("fold",
           [](ShmHaloStep& s, py::array& a, int op, int kind) {
             check_padded(s, a);
             py::gil_scoped_release nogil;
             s.start();
             s.wait(static_cast<FoldOp>(op), static_cast<FoldKind>(kind));
           },
           py::arg("padded"), py::arg("op"), py::arg("kind"))
      .def_property_readonly("active", &ShmHaloStep::active)
      .def_property_readonly("node_peers", &ShmHaloStep::node_peers)
      .def_property_readonly("waiters", &ShmHaloStep::waiters)
      .def_property_readonly("mpi_peers", &ShmHaloStep::mpi_peers);

  py::class_<ShmExchangeStep, std::shared_ptr<ShmExchangeStep>>(m, "ShmExchangeStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<NodeShm>, i64, Shape, Shape,
                    const std::vector<std::tuple<int, Shape, Shape, Shape, Shape>>&,
                    const std::vector<BlockSpec>&, const std::vector<LocalSpec>&,
                    std::shared_ptr<Workspace>, bool>(),
           py::arg("comm"), py::arg("node"), py::arg("item"), py::arg("src_shape"),
           py::arg("dst_shape"), py::arg("pushes"), py::arg("recvs"), py::arg("local"),
           py::arg("workspace"), py::arg("attach") = false)
      .def("run",
           [](ShmExchangeStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.src_shape(), &s.dst_shape());
           },
           py::arg("src"), py::arg("dst"))
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
           },
           py::arg("src"), py::arg("dst"))
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
           },
           py::arg("src"), py::arg("dst"))
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
           },
           py::arg("srcs"), py::arg("batch"))
      .def("offset", &ShmFusedStep::offset, py::arg("k"))
      .def_property_readonly("bytes", &ShmFusedStep::bytes)
      .def_property_readonly("workspace_bytes", &ShmFusedStep::workspace_bytes);
}

}  // namespace pyshard::bind
