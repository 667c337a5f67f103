#include "peer_messages.h"

#include <stdexcept>
#include <string>

namespace pyshard {

namespace {

bool same(const std::vector<PeerMsg>& a, const std::vector<PeerMsg>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].at != b[i].at || a[i].bytes != b[i].bytes || a[i].peer != b[i].peer ||
        a[i].type != b[i].type)
      return false;
  return true;
}

void* base(const PeerMsg& m) { return m.at ? static_cast<void*>(m.at) : MPI_BOTTOM; }
int typed_count(const PeerMsg& m) { return m.bytes ? 1 : 0; }

void post_recv(const PeerMsg& m, int tag, MPI_Comm c, MPI_Request* r) {
  if (m.type == MPI_BYTE)
    mpi::irecv(m.at, m.bytes, m.peer, tag, c, r);
  else
    mpi::irecv_typed(base(m), typed_count(m), m.type, m.peer, tag, c, r);
}

void post_send(const PeerMsg& m, int tag, MPI_Comm c, MPI_Request* r) {
  if (m.type == MPI_BYTE)
    mpi::isend(m.at, m.bytes, m.peer, tag, c, r);
  else
    mpi::isend_typed(base(m), typed_count(m), m.type, m.peer, tag, c, r);
}

}  // namespace

PeerMessages::PeerMessages(std::shared_ptr<Comm> comm, int tag, PeerMethod method)
    : comm_(std::move(comm)), tag_(tag), method_(method) {
  if (comm_) comm_->adopt(this);
}

// Mesh.free(): the messages in flight completed, the persistent requests (which keep the
// communicator alive past its free) and the graph communicator freed.
void PeerMessages::comm_released() {
  drop();
  free_requests();
  if (graph_ != MPI_COMM_NULL) mpi::comm_free(&graph_);
}

void PeerMessages::note_recvs(const std::vector<PeerMsg>& recvs) {
  rpeer_.clear();
  rbytes_.clear();
  for (const PeerMsg& m : recvs) {
    rpeer_.push_back(m.peer);
    rbytes_.push_back(m.type == MPI_BYTE ? m.bytes : -1);
  }
}

PeerMessages::~PeerMessages() {
  if (comm_) comm_->forget(this);  // (first: the Comm may outlive this, finalized or not)
  if (mpi::finalized()) return;
  drop();
  free_requests();
  if (graph_ != MPI_COMM_NULL) mpi::comm_free(&graph_);
}

void PeerMessages::free_requests() {
  if (method_ != PeerMethod::p2p)
    for (MPI_Request& r : reqs_)
      if (r != MPI_REQUEST_NULL) mpi::request_free(&r);
  reqs_.clear();
  bound_ = false;
}

void PeerMessages::drop() {
  if (active_)  // one at a time, as wait() (a failed receive is what brings most here)
    for (MPI_Request& r : reqs_) mpi::wait_unchecked(&r);
  active_ = false;
}

void PeerMessages::start(const std::vector<PeerMsg>& recvs, const std::vector<PeerMsg>& sends,
                         char* rbase, const char* sbase) {
  if (active_) throw std::logic_error("pyshard: messages started again before they completed");
  arrived_ = false;
  if (method_ == PeerMethod::neighbor) {
    start_neighbor(recvs, sends, rbase, sbase);
    active_ = true;
    return;
  }
  const MPI_Comm c = comm_->get();
  nrecv_ = recvs.size();
  note_recvs(recvs);
  nsend_ = sends.size();
  if (method_ == PeerMethod::p2p) {
    reqs_.assign(nrecv_ + nsend_, MPI_REQUEST_NULL);
    for (size_t i = 0; i < nrecv_; ++i) pyshard::post_recv(recvs[i], tag_, c, &reqs_[i]);
    for (size_t i = 0; i < nsend_; ++i) pyshard::post_send(sends[i], tag_, c, &reqs_[nrecv_ + i]);
    active_ = true;
    return;
  }
  if (!bound_ || !same(recvs, bound_r_) || !same(sends, bound_s_)) {
    free_requests();
    reqs_.assign(nrecv_ + nsend_, MPI_REQUEST_NULL);
    for (size_t i = 0; i < nrecv_; ++i) {
      const PeerMsg& m = recvs[i];
      if (m.type == MPI_BYTE)
        mpi::recv_init(m.at, m.bytes, m.peer, tag_, c, &reqs_[i]);
      else
        mpi::recv_init_typed(base(m), typed_count(m), m.type, m.peer, tag_, c, &reqs_[i]);
    }
    for (size_t i = 0; i < nsend_; ++i) {
      const PeerMsg& m = sends[i];
      if (m.type == MPI_BYTE)
        mpi::send_init(m.at, m.bytes, m.peer, tag_, c, &reqs_[nrecv_ + i]);
      else
        mpi::send_init_typed(base(m), typed_count(m), m.type, m.peer, tag_, c,
                             &reqs_[nrecv_ + i]);
    }
    bound_r_ = recvs;
    bound_s_ = sends;
    bound_ = true;
  }
  if (!reqs_.empty()) mpi::startall(reqs_.size(), reqs_.data());
  active_ = true;
}

// One neighbourhood all-to-all: the graph communicator at the first call (collective over
// the communicator: every rank starts this pattern together), the counts and offsets from
// the messages (kept as members: a nonblocking call reads them until it completes).
void PeerMessages::start_neighbor(const std::vector<PeerMsg>& recvs,
                                  const std::vector<PeerMsg>& sends, char* rbase,
                                  const char* sbase) {
  if (graph_ == MPI_COMM_NULL) {
    std::vector<int> src, dst;
    for (const PeerMsg& m : recvs) src.push_back(m.peer);
    for (const PeerMsg& m : sends) dst.push_back(m.peer);
    graph_ = mpi::dist_graph(comm_->get(), comm_->rank(), src, dst);
  }
  const bool again = !bound_ || !same(recvs, bound_r_) || !same(sends, bound_s_) ||
                     bound_base_[0] != rbase || bound_base_[1] != sbase;
  if (again) {
    for (const auto* v : {&recvs, &sends})
      for (const PeerMsg& m : *v)
        if (m.type != MPI_BYTE)
          throw std::invalid_argument("pyshard: the neighbor method sends byte messages only");
    for (int side = 0; side < 2; ++side) {
      const auto& v = side == 0 ? recvs : sends;
      const char* b = side == 0 ? rbase : sbase;
      mpi::Counts& n = ncounts_[side];
      mpi::Displs& d = ndispls_[side];
      n.clear();
      d.clear();
      for (const PeerMsg& m : v) {
        n.push_back(to_count(m.bytes, "a message"));
        d.push_back(static_cast<DisplT>(m.bytes ? m.at - b : 0));
      }
      n.push_back(0);  // a valid pointer even for no peers (MPI reads only the degrees' worth)
      d.push_back(0);
    }
  }
  nrecv_ = recvs.size();
  note_recvs(recvs);
  nsend_ = sends.size();
  if (mpi::neighbor_persistent()) {
    if (again) {
      free_requests();
      reqs_.assign(1, MPI_REQUEST_NULL);
      mpi::neighbor_alltoallv_init(sbase, ncounts_[1], ndispls_[1], rbase, ncounts_[0],
                                   ndispls_[0], graph_, &reqs_[0]);
    }
    mpi::start(&reqs_[0]);
  } else {
    free_requests();  // one bound while the library took the persistent path (a test's limit)
    reqs_.assign(1, MPI_REQUEST_NULL);
    mpi::ineighbor_alltoallv(sbase, ncounts_[1], ndispls_[1], rbase, ncounts_[0], ndispls_[0],
                             graph_, &reqs_[0]);
  }
  if (again) {
    bound_r_ = recvs;
    bound_s_ = sends;
    bound_base_[0] = rbase;
    bound_base_[1] = sbase;
  }
  bound_ = true;
}

void PeerMessages::post_recvs(const std::vector<PeerMsg>& recvs) {
  if (active_) throw std::logic_error("pyshard: messages started again before they completed");
  if (method_ != PeerMethod::p2p)
    throw std::logic_error("pyshard: messages posted in steps take the p2p method");
  arrived_ = false;
  nrecv_ = recvs.size();
  note_recvs(recvs);
  nsend_ = 0;
  reqs_.assign(nrecv_, MPI_REQUEST_NULL);
  const MPI_Comm c = comm_->get();
  for (size_t i = 0; i < nrecv_; ++i) pyshard::post_recv(recvs[i], tag_, c, &reqs_[i]);
  active_ = true;
}

void PeerMessages::post_send(const PeerMsg& m) {
  if (!active_ || method_ != PeerMethod::p2p)
    throw std::logic_error("pyshard: post_send() without post_recvs()");
  reqs_.push_back(MPI_REQUEST_NULL);
  pyshard::post_send(m, tag_, comm_->get(), &reqs_.back());
  ++nsend_;
}

bool PeerMessages::test() {
  if (!active_ || arrived_ || reqs_.empty()) return true;
  if (method_ == PeerMethod::neighbor) {
    arrived_ = mpi::test(&reqs_[0]);
    return arrived_;
  }
  std::vector<MPI_Status>& st = statuses_;  // kept: no allocation a call
  st.resize(reqs_.size());
  int done = 0;
  int err = MPI_SUCCESS;
  if (reqs_.size() == 1) {  // one request's error is the call's answer, not its status's
    err = mpi::test_status(&reqs_[0], &done, &st[0]);
    if (err != MPI_SUCCESS) {
      st[0].MPI_ERROR = err;
      err = MPI_ERR_IN_STATUS;
    }
  } else {
    err = mpi::testall_status(reqs_.size(), reqs_.data(), &done, st.data());
  }
  if (err != MPI_SUCCESS) failed(err, st, "MPI_Testall");
  arrived_ = done != 0;
  if (arrived_ && check_sizes_) check_sizes(st);
  return arrived_;
}

void PeerMessages::check_sizes(const std::vector<MPI_Status>& st) const {
  if (method_ == PeerMethod::neighbor) return;  // one request: no status per peer
  for (size_t i = 0; i < nrecv_ && i < rbytes_.size() && i < st.size(); ++i)
    if (rbytes_[i] > 0) {
      const i64 got = mpi::received_bytes(st[i]);
      if (got < rbytes_[i]) throw MessageSizeError(rpeer_[i], false, got, rbytes_[i]);
    }
}

void PeerMessages::wait() {
  if (!active_) return;
  if (arrived_ || reqs_.empty()) {
    active_ = false;
    return;
  }
  std::vector<MPI_Status>& st = statuses_;  // kept: no allocation a call
  st.resize(reqs_.size());
  // One request at a time by MPI_Wait, in the order posted, each error in its status; not
  // MPI_Waitall: where a receive fails (MPI_ERR_TRUNCATE: migrate's back() of wider values,
  // a scatter's check), Open MPI 4.1.4's MPI_Waitall under MPI_THREAD_MULTIPLE (mpi4py's
  // default) left the ranks hung in that or a later MPI_Waitall, a few calls in a hundred at
  // 4 ranks (the same pattern in plain mpi4py too; not with MPI_THREAD_SINGLE, not MPI_Wait).
  // Every request has completed when this loop ends, so failed() waits for none.
  int err = MPI_SUCCESS;
  for (size_t i = 0; i < reqs_.size(); ++i) {
    const int e = mpi::wait_status(&reqs_[i], &st[i]);
    if (e != MPI_SUCCESS) {
      st[i].MPI_ERROR = e;
      err = MPI_ERR_IN_STATUS;
    } else {
      st[i].MPI_ERROR = MPI_SUCCESS;
    }
  }
  active_ = false;
  if (err != MPI_SUCCESS) failed(err, st, "MPI_Wait");
  if (check_sizes_) check_sizes(st);
}

void PeerMessages::failed(int err, std::vector<MPI_Status>& st, const char* call) {
  active_ = false;
  if (err != MPI_ERR_IN_STATUS) {  // the call itself: no status to read
    mpi::waitall_unchecked(reqs_.size(), reqs_.data());
    check_mpi(err, call);
  }
  int first = MPI_SUCCESS;
  long truncated = -1;
  for (size_t i = 0; i < reqs_.size(); ++i) {
    const int e = st[i].MPI_ERROR;
    if (e == MPI_SUCCESS || e == MPI_ERR_PENDING) {
      // not completed yet (or completed, its handle already MPI_REQUEST_NULL): waited for
      if (reqs_[i] != MPI_REQUEST_NULL) mpi::wait_unchecked(&reqs_[i]);
      continue;
    }
    // a failed request MPI left allocated (Open MPI keeps it: a leak each error otherwise)
    if (method_ == PeerMethod::p2p && reqs_[i] != MPI_REQUEST_NULL) mpi::request_free(&reqs_[i]);
    if (mpi::error_class(e) == MPI_ERR_TRUNCATE && i < nrecv_ &&
        method_ != PeerMethod::neighbor) {  // (one request for every peer there)
      if (truncated < 0) truncated = static_cast<long>(i);
    } else if (first == MPI_SUCCESS) {
      first = e;
    }
  }
  check_mpi(first, call);
  if (truncated < 0) throw std::runtime_error(std::string("pyshard: ") + call + " failed");
  throw MessageSizeError(rpeer_[static_cast<size_t>(truncated)], true);
}

}  // namespace pyshard
