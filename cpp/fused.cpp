#include "fused.h"

#include <algorithm>
#include <stdexcept>

namespace pyshard {

FusedGeometry::FusedGeometry(const std::vector<std::shared_ptr<ExchangeGeometry>>& parts_)
    : size(parts_.empty() ? 0 : parts_[0]->size), parts(parts_) {
  if (parts.empty()) throw std::invalid_argument("pyshard: a fused exchange of no arrays");
  for (const auto& g : parts)
    if (g->size != size)
      throw std::invalid_argument("pyshard: fused exchanges on different communicators");
  const size_t n = parts.size();
  pack.resize(n);
  unpack.resize(n);
  // bytes of array a's block for peer p, each way
  std::vector<std::vector<i64>> sb(n, std::vector<i64>(size, 0)), rb = sb;
  std::vector<std::vector<const Block*>> sblk(n, std::vector<const Block*>(size, nullptr)),
      rblk = sblk;
  for (size_t a = 0; a < n; ++a) {
    for (const Block& b : parts[a]->sends) {
      sb[a][b.peer] = b.bytes;
      sblk[a][b.peer] = &b;
    }
    for (const Block& b : parts[a]->recvs) {
      rb[a][b.peer] = b.bytes;
      rblk[a][b.peer] = &b;
    }
  }
  // peer-major layout: the message for peer p is every array's block for p, in array order
  std::vector<std::vector<i64>> soff(n, std::vector<i64>(size, 0)), roff = soff;
  for (int p = 0; p < size; ++p) {
    i64 s0 = send_ws, r0 = recv_ws, s = s0, r = r0;
    for (size_t a = 0; a < n; ++a) {
      soff[a][p] = s;
      roff[a][p] = r;
      s += sb[a][p];
      r += rb[a][p];
    }
    scounts.push_back(to_count(s - s0, "a fused send count"));
    rcounts.push_back(to_count(r - r0, "a fused receive count"));
    sdispls.push_back(static_cast<DisplT>(s0));
    rdispls.push_back(static_cast<DisplT>(r0));
    max_block = std::max(max_block, std::max(s - s0, r - r0));
    send_ws = align_up(s);
    recv_ws = align_up(r);
  }
  for (size_t a = 0; a < n; ++a) {
    const ExchangeGeometry& g = *parts[a];
    for (int p = 0; p < size; ++p) {
      if (const Block* b = sblk[a][p]) {
        pack[a].begin_block();
        describe_copy(g.src_shape, b->start, b->ext, Shape(b->ext.size(), 0), b->ext, g.item, 0,
                      soff[a][p], &pack[a].host);
        pack[a].end_block();
      }
      if (const Block* b = rblk[a][p]) {
        unpack[a].begin_block();
        describe_copy(b->ext, Shape(b->ext.size(), 0), g.dst_shape, b->start, b->ext, g.item,
                      roff[a][p], 0, &unpack[a].host);
        unpack[a].end_block();
      }
    }
    pack[a].begin_block();
    unpack[a].begin_block();
  }
}

FusedExchangeStep::FusedExchangeStep(std::shared_ptr<Comm> comm,
                                     std::shared_ptr<FusedGeometry> g,
                                     std::shared_ptr<Workspace> ws, Transport tr,
                                     bool nonblocking)
    : comm_(std::move(comm)),
      g_(std::move(g)),
      ws_(std::move(ws)),
      tr_(tr),
      nonblocking_(nonblocking) {
  if (g_->size != comm_->size())
    throw std::invalid_argument("pyshard: geometry for another communicator");
}

void FusedExchangeStep::run(const std::vector<const char*>& srcs, const std::vector<char*>& dsts,
                            Packer& pk) {
  const FusedGeometry& g = *g_;
  const size_t n = g.parts.size();
  if (srcs.size() != n || dsts.size() != n)
    throw std::invalid_argument("pyshard: a fused exchange needs one source and one result "
                                "per array");
  const i64 S = g.send_ws, R = g.recv_ws;
  char* work = ws_->work(pk, S + R);
  for (size_t a = 0; a < n; ++a) pk.copy_all(g.pack[a], srcs[a], work);
  MPI_Comm c = comm_->get();
  auto local = [&]() {
    for (size_t a = 0; a < n; ++a) pk.copy_all(g.parts[a]->local, srcs[a], dsts[a]);
  };
  if (tr_ == Transport::staged) {
    char* bounce = ws_->bounce(pk, S + R);
    local();
    pk.to_host(bounce, work, S);
    pk.sync();
    mpi::alltoallv(bounce, g.scounts, g.sdispls, bounce + S, g.rcounts, g.rdispls, c);
    pk.from_host(work + S, bounce + S, R);
  } else if (nonblocking_ && pk.kind() == Mem::host) {
    MPI_Request req;
    mpi::ialltoallv(work, g.scounts, g.sdispls, work + S, g.rcounts, g.rdispls, c, &req);
    local();  // this rank's own blocks while the exchange runs
    mpi::wait(&req);
  } else {
    local();
    pk.sync();
    mpi::alltoallv(work, g.scounts, g.sdispls, work + S, g.rcounts, g.rdispls, c);
  }
  for (size_t a = 0; a < n; ++a) pk.copy_all(g.unpack[a], work + S, dsts[a]);
  count_call("alltoallv", pk, tr_);
  pk.finish();
}

}  // namespace pyshard
