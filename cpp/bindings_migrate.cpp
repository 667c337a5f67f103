// pyshard._core's bindings of the row migration (cpp/migrate.h): host arrays only; the Python
// layer (pyshard/migration.py) checks shapes, lengths and dtypes before it calls these.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings_common.h"
#include "migrate.h"
#include "shm_node.h"

namespace pyshard::bind {

namespace {

using I64Array = py::array_t<i64, py::array::c_style | py::array::forcecast>;

Cols cols_of(const py::list& arrays, bool writable, const char* name) {
  Cols c;
  for (const auto& h : arrays) {
    auto a = py::reinterpret_borrow<py::array>(h);
    Buf b = get_buf(a, writable, name);
    i64 rb = b.item;
    for (size_t k = 1; k < b.shape.size(); ++k) rb *= b.shape[k];
    c.ptr.push_back(b.ptr);
    c.rb.push_back(rb);
  }
  return c;
}

const void* dest_ptr(const py::array& dest, int* item) {
  if (!(dest.flags() & py::array::c_style) || (dest.itemsize() != 4 && dest.itemsize() != 8) ||
      dest.dtype().kind() != 'i')
    throw std::invalid_argument("pyshard: dest must be a C-contiguous int32 or int64 array");
  *item = static_cast<int>(dest.itemsize());
  return dest.data();
}

const i64* checked(const I64Array& a, i64 n, const char* name) {
  if (a.size() != n)
    throw std::invalid_argument(std::string("pyshard: ") + name + " must have one entry per rank");
  return a.data();
}

char* bytes_of(py::array& a, const char* name) {
  return get_buf(a, true, name).ptr;
}

// What start_forward and start_back take, checked and as pointers (while the GIL is held).
struct Args {
  Args(const py::array& dest, const I64Array& cnt, const I64Array& rcnt, const py::list& src,
       const py::list& dst, const I64Array& row_off, py::array& send, py::array& recv)
      : d(dest_ptr(dest, &item)), n(dest.size()), s(cols_of(src, false, "a column")),
        t(cols_of(dst, true, "a result column")) {
    const i64 P = cnt.size();
    c = checked(cnt, P, "cnt");
    rc = checked(rcnt, P, "rcnt");
    ro = checked(row_off, P, "row_off");
    sb = bytes_of(send, "send");
    rb = bytes_of(recv, "recv");
  }
  int item = 8;
  const void* d;
  i64 n;
  Cols s, t;
  const i64 *c, *rc, *ro;
  char *sb, *rb;
};

}  // namespace

void bind_migrate(py::module_& m) {
  m.def(
      "migrate_count",
      [](const py::array& dest, int P) {
        int item = 8;
        const void* p = dest_ptr(dest, &item);
        I64Array counts(P);
        i64 bad;
        {
          py::gil_scoped_release nogil;
          bad = migrate_count(p, item, dest.size(), P, counts.mutable_data());
        }
        return py::make_tuple(counts, bad);
      },
      py::arg("dest"), py::arg("P"),
      "Rows per rank of dest (int32 or int64) and the index of its first entry outside "
      "[0, P), or -1. No MPI call.");

  m.def(
      "migrate_counts",
      [](std::shared_ptr<Comm> comm, int algorithm, const I64Array& counts, i64 code,
         i64 sig) {
        const i64* c = checked(counts, comm->size(), "counts");
        CountResult r;
        {
          py::gil_scoped_release nogil;
          r = migrate_counts(*comm, algorithm, c, code, sig);
        }
        I64Array rc(static_cast<py::ssize_t>(r.rcounts.size()));
        std::copy(r.rcounts.begin(), r.rcounts.end(), rc.mutable_data());
        return py::make_tuple(rc, r.bad, r.sig_mismatch, r.sig_rank);
      },
      py::arg("comm"), py::arg("algorithm"), py::arg("counts"), py::arg("code"), py::arg("sig"),
      "The count exchange of a migration (algorithm 0: MPI_Alltoall, 1: NBX; the given "
      "peers' is MigratePeers), carrying this rank's error code and column signature: (rows from each rank, "
      "rank * 256 + code of the first rank at fault or -1, signature mismatch, a rank whose "
      "signature differs or -1).");

  py::class_<MigratePeers, std::shared_ptr<MigratePeers>>(m, "MigratePeers")
      .def(py::init<std::shared_ptr<Comm>, std::vector<int>>(), py::arg("comm"),
           py::arg("peers"),
           "The count exchange with these peers (not this rank), by persistent requests made "
           "here once (no MPI traffic until exchange).")
      .def(
          "exchange",
          [](MigratePeers& x, const I64Array& counts, i64 code, i64 sig) {
            CountResult r;
            const i64* c = checked(counts, x.comm_size(), "counts");
            {
              py::gil_scoped_release nogil;
              r = x.exchange(c, code, sig);
            }
            I64Array rc(static_cast<py::ssize_t>(r.rcounts.size()));
            std::copy(r.rcounts.begin(), r.rcounts.end(), rc.mutable_data());
            return py::make_tuple(rc, r.bad, r.sig_mismatch, r.sig_rank);
          },
          py::arg("counts"), py::arg("code"), py::arg("sig"),
          "The counts to and from the peers: as migrate_counts returns them.")
      .def_property_readonly("peers", &MigratePeers::peers);

  py::class_<MigrateExchange, std::shared_ptr<MigrateExchange>>(m, "MigrateExchange")
      .def(py::init<std::shared_ptr<Comm>, std::shared_ptr<NodeShm>>(), py::arg("comm"),
           py::arg("node") = nullptr,
           "The exchange of a migration on `comm`; with `node` (its NodeShm), rows between "
           "ranks of one node go through node-shared memory (the shm path).")
      .def(
          "start_forward",
          [](MigrateExchange& x, const py::array& dest, const I64Array& cnt,
             const I64Array& rcnt, const py::list& src, const py::list& dst,
             const I64Array& row_off, py::array& send, py::array& recv,
             std::optional<py::array> block) {
            Args a(dest, cnt, rcnt, src, dst, row_off, send, recv);
            char* b = nullptr;
            i64 bb = 0;
            if (block) {
              b = bytes_of(*block, "block");
              bb = block->nbytes();
            }
            py::gil_scoped_release nogil;
            x.start_forward(a.d, a.item, a.n, a.c, a.rc, a.s, a.t, a.ro, a.sb, a.rb, b, bb);
          },
          py::arg("dest"), py::arg("cnt"), py::arg("rcnt"), py::arg("src"), py::arg("dst"),
          py::arg("row_off"), py::arg("send"), py::arg("recv"), py::arg("block") = py::none())
      .def(
          "start_inplace",
          [](MigrateExchange& x, const py::array& dest, const I64Array& cnt,
             const I64Array& rcnt, const py::list& cols, py::array& send, py::array& recv) {
            int item = 8;
            const void* d = dest_ptr(dest, &item);
            const i64 P = cnt.size();
            const i64 *c = checked(cnt, P, "cnt"), *rc = checked(rcnt, P, "rcnt");
            Cols t = cols_of(cols, true, "a column");
            i64 cap = -1;
            for (const auto& h : cols) {
              const i64 len = py::reinterpret_borrow<py::array>(h).shape(0);
              cap = cap < 0 ? len : std::min(cap, len);
            }
            char *sb = bytes_of(send, "send"), *rb = bytes_of(recv, "recv");
            py::gil_scoped_release nogil;
            x.start_inplace(d, item, dest.size(), c, rc, t, std::max<i64>(cap, 0), sb, rb);
          },
          py::arg("dest"), py::arg("cnt"), py::arg("rcnt"), py::arg("cols"), py::arg("send"),
          py::arg("recv"),
          "Forward in place: `cols` (len(dest) rows held, room for as many as their length) "
          "are source and result; wait() fills the leavers' rows with arrivals (see "
          "MigrateExchange::start_inplace).")
      .def("table_bytes", &MigrateExchange::table_bytes, py::arg("back"), py::arg("columns"),
           "The bytes of the table that leads a node-shared block (forward: the result's, "
           "with `columns` columns; back: the received sections').")
      .def(
          "start_back",
          [](MigrateExchange& x, const py::array& dest, const I64Array& cnt,
             const I64Array& rcnt, const py::list& src, const py::list& dst,
             const I64Array& row_off, py::array& send, py::array& recv, i64 sig) {
            Args a(dest, cnt, rcnt, src, dst, row_off, send, recv);
            const i64 rb = recv.nbytes();
            py::gil_scoped_release nogil;
            x.start_back(a.d, a.item, a.n, a.c, a.rc, a.s, a.t, a.ro, a.sb, a.rb, sig, rb);
          },
          py::arg("dest"), py::arg("cnt"), py::arg("rcnt"), py::arg("src"), py::arg("dst"),
          py::arg("row_off"), py::arg("send"), py::arg("recv"), py::arg("sig"))
      .def(
          "back_error",
          [](MigrateExchange& x, const I64Array& cnt, const I64Array& rcnt, i64 sig, i64 code,
             std::optional<py::array> recv) {
            const i64 P = cnt.size();
            const i64 *c = checked(cnt, P, "cnt"), *rc = checked(rcnt, P, "rcnt");
            char* b = nullptr;
            i64 bb = 0;
            if (recv) {
              b = bytes_of(*recv, "recv");
              bb = recv->nbytes();
            }
            py::gil_scoped_release nogil;
            x.back_error(c, rc, sig, code, b, bb);
          },
          py::arg("cnt"), py::arg("rcnt"), py::arg("sig"), py::arg("code"),
          py::arg("recv") = py::none())
      .def("wait", &MigrateExchange::wait, py::call_guard<py::gil_scoped_release>())
      .def("test", &MigrateExchange::test, py::call_guard<py::gil_scoped_release>(),
           "Have the messages completed? (MPI_Testall; never blocks; wait() then only "
           "unpacks.)")
      .def_property_readonly("active", &MigrateExchange::active);
}

}  // namespace pyshard::bind
