// The collective steps of a plan, one header per step kind. Python computes every count from
// layouts that all ranks share; a step only moves bytes. Each step is built once from its
// geometry (pure data, also built by the planner to report workspace sizes) and run many
// times on any memory kind: pack -> wait -> MPI -> unpack, staging through host bounce
// buffers when the transport says so (heFFTe's reshape `apply`, cuDecomp's transposes).
//
//   comm.h      the communicator the core owns, call counts, how one call runs
//   exchange.h  Alltoallv / padded Alltoall / point-to-point / Alltoallw, and its geometry
//   gather.h    Allgatherv / Allgather, and its geometry
//   reduce.h    Allreduce, Reduce_scatter / Reduce_scatter_block, and its geometry
#pragma once

#include "comm.h"
#include "exchange.h"
#include "gather.h"
#include "reduce.h"
