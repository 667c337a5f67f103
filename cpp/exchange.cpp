#include "exchange.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tags.h"

namespace pyshard {

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::alltoallv:
      return "alltoallv";
    case Algorithm::alltoall:
      return "alltoall";
    case Algorithm::p2p:
      return "p2p";
    case Algorithm::alltoallw:
      return "alltoallw";
  }
  return "?";
}

namespace {

// Blocks of `in` against a C-contiguous array of `shape`, with packed workspace offsets:
// `slot` bytes apart when slot > 0 (padded Alltoall), else 4 KiB-aligned one after another.
std::vector<Block> make_blocks(const std::vector<BlockSpec>& in, const Shape& shape, i64 item,
                               i64 slot, i64* ws_bytes) {
  std::vector<Block> out;
  i64 off = 0;
  for (auto& t : in) {
    Block b{std::get<0>(t), std::get<1>(t), std::get<2>(t)};
    b.bytes = volume(b.ext) * item;
    b.contiguous = box_contiguous(shape, b.start, b.ext, item, &b.array_off);
    if (slot > 0) {
      if (b.bytes > slot)
        throw std::invalid_argument("pyshard: a block exceeds the Alltoall padding");
      b.ws_off = static_cast<i64>(b.peer) * slot;
    } else {
      b.ws_off = off;
      off = align_up(off + b.bytes);
    }
    out.push_back(std::move(b));
  }
  *ws_bytes = off;
  return out;
}

}  // namespace

ExchangeGeometry::ExchangeGeometry(int size_, i64 item_, Shape src_shape_, Shape dst_shape_,
                                   const std::vector<BlockSpec>& sends_,
                                   const std::vector<BlockSpec>& recvs_,
                                   const std::vector<LocalSpec>& local_, Algorithm algo_,
                                   i64 pad_)
    : size(size_),
      item(item_),
      src_shape(std::move(src_shape_)),
      dst_shape(std::move(dst_shape_)),
      algo(algo_),
      pad(pad_) {
  const i64 slot = algo == Algorithm::alltoall ? pad : 0;
  sends = make_blocks(sends_, src_shape, item, slot, &send_ws);
  recvs = make_blocks(recvs_, dst_shape, item, slot, &recv_ws);
  if (slot > 0) send_ws = recv_ws = slot * size;
  // Alltoallv goes straight from and to the arrays when every block is contiguous (and
  // large ones aligned); Alltoall when every member's slot (this rank's own included) is a
  // whole contiguous block exactly where the slot lies in the array
  auto needs_ws = [&](const Block& b) {
    if (!b.contiguous) return true;
    if (algo == Algorithm::alltoall) return b.bytes != slot || b.array_off != b.ws_off;
    return algo == Algorithm::alltoallv && misaligned(b.array_off, b.bytes);
  };
  if (algo == Algorithm::alltoall) {
    pack_all = static_cast<int>(sends.size()) != size;
    unpack_all = static_cast<int>(recvs.size()) != size;
  }
  for (const Block& b : sends) {
    if (needs_ws(b)) pack_all = true;
    pack.begin_block();
    describe_copy(src_shape, b.start, b.ext, Shape(b.ext.size(), 0), b.ext, item, 0, b.ws_off,
                  &pack.host);
    pack.end_block();
  }
  for (const Block& b : recvs) {
    if (needs_ws(b)) unpack_all = true;
    unpack.begin_block();
    describe_copy(b.ext, Shape(b.ext.size(), 0), dst_shape, b.start, b.ext, item, b.ws_off, 0,
                  &unpack.host);
    unpack.end_block();
  }
  for (auto& t : local_) {
    local.begin_block();
    describe_copy(src_shape, std::get<0>(t), dst_shape, std::get<1>(t), std::get<2>(t), item, 0,
                  0, &local.host);
    local.end_block();
  }
  pack.begin_block();  // empty tables still have blocks() == 0
  unpack.begin_block();
  local.begin_block();
}

i64 ExchangeGeometry::workspace_bytes() const {
  switch (algo) {
    case Algorithm::alltoallw:
      return 0;
    default:
      return (pack_all ? send_ws : 0) + (unpack_all ? recv_ws : 0);
  }
}

ExchangeStep::ExchangeStep(std::shared_ptr<Comm> comm, std::shared_ptr<ExchangeGeometry> g,
                           std::shared_ptr<Workspace> ws, Transport tr, bool nonblocking)
    : comm_(std::move(comm)),
      g_(std::move(g)),
      ws_(std::move(ws)),
      tr_(tr),
      nonblocking_(nonblocking),
      msgs_(comm_, tags::kExchange) {
  const int P = comm_->size();
  if (g_->size != P) throw std::invalid_argument("pyshard: geometry for another communicator");
  if (g_->algo == Algorithm::p2p) {  // messages to the peers it has: nothing O(ranks)
    // sends in order of distance from this rank
    const int me = comm_->rank();
    order_.resize(g_->sends.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      return (g_->sends[a].peer - me + P) % P < (g_->sends[b].peer - me + P) % P;
    });
    return;
  }
  scounts_.assign(P, 0);
  rcounts_.assign(P, 0);
  sdispls_.assign(P, 0);
  rdispls_.assign(P, 0);
  sdirect_.assign(P, 0);
  rdirect_.assign(P, 0);
  for (const Block& b : g_->sends) {
    scounts_[b.peer] = to_count(b.bytes, "a send count");
    sdispls_[b.peer] = static_cast<DisplT>(b.ws_off);
    sdirect_[b.peer] = static_cast<DisplT>(b.array_off);
  }
  for (const Block& b : g_->recvs) {
    rcounts_[b.peer] = to_count(b.bytes, "a receive count");
    rdispls_[b.peer] = static_cast<DisplT>(b.ws_off);
    rdirect_[b.peer] = static_cast<DisplT>(b.array_off);
  }
  if (g_->algo == Algorithm::alltoallw) build_types();
}

ExchangeStep::~ExchangeStep() {
  if (mpi::finalized()) return;
  for (auto* v : {&wstypes_, &wrtypes_})
    for (auto& t : *v)
      if (t != MPI_BYTE) mpi::type_free(&t);
}

// One MPI datatype per peer block (a subarray of the local array): MPI packs and unpacks
// on the fly, so no separate pack pass and no workspace.
void ExchangeStep::build_types() {
  const int P = comm_->size();
  wstypes_.assign(P, MPI_BYTE);
  wrtypes_.assign(P, MPI_BYTE);
  wscounts_.assign(P, 0);
  wrcounts_.assign(P, 0);
  wdispls_.assign(P, 0);
  for (const Block& b : g_->sends) {
    if (b.bytes == 0) continue;
    wstypes_[b.peer] = mpi::subarray(g_->src_shape, b.start, b.ext, g_->item);
    wscounts_[b.peer] = 1;
  }
  for (const Block& b : g_->recvs) {
    if (b.bytes == 0) continue;
    wrtypes_[b.peer] = mpi::subarray(g_->dst_shape, b.start, b.ext, g_->item);
    wrcounts_[b.peer] = 1;
  }
}

void ExchangeStep::run(const char* src, char* dst, Packer& pk) {
  if (tr_ == Transport::staged)
    staged(src, dst, pk);
  else
    direct(src, dst, pk);
  // a staged Alltoallw is an Alltoallv of packed blocks (MPI datatypes need MPI's memory)
  const bool w_as_v = tr_ == Transport::staged && g_->algo == Algorithm::alltoallw;
  count_call(algorithm_name(w_as_v ? Algorithm::alltoallv : g_->algo), pk, tr_);
  pk.finish();
}

void ExchangeStep::direct(const char* src, char* dst, Packer& pk) {
  const ExchangeGeometry& g = *g_;
  MPI_Comm c = comm_->get();
  if (g.algo == Algorithm::alltoallw) {
    pk.copy_all(g.local, src, dst);
    pk.sync();
    mpi::alltoallw(src, wscounts_, wdispls_, wstypes_, dst, wrcounts_, wdispls_, wrtypes_, c);
    return;
  }
  const bool all = g.algo == Algorithm::alltoall;
  const bool pack = g.pack_all, unpack = g.unpack_all;
  const i64 S = pack ? g.send_ws : 0, R = unpack ? g.recv_ws : 0;
  char* work = ws_->work(pk, S + R);
  if (g.algo == Algorithm::p2p) {
    p2p(src, dst, work, pk, false);
    return;
  }
  if (pack) pk.copy_all(g.pack, src, work);
  const char* sb = pack ? work : src;
  char* rb = unpack ? work + S : dst;
  if (all) {  // this rank's own block travels in its slot
    pk.sync();
    mpi::alltoall(sb, rb, g.pad, c);
  } else if (nonblocking_ && pk.kind() == Mem::host) {
    host_nonblocking(sb, rb, src, dst);
  } else {
    pk.copy_all(g.local, src, dst);  // on a GPU it overlaps the exchange by itself
    pk.sync();
    mpi::alltoallv(sb, scounts_, pack ? sdispls_ : sdirect_, rb, rcounts_,
                   unpack ? rdispls_ : rdirect_, c);
  }
  if (unpack) pk.copy_all(g.unpack, work + S, dst);
}

// Start the exchange, then copy this rank's own block in runs of at most 1 MiB while it
// progresses (MPI_Test between runs drives the transfer), then wait. Host memory only.
void ExchangeStep::host_nonblocking(const char* sb, char* rb, const char* src, char* dst) {
  const ExchangeGeometry& g = *g_;
  MPI_Request req;
  mpi::ialltoallv(sb, scounts_, g.pack_all ? sdispls_ : sdirect_, rb, rcounts_,
                  g.unpack_all ? rdispls_ : rdirect_, comm_->get(), &req);
  int done = 0;
  i64 since = 0;
  for (const CopyDesc& d : g.local.host) {
    const i64 chunk = done ? d.run : std::min<i64>(d.run, i64(1) << 20);
    for (const CopyDesc& piece : split_runs({d}, chunk)) {
      for_each_run(piece, [&](i64 s, i64 t) {
        std::memcpy(dst + t, src + s, static_cast<size_t>(piece.run));
        since += piece.run;
        if (!done && since >= (i64(1) << 20)) {
          done = mpi::test(&req);
          since = 0;
        }
      });
    }
  }
  mpi::wait(&req);
}

// Irecv every block, then pack and Isend per peer in order of distance from this rank (on
// the host each block is packed just before it is sent), then unpack blocks as they arrive.
// Direct: contiguous blocks go straight from and to the arrays. Staged: every block goes
// through the bounce buffers, and each arrival is copied back and unpacked on its own while
// the other messages are still in flight.
void ExchangeStep::p2p(const char* src, char* dst, char* work, Packer& pk, bool staged) {
  const ExchangeGeometry& g = *g_;
  const bool packs = staged || g.pack_all;
  const i64 S = packs ? g.send_ws : 0;
  char* bounce = staged ? ws_->bounce(pk, g.send_ws + g.recv_ws) : nullptr;
  char* sbase = staged ? bounce : work;  // where packed blocks are sent from
  char* rbase = staged ? bounce + S : work + S;
  auto via_ws = [&](const Block& b) { return staged || !b.contiguous; };
  const size_t ns = g.sends.size();
  const bool pipelined = pk.kind() == Mem::host && !staged;
  // A GPU's stream may still read what the receives below let MPI write (the bounce buffer
  // or workspace a previous step unpacks from, memory a queued kernel reads): wait for it
  // before posting them, as every other step waits before MPI touches its buffers.
  if (pk.kind() != Mem::host) pk.sync();
  post_p2p(msgs_, sbase, rbase, src, dst, staged,
           [&] {
             if (pipelined) return;  // one pass (one kernel launch on a GPU), then wait once
             for (size_t i = 0; i < ns; ++i)
               if (via_ws(g.sends[i])) pk.copy(g.pack, i, i + 1, src, work);
             pk.copy_all(g.local, src, dst);
             if (staged) pk.to_host(bounce, work, g.send_ws);
             pk.sync();
           },
           [&](size_t i) {
             if (pipelined && via_ws(g.sends[i])) pk.copy(g.pack, i, i + 1, src, work);
           });
  if (pipelined) pk.copy_all(g.local, src, dst);
  char* rwork = work + S;
  msgs_.wait_each([&](size_t i) {
    const Block& b = g.recvs[i];
    if (!via_ws(b)) return;
    if (staged) pk.from_host(rwork + b.ws_off, rbase + b.ws_off, b.bytes);
    pk.copy(g.unpack, i, i + 1, rwork, dst);
  });
}

// The p2p algorithm's messages (peer_messages.h): block i's receive into rbase (through the
// workspace) or straight into dst; then ready(), then per send in order of distance pack(i)
// and its send, from sbase or straight from src.
template <class Ready, class Pack>
void ExchangeStep::post_p2p(PeerMessages& msgs, const char* sbase, char* rbase, const char* src,
                            char* dst, bool staged, Ready&& ready, Pack&& pack) {
  const ExchangeGeometry& g = *g_;
  auto via_ws = [&](const Block& b) { return staged || !b.contiguous; };
  rmsg_.clear();
  for (const Block& b : g.recvs)
    rmsg_.push_back(PeerMsg{via_ws(b) ? rbase + b.ws_off : dst + b.array_off, b.bytes, b.peer});
  msgs.post_recvs(rmsg_);
  ready();
  for (size_t i : order_) {
    pack(i);
    const Block& b = g.sends[i];
    msgs.post_send(PeerMsg{const_cast<char*>(via_ws(b) ? sbase + b.ws_off : src + b.array_off),
                           b.bytes, b.peer});
  }
}

void ExchangeStep::staged(const char* src, char* dst, Packer& pk) {
  const ExchangeGeometry& g = *g_;
  const i64 S = g.send_ws, R = g.recv_ws;
  char* work = ws_->work(pk, S + R);
  if (g.algo == Algorithm::p2p) {
    p2p(src, dst, work, pk, true);
    return;
  }
  char* bounce = ws_->bounce(pk, S + R);
  pk.copy_all(g.pack, src, work);  // one launch for every block of every peer
  pk.copy_all(g.local, src, dst);  // this rank's own block, while MPI runs
  pk.to_host(bounce, work, S);
  pk.sync();
  if (g.algo == Algorithm::alltoall)
    mpi::alltoall(bounce, bounce + S, g.pad, comm_->get());
  else
    mpi::alltoallv(bounce, scounts_, sdispls_, bounce + S, rcounts_, rdispls_, comm_->get());
  pk.from_host(work + S, bounce + S, R);
  pk.copy_all(g.unpack, work + S, dst);
}

// ---------------------------------------------------------------- exchanges in flight
void ExchangeStep::start(const char* src, char* dst, Packer& pk, PendingExchange& p) {
  if (p.active) throw std::logic_error("pyshard: this exchange is already in flight");
  const ExchangeGeometry& g = *g_;
  if (g.algo != Algorithm::p2p && g.algo != Algorithm::alltoallv)
    throw std::invalid_argument("pyshard: only alltoallv and p2p exchanges run in flight");
  MPI_Comm c = comm_->get();
  const bool staged = tr_ == Transport::staged;
  const i64 S = g.send_ws, R = g.recv_ws;
  char* work = p.ws.work(pk, S + R);
  char* bounce = staged ? p.ws.bounce(pk, S + R) : nullptr;
  p.src = src;
  p.dst = dst;
  p.arrived = false;
  p.reqs.clear();
  if (g.algo == Algorithm::p2p) {
    if (!p.msgs || &p.msgs->comm() != comm_.get())
      p.msgs = std::make_unique<PeerMessages>(comm_, tags::kPending);
    if (pk.kind() != Mem::host) pk.sync();  // (as in p2p(): before the receives are posted)
    post_p2p(*p.msgs, staged ? bounce : work, staged ? bounce + S : work + S, src, dst, staged,
             [&] {
               for (size_t i = 0; i < g.sends.size(); ++i)
                 if (staged || !g.sends[i].contiguous) pk.copy(g.pack, i, i + 1, src, work);
               pk.copy_all(g.local, src, dst);
               if (staged) pk.to_host(bounce, work, S);
               pk.sync();
             },
             [](size_t) {});
  } else {
    const bool pack = staged || g.pack_all, unpack = staged || g.unpack_all;
    if (pack) pk.copy_all(g.pack, src, work);
    pk.copy_all(g.local, src, dst);  // this rank's own block, now
    if (staged) pk.to_host(bounce, work, S);
    pk.sync();
    const char* sb = staged ? bounce : pack ? work : src;
    char* rb = staged ? bounce + S : unpack ? work + S : dst;
    p.reqs.assign(1, MPI_REQUEST_NULL);
    mpi::ialltoallv(sb, scounts_, pack ? sdispls_ : sdirect_, rb, rcounts_,
                    unpack ? rdispls_ : rdirect_, c, &p.reqs[0]);
  }
  p.active = true;
}

void ExchangeStep::complete(PendingExchange& p, Packer& pk) {
  if (!p.active) throw std::logic_error("pyshard: no exchange in flight");
  p.active = false;
  const ExchangeGeometry& g = *g_;
  const bool staged = tr_ == Transport::staged;
  const i64 S = g.send_ws, R = g.recv_ws;
  char* work = p.ws.work(pk, S + R);
  if (g.algo == Algorithm::p2p) {
    // direct: each block through the workspace unpacked as it lands; staged: the bounce
    // buffer copied back in one piece once every message is in, then each block unpacked
    const auto unpack = [&](size_t i) {
      if (!staged && !g.recvs[i].contiguous) pk.copy(g.unpack, i, i + 1, work + S, p.dst);
    };
    p.msgs->wait_each(unpack);  // (all at once when test() saw every message complete)
    if (staged) {
      pk.from_host(work + S, p.ws.bounce(pk, S + R) + S, R);
      for (size_t i = 0; i < g.recvs.size(); ++i) pk.copy(g.unpack, i, i + 1, work + S, p.dst);
    }
  } else {
    if (!p.arrived) mpi::waitall(p.reqs.size(), p.reqs.data());
    if (staged) pk.from_host(work + S, p.ws.bounce(pk, S + R) + S, R);
    if (staged || g.unpack_all) pk.copy_all(g.unpack, work + S, p.dst);
  }
  p.arrived = false;
  count_call(algorithm_name(g.algo), pk, tr_);
  pk.finish();
}

bool ExchangeStep::test(PendingExchange& p) {
  if (!p.active || p.arrived) return true;
  p.arrived = g_->algo == Algorithm::p2p ? p.msgs->test() : mpi::testall(p.reqs.size(), p.reqs.data());
  return p.arrived;
}

}  // namespace pyshard
