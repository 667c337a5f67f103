// pyshard._core: pack/unpack of strided N-D boxes and the MPI collectives of a plan.
//
// Python computes every count from layouts that all ranks share; this module only moves
// bytes. Each planned step becomes one C++ object that holds its counts, displacements and
// block lists, built once and reused for every call. Counts are 64-bit throughout and the
// MPI-4 large-count calls (MPI_Alltoallv_c, ...) are used where the MPI library has them.
#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;
using i64 = std::int64_t;
using Shape = std::vector<i64>;

#if defined(MPI_VERSION) && MPI_VERSION >= 4
#define PYSHARD_LARGE_COUNT 1
using CountT = MPI_Count;
using DisplT = MPI_Aint;
#else
#define PYSHARD_LARGE_COUNT 0
using CountT = int;
using DisplT = int;
#endif

namespace {

std::map<std::string, i64> g_stats;

void check_mpi(int err, const char* what) {
  if (err == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  throw std::runtime_error(std::string("pyshard: ") + what + " failed: " + std::string(msg, len));
}

CountT to_count(i64 v, const char* what) {
#if !PYSHARD_LARGE_COUNT
  if (v > INT_MAX)
    throw std::overflow_error(std::string("pyshard: ") + what +
                              " exceeds 2^31-1 and this MPI has no large-count calls");
#else
  (void)what;
#endif
  return static_cast<CountT>(v);
}

// ---------------------------------------------------------------- MPI communicator (owned)
class Comm {
 public:
  explicit Comm(i64 fhandle) {
    MPI_Comm base = MPI_Comm_f2c(static_cast<MPI_Fint>(fhandle));
    check_mpi(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
  }
  ~Comm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  MPI_Comm get() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 0;
  int rank_ = 0;
};

// ---------------------------------------------------------------- box copy kernel
i64 volume(const Shape& ext) {
  i64 v = 1;
  for (i64 e : ext) v *= e;
  return v;
}

// Copy the box `ext` at `sstart` of a C-contiguous array of shape `sshape` into the box at
// `dstart` of a C-contiguous array of shape `dshape`. Trailing dims that are whole on both
// sides collapse into one contiguous run, so a contiguous block is a single memcpy.
void copy_box(const char* src, const Shape& sshape, const Shape& sstart, char* dst,
              const Shape& dshape, const Shape& dstart, const Shape& ext, i64 item) {
  const int nd = static_cast<int>(ext.size());
  for (i64 e : ext)
    if (e == 0) return;
  std::vector<i64> sstr(nd), dstr(nd);
  i64 s = item, d = item;
  for (int k = nd - 1; k >= 0; --k) {
    sstr[k] = s;
    dstr[k] = d;
    s *= sshape[k];
    d *= dshape[k];
  }
  i64 soff = 0, doff = 0;
  for (int k = 0; k < nd; ++k) {
    soff += sstart[k] * sstr[k];
    doff += dstart[k] * dstr[k];
  }
  // innermost contiguous run
  i64 run = item;
  int k = nd - 1;
  for (; k >= 0; --k) {
    run *= ext[k];
    if (ext[k] != sshape[k] || ext[k] != dshape[k]) break;
  }
  const int outer = k;  // dims [0, outer) are looped over; dim `outer` is inside the run
  if (outer <= 0) {
    std::memcpy(dst + doff, src + soff, static_cast<size_t>(run));
    return;
  }
  std::vector<i64> idx(outer, 0);
  const char* sp = src + soff;
  char* dp = dst + doff;
  while (true) {
    std::memcpy(dp, sp, static_cast<size_t>(run));
    int j = outer - 1;
    for (; j >= 0; --j) {
      if (++idx[j] < ext[j]) {
        sp += sstr[j];
        dp += dstr[j];
        break;
      }
      sp -= (ext[j] - 1) * sstr[j];
      dp -= (ext[j] - 1) * dstr[j];
      idx[j] = 0;
    }
    if (j < 0) break;
  }
}

// Is the box one contiguous run of the C-contiguous array? If so, its byte offset.
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
  // Find the first dim (from the outside) whose extent is > 1; every dim after it must be whole.
  int k = 0;
  while (k < nd && ext[k] == 1) ++k;
  for (int j = k + 1; j < nd; ++j)
    if (ext[j] != shape[j]) return false;
  return true;
}

// Round up to a multiple of 4 KiB (packed blocks start page-aligned in the workspace).
inline i64 align_up(i64 v) { return (v + 4095) & ~i64(4095); }

void irecv_bytes(char* ptr, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
#if PYSHARD_LARGE_COUNT
  check_mpi(MPI_Irecv_c(ptr, n, MPI_BYTE, peer, tag, comm, req), "MPI_Irecv");
#else
  check_mpi(MPI_Irecv(ptr, to_count(n, "a message"), MPI_BYTE, peer, tag, comm, req), "MPI_Irecv");
#endif
}

void isend_bytes(const char* ptr, i64 n, int peer, int tag, MPI_Comm comm, MPI_Request* req) {
#if PYSHARD_LARGE_COUNT
  check_mpi(MPI_Isend_c(ptr, n, MPI_BYTE, peer, tag, comm, req), "MPI_Isend");
#else
  check_mpi(MPI_Isend(ptr, to_count(n, "a message"), MPI_BYTE, peer, tag, comm, req), "MPI_Isend");
#endif
}

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

struct Block {
  int peer;
  Shape start;
  Shape ext;
};

std::vector<Block> to_blocks(const std::vector<std::tuple<int, Shape, Shape>>& in) {
  std::vector<Block> out;
  out.reserve(in.size());
  for (auto& t : in) out.push_back(Block{std::get<0>(t), std::get<1>(t), std::get<2>(t)});
  return out;
}

// ---------------------------------------------------------------- Alltoallv step
class AlltoallvStep {
 public:
  // sends/recvs: (peer rank in comm, start in local array, extent), at most one per peer,
  // never this rank itself; local: (src start, dst start, extent) copied directly.
  // algo: 0 = MPI_Alltoallv, 1 = MPI_Alltoall on blocks padded to `pad` bytes (the same on
  // every rank), 2 = point-to-point (Irecv all, pack and Isend per peer, unpack on arrival).
  AlltoallvStep(std::shared_ptr<Comm> comm, i64 item, Shape src_shape, Shape dst_shape,
                const std::vector<std::tuple<int, Shape, Shape>>& sends,
                const std::vector<std::tuple<int, Shape, Shape>>& recvs,
                const std::vector<std::tuple<Shape, Shape, Shape>>& local, int algo, i64 pad,
                bool nonblocking)
      : algo_(algo),
        pad_(pad),
        nonblocking_(nonblocking),
        comm_(std::move(comm)),
        item_(item),
        src_shape_(std::move(src_shape)),
        dst_shape_(std::move(dst_shape)),
        sends_(to_blocks(sends)),
        recvs_(to_blocks(recvs)),
        local_(local) {
    const int P = comm_->size();
    scounts_.assign(P, 0);
    sdispls_.assign(P, 0);
    rcounts_.assign(P, 0);
    rdispls_.assign(P, 0);
    pack_ = false;
    i64 off = 0;
    // A large block at an offset that is not a multiple of 64 bytes goes through the
    // (page-aligned) workspace: MPICH moved a misaligned 64 MiB block 1.5x slower than an
    // aligned one (38 vs 25 ms), more than the extra copy costs.
    auto misaligned = [](i64 coff, i64 n) { return n >= (i64(1) << 20) && coff % 64 != 0; };
    for (auto& b : sends_) {
      i64 n = volume(b.ext) * item_, coff = 0;
      if (!box_contiguous(src_shape_, b.start, b.ext, item_, &coff) || misaligned(coff, n))
        pack_ = true;
      scounts_[b.peer] = to_count(n, "a send count");
      sdispls_[b.peer] = static_cast<DisplT>(off);
      off = align_up(off + n);  // packed blocks start 4 KiB-aligned: MPICH copies them faster
    }
    send_bytes_ = off;
    if (!pack_) {  // send straight from the source array
      for (auto& b : sends_) {
        i64 coff = 0;
        box_contiguous(src_shape_, b.start, b.ext, item_, &coff);
        sdispls_[b.peer] = static_cast<DisplT>(coff);
      }
    }
    unpack_ = false;
    off = 0;
    for (auto& b : recvs_) {
      i64 n = volume(b.ext) * item_, coff = 0;
      if (!box_contiguous(dst_shape_, b.start, b.ext, item_, &coff) || misaligned(coff, n))
        unpack_ = true;
      rcounts_[b.peer] = to_count(n, "a receive count");
      rdispls_[b.peer] = static_cast<DisplT>(off);
      off = align_up(off + n);
    }
    recv_bytes_ = off;
    if (algo_ < 0 || algo_ > 3) throw std::invalid_argument("pyshard: unknown exchange algorithm");
    if (algo_ == 3) build_types();
    if (algo_ == 1) {
      for (auto& b : sends_)
        if (volume(b.ext) * item_ > pad_)
          throw std::invalid_argument("pyshard: a block exceeds the Alltoall padding");
      for (auto& b : recvs_)
        if (volume(b.ext) * item_ > pad_)
          throw std::invalid_argument("pyshard: a block exceeds the Alltoall padding");
    }
    if (algo_ == 2) {
      // per block: staged or direct, each on its own
      i64 so = 0, ro = 0;
      for (auto& b : sends_) {
        i64 coff = 0;
        bool c = box_contiguous(src_shape_, b.start, b.ext, item_, &coff);
        p2p_send_.push_back({c ? coff : so, c});
        if (!c) so += volume(b.ext) * item_;
      }
      for (auto& b : recvs_) {
        i64 coff = 0;
        bool c = box_contiguous(dst_shape_, b.start, b.ext, item_, &coff);
        p2p_recv_.push_back({c ? coff : ro, c});
        if (!c) ro += volume(b.ext) * item_;
      }
      p2p_sbytes_ = so;
      p2p_rbytes_ = ro;
    }
    if (!unpack_) {  // receive straight into the output
      for (auto& b : recvs_) {
        i64 coff = 0;
        box_contiguous(dst_shape_, b.start, b.ext, item_, &coff);
        rdispls_[b.peer] = static_cast<DisplT>(coff);
      }
    }
  }

  void run(const py::array& src, py::array& dst) {
    Buf s = get_buf(src, false, "source");
    Buf d = get_buf(dst, true, "destination");
    check_shape(s, src_shape_, "source");
    check_shape(d, dst_shape_, "destination");
    {
      py::gil_scoped_release nogil;
      if (algo_ == 3)
        run_alltoallw(s, d);
      else if (algo_ == 1)
        run_alltoall(s, d);
      else if (algo_ == 2)
        run_p2p(s, d);
      else
        run_alltoallv(s, d);
    }
    static const char* names[] = {"alltoallv", "alltoall", "p2p_exchange", "alltoallw"};
    g_stats[names[algo_]] += 1;
  }

 private:
  void copy_local(const Buf& s, const Buf& d) {
    for (auto& t : local_)
      copy_box(s.ptr, src_shape_, std::get<0>(t), d.ptr, dst_shape_, std::get<1>(t),
               std::get<2>(t), item_);
  }

  // copy_local in slices of about 1 MiB along the outermost dim, testing `req` in between
  void copy_local_progress(const Buf& s, const Buf& d, MPI_Request* req) {
    int done = 0;
    for (auto& t : local_) {
      const Shape& ss = std::get<0>(t);
      const Shape& ds = std::get<1>(t);
      const Shape& ext = std::get<2>(t);
      i64 vol = volume(ext);
      if (vol == 0) continue;
      if (ext.empty() || done) {
        copy_box(s.ptr, src_shape_, ss, d.ptr, dst_shape_, ds, ext, item_);
        continue;
      }
      i64 row = vol / ext[0] * item_;
      i64 step = std::max<i64>(1, (i64(1) << 20) / std::max<i64>(row, 1));
      for (i64 r = 0; r < ext[0]; r += step) {
        Shape s2 = ss, d2 = ds, e2 = ext;
        s2[0] += r;
        d2[0] += r;
        e2[0] = std::min(step, ext[0] - r);
        copy_box(s.ptr, src_shape_, s2, d.ptr, dst_shape_, d2, e2, item_);
        if (!done) MPI_Test(req, &done, MPI_STATUS_IGNORE);
      }
    }
  }

  void run_alltoallv(const Buf& s, const Buf& d) {
    if (pack_) {
      sbuf_.resize(static_cast<size_t>(send_bytes_));
      for (auto& b : sends_) {
        Shape zero(b.ext.size(), 0);
        copy_box(s.ptr, src_shape_, b.start, sbuf_.data() + sdispls_[b.peer], b.ext, zero, b.ext,
                 item_);
      }
    }
    if (unpack_) rbuf_.resize(static_cast<size_t>(recv_bytes_));
    const char* sb = pack_ ? sbuf_.data() : s.ptr;
    char* rb = unpack_ ? rbuf_.data() : d.ptr;
    // Blocking or not must be the same on every rank (they are different collectives):
    // the caller decides from the layouts (`nonblocking_`), never from this rank's counts.
    if (!nonblocking_) {  // small blocks: a blocking call is cheaper
      copy_local(s, d);
#if PYSHARD_LARGE_COUNT
      int err = MPI_Alltoallv_c(sb, scounts_.data(), sdispls_.data(), MPI_BYTE, rb,
                                rcounts_.data(), rdispls_.data(), MPI_BYTE, comm_->get());
#else
      int err = MPI_Alltoallv(sb, scounts_.data(), sdispls_.data(), MPI_BYTE, rb, rcounts_.data(),
                              rdispls_.data(), MPI_BYTE, comm_->get());
#endif
      check_mpi(err, "MPI_Alltoallv");
    } else {
      ialltoallv(s, d, sb, rb);
    }
    if (unpack_) {
      for (auto& b : recvs_) {
        Shape zero(b.ext.size(), 0);
        copy_box(rbuf_.data() + rdispls_[b.peer], b.ext, zero, d.ptr, dst_shape_, b.start, b.ext,
                 item_);
      }
    }
  }

  // Start the exchange, then copy this rank's own block in slices while it progresses
  // (MPI_Test between slices drives the transfer), then wait.
  void ialltoallv(const Buf& s, const Buf& d, const char* sb, char* rb) {
    MPI_Request req;
#if PYSHARD_LARGE_COUNT
    int err = MPI_Ialltoallv_c(sb, scounts_.data(), sdispls_.data(), MPI_BYTE, rb,
                               rcounts_.data(), rdispls_.data(), MPI_BYTE, comm_->get(), &req);
#else
    int err = MPI_Ialltoallv(sb, scounts_.data(), sdispls_.data(), MPI_BYTE, rb, rcounts_.data(),
                             rdispls_.data(), MPI_BYTE, comm_->get(), &req);
#endif
    check_mpi(err, "MPI_Ialltoallv");
    copy_local_progress(s, d, &req);
    check_mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }

  // One MPI datatype per peer block (a subarray of the local array): MPI packs and unpacks
  // on the fly, so no separate pack pass and no workspace.
  MPI_Datatype subarray(const Shape& shape, const Block& b) {
    const int nd = static_cast<int>(shape.size());
    MPI_Datatype elem, t;
    check_mpi(MPI_Type_contiguous(static_cast<int>(item_), MPI_BYTE, &elem), "MPI_Type_contiguous");
    if (nd == 0) return elem;
#if PYSHARD_LARGE_COUNT
    std::vector<MPI_Count> sz(shape.begin(), shape.end()), sub(b.ext.begin(), b.ext.end()),
        st(b.start.begin(), b.start.end());
    check_mpi(MPI_Type_create_subarray_c(nd, sz.data(), sub.data(), st.data(), MPI_ORDER_C, elem,
                                         &t),
              "MPI_Type_create_subarray");
#else
    std::vector<int> sz, sub, st;
    for (int k = 0; k < nd; ++k) {
      sz.push_back(static_cast<int>(to_count(shape[k], "an extent")));
      sub.push_back(static_cast<int>(b.ext[k]));
      st.push_back(static_cast<int>(b.start[k]));
    }
    check_mpi(MPI_Type_create_subarray(nd, sz.data(), sub.data(), st.data(), MPI_ORDER_C, elem, &t),
              "MPI_Type_create_subarray");
#endif
    MPI_Type_free(&elem);
    check_mpi(MPI_Type_commit(&t), "MPI_Type_commit");
    return t;
  }

  void build_types() {
    const int P = comm_->size();
    wstypes_.assign(P, MPI_BYTE);
    wrtypes_.assign(P, MPI_BYTE);
    wscounts_.assign(P, 0);
    wrcounts_.assign(P, 0);
    wsdispls_.assign(P, 0);
    wrdispls_.assign(P, 0);
    for (auto& b : sends_) {
      if (volume(b.ext) == 0) continue;
      wstypes_[b.peer] = subarray(src_shape_, b);
      wscounts_[b.peer] = 1;
      owned_.push_back(wstypes_[b.peer]);
    }
    for (auto& b : recvs_) {
      if (volume(b.ext) == 0) continue;
      wrtypes_[b.peer] = subarray(dst_shape_, b);
      wrcounts_[b.peer] = 1;
      owned_.push_back(wrtypes_[b.peer]);
    }
  }

  void run_alltoallw(const Buf& s, const Buf& d) {
    copy_local(s, d);
#if PYSHARD_LARGE_COUNT
    int err = MPI_Alltoallw_c(s.ptr, wscounts_.data(), wsdispls_.data(), wstypes_.data(), d.ptr,
                              wrcounts_.data(), wrdispls_.data(), wrtypes_.data(), comm_->get());
#else
    std::vector<int> sc(wscounts_.begin(), wscounts_.end()), rc(wrcounts_.begin(), wrcounts_.end());
    std::vector<int> sd(wsdispls_.size(), 0), rd(wrdispls_.size(), 0);
    int err = MPI_Alltoallw(s.ptr, sc.data(), sd.data(), wstypes_.data(), d.ptr, rc.data(),
                            rd.data(), wrtypes_.data(), comm_->get());
#endif
    check_mpi(err, "MPI_Alltoallw");
  }

  void run_alltoall(const Buf& s, const Buf& d) {
    const size_t P = static_cast<size_t>(comm_->size());
    sbuf_.resize(P * static_cast<size_t>(pad_));
    rbuf_.resize(P * static_cast<size_t>(pad_));
    for (auto& b : sends_) {
      Shape zero(b.ext.size(), 0);
      copy_box(s.ptr, src_shape_, b.start, sbuf_.data() + b.peer * pad_, b.ext, zero, b.ext,
               item_);
    }
    copy_local(s, d);
#if PYSHARD_LARGE_COUNT
    int err = MPI_Alltoall_c(sbuf_.data(), pad_, MPI_BYTE, rbuf_.data(), pad_, MPI_BYTE,
                             comm_->get());
#else
    int err = MPI_Alltoall(sbuf_.data(), to_count(pad_, "a padded block"), MPI_BYTE, rbuf_.data(),
                           to_count(pad_, "a padded block"), MPI_BYTE, comm_->get());
#endif
    check_mpi(err, "MPI_Alltoall");
    for (auto& b : recvs_) {
      Shape zero(b.ext.size(), 0);
      copy_box(rbuf_.data() + b.peer * pad_, b.ext, zero, d.ptr, dst_shape_, b.start, b.ext,
               item_);
    }
  }

  void run_p2p(const Buf& s, const Buf& d) {
    const int tag = 7;
    sbuf_.resize(static_cast<size_t>(p2p_sbytes_));
    rbuf_.resize(static_cast<size_t>(p2p_rbytes_));
    std::vector<MPI_Request> rreq(recvs_.size(), MPI_REQUEST_NULL),
        sreq(sends_.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < recvs_.size(); ++i) {
      const Block& b = recvs_[i];
      char* ptr = p2p_recv_[i].direct ? d.ptr + p2p_recv_[i].off : rbuf_.data() + p2p_recv_[i].off;
      i64 n = volume(b.ext) * item_;
      irecv_bytes(ptr, n, b.peer, tag, comm_->get(), &rreq[i]);
    }
    // send in order of distance from this rank, so peers are not all hit at once
    const int me = comm_->rank(), P = comm_->size();
    std::vector<size_t> order(sends_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return (sends_[a].peer - me + P) % P < (sends_[b].peer - me + P) % P;
    });
    for (size_t i : order) {
      const Block& b = sends_[i];
      const char* ptr = s.ptr + p2p_send_[i].off;
      if (!p2p_send_[i].direct) {
        Shape zero(b.ext.size(), 0);
        copy_box(s.ptr, src_shape_, b.start, sbuf_.data() + p2p_send_[i].off, b.ext, zero, b.ext,
                 item_);
        ptr = sbuf_.data() + p2p_send_[i].off;
      }
      i64 n = volume(b.ext) * item_;
      isend_bytes(ptr, n, b.peer, tag, comm_->get(), &sreq[i]);
    }
    copy_local(s, d);
    for (size_t k = 0; k < recvs_.size(); ++k) {
      int idx = MPI_UNDEFINED;
      check_mpi(MPI_Waitany(static_cast<int>(rreq.size()), rreq.data(), &idx, MPI_STATUS_IGNORE),
                "MPI_Waitany");
      if (idx == MPI_UNDEFINED) break;
      if (!p2p_recv_[idx].direct) {
        const Block& b = recvs_[idx];
        Shape zero(b.ext.size(), 0);
        copy_box(rbuf_.data() + p2p_recv_[idx].off, b.ext, zero, d.ptr, dst_shape_, b.start, b.ext,
                 item_);
      }
    }
    check_mpi(MPI_Waitall(static_cast<int>(sreq.size()), sreq.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
  }

 public:
  ~AlltoallvStep() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      for (auto& t : owned_) MPI_Type_free(&t);
  }
  AlltoallvStep(const AlltoallvStep&) = delete;
  AlltoallvStep& operator=(const AlltoallvStep&) = delete;

  bool packs() const { return pack_; }
  bool unpacks() const { return unpack_; }
  int algorithm() const { return algo_; }
  i64 workspace_bytes() const {
    if (algo_ == 1) return 2 * pad_ * comm_->size();
    if (algo_ == 2) return p2p_sbytes_ + p2p_rbytes_;
    if (algo_ == 3) return 0;
    return (pack_ ? send_bytes_ : 0) + (unpack_ ? recv_bytes_ : 0);
  }

 private:
  struct P2PBuf {
    i64 off;
    bool direct;
  };
  int algo_ = 0;
  i64 pad_ = 0;
  bool nonblocking_ = false;
  std::vector<MPI_Datatype> wstypes_, wrtypes_, owned_;
  std::vector<CountT> wscounts_, wrcounts_;
  std::vector<DisplT> wsdispls_, wrdispls_;
  std::vector<P2PBuf> p2p_send_, p2p_recv_;
  i64 p2p_sbytes_ = 0, p2p_rbytes_ = 0;
  std::shared_ptr<Comm> comm_;
  i64 item_;
  Shape src_shape_, dst_shape_;
  std::vector<Block> sends_, recvs_;
  std::vector<std::tuple<Shape, Shape, Shape>> local_;
  std::vector<CountT> scounts_, rcounts_;
  std::vector<DisplT> sdispls_, rdispls_;
  i64 send_bytes_ = 0, recv_bytes_ = 0;
  bool pack_ = false, unpack_ = false;
  std::vector<char> sbuf_, rbuf_;
};

// ---------------------------------------------------------------- Allgatherv step
class AllgathervStep {
 public:
  // Every member sends its whole (contiguous) source array; recvs[i] is where member i's
  // block lands in the destination (start, extent), in comm rank order.
  AllgathervStep(std::shared_ptr<Comm> comm, i64 item, Shape src_shape, Shape dst_shape,
                 const std::vector<std::tuple<Shape, Shape>>& recvs)
      : comm_(std::move(comm)),
        item_(item),
        src_shape_(std::move(src_shape)),
        dst_shape_(std::move(dst_shape)) {
    const int P = comm_->size();
    if (static_cast<int>(recvs.size()) != P)
      throw std::invalid_argument("pyshard: Allgatherv needs one block per member");
    for (auto& t : recvs) blocks_.push_back(Block{0, std::get<0>(t), std::get<1>(t)});
    counts_.assign(P, 0);
    displs_.assign(P, 0);
    unpack_ = false;
    i64 off = 0;
    for (int p = 0; p < P; ++p) {
      i64 n = volume(blocks_[p].ext) * item_, coff = 0;
      if (!box_contiguous(dst_shape_, blocks_[p].start, blocks_[p].ext, item_, &coff))
        unpack_ = true;
      counts_[p] = to_count(n, "a gather count");
      displs_[p] = static_cast<DisplT>(off);
      off += n;
    }
    total_ = off;
    if (volume(src_shape_) * item_ != volume(blocks_[comm_->rank()].ext) * item_)
      throw std::invalid_argument("pyshard: Allgatherv block of this rank != its source size");
    if (!unpack_) {
      for (int p = 0; p < P; ++p) {
        i64 coff = 0;
        box_contiguous(dst_shape_, blocks_[p].start, blocks_[p].ext, item_, &coff);
        displs_[p] = static_cast<DisplT>(coff);
      }
    }
  }

  void run(const py::array& src, py::array& dst) {
    Buf s = get_buf(src, false, "source");
    Buf d = get_buf(dst, true, "destination");
    check_shape(s, src_shape_, "source");
    check_shape(d, dst_shape_, "destination");
    {
      py::gil_scoped_release nogil;
      if (unpack_) rbuf_.resize(static_cast<size_t>(total_));
      char* rb = unpack_ ? rbuf_.data() : d.ptr;
      const int me = comm_->rank();
#if PYSHARD_LARGE_COUNT
      int err = MPI_Allgatherv_c(s.ptr, counts_[me], MPI_BYTE, rb, counts_.data(),
                                 displs_.data(), MPI_BYTE, comm_->get());
#else
      int err = MPI_Allgatherv(s.ptr, counts_[me], MPI_BYTE, rb, counts_.data(), displs_.data(),
                               MPI_BYTE, comm_->get());
#endif
      check_mpi(err, "MPI_Allgatherv");
      if (unpack_) {
        for (size_t p = 0; p < blocks_.size(); ++p) {
          const Block& b = blocks_[p];
          Shape zero(b.ext.size(), 0);
          copy_box(rbuf_.data() + displs_[p], b.ext, zero, d.ptr, dst_shape_, b.start, b.ext,
                   item_);
        }
      }
    }
    g_stats["allgatherv"] += 1;
  }

  bool unpacks() const { return unpack_; }
  i64 workspace_bytes() const { return unpack_ ? total_ : 0; }

 private:
  std::shared_ptr<Comm> comm_;
  i64 item_;
  Shape src_shape_, dst_shape_;
  std::vector<Block> blocks_;
  std::vector<CountT> counts_;
  std::vector<DisplT> displs_;
  i64 total_ = 0;
  bool unpack_ = false;
  std::vector<char> rbuf_;
};

// ---------------------------------------------------------------- reductions
MPI_Datatype mpi_type(const std::string& code) {
  static const std::map<std::string, MPI_Datatype> m = {
      {"b1", MPI_C_BOOL},         {"i1", MPI_INT8_T},          {"i2", MPI_INT16_T},
      {"i4", MPI_INT32_T},        {"i8", MPI_INT64_T},         {"u1", MPI_UINT8_T},
      {"u2", MPI_UINT16_T},       {"u4", MPI_UINT32_T},        {"u8", MPI_UINT64_T},
      {"f4", MPI_FLOAT},          {"f8", MPI_DOUBLE},          {"c8", MPI_C_FLOAT_COMPLEX},
      {"c16", MPI_C_DOUBLE_COMPLEX},
  };
  auto it = m.find(code);
  if (it == m.end()) throw std::invalid_argument("pyshard: no MPI reduction type for " + code);
  return it->second;
}

MPI_Op mpi_op(const std::string& op) {
  if (op == "sum") return MPI_SUM;
  if (op == "max") return MPI_MAX;
  if (op == "min") return MPI_MIN;
  if (op == "lor") return MPI_LOR;
  if (op == "land") return MPI_LAND;
  throw std::invalid_argument("pyshard: unknown reduction op " + op);
}

class AllreduceStep {
 public:
  AllreduceStep(std::shared_ptr<Comm> comm, const std::string& type, const std::string& op,
                Shape shape)
      : comm_(std::move(comm)), type_(mpi_type(type)), op_(mpi_op(op)), shape_(std::move(shape)) {}

  void run(const py::array& src, py::array& dst) {
    Buf s = get_buf(src, false, "source");
    Buf d = get_buf(dst, true, "destination");
    check_shape(s, shape_, "source");
    check_shape(d, shape_, "destination");
    {
      py::gil_scoped_release nogil;
      i64 n = volume(shape_);
#if PYSHARD_LARGE_COUNT
      int err = MPI_Allreduce_c(s.ptr, d.ptr, n, type_, op_, comm_->get());
#else
      int err = MPI_Allreduce(s.ptr, d.ptr, to_count(n, "a reduce count"), type_, op_,
                              comm_->get());
#endif
      check_mpi(err, "MPI_Allreduce");
    }
    g_stats["allreduce"] += 1;
  }

 private:
  std::shared_ptr<Comm> comm_;
  MPI_Datatype type_;
  MPI_Op op_;
  Shape shape_;
};

class ReduceScatterStep {
 public:
  // pieces[i]: the box of the source that member i receives reduced, in comm rank order.
  ReduceScatterStep(std::shared_ptr<Comm> comm, const std::string& type, const std::string& op,
                    i64 item, Shape src_shape, Shape dst_shape,
                    const std::vector<std::tuple<Shape, Shape>>& pieces)
      : comm_(std::move(comm)),
        type_(mpi_type(type)),
        op_(mpi_op(op)),
        item_(item),
        src_shape_(std::move(src_shape)),
        dst_shape_(std::move(dst_shape)) {
    const int P = comm_->size();
    if (static_cast<int>(pieces.size()) != P)
      throw std::invalid_argument("pyshard: Reduce_scatter needs one piece per member");
    pack_ = false;
    i64 expect = 0;
    for (auto& t : pieces) {
      Block b{0, std::get<0>(t), std::get<1>(t)};
      i64 coff = 0;
      if (!box_contiguous(src_shape_, b.start, b.ext, item_, &coff) || coff != expect * item_)
        pack_ = true;
      i64 n = volume(b.ext);
      expect += n;
      counts_.push_back(to_count(n, "a reduce-scatter count"));
      pieces_.push_back(std::move(b));
    }
    total_ = expect;
    if (volume(dst_shape_) != volume(pieces_[comm_->rank()].ext))
      throw std::invalid_argument("pyshard: Reduce_scatter piece of this rank != its output");
  }

  void run(const py::array& src, py::array& dst) {
    Buf s = get_buf(src, false, "source");
    Buf d = get_buf(dst, true, "destination");
    check_shape(s, src_shape_, "source");
    check_shape(d, dst_shape_, "destination");
    {
      py::gil_scoped_release nogil;
      const char* sb = s.ptr;
      if (pack_) {
        sbuf_.resize(static_cast<size_t>(total_ * item_));
        i64 off = 0;
        for (auto& b : pieces_) {
          Shape zero(b.ext.size(), 0);
          copy_box(s.ptr, src_shape_, b.start, sbuf_.data() + off, b.ext, zero, b.ext, item_);
          off += volume(b.ext) * item_;
        }
        sb = sbuf_.data();
      }
#if PYSHARD_LARGE_COUNT
      int err = MPI_Reduce_scatter_c(sb, d.ptr, counts_.data(), type_, op_, comm_->get());
#else
      int err = MPI_Reduce_scatter(sb, d.ptr, counts_.data(), type_, op_, comm_->get());
#endif
      check_mpi(err, "MPI_Reduce_scatter");
    }
    g_stats["reduce_scatter"] += 1;
  }

  bool packs() const { return pack_; }
  i64 workspace_bytes() const { return pack_ ? total_ * item_ : 0; }

 private:
  std::shared_ptr<Comm> comm_;
  MPI_Datatype type_;
  MPI_Op op_;
  i64 item_;
  Shape src_shape_, dst_shape_;
  std::vector<Block> pieces_;
  std::vector<CountT> counts_;
  i64 total_ = 0;
  bool pack_ = false;
  std::vector<char> sbuf_;
};

// One Allgather of a few int64 per rank: the only place pyshard learns shapes over the wire.
std::vector<i64> allgather_i64(const std::shared_ptr<Comm>& comm, const std::vector<i64>& mine) {
  std::vector<i64> all(mine.size() * static_cast<size_t>(comm->size()));
  {
    py::gil_scoped_release nogil;
    check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                            static_cast<int>(mine.size()), MPI_INT64_T, comm->get()),
              "MPI_Allgather");
  }
  g_stats["allgather"] += 1;
  return all;
}

// The same box copy as the steps use, exposed for local (no communication) steps and tests.
void py_copy_box(const py::array& src, const Shape& sstart, py::array& dst, const Shape& dstart,
                 const Shape& ext) {
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
  py::gil_scoped_release nogil;
  copy_box(s.ptr, s.shape, sstart, d.ptr, d.shape, dstart, ext, s.item);
}

std::string library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  return std::string(v, len);
}

std::string library_path() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&MPI_Get_library_version), &info) && info.dli_fname)
    return info.dli_fname;
  return "";
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "pyshard C++ core: box packing and the MPI collectives of a plan";
  m.attr("__version__") = PYSHARD_VERSION;
  m.attr("large_count") = bool(PYSHARD_LARGE_COUNT);
#ifdef MPICH_VERSION
  m.attr("built_with") = std::string("MPICH ") + MPICH_VERSION;
#elif defined(OMPI_MAJOR_VERSION)
  m.attr("built_with") = "Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." +
                         std::to_string(OMPI_MINOR_VERSION) + "." +
                         std::to_string(OMPI_RELEASE_VERSION);
#else
  m.attr("built_with") = "MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION);
#endif

  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm")
      .def(py::init<i64>(), py::arg("fortran_handle"))
      .def_property_readonly("size", &Comm::size)
      .def_property_readonly("rank", &Comm::rank);

  py::class_<AlltoallvStep>(m, "AlltoallvStep")
      .def(py::init<std::shared_ptr<Comm>, i64, Shape, Shape,
                    const std::vector<std::tuple<int, Shape, Shape>>&,
                    const std::vector<std::tuple<int, Shape, Shape>>&,
                    const std::vector<std::tuple<Shape, Shape, Shape>>&, int, i64, bool>(),
           py::arg("comm"), py::arg("itemsize"), py::arg("src_shape"), py::arg("dst_shape"),
           py::arg("sends"), py::arg("recvs"), py::arg("local"), py::arg("algorithm") = 0,
           py::arg("pad_bytes") = 0, py::arg("nonblocking") = false)
      .def("run", &AlltoallvStep::run)
      .def_property_readonly("algorithm", &AlltoallvStep::algorithm)
      .def_property_readonly("packs", &AlltoallvStep::packs)
      .def_property_readonly("unpacks", &AlltoallvStep::unpacks)
      .def_property_readonly("workspace_bytes", &AlltoallvStep::workspace_bytes);

  py::class_<AllgathervStep>(m, "AllgathervStep")
      .def(py::init<std::shared_ptr<Comm>, i64, Shape, Shape,
                    const std::vector<std::tuple<Shape, Shape>>&>())
      .def("run", &AllgathervStep::run)
      .def_property_readonly("unpacks", &AllgathervStep::unpacks)
      .def_property_readonly("workspace_bytes", &AllgathervStep::workspace_bytes);

  py::class_<AllreduceStep>(m, "AllreduceStep")
      .def(py::init<std::shared_ptr<Comm>, const std::string&, const std::string&, Shape>())
      .def("run", &AllreduceStep::run);

  py::class_<ReduceScatterStep>(m, "ReduceScatterStep")
      .def(py::init<std::shared_ptr<Comm>, const std::string&, const std::string&, i64, Shape,
                    Shape, const std::vector<std::tuple<Shape, Shape>>&>())
      .def("run", &ReduceScatterStep::run)
      .def_property_readonly("packs", &ReduceScatterStep::packs)
      .def_property_readonly("workspace_bytes", &ReduceScatterStep::workspace_bytes);

  m.def("allgather_i64", &allgather_i64, py::arg("comm"), py::arg("values"));
  m.def("copy_box", &py_copy_box, py::arg("src"), py::arg("src_start"), py::arg("dst"),
        py::arg("dst_start"), py::arg("extent"));
  m.def("stats", []() { return g_stats; });
  m.def("reset_stats", []() { g_stats.clear(); });
  m.def("library_version", &library_version);
  m.def("library_path", &library_path);
}
