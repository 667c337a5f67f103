// The body of the CUDA fold-combine kernel, one thread at a time, as a plain function of its
// block and thread indices (as copy_kernel.h): dst = op(dst, src) element by element over
// the runs of ONE descriptor. nvcc compiles it into the `__global__` wrapper in
// cuda_packer.cu; the host compiler compiles the same lines into the CPU build, where
// kernel_harness.h runs it over the whole launch grid (tests/test_kernels_on_host.py checks
// it against the host fold, fold_combine, bit for bit).
//
// The order rule of a fold (contributions to one cell combine in table order) holds because
// the packer launches one descriptor at a time, in table order, on one stream: two boxes that
// land on the same cell never run together, and one box's runs never overlap. The warps of a
// launch stride over the descriptor's runs, the lanes of a warp over a run's elements.
#pragma once

#include <cstdint>
#include <type_traits>
#ifndef __CUDA_ARCH__
#include <stdexcept>
#endif

#include "box.h"
#include "copy_kernel.h"  // ThreadIndex, kThreads
#include "fold_kind.h"

namespace pyshard {

// Complex elements as two plain members (std::complex is not a device type); sum only.
template <class R>
struct alignas(2 * sizeof(R)) DevComplex {
  R re, im;
};

template <class T>
struct DevSum {
  PYSHARD_HD T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {  // wrap around, as numpy (no signed overflow UB)
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
template <class R>
struct DevSum<DevComplex<R>> {
  PYSHARD_HD DevComplex<R> operator()(DevComplex<R> a, DevComplex<R> b) const {
    return DevComplex<R>{a.re + b.re, a.im + b.im};
  }
};
template <class T>
struct DevMax {  // NaN wins, as numpy.maximum and the host fold
  PYSHARD_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return b > a ? b : a;
  }
};
template <class T>
struct DevMin {
  PYSHARD_HD T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return b < a ? b : a;
  }
};

// One thread of the combine kernel over descriptor `d` (byte offsets into `src` and `dst`,
// which may be one array: a fold's periodic wraps read its ghost boxes and write its
// interior). Compiled for the host, a misaligned element traps as it would on the device.
template <class T, class F>
PYSHARD_HD inline void combine_kernel_thread(const CopyDesc& d, const char* src, char* dst,
                                             F f, const ThreadIndex& at) {
  const int lane = at.thread_x & 31;
  const i64 warp = (static_cast<i64>(at.block_x) * at.block_dim_x + at.thread_x) >> 5;
  const i64 nwarps = (static_cast<i64>(at.grid_x) * at.block_dim_x) >> 5;
  const i64 n = d.run / static_cast<i64>(sizeof(T));
  for (i64 r = warp; r < d.runs; r += nwarps) {
    i64 so, to;
    run_offsets(d, r, &so, &to);
#ifndef __CUDA_ARCH__
    if ((reinterpret_cast<std::uintptr_t>(src + so) |
         reinterpret_cast<std::uintptr_t>(dst + to)) % alignof(T))
      throw std::runtime_error("pyshard: the combine kernel would read or write a misaligned "
                               "element");
#endif
    const T* s = reinterpret_cast<const T*>(src + so);
    T* o = reinterpret_cast<T*>(dst + to);
    for (i64 e = lane; e < n; e += 32) o[e] = f(o[e], s[e]);
  }
}

template <class T>
struct TypeTag {
  using type = T;
};

// Call fn(TypeTag<T>{}, Op{}) for the element type of `kind` and the functor of `op`; false
// for FoldKind::none, max/min of complex, or an unknown kind (the caller raises).
template <class Fn>
bool with_fold_type(FoldKind kind, FoldOp op, Fn&& fn) {
  auto ops = [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (op == FoldOp::sum) {
      fn(tag, DevSum<T>{});
      return true;
    }
    if constexpr (std::is_arithmetic_v<T>) {
      if (op == FoldOp::max) {
        fn(tag, DevMax<T>{});
        return true;
      }
      if (op == FoldOp::min) {
        fn(tag, DevMin<T>{});
        return true;
      }
    }
    return false;
  };
  switch (kind) {
    case FoldKind::f32: return ops(TypeTag<float>{});
    case FoldKind::f64: return ops(TypeTag<double>{});
    case FoldKind::i8: return ops(TypeTag<std::int8_t>{});
    case FoldKind::i16: return ops(TypeTag<std::int16_t>{});
    case FoldKind::i32: return ops(TypeTag<std::int32_t>{});
    case FoldKind::i64: return ops(TypeTag<std::int64_t>{});
    case FoldKind::u8: return ops(TypeTag<std::uint8_t>{});
    case FoldKind::u16: return ops(TypeTag<std::uint16_t>{});
    case FoldKind::u32: return ops(TypeTag<std::uint32_t>{});
    case FoldKind::u64: return ops(TypeTag<std::uint64_t>{});
    case FoldKind::c64: return ops(TypeTag<DevComplex<float>>{});
    case FoldKind::c128: return ops(TypeTag<DevComplex<double>>{});
    default: return false;
  }
}

}  // namespace pyshard
