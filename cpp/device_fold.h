// A fold's combine on a device: dst = op(dst, src) over blocks [b0, b1) of a descriptor table,
// one launch of the combine kernel (combine_kernel.h) per descriptor, in table order, on the
// packer's stream, so contributions to one cell combine in the order the host fold uses
// (the same bits). HaloStep::wait runs it for device buffers with a native element kind
// (pyshard.jax's folds on the CUDA platform).
#pragma once

#include <cstddef>

#include "fold_kind.h"
#include "memory.h"

namespace pyshard {

// Throws std::runtime_error in a core built without CUDA, std::invalid_argument for a host
// packer or a kind/op the kernel has no combine for (FoldKind::none, max/min of complex).
void device_fold_combine(Packer& pk, FoldKind kind, FoldOp op, const DescTable& t, size_t b0,
                         size_t b1, const char* src, char* dst);

}  // namespace pyshard
