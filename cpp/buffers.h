// Result buffers that numpy arrays view through the buffer protocol (bound in bindings.cpp):
// when the last array over one goes, its memory returns to the pool it came from.
#pragma once

#include <memory>
#include <utility>

#include "memory.h"
#include "shm_node.h"

namespace pyshard {

// A result buffer from the process's result pool (ResultPool), already faulted in when reused.
struct PooledBuffer {
  char* ptr = nullptr;
  i64 cap = 0;
  i64 n = 0;
  explicit PooledBuffer(i64 bytes) : n(bytes) { ptr = ResultPool::get().take(bytes, &cap); }
  ~PooledBuffer() { ResultPool::get().give(ptr, cap); }
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
};

// A result buffer in node-shared memory (the node-local transport's pool): the segment
// returns to the pool of the transport that made it (or is unmapped, if that transport was
// released).
struct ShmBuffer {
  std::shared_ptr<ShmSegment> seg;
  std::weak_ptr<NodeShm> pool;
  i64 n = 0;
  ShmBuffer(std::shared_ptr<NodeShm> node, i64 bytes) : pool(node), n(bytes) {
    seg = node->take(bytes);
  }
  ~ShmBuffer() {
    if (auto p = pool.lock()) p->give(std::move(seg));
  }
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;
};

}  // namespace pyshard
