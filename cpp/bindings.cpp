// pyshard._core: the pybind11 bindings of the steps, geometries, packers and workspace pool.
#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "bindings_common.h"
#include "buffers.h"
#include "fused.h"
#include "halo.h"
#include "shm_node.h"
#include "shm_segment.h"
#include "steps.h"
#include "tags.h"

namespace py = pybind11;
using namespace pyshard;
using namespace pyshard::bind;

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

MPI_Datatype mpi_type(const py::dtype& dt) {
  MPI_Datatype t = mpi::reduce_type(dt.kind(), dt.itemsize());
  if (t == MPI_DATATYPE_NULL)
    throw std::invalid_argument("pyshard: no MPI reduction type for dtype " +
                                std::string(py::str(dt)));
  return t;
}

// The padded array a halo step runs on: its shape, and its element size (an array of another
// dtype would be read and written past its end, or its ghosts filled with other bytes).
Buf padded_buf(const HaloStep& s, py::array& a) {
  Buf b = get_buf(a, true, "the padded array");
  check_shape(b, s.geometry().shape, "the padded array");
  if (b.item != s.geometry().item)
    throw std::invalid_argument("pyshard: the padded array has " + std::to_string(b.item) +
                                "-byte elements, the halo step's have " +
                                std::to_string(s.geometry().item) + " (another dtype)");
  return b;
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
  m.attr("FOLD_TAG") = tags::kFold;  // and its fold's

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
      .def_property_readonly("rank", &Comm::rank)
      .def("release", &Comm::release);

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
      .def_readonly("active", &PendingExchange::active)
      .def_readonly("arrived", &PendingExchange::arrived);

  // Every step is built with its transport (pyshard/route.py's Route.transport) and runs on
  // it for its whole life: there is no process-wide transport.
  py::class_<ExchangeStep>(m, "ExchangeStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<ExchangeGeometry>,
                    std::shared_ptr<Workspace>, Transport, bool>(),
           py::arg("comm"), py::arg("geometry"), py::arg("workspace"), py::arg("transport"),
           py::arg("nonblocking") = false)
      .def("run",
           [](ExchangeStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           },
           py::arg("src"), py::arg("dst"))
      .def("run_device", &run_device<ExchangeStep>,
           py::arg("src"), py::arg("dst"), py::arg("stream"))
      .def("start",
           [](ExchangeStep& s, const py::array& a, py::array& b, PendingExchange& p) {
             Buf src = get_buf(a, false, "source");
             Buf dst = get_buf(b, true, "destination");
             check_shape(src, s.geometry().src_shape, "source");
             check_shape(dst, s.geometry().dst_shape, "destination");
             py::gil_scoped_release nogil;
             s.start(src.ptr, dst.ptr, host_packer(), p);
           },
           py::arg("src"), py::arg("dst"), py::arg("pending"))
      .def("complete",
           [](ExchangeStep& s, PendingExchange& p) {
             py::gil_scoped_release nogil;
             s.complete(p, host_packer());
           },
           py::arg("pending"))
      .def("test", &ExchangeStep::test, py::arg("pending"),
           py::call_guard<py::gil_scoped_release>(),
           "Have the messages of this exchange in flight completed? (MPI_Testall; never "
           "blocks; complete() then only unpacks.)")
      .def("start_device",
           [](ExchangeStep& s, std::uintptr_t src, std::uintptr_t dst, std::uintptr_t stream,
              PendingExchange& p) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.start(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst), pk, p);
           },
           py::arg("src"), py::arg("dst"), py::arg("stream"), py::arg("pending"))
      .def("complete_device",
           [](ExchangeStep& s, PendingExchange& p, std::uintptr_t stream) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.complete(p, pk);
           },
           py::arg("pending"), py::arg("stream"))
      .def_property_readonly("transport", &ExchangeStep::transport)
      .def_property_readonly("algorithm", [](ExchangeStep& s) { return s.geometry().algo; })
      .def_property_readonly("packs", [](ExchangeStep& s) { return s.geometry().pack_all; })
      .def_property_readonly("unpacks", [](ExchangeStep& s) { return s.geometry().unpack_all; })
      .def_property_readonly("workspace_bytes",
                             [](ExchangeStep& s) { return s.geometry().workspace_bytes(); })
      .def_property_readonly("staged_bytes",
                             [](ExchangeStep& s) { return s.geometry().staged_bytes(); });


  py::class_<AllgathervStep>(m, "AllgathervStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<GatherGeometry>,
                    std::shared_ptr<Workspace>, Transport>(),
           py::arg("comm"), py::arg("geometry"), py::arg("workspace"), py::arg("transport"))
      .def("run",
           [](AllgathervStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           },
           py::arg("src"), py::arg("dst"))
      .def("run_device", &run_device<AllgathervStep>,
           py::arg("src"), py::arg("dst"), py::arg("stream"))
      .def_property_readonly("transport", &AllgathervStep::transport)
      .def_property_readonly("unpacks", [](AllgathervStep& s) { return s.geometry().unpack_all; })
      .def_property_readonly("workspace_bytes",
                             [](AllgathervStep& s) { return s.geometry().workspace_bytes(); })
      .def_property_readonly("staged_bytes",
                             [](AllgathervStep& s) { return s.geometry().staged_bytes(); });
  bind_bound_steps(m);  // the steps they bind are registered above

  py::class_<AllreduceStep>(m, "AllreduceStep")
      .def(py::init([](std::shared_ptr<Comm> c, const py::dtype& dt, ReduceOp op, Shape shape,
                       std::shared_ptr<Workspace> ws, Transport tr) {
             return std::make_unique<AllreduceStep>(std::move(c), mpi_type(dt), dt.itemsize(),
                                                    op, std::move(shape), std::move(ws), tr);
           }),
           py::arg("comm"), py::arg("dtype"), py::arg("op"), py::arg("shape"),
           py::arg("workspace"), py::arg("transport"))
      .def("run", [](AllreduceStep& s, const py::array& a,
                     py::array& b) { run_host(s, a, b, nullptr, nullptr); },
           py::arg("src"), py::arg("dst"))
      .def("run_device", &run_device<AllreduceStep>,
           py::arg("src"), py::arg("dst"), py::arg("stream"))
      .def_property_readonly("transport", &AllreduceStep::transport)
      .def_property_readonly("workspace_bytes", [](AllreduceStep&) { return i64(0); })
      .def_property_readonly("staged_bytes", &AllreduceStep::staged_bytes);

  py::class_<ReduceScatterStep>(m, "ReduceScatterStep")
      .def(py::init([](std::shared_ptr<Comm> c, std::shared_ptr<ScatterGeometry> g,
                       const py::dtype& dt, ReduceOp op, std::shared_ptr<Workspace> ws,
                       Transport tr) {
             return std::make_unique<ReduceScatterStep>(std::move(c), std::move(g), mpi_type(dt),
                                                        op, std::move(ws), tr);
           }),
           py::arg("comm"), py::arg("geometry"), py::arg("dtype"), py::arg("op"),
           py::arg("workspace"), py::arg("transport"))
      .def("run",
           [](ReduceScatterStep& s, const py::array& a, py::array& b) {
             run_host(s, a, b, &s.geometry().src_shape, &s.geometry().dst_shape);
           },
           py::arg("src"), py::arg("dst"))
      .def("run_device", &run_device<ReduceScatterStep>,
           py::arg("src"), py::arg("dst"), py::arg("stream"))
      .def_property_readonly("transport", &ReduceScatterStep::transport)
      .def_property_readonly("packs", [](ReduceScatterStep& s) { return s.geometry().pack_all; })
      .def_property_readonly("workspace_bytes",
                             [](ReduceScatterStep& s) { return s.geometry().workspace_bytes(); })
      .def_property_readonly("staged_bytes",
                             [](ReduceScatterStep& s) { return s.geometry().staged_bytes(); });

  py::class_<FusedGeometry, std::shared_ptr<FusedGeometry>>(m, "FusedGeometry")
      .def(py::init<const std::vector<std::shared_ptr<ExchangeGeometry>>&>(), py::arg("parts"))
      .def_readonly("send_bytes", &FusedGeometry::send_ws)
      .def_readonly("recv_bytes", &FusedGeometry::recv_ws)
      .def_property_readonly("arrays", [](const FusedGeometry& g) { return g.parts.size(); });
  py::class_<FusedExchangeStep>(m, "FusedExchangeStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<FusedGeometry>,
                    std::shared_ptr<Workspace>, Transport, bool>(),
           py::arg("comm"), py::arg("geometry"), py::arg("workspace"), py::arg("transport"),
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
             s.run(sp, dp, host_packer());
           },
           py::arg("srcs"), py::arg("dsts"))
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
             s.run(sp, dp, pk);
           },
           py::arg("srcs"), py::arg("dsts"), py::arg("stream"))
      .def_property_readonly("transport", &FusedExchangeStep::transport)
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
                    const std::vector<LocalSpec>&, bool, int>(),
           py::arg("itemsize"), py::arg("shape"), py::arg("sends"), py::arg("recvs"),
           py::arg("local"), py::arg("reverse") = false, py::arg("local_at") = 0)
      .def_readonly("reverse", &HaloGeometry::reverse)
      .def_readonly("local_at", &HaloGeometry::local_at)
      .def_property_readonly("recv_offsets",
                             [](const HaloGeometry& g) {
                               std::vector<i64> v;
                               for (const HaloMessage& m : g.recvs) v.push_back(m.off);
                               return v;
                             })
      .def_readonly("send_bytes", &HaloGeometry::send_bytes)
      .def_readonly("recv_bytes", &HaloGeometry::recv_bytes)
      .def_readonly("local_bytes", &HaloGeometry::local_bytes)
      .def_property_readonly("descriptors", [](const HaloGeometry& g) {
        return g.pack.host.size() + g.unpack.host.size() + g.local.host.size();
      });
  py::class_<HaloStep>(m, "HaloStep")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<HaloGeometry>, HaloMethod, int,
                    Transport>(),
           py::arg("comm"), py::arg("geometry"), py::arg("method"), py::arg("tag"),
           py::arg("transport"))
      .def("start",
           [](HaloStep& s, py::array& a) {
             Buf b = padded_buf(s, a);
             py::gil_scoped_release nogil;
             s.start(b.ptr, host_packer());
           },
           py::arg("padded"))
      .def("test", &HaloStep::test, py::call_guard<py::gil_scoped_release>(),
           "Have the messages of the exchange in flight completed? (MPI_Testall; never "
           "blocks; wait() then only unpacks or combines.)")
      .def("wait",
           [](HaloStep& s, py::array& a) {
             Buf b = padded_buf(s, a);
             py::gil_scoped_release nogil;
             s.wait(b.ptr, host_packer());
           },
           py::arg("padded"))
      .def("fold_wait",
           [](HaloStep& s, py::array& a, int op, int kind) {
             Buf b = padded_buf(s, a);
             py::gil_scoped_release nogil;
             s.wait(b.ptr, host_packer(), static_cast<FoldOp>(op),
                    static_cast<FoldKind>(kind));
           },
           py::arg("padded"), py::arg("op"), py::arg("kind"),
           "Complete a fold: combine the received values with op (0 sum, 1 max, 2 min) as "
           "element kind `kind` (-1: leave them in the buffer for the caller)")
      .def("fold",
           [](HaloStep& s, py::array& a, int op, int kind) {
             Buf b = padded_buf(s, a);
             py::gil_scoped_release nogil;
             s.start(b.ptr, host_packer());
             s.wait(b.ptr, host_packer(), static_cast<FoldOp>(op),
                    static_cast<FoldKind>(kind));
           },
           py::arg("padded"), py::arg("op"), py::arg("kind"))
      .def_property_readonly("buffer",
                             [](const HaloStep& s) {
                               return reinterpret_cast<std::uintptr_t>(s.buffer());
                             })
      .def("update",
           [](HaloStep& s, py::array& a) {
             Buf b = padded_buf(s, a);
             py::gil_scoped_release nogil;
             s.start(b.ptr, host_packer());
             s.wait(b.ptr, host_packer());
           },
           py::arg("padded"))
      .def("start_device",
           [](HaloStep& s, std::uintptr_t p, std::uintptr_t stream) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.start(reinterpret_cast<char*>(p), pk);
           },
           py::arg("padded"), py::arg("stream"))
      .def("wait_device",
           [](HaloStep& s, std::uintptr_t p, std::uintptr_t stream) {
             Packer& pk = cuda_packer();
             py::gil_scoped_release nogil;
             pk.set_stream(stream);
             s.wait(reinterpret_cast<char*>(p), pk);
           },
           py::arg("padded"), py::arg("stream"))
      .def_property_readonly("active", &HaloStep::active)
      .def_property_readonly("method", &HaloStep::method)
      .def_property_readonly("transport", &HaloStep::transport);

  bind_node_shared(m);
  bind_migrate(m);
  bind_index(m);
  bind_jax(m);

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
  bind_kernels_on_host(m);  // copy_box, copy_kernel_on_host: the host packer, the CUDA kernels on the host
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
  m.def("peer_timeout", &peer_timeout, "seconds a wait for a node peer may take (then RuntimeError)");
  m.def("set_peer_timeout", &set_peer_timeout, py::arg("seconds"),
        "bound every wait for a node peer (PYSHARD_PEER_TIMEOUT)");
  m.def("cma_enabled", &cma_enabled,
        "whether private destinations take cross-memory attach where the node can (PYSHARD_CMA)");
  m.def("set_cma_enabled", &set_cma_enabled, py::arg("on"),
        "take cross-memory attach for private destinations where the node can (PYSHARD_CMA)");
  m.def("allow_peer_attach", &allow_peer_attach, py::arg("scope_file"),
        "Where scope_file (Yama's ptrace_scope) is not 0, let any process of this user attach "
        "to this one (prctl PR_SET_PTRACER_ANY), so node peers can write into it by "
        "cross-memory attach: 0 nothing needed, 1 set, -errno refused.");
  m.def("set_count_limit", &mpi::set_count_limit, py::arg("n"),
        "Tests only: counts and displacements above n (>= 8) take the datatype/split path "
        "that MPI libraries without large-count calls take past 2^31-1.");
  m.def("stall_next_arrival", &stall_next_arrival, py::arg("seconds"),
        "Tests only: this process's next node-shared handshake sleeps `seconds` after its "
        "writes, before it tells its node peers they are done.");
  m.def("library_path", &mpi::library_path);
  m.def("cuda_built", &cuda_built);
  m.def("cuda_build_version", &cuda_build_version);
  m.def("cuda_device_present", &cuda_device_present);
  m.def("cuda_aware_mpi", &mpi::cuda_aware);
}
