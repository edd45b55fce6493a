#pragma once
// Forward quantizers (SPEC section 1): absmax scaling and round-to-nearest-even to int8.
//
//   per row (per token):            sx[t] = max_k |X[t,k]| / 127,  Xq[t,k] = rne(X[t,k] / sx[t])
//   per column (per output channel): sw[n] = max_k |W[k,n]| / 127,  Wq[k,n] = rne(W[k,n] / sw[n])
//
// Codes lie in [-127, 127]; an all-zero row or column gets scale 1 and zero codes. A non-finite
// input throws s3r::Error naming `tensor_name` and the first bad position. Results are
// bit-identical for every ISA and thread count (each code depends on its own row/column only).
#include <cstdint>
#include <span>
#include <string_view>

namespace s3r {

// x: (rows, cols) f32 row-major. codes: (rows, cols) int8. scales: (rows) f32.
void quantize_rows_rtne(std::span<int8_t> codes, std::span<float> scales,
                        std::span<const float> x, int64_t rows, int64_t cols,
                        std::string_view tensor_name);

// w: (rows, cols) f32 row-major (rows = K inputs, cols = N outputs). codes: (rows, cols) int8.
// scales: (cols) f32, one per column.
void quantize_cols_rtne(std::span<int8_t> codes, std::span<float> scales,
                        std::span<const float> w, int64_t rows, int64_t cols,
                        std::string_view tensor_name);

}  // namespace s3r
