// pyshard._core's bindings of the index exchange (cpp/index_exchange.h): host arrays only; the
// Python layer (pyshard/unstructured.py) checks indices, shapes and dtypes before it calls
// these, and keeps the arrays alive while an exchange is in flight.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings_common.h"
#include "index_exchange.h"
#include "shm_node.h"

namespace pyshard::bind {

namespace {

using I64Array = py::array_t<i64, py::array::c_style | py::array::forcecast>;

std::vector<i64> vec(const I64Array& a) { return std::vector<i64>(a.data(), a.data() + a.size()); }

i64 row_bytes(const Buf& b) {
  i64 rb = b.item;
  for (size_t k = 1; k < b.shape.size(); ++k) rb *= b.shape[k];
  return rb;
}

}  // namespace

void bind_index(py::module_& m) {
  m.def(
      "index_requests",
      [](std::shared_ptr<Comm> comm, int algorithm, const I64Array& counts, i64 code, i64 sig,
         const I64Array& req, i64 own) {
        if (counts.size() != comm->size())
          throw std::invalid_argument("pyshard: counts must have one entry per rank");
        i64 want = own;
        for (int p = 0; p < comm->size(); ++p)
          if (p != comm->rank()) want += counts.data()[p];
        if (own < 0 || (code == 0 && req.size() < want))
          throw std::invalid_argument("pyshard: index_requests: req has " +
                                      std::to_string(req.size()) + " rows, the counts say " +
                                      std::to_string(want));
        IndexRequests r;
        {
          py::gil_scoped_release nogil;
          r = index_requests(comm, algorithm, counts.data(), code, sig, req.data(), own);
        }
        I64Array rc(static_cast<py::ssize_t>(r.rcounts.size()));
        std::copy(r.rcounts.begin(), r.rcounts.end(), rc.mutable_data());
        if (!r.rows) {  // an error: no rows exchanged
          I64Array none(0);
          return py::make_tuple(rc, none, r.bad, r.sig_mismatch, r.sig_rank);
        }
        // the received rows handed to numpy as they are (no copy)
        i64* data = r.rows.get();
        py::capsule owner(r.rows.release(), [](void* q) { delete[] static_cast<i64*>(q); });
        I64Array rows(static_cast<py::ssize_t>(r.n_rows), data, owner);
        return py::make_tuple(rc, rows, r.bad, r.sig_mismatch, r.sig_rank);
      },
      py::arg("comm"), py::arg("algorithm"), py::arg("counts"), py::arg("code"), py::arg("sig"),
      py::arg("req"), py::arg("own") = 0,
      "The setup of an index exchange: the counts (algorithm 0: MPI_Alltoall, 1: NBX) with "
      "this rank's error code and signature, then the requested rows (global indices, owner "
      "after owner; own: how many of this rank's own rows lie at its place in that order, not "
      "sent) to their owners: (rows each rank reads from this one, those rows rank after "
      "rank, rank * 256 + code of the first rank at fault or -1, signature mismatch, a rank "
      "whose signature differs or -1).");

  py::class_<IndexExchange, std::shared_ptr<IndexExchange>>(m, "IndexExchange")
      .def(py::init([](std::shared_ptr<Comm> comm, std::vector<int> rpeer,
                       const I64Array& rcount, const I64Array& slot, const I64Array& self_rows,
                       std::vector<int> opeer, const I64Array& ooff, const I64Array& own_rows,
                       i64 n_local, int method, std::shared_ptr<NodeShm> node) {
             if (method < 0 || method > 2)
               throw std::invalid_argument("pyshard: unknown message method");
             return std::make_shared<IndexExchange>(std::move(comm), std::move(rpeer),
                                                    vec(rcount), vec(slot), vec(self_rows),
                                                    std::move(opeer), vec(ooff), vec(own_rows),
                                                    n_local, static_cast<PeerMethod>(method),
                                                    std::move(node));
           }),
           py::arg("comm"), py::arg("rpeer"), py::arg("rcount"), py::arg("slot"),
           py::arg("self_rows"), py::arg("opeer"), py::arg("ooff"), py::arg("own_rows"),
           py::arg("n_local"), py::arg("method") = 0, py::arg("node") = nullptr,
           "The pattern of an index exchange on this rank (cpp/index_exchange.h); no MPI call. "
           "method: 0 p2p, 1 persistent, 2 neighbor (cpp/peer_messages.h); the neighbor "
           "method builds its graph communicators at the first gather and the first scatter "
           "(collective). node: the communicator's node transport (NodeShm) or None: groups "
           "between ranks of one node go through node-shared memory, in a handshake of the "
           "node's ranks at every gather and scatter.")
      .def(
          "start_forward",
          [](IndexExchange& x, const py::array& src, py::array& out, py::object block,
             bool bad) {
            Buf s = get_buf(src, false, "x");
            Buf o = get_buf(out, true, "out");
            char* b = nullptr;
            if (!block.is_none()) {
              py::array a = block.cast<py::array>();
              Buf bb = get_buf(a, true, "block");
              if (static_cast<i64>(a.nbytes()) < x.gather_block_bytes(row_bytes(s)))
                throw std::invalid_argument("pyshard: block is too small");
              b = bb.ptr;
            }
            const i64 rb = row_bytes(s);
            if (s.shape.empty() || s.shape[0] != x.n_local())
              throw std::invalid_argument("pyshard: x has the wrong number of rows");
            if (o.shape.empty() || o.shape[0] != x.size() || row_bytes(o) != rb)
              throw std::invalid_argument("pyshard: out has the wrong shape");
            py::gil_scoped_release nogil;
            x.start_forward(s.ptr, rb, o.ptr, b, bad);
          },
          py::arg("x"), py::arg("out"), py::arg("block") = py::none(), py::arg("bad") = false,
          "block: None, or this rank's node-shared uint8 array of at least "
          "gather_block_bytes(row bytes) that `out` follows in the same segment (node owners "
          "then write the groups that land as one run straight into `out`). bad: this rank's "
          "x cannot be used (x, of the right size, is not read): it sends each reader an "
          "empty message (a mark in its table on the node path), so that every reader of its "
          "rows raises ValueError at wait() naming it; its own wait() returns without "
          "unpacking (the caller raises)")
      .def("gather_block_bytes", &IndexExchange::gather_block_bytes, py::arg("row_bytes"))
      .def_property_readonly("node_groups_direct", &IndexExchange::node_groups_direct)
      .def_property_readonly("node", &IndexExchange::node,
                             "The node transport (NodeShm) it was built with, or None")
      .def(
          "start_reverse",
          [](IndexExchange& x, const py::array& values, py::array& into, int kind, int op,
             bool bad) {
            Buf v = get_buf(values, false, "values");
            Buf t = get_buf(into, true, "into");
            const i64 rb = row_bytes(t);
            if (t.shape.empty() || t.shape[0] != x.n_local())
              throw std::invalid_argument("pyshard: into has the wrong number of rows");
            if (v.shape.empty() || v.shape[0] != x.size() || row_bytes(v) != rb)
              throw std::invalid_argument("pyshard: values has the wrong shape");
            if (op < 0 || op > 3) throw std::invalid_argument("pyshard: unknown scatter op");
            py::gil_scoped_release nogil;
            x.start_reverse(v.ptr, rb, t.ptr, static_cast<FoldKind>(kind),
                            static_cast<IndexOp>(op), bad);
          },
          py::arg("values"), py::arg("into"), py::arg("kind"), py::arg("op"),
          py::arg("bad") = false,
          "bad: this rank's values were bad (the caller raises after wait()): it takes part "
          "without values, and each owner it sends to raises at its wait(), naming it")
      .def("test", &IndexExchange::test, py::call_guard<py::gil_scoped_release>())
      .def("wait", &IndexExchange::wait, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("active", &IndexExchange::active)
      .def_property_readonly("node_groups_in", &IndexExchange::node_groups_in)
      .def_property_readonly("node_groups_out", &IndexExchange::node_groups_out)
      .def_property_readonly("on_node_transport", &IndexExchange::on_node_transport)
      .def_property_readonly("method",
                             [](const IndexExchange& x) { return static_cast<int>(x.method()); })
      .def_property_readonly("messages_out", &IndexExchange::messages_out)
      .def_property_readonly("rows_in", &IndexExchange::rows_in)
      .def_property_readonly("rows_out", &IndexExchange::rows_out)
      .def_property_readonly("self_rows", &IndexExchange::self_rows)
      .def_property_readonly("size", &IndexExchange::size);
}

}  // namespace pyshard::bind
