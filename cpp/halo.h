// Halo (ghost-cell) exchange of one padded local array: one message per peer each way,
// through the packers (one descriptor table per direction, one block per message) and
// persistent point-to-point requests (MPI_Send_init / MPI_Recv_init, bound once, started
// every update). Python (pyshard/halo.py) computes every box from the layout and the widths,
// the same on every rank; this file only moves bytes. PETSc's PetscSF and DMDA
// globalToLocal Begin/End have the same shape: a pattern built once, then start / wait.
//
// start(): pack every send block (interior cells) into the step's own send buffer, copy
// the periodic wrap-arounds this rank sends to itself (interior -> ghost cells of the same
// array), stage to host when the transport says so, then start every receive and send.
// wait(): complete them, unpack into the ghost cells. Between the two the caller may read
// and write the interior (the sends were packed) but not the ghost cells.
#pragma once

#include <mpi.h>

#include <memory>
#include <tuple>
#include <vector>

#include "comm.h"
#include "fold_kind.h"
#include "geometry.h"
#include "memory.h"
#include "mpi_calls.h"
#include "peer_messages.h"

namespace pyshard {

// (peer rank, boxes of the padded array in message order): one message per peer.
using PeerBoxes = std::tuple<int, std::vector<BoxSpec>>;

// persistent: MPI_Send_init/MPI_Recv_init once, MPI_Startall per update; p2p: a fresh
// MPI_Isend/MPI_Irecv per message and update; datatype: persistent requests on the padded
// array itself with one MPI datatype per message (subarrays): no pack or unpack pass of
// ours, the MPI library copies from and to the boxes (host memory only).
// neighbor: one neighbourhood collective on a distributed-graph communicator of this rank's
// peers (MPI_Dist_graph_create_adjacent once), persistent where the library has MPI-4's
// MPI_Neighbor_alltoallv_init, else MPI_Ineighbor_alltoallw per update (mpi_calls.h).
enum class HaloMethod { persistent = 0, p2p = 1, datatype = 2, neighbor = 3 };

struct HaloMessage {
  int peer;
  i64 bytes = 0;
  i64 off = 0;            // in the packed buffer (4 KiB aligned)
  std::vector<Shape> starts, exts;  // its boxes in the padded array, in message order
  bool contiguous = false;  // one box that is one run of the padded array
  i64 array_off = 0;      // its byte offset there when contiguous
};

// A fold geometry (reverse = true) is the update's with sends and receives swapped (Python
// passes them so): the sends are ghost boxes, the receives interior boxes, and the local
// copies go ghost -> interior. Its receives never land in place (they combine), and its
// local copies (`local_unpack`; `local` stays empty) combine straight from the ghost boxes
// into the interior at wait(), as the block at position `local_at` among the received
// messages (the fixed order: by peer rank, this rank's own copies at its own rank's place,
// boxes in message order).
struct HaloGeometry {
  HaloGeometry(i64 item, Shape shape, const std::vector<PeerBoxes>& sends,
               const std::vector<PeerBoxes>& recvs, const std::vector<LocalSpec>& local,
               bool reverse = false, int local_at = 0);
  bool reverse = false;
  int local_at = 0;
  DescTable local_unpack;  // fold only: ghost boxes -> interior, in the array
  std::vector<std::vector<size_t>> local_unpack_groups;  // (wrap_groups)
  i64 item;
  Shape shape;  // the padded local array
  std::vector<HaloMessage> sends, recvs;
  // pack: array -> send buffer; unpack: receive buffer -> array (every message);
  // unpack_packed: the same with the contiguous messages left out (they land in place);
  // local: array -> array (periodic wrap onto this rank itself)
  DescTable pack, unpack, unpack_packed, local;
  // the descriptors of `local` by shape (same_walk, box.h): the host copies each group in one
  // walk (copy_local)
  std::vector<std::vector<size_t>> local_groups;  // indices into local.host
  // The wraps onto this rank (`local`), from `src` to `dst` (the same padded array, or one
  // of its shape): on the host group by group, else by `pk`.
  void copy_local(Packer& pk, const char* src, char* dst) const;
  i64 send_bytes = 0, recv_bytes = 0;
  i64 local_bytes = 0;
};

// dst = op(dst, src) over blocks [b0, b1) of table `t`, element by element in table order
// (serial: two contributions to one cell always combine in the same order); host memory.
void fold_combine(FoldKind kind, FoldOp op, const DescTable& t, size_t b0, size_t b1,
                  const char* src, char* dst);

// The periodic wraps of a fold (`t`: one block, ghost -> interior, as HaloGeometry's
// local_unpack) combined into `arr` with `op`, descriptors of one shape walked together
// (`groups`, from wrap_groups) as an update's wraps are copied.
void fold_combine_wraps(FoldKind kind, FoldOp op, const DescTable& t,
                        const std::vector<std::vector<size_t>>& groups, char* arr);
// Groups of the descriptors of `t` of one shape (same_walk); where `dsts` (the destination
// boxes, start and extent) overlap, one descriptor a group, in order (the fixed combine order).
std::vector<std::vector<size_t>> wrap_groups(const DescTable& t,
                                             const std::vector<std::pair<Shape, Shape>>& dsts);

class HaloStep {
 public:
  // `tr`: the transport every exchange of this step takes (direct, or staged through host
  // bounce buffers; the datatype method takes direct only)
  HaloStep(std::shared_ptr<Comm> comm, std::shared_ptr<HaloGeometry> g, HaloMethod method,
           int tag, Transport tr);
  ~HaloStep();
  HaloStep(const HaloStep&) = delete;
  HaloStep& operator=(const HaloStep&) = delete;
  void start(char* arr, Packer& pk);
  // A fold step's wait combines with `op` in the host packer's memory when `kind` is not
  // none; otherwise it leaves the received bytes at buffer() (at geometry().send_bytes,
  // or 0 for the datatype method) and the caller combines them and the local copies.
  void wait(char* arr, Packer& pk, FoldOp op = FoldOp::sum, FoldKind kind = FoldKind::none);
  // Have the messages of the exchange in flight completed? MPI_Testall on its requests:
  // never blocks, drives progress; wait() then only unpacks or combines.
  bool test();
  char* buffer() const { return work_; }
  bool active() const { return active_; }
  const HaloGeometry& geometry() const { return *g_; }
  HaloMethod method() const { return method_; }
  Transport transport() const { return tr_; }
  i64 buffer_bytes() const { return ws_.held(); }
  // Count each exchange in stats() (a step inside another, ShmHaloStep, leaves it to that one)
  void set_counted(bool c) { counted_ = c; }

 private:
  void post(char* arr, char* sb, char* rb, bool in_place);
  void post_typed(char* arr);
  void waitall();

  std::shared_ptr<Comm> comm_;
  std::shared_ptr<HaloGeometry> g_;
  HaloMethod method_;
  Transport tr_;
  Workspace ws_;                     // this step's own buffers: persistent requests bind them
  std::vector<MPI_Datatype> types_;  // datatype method: one per message, receives first
  PeerMessages msgs_;                // the messages, by the method (peer_messages.h)
  std::vector<PeerMsg> rmsg_, smsg_;
  bool active_ = false;
  bool counted_ = true;
  char* work_ = nullptr;  // the packed buffer of the last start()
};

}  // namespace pyshard
