#include "shm_exchange.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mpi_calls.h"
#include "peer_messages.h"
#include "shm_copy.h"
#include "tags.h"

namespace pyshard {

using shm::add_cursors;
using shm::copy_interleaved;
using shm::Cursor;

ShmExchangeStep::ShmExchangeStep(
    std::shared_ptr<Comm> comm, std::shared_ptr<NodeShm> node, i64 item, Shape src_shape,
    Shape dst_shape, const std::vector<std::tuple<int, Shape, Shape, Shape, Shape>>& pushes,
    const std::vector<BlockSpec>& recvs, const std::vector<LocalSpec>& local,
    std::shared_ptr<Workspace> ws, bool attach)
    : comm_(std::move(comm)),
      node_(std::move(node)),
      ws_(std::move(ws)),
      item_(item),
      src_shape_(std::move(src_shape)),
      dst_shape_(std::move(dst_shape)),
      off_(comm_, tags::kShmOffNode) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  dst_bytes_ = volume(dst_shape_) * item_;
  push_.resize(node_->node_size());
  push_end_.assign(push_.size(), 0);
  for (const auto& [peer, sstart, pshape, pstart, ext] : pushes) {
    const i64 bytes = volume(ext) * item_;
    if (bytes == 0) continue;
    const int idx = node_->local_index(peer);
    if (idx >= 0) {
      push_end_[idx] = volume(pshape) * item_;  // the peer's destination, as this rank sees it
      DescTable& t = push_[idx];
      t.begin_block();
      describe_copy(src_shape_, sstart, pshape, pstart, ext, item_, 0, 0, &t.host);
      t.end_block();
    } else {
      off_pack_.begin_block();
      describe_copy(src_shape_, sstart, ext, Shape(ext.size(), 0), ext, item_, 0, off_send_,
                    &off_pack_.host);
      off_pack_.end_block();
      off_sends_.push_back(Msg{peer, off_send_, bytes});
      off_send_ += align_up(bytes);
    }
  }
  for (const auto& [peer, dstart, ext] : recvs) {
    const i64 bytes = volume(ext) * item_;
    if (bytes == 0) continue;
    if (node_->local_index(peer) >= 0) {
      node_recv_.begin_block();
      describe_copy(dst_shape_, dstart, dst_shape_, dstart, ext, item_, 0, 0, &node_recv_.host);
      node_recv_.end_block();
      continue;
    }
    off_unpack_.begin_block();
    describe_copy(ext, Shape(ext.size(), 0), dst_shape_, dstart, ext, item_, off_recv_, 0,
                  &off_unpack_.host);
    off_unpack_.end_block();
    off_recvs_.push_back(Msg{peer, off_recv_, bytes});
    off_recv_ += align_up(bytes);
  }
  local_.begin_block();
  for (const auto& [sstart, dstart, ext] : local)
    describe_copy(src_shape_, sstart, dst_shape_, dstart, ext, item_, 0, 0, &local_.host);
  local_.end_block();
  if (node_->cma()) {
    // one process_vm_writev moves at most about 2 GiB: runs split at 1 GiB, and a call takes
    // at most kIov runs (write_remote)
    constexpr i64 kMaxRun = i64(1) << 30;
    attach_ = attach && node_recv_.blocks() > 0;
    runs_.resize(push_.size());
    auto add_runs = [&](std::vector<Run>& out, const std::vector<CopyDesc>& descs) {
      for (const CopyDesc& d : descs)
        for_each_run(d, [&](i64 s, i64 t) {
          for (i64 done = 0; done < d.run; done += kMaxRun) {
            const i64 n = std::min(kMaxRun, d.run - done);
            if (!out.empty() && out.back().s + out.back().n == s + done &&
                out.back().t + out.back().n == t + done && out.back().n + n <= kMaxRun)
              out.back().n += n;
            else
              out.push_back(Run{s + done, t + done, n});
          }
        });
    };
    for (size_t idx = 0; idx < push_.size(); ++idx) add_runs(runs_[idx], push_[idx].host);
  }
}

void ShmExchangeStep::write_remote(int idx, const char* src, std::uint64_t base) const {
  constexpr size_t kIov = 1024;  // UIO_MAXIOV
  iovec l[kIov], r[kIov];
  const auto& runs = runs_[idx];
  char* in = const_cast<char*>(src);
  for (size_t i = 0; i < runs.size();) {
    const size_t end = std::min(runs.size(), i + kIov);
    size_t nl = 0, nr = 0;
    i64 bytes = 0;
    for (; i < end; ++i) {
      const Run& u = runs[i];
      char* a = in + u.s;
      auto* b = reinterpret_cast<char*>(base + static_cast<std::uint64_t>(u.t));
      const size_t n = static_cast<size_t>(u.n);
      if (nl && static_cast<char*>(l[nl - 1].iov_base) + l[nl - 1].iov_len == a)
        l[nl - 1].iov_len += n;
      else
        l[nl++] = iovec{a, n};
      if (nr && static_cast<char*>(r[nr - 1].iov_base) + r[nr - 1].iov_len == b)
        r[nr - 1].iov_len += n;
      else
        r[nr++] = iovec{b, n};
      bytes += u.n;
    }
    // a refusal fails the call on every rank of the node after the handshake
    if (!node_->write_remote(idx, l, nl, r, nr, bytes)) return;
  }
}

void ShmExchangeStep::post(const char* src, char* work) {
  char* rbase = work + off_send_;
  msg_.clear();
  for (const Msg& m : off_recvs_) msg_.push_back(PeerMsg{rbase + m.off, m.bytes, m.peer});
  off_.post_recvs(msg_);
  if (!off_sends_.empty()) host_packer().copy_all(off_pack_, src, work);
  for (const Msg& m : off_sends_) off_.post_send(PeerMsg{work + m.off, m.bytes, m.peer});
}

void ShmExchangeStep::complete(const char* work, char* target) {
  off_.wait_each([&](size_t i) {
    host_packer().copy(off_unpack_, i, i + 1, work + off_send_, target);
  });
}

void ShmExchangeStep::copy_all(const char* src, const std::vector<char*>& bases,
                               char* target) const {
  thread_local std::vector<Cursor> cs;
  cs.clear();
  // node peers whose destination is their private memory first (they wait for these alone)
  for (size_t idx = 0; idx < bases.size(); ++idx)
    if (!bases[idx] && idx < runs_.size() && node_->remote(static_cast<int>(idx)) &&
        node_->remote_fits(static_cast<int>(idx), push_end_[idx]))
      write_remote(static_cast<int>(idx), src, node_->remote(static_cast<int>(idx)));
  // (a peer whose destination is smaller than this rank's plan says: nothing written there,
  // the call fails on every rank of the node)
  for (size_t idx = 0; idx < bases.size(); ++idx)
    if (bases[idx] && node_->fits(static_cast<int>(idx), bases[idx], push_end_[idx]))
      add_cursors(cs, push_[idx], src, bases[idx]);
  add_cursors(cs, local_, src, target);
  copy_interleaved(cs, src);
}

void ShmExchangeStep::run(const char* src, char* dst) {
  Packer& pk = host_packer();
  i64 off = 0;
  ShmSegment* mine = node_->find(dst, dst_bytes_, &off);
  // a destination in private memory (out=, XLA's buffers): node peers write their blocks
  // straight into it by cross-memory attach where the node can (cma), else into a segment of
  // this rank's, copied over at the end; this rank's own blocks and those from other nodes go
  // straight into dst either way
  std::shared_ptr<ShmSegment> tmp;
  const bool direct = !mine && attach_ && cma_enabled();
  if (!mine && !direct) {
    tmp = node_->take(dst_bytes_);
    mine = tmp.get();
    off = 0;
  }
  char* work = off_bytes() > 0 ? ws_->work(pk, off_bytes()) : nullptr;
  post(src, work);
  try {
    node_->exchange_into(mine, off, dst, dst_bytes_,
                         [&](const std::vector<char*>& bases) { copy_all(src, bases, dst); });
  } catch (...) {  // a node peer failed: this rank's messages still complete, then it raises
    off_.drop();
    if (tmp) node_->give(std::move(tmp));
    throw;
  }
  complete(work, dst);
  if (tmp) {
    if (node_recv_.blocks()) pk.copy_all(node_recv_, tmp->ptr, dst);
    node_->give(std::move(tmp));
  }
  auto& s = stats();
  s["shm"] += 1;
  if (direct) s["shm_cma"] += 1;
}

// ----------------------------------------------------------------------------- fused

ShmFusedStep::ShmFusedStep(std::shared_ptr<NodeShm> node,
                           std::vector<std::shared_ptr<ShmExchangeStep>> parts,
                           std::vector<std::vector<i64>> offsets, std::shared_ptr<Workspace> ws)
    : node_(std::move(node)), parts_(std::move(parts)), ws_(std::move(ws)) {
  if (!node_->usable()) throw std::invalid_argument("pyshard: node-shared memory is not usable");
  if (offsets.size() != parts_.size())
    throw std::invalid_argument("pyshard: one list of offsets per fused array");
  const int n = node_->node_size();
  const auto& ranks = node_->node_ranks();
  peer_off_.assign(n, std::vector<i64>(parts_.size(), 0));
  for (size_t k = 0; k < parts_.size(); ++k) {
    if (!parts_[k] || &parts_[k]->node() != node_.get())
      throw std::invalid_argument("pyshard: every fused array runs on the same node transport");
    for (int idx = 0; idx < n; ++idx) {
      const size_t r = static_cast<size_t>(ranks[idx]);
      if (r >= offsets[k].size())
        throw std::invalid_argument("pyshard: an offset per rank of the communicator");
      peer_off_[idx][k] = offsets[k][r];
    }
  }
  mine_.resize(parts_.size());
  work_off_.resize(parts_.size());
  const int self = node_->self();
  for (size_t k = 0; k < parts_.size(); ++k) {
    mine_[k] = peer_off_[self][k];
    if (mine_[k] < 0 || (k > 0 && mine_[k] < mine_[k - 1] + parts_[k - 1]->dst_bytes()))
      throw std::invalid_argument("pyshard: fused results overlap in the batch");
    bytes_ = std::max(bytes_, mine_[k] + parts_[k]->dst_bytes());
    work_off_[k] = off_;
    off_ += align_up(parts_[k]->off_bytes());
  }
}

void ShmFusedStep::run(const std::vector<const char*>& srcs, char* dst) {
  if (srcs.size() != parts_.size())
    throw std::invalid_argument("pyshard: one source per fused array");
  i64 off = 0;
  ShmSegment* mine = node_->find(dst, std::max<i64>(bytes_, 1), &off);
  if (!mine) throw std::invalid_argument("pyshard: a fused batch's results lie in node-shared memory");
  char* work = off_ > 0 ? ws_->work(host_packer(), off_) : nullptr;
  for (size_t k = 0; k < parts_.size(); ++k) parts_[k]->post(srcs[k], work + work_off_[k]);
  const size_t np = parts_.size();
  try {
    node_->exchange_all(mine, off, [&](const std::vector<char*>& bases) {
      std::vector<char*>& at = at_;
      at.assign(bases.size(), nullptr);
      for (size_t k = 0; k < np; ++k) {
        for (size_t idx = 0; idx < bases.size(); ++idx)
          if (bases[idx]) at[idx] = bases[idx] + peer_off_[idx][k];
        parts_[k]->copy_all(srcs[k], at, dst + mine_[k]);
      }
    });
  } catch (...) {  // a node peer failed: this rank's messages still complete, then it raises
    for (auto& part : parts_) part->drop();
    throw;
  }
  for (size_t k = 0; k < np; ++k) parts_[k]->complete(work + work_off_[k], dst + mine_[k]);
  auto& s = stats();
  s["shm"] += 1;
}


}  // namespace pyshard
