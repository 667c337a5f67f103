// The point-to-point sequence every exchange that sends its blocks as messages runs (the p2p
// algorithm, an exchange in flight, the node-local transport's messages to other nodes, the
// halo's p2p method): post every receive first (a peer's message is matched as soon as it
// arrives), then pack and post each send; later, complete each receive as it lands, then the
// sends. Requests: the receives', then the sends', in one array.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "mpi_calls.h"

namespace pyshard::p2p {

// One message: `bytes` at `at`, to or from `peer`.
struct Msg {
  const char* at;
  i64 bytes;
  int peer;
};

// Post receive i (recv(i): its Msg, into reqs[i]) for i < nrecv; then ready() (what is packed
// in one pass before any send: a GPU's one launch, the host's whole table); then, for each
// send i in `order` (null: 0, 1, ...), pack(i) (what is packed just before it goes) and post
// it (send(i): its Msg, into reqs[nrecv + i]).
template <class Recv, class Ready, class Pack, class Send>
void post(MPI_Comm c, int tag, size_t nrecv, Recv&& recv, Ready&& ready, size_t nsend,
          const size_t* order, Pack&& pack, Send&& send, MPI_Request* reqs) {
  for (size_t i = 0; i < nrecv; ++i) {
    const Msg m = recv(i);
    mpi::irecv(const_cast<char*>(m.at), m.bytes, m.peer, tag, c, &reqs[i]);
  }
  ready();
  for (size_t k = 0; k < nsend; ++k) {
    const size_t i = order ? order[k] : k;
    pack(i);
    const Msg m = send(i);
    mpi::isend(m.at, m.bytes, m.peer, tag, c, &reqs[nrecv + i]);
  }
}

// Wait for the receives posted by post() one at a time, arrived(i) for each as it lands,
// then for the sends.
template <class Arrived>
void complete(size_t nrecv, size_t nsend, MPI_Request* reqs, Arrived&& arrived) {
  for (size_t k = 0; k < nrecv; ++k) {
    const int idx = mpi::waitany(nrecv, reqs);
    if (idx == MPI_UNDEFINED) break;
    arrived(static_cast<size_t>(idx));
  }
  mpi::waitall(nsend, reqs + nrecv);
}

}  // namespace pyshard::p2p
