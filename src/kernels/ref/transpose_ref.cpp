// Scalar reference of the int8 transpose (kernels/kernels.hpp): plain loops.
#include "kernels/kernels.hpp"

namespace s3r::kernels::ref {

void transpose_s8(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r0, int64_t r1,
                  int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = r0; r < r1; ++r) dst[c * ldd + r] = src[r * lds + c];
  }
}

}  // namespace s3r::kernels::ref
