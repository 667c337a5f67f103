// A best-fit pool of buffers kept for reuse, bounded in bytes and in count: the result pool of
// host results (ResultPool, memory.h) and the node-shared segments of the node-local
// transport (NodeShm, shm_node.h) are two of it, over their own kinds of buffer and bounds.
//
// A request takes the smallest kept buffer of at least its size and at most twice it. A
// request that fits none drops the kept ones smaller than it (a growing pattern: a loop over
// ever larger shapes would never use them again) and the caller allocates a new one. A
// buffer given back is kept, the oldest dropped first while the pool holds more than its
// bytes or its count. `Drop` frees one buffer: drop(item, cap).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "box.h"

namespace pyshard {

template <class T, class Drop>
class BestFitPool {
 public:
  // Buffers still kept when the pool is destroyed are not dropped (T's destructor runs): the
  // process-wide result pool lives until exit, when arrays may still give theirs back.
  BestFitPool(size_t max_count, i64 limit) : max_count_(max_count), limit_(limit) {}
  BestFitPool(const BestFitPool&) = delete;
  BestFitPool& operator=(const BestFitPool&) = delete;

  // The best kept buffer for `need` bytes into *out (its capacity into *cap), or false (the
  // kept ones smaller than `need` dropped).
  bool take(i64 need, T* out, i64* cap) {
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const i64 c = free_[i].cap;
      if (c >= need && c <= 2 * need && (best == free_.size() || c < free_[best].cap)) best = i;
    }
    if (best < free_.size()) {
      *out = std::move(free_[best].item);
      *cap = free_[best].cap;
      held_ -= *cap;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      return true;
    }
    for (size_t i = 0; i < free_.size();) {
      if (free_[i].cap < need) {
        drop(i);
      } else {
        ++i;
      }
    }
    return false;
  }

  void give(T item, i64 cap) {
    free_.push_back(Kept{std::move(item), cap});
    held_ += cap;
    shrink();
  }

  // Drop the oldest kept buffers while over the bounds.
  void shrink() {
    while (!free_.empty() && (held_ > limit_ || free_.size() > max_count_)) drop(0);
  }
  void clear() {
    while (!free_.empty()) drop(free_.size() - 1);
  }
  // The byte bound; applies from the next give() or shrink().
  void set_limit(i64 bytes) { limit_ = bytes; }
  i64 limit() const { return limit_; }
  i64 held() const { return held_; }  // bytes kept
  template <class F>
  void for_each(F&& f) const {  // f(item) for every kept buffer, the oldest first
    for (const Kept& k : free_) f(k.item);
  }

 private:
  struct Kept {
    T item;
    i64 cap;
  };
  void drop(size_t i) {
    Drop{}(free_[i].item, free_[i].cap);
    held_ -= free_[i].cap;
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::vector<Kept> free_;  // the most recently given back last
  size_t max_count_;
  i64 held_ = 0;
  i64 limit_;
};

}  // namespace pyshard
