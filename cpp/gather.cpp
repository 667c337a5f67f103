#include "gather.h"

#include <stdexcept>

namespace pyshard {

GatherGeometry::GatherGeometry(int size_, int rank_, i64 item_, Shape src_shape_,
                               Shape dst_shape_, const std::vector<BoxSpec>& recvs)
    : size(size_),
      rank(rank_),
      item(item_),
      src_shape(std::move(src_shape_)),
      dst_shape(std::move(dst_shape_)) {
  if (static_cast<int>(recvs.size()) != size)
    throw std::invalid_argument("pyshard: Allgatherv needs one block per member");
  for (int p = 0; p < size; ++p) {
    Block b{p, std::get<0>(recvs[p]), std::get<1>(recvs[p])};
    b.bytes = volume(b.ext) * item;
    if (!box_contiguous(dst_shape, b.start, b.ext, item, &b.array_off)) unpack_all = true;
    b.ws_off = total;
    total += b.bytes;
    unpack.begin_block();
    describe_copy(b.ext, Shape(b.ext.size(), 0), dst_shape, b.start, b.ext, item, b.ws_off, 0,
                  &unpack.host);
    unpack.end_block();
    blocks.push_back(std::move(b));
  }
  if (volume(src_shape) * item != blocks[rank].bytes)
    throw std::invalid_argument("pyshard: Allgatherv block of this rank != its source size");
  for (const Block& b : blocks)
    if (b.bytes != blocks[0].bytes) regular = false;
  if (regular)  // Allgather lands block p at p * count: in place only if the output agrees
    for (const Block& b : blocks)
      if (b.bytes && b.array_off != b.ws_off) unpack_all = true;
}

AllgathervStep::AllgathervStep(std::shared_ptr<Comm> comm, std::shared_ptr<GatherGeometry> g,
                               std::shared_ptr<Workspace> ws, Transport tr)
    : comm_(std::move(comm)), g_(std::move(g)), ws_(std::move(ws)), tr_(tr) {
  if (g_->size != comm_->size() || g_->rank != comm_->rank())
    throw std::invalid_argument("pyshard: geometry for another communicator");
  for (const Block& b : g_->blocks) {
    counts_.push_back(to_count(b.bytes, "a gather count"));
    packed_.push_back(static_cast<DisplT>(b.ws_off));
    direct_.push_back(static_cast<DisplT>(b.array_off));
  }
}

void AllgathervStep::run(const char* src, char* dst, Packer& pk) {
  const GatherGeometry& g = *g_;
  MPI_Comm c = comm_->get();
  const CountT mine = counts_[g.rank];
  if (tr_ == Transport::staged) {
    char* bounce = ws_->bounce(pk, g.staged_bytes());
    char* work = ws_->work(pk, g.total);
    pk.to_host(bounce + g.total, src, g.blocks[g.rank].bytes);
    pk.sync();
    if (g.regular)
      mpi::allgather(bounce + g.total, bounce, g.blocks[0].bytes, c);
    else
      mpi::allgatherv(bounce + g.total, mine, bounce, counts_, packed_, c);
    pk.from_host(work, bounce, g.total);
    pk.copy_all(g_->unpack, work, dst);
  } else {
    char* work = g.unpack_all ? ws_->work(pk, g.total) : nullptr;
    pk.sync();
    if (g.regular)
      mpi::allgather(src, g.unpack_all ? work : dst, g.blocks[0].bytes, c);
    else
      mpi::allgatherv(src, mine, g.unpack_all ? work : dst, counts_,
                      g.unpack_all ? packed_ : direct_, c);
    if (g.unpack_all) pk.copy_all(g_->unpack, work, dst);
  }
  count_call(g.regular ? "allgather" : "allgatherv", pk, tr_);
  pk.finish();
}

}  // namespace pyshard
