// The node-local transport: ranks of one node exchange through node-shared memory instead of
// MPI messages. A sender copies each block once, from where it lies in its source shard
// straight to where it belongs in the receiver's result, which lives in node-shared memory;
// ranks on other nodes are reached through MPI point-to-point messages as before.
//
// Memory: every rank owns its segments (Linux memfd: anonymous, never a name in /dev/shm, so
// a killed job leaves nothing behind); a peer maps one by opening /proc/<pid>/fd/<fd> of its
// owner. A rank's results come from its own pool of segments (one result per segment, kept
// for reuse when the result is freed, bounded in bytes and count). A result in a rank's
// private memory (out=, XLA's buffers) is written by its node peers with process_vm_writev
// (cross-memory attach: the kernel copies once, from the sender's source into the receiver's
// pages) where every rank of the node could write into every other when the mesh was built
// (NodeCtl::cma), else landed in a segment and copied over.
//
// Ordering, per call on a communicator (calls run in the same order on every rank): a
// receiver publishes where its result lies and bumps its epoch; a sender waits for its
// on-node peers' epochs, copies its blocks in, and bumps each peer's arrival counter; a
// receiver returns once every on-node peer has arrived. No MPI call and no node-wide barrier.
// A peer cannot publish its next call's result before this rank has arrived in this one, so a
// published destination stays valid until this rank's copies are done.
//
// By role: shm_segment.h (memfd segments, the control segments and slots, futex waits),
// shm_node.h (NodeShm: a communicator's node peers, its pool, the handshake), shm_copy.h (the
// copy loops), shm_exchange.h (ShmExchangeStep, ShmFusedStep), shm_reduce.h
// (ShmReduceScatterStep, ShmAllreduceStep), shm_halo.h (HaloBuffer, ShmHaloStep: halo
// updates and folds between padded arrays in node-shared memory). This header includes them
// all.
#pragma once

#include "shm_exchange.h"
#include "shm_halo.h"
#include "shm_node.h"
#include "shm_reduce.h"
#include "shm_segment.h"
