#include "shm_halo.h"

#include <sys/mman.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "shm_copy.h"
#include "comm.h"

namespace pyshard {

using shm::kPage;
using shm::page_up;

// ----------------------------------------------------------------------------- HaloBuffer

std::uint64_t halo_shape_hash(const Shape& shape, i64 item) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  mix(shape.size());
  for (i64 n : shape) mix(static_cast<std::uint64_t>(n));
  mix(static_cast<std::uint64_t>(item));
  return h;
}

namespace {

// The folds through node-shared memory this process has in flight (ShmHaloStep::enlist):
// every wait of a halo step serves them (help_folds), so that folds waited in different
// orders on different ranks complete.
std::mutex fold_mu;
std::vector<ShmHaloStep*> folds_in_flight;
std::atomic<int> folds_count{0};

// The page ranges (offset, length) of an array of `shape` and `item`-byte elements that the
// boxes touch, merged, in order; *many set (and nothing returned) where there are more than
// `most` of them.
std::vector<std::pair<i64, i64>> box_pages(const Shape& shape, i64 item,
                                           const std::vector<std::pair<Shape, Shape>>& boxes,
                                           size_t most, bool* many) {
  *many = false;
  const i64 pages = page_up(volume(shape) * item) / kPage;
  std::vector<bool> on(static_cast<size_t>(pages), false);
  std::vector<CopyDesc> ds;  // each box's runs, walked as the copies walk them
  for (const auto& [start, ext] : boxes) {
    if (start.size() != shape.size() || ext.size() != shape.size())
      throw std::invalid_argument("pyshard: a shared box of another rank count of dims");
    for (size_t d = 0; d < shape.size(); ++d)
      if (start[d] < 0 || ext[d] < 0 || start[d] + ext[d] > shape[d])
        throw std::out_of_range("pyshard: a shared box lies outside the padded array");
    describe_copy(shape, start, shape, start, ext, item, 0, 0, &ds);
  }
  for (const CopyDesc& d : ds)
    for_each_run(d, [&](i64 off, i64) {
      for (i64 p = off / kPage; p <= (off + d.run - 1) / kPage; ++p)
        on[static_cast<size_t>(p)] = true;
    });
  std::vector<std::pair<i64, i64>> out;
  for (i64 p = 0; p < pages; ++p) {
    if (!on[static_cast<size_t>(p)]) continue;
    if (!out.empty() && out.back().first + out.back().second == p * kPage)
      out.back().second += kPage;
    else if (out.size() == most)
      return *many = true, std::vector<std::pair<i64, i64>>{};
    else
      out.emplace_back(p * kPage, kPage);
  }
  return out;
}

}  // namespace

HaloBuffer::HaloBuffer(std::shared_ptr<NodeShm> node, i64 bytes, const Shape& shape, i64 item,
                       const std::vector<std::pair<Shape, Shape>>& shared)
    : node_(std::move(node)), bytes_(bytes) {
  if (!node_ || !node_->usable())
    throw std::invalid_argument("pyshard: node-shared memory is not usable");
  if (bytes < 0) throw std::invalid_argument("pyshard: a halo buffer of negative size");
  if (!shape.empty() && volume(shape) * item != bytes)
    throw std::invalid_argument("pyshard: a halo buffer's shape does not hold its bytes");
  // the counters on a page of their own after the padded array: a peer finds them from the
  // segment's size alone
  const i64 cap = page_up(bytes) + kPage;
  std::vector<std::pair<i64, i64>> ranges;
  i64 on = 0;
  bool many = true;
  if (!shape.empty()) {
    ranges = box_pages(shape, item, shared, 1024, &many);  // (a range costs two mappings)
    for (const auto& r : ranges) on += r.second;
  }
  if (!many && 2 * on <= cap - kPage) {
    ranges.emplace_back(cap - kPage, kPage);
    seg_ = node_->make_segment(cap, ranges);
    shared_bytes_ = std::min(on, bytes);
  } else {
    seg_ = node_->make_segment(cap);
    shared_bytes_ = bytes;
  }
  ctl_off_ = seg_->cap - kPage;
  ctl().bytes = bytes;  // (before the handshake that lets peers map it)
  ctl().shape_hash = halo_shape_hash(shape, item);
}

HaloBuffer::~HaloBuffer() {
  for (auto& [p, cap] : peers_)
    if (p) ::munmap(p, static_cast<size_t>(cap));
}

void HaloBuffer::connect() {
  if (connected_) return;
  const int n = node_->node_size();
  std::vector<std::pair<char*, i64>> maps(n, {nullptr, 0});
  std::vector<i64> offs(n, 0);
  try {
    node_->trade(seg_.get(), 0, [&](int idx, std::int64_t pid, std::int64_t fd, i64 cap, i64) {
      char* p = shm::map_foreign(pid, fd, cap, false);  // (sparse: holes stay holes)
      if (!p) return false;
      maps[idx] = {p, cap};
      offs[idx] = cap - kPage;
      return true;
    });
  } catch (...) {
    for (auto& [p, cap] : maps)
      if (p) ::munmap(p, static_cast<size_t>(cap));
    throw;
  }
  peers_ = std::move(maps);
  ctl_off_of_ = std::move(offs);
  connected_ = true;
}

void HaloBuffer::signal(HaloCtl& c) { bump_and_wake(c.seq, c.sleepers); }

// ----------------------------------------------------------------------------- ShmHaloStep

ShmHaloStep::ShmHaloStep(std::shared_ptr<Comm> comm, std::shared_ptr<HaloBuffer> buf,
                         std::shared_ptr<HaloGeometry> mpi, int tag,
                         const std::vector<HaloPeer>& peers, int waiters, bool reverse,
                         std::vector<FoldEntry> order, const std::vector<LocalSpec>& wraps)
    : buf_(std::move(buf)), g_(std::move(mpi)), reverse_(reverse), shape_(g_->shape),
      waiters_(waiters), order_(std::move(order)) {
  if (g_->reverse != reverse)
    throw std::invalid_argument("pyshard: a halo step's MPI part runs the other way");
  if (volume(shape_) * g_->item > buf_->bytes())
    throw std::invalid_argument("pyshard: the padded array is larger than its halo buffer");
  NodeShm& node = buf_->node();
  if (waiters < 0 || waiters >= node.node_size())
    throw std::invalid_argument("pyshard: more node peers than the node has");
  mpi_ = std::make_unique<HaloStep>(comm, g_, HaloMethod::persistent, tag, Transport::direct);
  mpi_->set_counted(false);
  const i64 item = g_->item;
  for (const auto& [peer, pshape, boxes] : peers) {
    const int idx = peer >= 0 && peer < comm->size() ? node.local_index(peer) : -1;
    if (idx < 0 || idx == node.self())
      throw std::invalid_argument("pyshard: a halo peer that is not another rank of this node");
    Peer p;
    p.idx = idx;
    p.pshape = pshape;
    p.t.begin_block();
    p.stage_in.begin_block();
    p.stage_out.begin_block();
    for (const auto& [here, there, ext] : boxes) {
      for (size_t d = 0; d < ext.size(); ++d)
        if (ext.size() != shape_.size() || pshape.size() != shape_.size() || ext[d] < 0 ||
            here[d] < 0 || there[d] < 0 || here[d] + ext[d] > shape_[d] ||
            there[d] + ext[d] > pshape[d])
          throw std::out_of_range("pyshard: a halo box lies outside a padded array");
      if (reverse) {
        describe_copy(pshape, there, shape_, here, ext, item, 0, 0, &p.t.host);
        const Shape zero(ext.size(), 0);
        describe_copy(pshape, there, ext, zero, ext, item, 0, p.stage_bytes, &p.stage_in.host);
        describe_copy(ext, zero, shape_, here, ext, item, p.stage_bytes, 0, &p.stage_out.host);
        p.stage_bytes += volume(ext) * item;
      } else {
        describe_copy(shape_, here, pshape, there, ext, item, 0, 0, &p.t.host);
      }
      node_bytes_ += volume(ext) * item;
    }
    p.t.end_block();
    p.stage_in.end_block();
    p.stage_out.end_block();
    peers_.push_back(std::move(p));
  }
  wraps_.begin_block();
  std::vector<std::pair<Shape, Shape>> dsts;
  for (const auto& [ghost, inner, ext] : wraps) {
    describe_copy(shape_, ghost, shape_, inner, ext, item, 0, 0, &wraps_.host);
    dsts.emplace_back(inner, ext);
  }
  wraps_.end_block();
  wrap_groups_ = wrap_groups(wraps_, dsts);
  if (reverse) {  // every message, node peer and the wraps exactly once
    size_t msgs = 0, nodes = 0, self = 0;
    for (const auto& [kind, i] : order_) {
      if (kind == 0 && i >= 0 && static_cast<size_t>(i) < g_->recvs.size()) ++msgs;
      else if (kind == 1 && i >= 0 && static_cast<size_t>(i) < peers_.size()) ++nodes;
      else if (kind == 2) ++self;
      else throw std::invalid_argument("pyshard: a fold's combine order names nothing");
    }
    if (msgs != g_->recvs.size() || nodes != peers_.size() || self != 1 ||
        order_.size() != msgs + nodes + 1)
      throw std::invalid_argument("pyshard: a fold's combine order is not one of each");
  }
}

// Started and dropped: finish the handshake without combining, so that no node peer is left
// waiting for this rank (the inner step completes its own requests).
ShmHaloStep::~ShmHaloStep() {
  delist();  // (after it, no helper touches this step)
  if (!active_) return;
  try {  // a destructor must not throw: a peer gone past the timeout is given up on
    HaloBuffer& b = *buf_;
    HaloCtl& mine = b.ctl();
    const std::uint64_t want = k_ * static_cast<std::uint64_t>(waiters_);
    if (reverse_) {
      for (const Peer& p : peers_) {
        if (p.state->load(std::memory_order_acquire) == 3) continue;  // released by a helper
        HaloCtl& c = b.peer_ctl(p.idx);
        b.wait_for(c, [&] { return c.fentered.load(std::memory_order_acquire) >= k_; },
                   [&] { return b.peer_what(p.idx, "enter its halo fold"); });
        c.pulled.fetch_add(1, std::memory_order_acq_rel);
        HaloBuffer::signal(c);
      }
      b.wait_for(mine, [&] { return mine.pulled.load(std::memory_order_acquire) >= want; },
                 [&] { return std::string("this node's halo peers to read its ghosts (fold)"); });
    } else {
      b.wait_for(mine, [&] { return mine.pushed.load(std::memory_order_acquire) >= want; },
                 [&] { return std::string("this node's halo peers to write its ghosts"); });
    }
  } catch (const std::exception&) {
  }
}

int ShmHaloStep::mpi_peers() const {
  return static_cast<int>(g_->sends.size() + g_->recvs.size());
}

void ShmHaloStep::check_peers() {
  if (checked_) return;
  HaloBuffer& b = *buf_;
  const i64 item = g_->item;
  for (const Peer& p : peers_) {
    const HaloCtl& c = b.peer_ctl(p.idx);
    const i64 want = volume(p.pshape) * item;
    if (c.bytes != want || c.shape_hash != halo_shape_hash(p.pshape, item))
      throw std::runtime_error(
          "pyshard: this rank's halo plan gives rank " +
          std::to_string(b.node().node_ranks()[p.idx]) + " (a node peer) a padded array of " +
          std::to_string(want) + " bytes, but it holds " + std::to_string(c.bytes) +
          " bytes" + (c.bytes == want ? " of another shape" : "") + ": the ranks disagree on "
          "the halo array (its width, periodic, corners, dtype or layout); nothing was copied");
  }
  checked_ = true;
}

void ShmHaloStep::enlist() {
  std::lock_guard<std::mutex> lk(fold_mu);
  folds_in_flight.push_back(this);
  folds_count.fetch_add(1, std::memory_order_release);
  enlisted_ = true;
}

void ShmHaloStep::delist() {
  if (!enlisted_) return;
  std::lock_guard<std::mutex> lk(fold_mu);
  for (size_t i = 0; i < folds_in_flight.size(); ++i)
    if (folds_in_flight[i] == this) {
      folds_in_flight.erase(folds_in_flight.begin() + static_cast<long>(i));
      folds_count.fetch_sub(1, std::memory_order_release);
      break;
    }
  enlisted_ = false;
}

void ShmHaloStep::prepull() {
  HaloBuffer& b = *buf_;
  for (Peer& p : peers_) {
    if (p.state->load(std::memory_order_acquire) != 0) continue;
    HaloCtl& c = b.peer_ctl(p.idx);
    if (c.fentered.load(std::memory_order_acquire) < k_) continue;
    int zero = 0;
    if (!p.state->compare_exchange_strong(zero, 1, std::memory_order_acq_rel)) continue;
    p.stage.resize(static_cast<size_t>(p.stage_bytes));
    std::vector<shm::Cursor> cs;
    shm::add_cursors(cs, p.stage_in, b.peer(p.idx), p.stage.data());
    shm::copy_interleaved(cs, b.peer(p.idx));
    c.pulled.fetch_add(1, std::memory_order_acq_rel);  // done reading its ghosts
    HaloBuffer::signal(c);
    p.state->store(3, std::memory_order_release);
  }
}

void serve_folds_in_flight() {
  if (folds_count.load(std::memory_order_acquire) == 0) return;
  ShmHaloStep::serve_all();
}

void ShmHaloStep::serve_all() {
  std::unique_lock<std::mutex> lk(fold_mu, std::try_to_lock);
  if (!lk.owns_lock()) return;  // another thread serves them now
  for (ShmHaloStep* f : folds_in_flight) f->prepull();
}

void ShmHaloStep::help_folds() const {
  const int own = enlisted_ ? 1 : 0;
  if (folds_count.load(std::memory_order_acquire) <= own) return;
  std::unique_lock<std::mutex> lk(fold_mu, std::try_to_lock);
  if (!lk.owns_lock()) return;  // another thread serves them now
  for (ShmHaloStep* f : folds_in_flight)
    if (f != this) f->prepull();
}

// An update's copies: every node peer as soon as it has entered this update (those already
// there first, then the others in turn, sleeping on each one's word).
void ShmHaloStep::push_all(std::uint64_t k) {
  HaloBuffer& b = *buf_;
  char* arr = b.data();
  todo_.clear();
  for (size_t i = 0; i < peers_.size(); ++i) todo_.push_back(static_cast<int>(i));
  auto push = [&](const Peer& p) {
    std::vector<shm::Cursor> cs;
    shm::add_cursors(cs, p.t, arr, b.peer(p.idx));
    shm::copy_interleaved(cs, arr);  // (fenced: the stores are visible before the count)
    HaloCtl& c = b.peer_ctl(p.idx);
    c.pushed.fetch_add(1, std::memory_order_acq_rel);
    HaloBuffer::signal(c);
  };
  size_t left = todo_.size();
  for (int& i : todo_)
    if (b.peer_ctl(peers_[i].idx).entered.load(std::memory_order_acquire) >= k) {
      push(peers_[i]);
      i = -1;
      --left;
    }
  if (left == 0) return;
  for (int i : todo_) {
    if (i < 0) continue;
    HaloCtl& c = b.peer_ctl(peers_[i].idx);
    wait_helping(c, [&] { return c.entered.load(std::memory_order_acquire) >= k; },
                 [&] { return b.peer_what(peers_[i].idx, "enter its halo update"); });
    push(peers_[i]);
  }
}

void ShmHaloStep::start() {
  if (active_) throw std::logic_error("pyshard: halo start() called again before wait()");
  HaloBuffer& b = *buf_;
  b.connect();
  check_peers();
  HaloCtl& mine = b.ctl();
  Packer& pk = host_packer();
  char* arr = b.data();
  if (reverse_) {
    k_ = ++b.folds;
    for (Peer& p : peers_) p.state->store(0, std::memory_order_release);
    mine.fentered.store(k_, std::memory_order_release);
    HaloBuffer::signal(mine);
    mpi_->start(arr, pk);  // the ghosts for other nodes, packed and sent
  } else {
    k_ = ++b.updates;
    mine.entered.store(k_, std::memory_order_release);
    HaloBuffer::signal(mine);
    mpi_->start(arr, pk);  // other nodes' messages, and the wraps
    push_all(k_);
  }
  active_ = true;
  if (reverse_) enlist();  // from now on the waits of this process serve it
}

void ShmHaloStep::wait(FoldOp op, FoldKind kind) {
  if (!active_) throw std::logic_error("pyshard: halo wait() called without start()");
  active_ = false;
  HaloBuffer& b = *buf_;
  HaloCtl& mine = b.ctl();
  Packer& pk = host_packer();
  char* arr = b.data();
  const std::uint64_t want = k_ * static_cast<std::uint64_t>(waiters_);
  if (!reverse_) {
    wait_helping(mine, [&] { return mine.pushed.load(std::memory_order_acquire) >= want; },
                 [&] { return std::string("this node's halo peers to write its ghosts"); });
    mpi_->wait(arr, pk);
    count_call("halo_shm", pk, Transport::direct);
    return;
  }
  struct Delist {  // out of the registry however wait() ends
    ShmHaloStep* s;
    ~Delist() { s->delist(); }
  } delist_at_end{this};
  if (kind == FoldKind::none)
    throw std::invalid_argument("pyshard: a fold through node-shared memory combines in the core");
  mpi_->wait(arr, pk, op, FoldKind::none);  // received into its buffer
  const char* got = mpi_->buffer() + g_->send_bytes;
  for (const auto& [what, i] : order_) {
    if (what == 0) {
      fold_combine(kind, op, g_->unpack, i, i + 1, got, arr);
    } else if (what == 1) {
      const Peer& p = peers_[i];
      HaloCtl& c = b.peer_ctl(p.idx);
      int zero = 0;
      if (p.state->load(std::memory_order_acquire) == 0) {
        wait_helping(c, [&] {
          return c.fentered.load(std::memory_order_acquire) >= k_ ||
                 p.state->load(std::memory_order_acquire) != 0;
        }, [&] { return b.peer_what(p.idx, "enter its halo fold"); });
      }
      if (p.state->compare_exchange_strong(zero, 2, std::memory_order_acq_rel)) {
        fold_combine(kind, op, p.t, 0, 1, b.peer(p.idx), arr);  // straight from its ghosts
        c.pulled.fetch_add(1, std::memory_order_acq_rel);
        HaloBuffer::signal(c);
      } else {  // a helper read them ahead (or is reading them: a copy of a few boxes)
        while (p.state->load(std::memory_order_acquire) != 3) shm_pause();
        fold_combine(kind, op, p.stage_out, 0, 1, p.stage.data(), arr);
      }
    } else {
      fold_combine_wraps(kind, op, wraps_, wrap_groups_, arr);
    }
  }
  wait_helping(mine, [&] { return mine.pulled.load(std::memory_order_acquire) >= want; },
               [&] { return std::string("this node's halo peers to read its ghosts (fold)"); });
  count_call("halo_fold_shm", pk, Transport::direct);
}

}  // namespace pyshard
