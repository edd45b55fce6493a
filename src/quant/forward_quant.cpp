// Forward quantizer drivers: argument checks, OpenMP over rows / bands of rows, error reports.
#include "s3r/quant/forward_quant.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/ref/numerics.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"

namespace s3r {

namespace {

void check_sizes(const char* fn, std::string_view tensor, int64_t rows, int64_t cols,
                 size_t input, size_t codes, size_t scales, size_t expected_scales) {
  std::ostringstream msg;
  if (rows < 0 || cols < 0) {
    msg << fn << ": tensor '" << tensor << "' has a negative shape (" << rows << ", " << cols << ")";
  } else if (input != static_cast<size_t>(rows * cols)) {
    msg << fn << ": tensor '" << tensor << "' has " << input << " elements, expected rows x cols = "
        << rows << " x " << cols << " = " << rows * cols;
  } else if (codes != input) {
    msg << fn << ": codes of '" << tensor << "' hold " << codes << " elements, expected " << input;
  } else if (scales != expected_scales) {
    msg << fn << ": scales of '" << tensor << "' hold " << scales << " elements, expected "
        << expected_scales;
  } else {
    return;
  }
  throw Error(msg.str());
}

[[noreturn]] void throw_nonfinite(std::string_view tensor, const float* x, int64_t rows,
                                  int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(x[i])) {
      std::ostringstream msg;
      msg << "tensor '" << tensor << "' (" << rows << " x " << cols << ") holds a non-finite value "
          << x[i] << " at [" << i / cols << ", " << i % cols
          << "]; it cannot be quantized (check the layer's input and the learning rate)";
      throw NonFiniteError(msg.str());
    }
  }
  throw NonFiniteError("tensor '" + std::string(tensor) + "' holds a non-finite value");
}

constexpr int64_t kRowBlock = 16;   // rows per task

}  // namespace

void quantize_rows_rtne(std::span<int8_t> codes, std::span<float> scales,
                        std::span<const float> x, int64_t rows, int64_t cols,
                        std::string_view tensor_name) {
  check_sizes("quantize_rows_rtne", tensor_name, rows, cols, x.size(), codes.size(),
              scales.size(), static_cast<size_t>(rows));
  work::add_bytes(static_cast<uint64_t>(5 * rows * cols + 4 * rows));  // x read; codes, scales written
  const auto kernel = kernels::active_kernels().quantize_rows_rtne;
  const bool ok = parallel_blocks_all(rows, kRowBlock, [&](int64_t r0, int64_t r1) {
    return kernel(codes.data(), scales.data(), x.data(), r0, r1, cols);
  });
  if (!ok) throw_nonfinite(tensor_name, x.data(), rows, cols);
}

void quantize_cols_rtne(std::span<int8_t> codes, std::span<float> scales,
                        std::span<const float> w, int64_t rows, int64_t cols,
                        std::string_view tensor_name) {
  check_sizes("quantize_cols_rtne", tensor_name, rows, cols, w.size(), codes.size(),
              scales.size(), static_cast<size_t>(cols));
  // w read twice (column maxima, then codes); codes and scales written
  work::add_bytes(static_cast<uint64_t>(9 * rows * cols + 4 * cols));
  const auto& k = kernels::active_kernels();
  // Column maxima of one band of whole rows per thread, then the maxima of those: W streams
  // through in order (strips of 256 columns down every row read it at 10 GB/s on a Zen 4, two
  // threads). A maximum is exact, so the bands do not change a bit.
  const int64_t bands = std::clamp<int64_t>(parallel_threads(), 1, std::max<int64_t>(rows, 1));
  const int64_t band_rows = (rows + bands - 1) / bands;
  thread_local AlignedVector<float> band_max;
  band_max.resize(static_cast<size_t>(bands * cols));
  float* part = band_max.data();  // this thread's buffer (the name means another's in the workers)
  const bool ok = parallel_blocks_all(bands, 1, [&](int64_t b, int64_t) {
    const int64_t r0 = std::min(rows, b * band_rows), r1 = std::min(rows, r0 + band_rows);
    return k.absmax_cols(part + b * cols, w.data(), r0, r1, cols, 0, cols);
  });
  if (!ok) throw_nonfinite(tensor_name, w.data(), rows, cols);
  for (int64_t c = 0; c < cols; ++c) {
    float m = part[c];
    for (int64_t b = 1; b < bands; ++b) m = std::max(m, part[b * cols + c]);
    scales[c] = kernels::ref::absmax_to_scale(m);
  }
  parallel_blocks(rows, kRowBlock, [&](int64_t r0, int64_t r1) {
    k.quantize_cols_rtne(codes.data(), w.data(), scales.data(), r0, r1, cols);
  });
}

}  // namespace s3r
