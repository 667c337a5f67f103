// Max and min for reductions over ranks, whose result does not depend on the order MPI (or
// the node's reduction) combines the operands in, bit for bit. A NaN wins (as
// numpy.maximum and numpy.minimum); between two NaNs the larger bit pattern; +0 is above -0
// (IEEE 754-2019 maximum and minimum). Each picks the extreme of one total order, so every
// rank of a Partial max/min -> Replicate gets the same bits whatever pairing MPI chose (the
// fold's DevMax/DevMin keep the first of a tie: their operands come in a fixed order).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pyshard {

template <class T>
inline auto float_bits(T v) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  static_assert(sizeof(T) == sizeof(U), "float or double");
  U u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

template <class T>
struct SymMax {
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      const bool na = a != a, nb = b != b;
      if (na || nb) return (na && nb) ? (float_bits(b) > float_bits(a) ? b : a) : (na ? a : b);
      if (a == b) return std::signbit(a) ? b : a;  // +0 over -0 (other equal values: one bits)
    }
    return b > a ? b : a;
  }
};

template <class T>
struct SymMin {
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      const bool na = a != a, nb = b != b;
      if (na || nb) return (na && nb) ? (float_bits(b) > float_bits(a) ? b : a) : (na ? a : b);
      if (a == b) return std::signbit(a) ? a : b;  // -0 under +0
    }
    return b < a ? b : a;
  }
};

}  // namespace pyshard
