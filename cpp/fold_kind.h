// The fold's vocabulary (the reverse exchange, HaloArray.fold): how a received value combines
// into the cell it lands on, and the element type the combine runs in (`none`: wait() leaves
// the received bytes in the step's buffer and the caller combines them: cupy arrays and the
// low-precision floats, which accumulate in float32 in Python). Plain enums in a header of
// their own, so that the CUDA packer (cuda_packer.cu) compiles them without the MPI headers.
#pragma once

namespace pyshard {

enum class FoldOp { sum = 0, max = 1, min = 2 };
enum class FoldKind {
  none = -1, f32 = 0, f64 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, u8 = 6, u16 = 7, u32 = 8,
  u64 = 9, c64 = 10, c128 = 11
};

}  // namespace pyshard
