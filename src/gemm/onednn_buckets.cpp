// int8 products whose row count or depth changes from call to call (a mixture of experts' rows
// per expert, M in the forward and dX products, K in the dW product) run as a few products of
// fixed sizes, so that oneDNN compiles a bounded set of kernels instead of one per count (each
// 0.3-3 ms on the Emerald Rapids VM: 4347 primitives in the first 14 steps of qwen3moe `small`,
// 12.7 s of compiling against 7.7 s of products). int8 sums are exact, so the result has the
// bits of the single product.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "gemm/onednn_matmul.hpp"

namespace s3r::gemm::onednn {

namespace {

// The granule: M and K are split into chunks of kGranule * 2^j (the binary digits of the count
// rounded down) and a last chunk of fewer than kGranule, padded with zeros to kGranule.
constexpr int64_t kGranule = 32;

int64_t bytes_of(Type t) { return t == Type::kS8 ? 1 : t == Type::kBf16 ? 2 : 4; }

// Copies `rows` stored rows of `width` bytes (stride `ld` elements of `size` bytes) into a
// zero-filled buffer of `padded_rows` rows at stride `ld_out` elements.
void copy_padded(std::vector<char>& out, const char* in, int64_t rows, int64_t width, int64_t ld, int64_t padded_rows,
                 int64_t ld_out, int64_t size) {
  out.assign(static_cast<size_t>(padded_rows * ld_out * size), 0);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * ld_out * size, in + r * ld * size, width * size);
}

// The chunks of a count: [start, size) pairs, the last (if any) shorter than kGranule.
std::vector<std::pair<int64_t, int64_t>> chunks(int64_t count) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  const int64_t whole = count - count % kGranule;
  for (int64_t size = int64_t{1} << 40; size >= kGranule; size /= 2) {
    if (whole & size) out.emplace_back(at, size), at += size;
  }
  if (at < count) out.emplace_back(at, count - at);
  return out;
}

// Rows [m0, m0 + rows) of the product as one call: op(A)'s rows m0.. and C's rows m0.., a short
// last chunk on zero-padded copies (A's rows; C's rows, read first when accumulating).
void run_rows(const Call& call, char* C, const char* A, const void* B, int64_t m0, int64_t rows) {
  const MatmulShape& s = call.shape;
  const int64_t ea = bytes_of(call.a), ec = bytes_of(call.c);
  Call part = call;
  part.shape.M = rows;
  const char* a = A + ea * (s.a_transposed ? m0 : m0 * s.lda);
  char* c = C + ec * m0 * s.ldc;
  if (rows % kGranule == 0) return run(part, c, a, B);
  thread_local std::vector<char> a_pad, c_pad;
  if (s.a_transposed) {  // stored K rows of M codes: columns m0.. of each
    copy_padded(a_pad, a, s.K, rows, s.lda, s.K, kGranule, ea);
    part.shape.lda = kGranule;
  } else {
    copy_padded(a_pad, a, rows, s.K, s.lda, kGranule, s.lda, ea);
  }
  part.shape.M = kGranule;
  if (call.accumulate) {
    copy_padded(c_pad, c, rows, s.N, s.ldc, kGranule, s.ldc, ec);
  } else {
    c_pad.resize(static_cast<size_t>(kGranule * s.ldc * ec));
  }
  run(part, c_pad.data(), a_pad.data(), B);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * s.ldc * ec, c_pad.data() + r * s.ldc * ec, s.N * ec);
}

// Every row of the product, chunk by chunk.
void run_all_rows(const Call& call, void* C, const void* A, const void* B) {
  for (const auto& [m0, rows] : chunks(call.shape.M)) {
    run_rows(call, static_cast<char*>(C), static_cast<const char*>(A), B, m0, rows);
  }
}

// Depth [k0, k0 + depth) of the product into the int32 (M, N) `out`: operands' slices, a short
// last chunk on zero-padded copies of both.
void run_depth(const Call& call, int32_t* out, const char* A, const char* B, int64_t k0, int64_t depth) {
  const MatmulShape& s = call.shape;
  Call part{call.a, call.b, Type::kS32, s, nullptr, false};
  part.shape.K = depth;
  part.shape.ldc = s.N;
  const char* a = A + (s.a_transposed ? k0 * s.lda : k0);
  const char* b = B + (s.b_transposed ? k0 : k0 * s.ldb);
  if (depth % kGranule == 0) return run_all_rows(part, out, a, b);
  thread_local std::vector<char> a_pad, b_pad;
  if (s.a_transposed) {  // stored K rows of M codes: rows k0..
    copy_padded(a_pad, a, depth, s.M, s.lda, kGranule, s.lda, 1);
  } else {  // M rows of K codes: columns k0.. of each
    copy_padded(a_pad, a, s.M, depth, s.lda, s.M, kGranule, 1);
    part.shape.lda = kGranule;
  }
  if (s.b_transposed) {  // N rows of K codes
    copy_padded(b_pad, b, s.N, depth, s.ldb, s.N, kGranule, 1);
    part.shape.ldb = kGranule;
  } else {
    copy_padded(b_pad, b, depth, s.N, s.ldb, kGranule, s.ldb, 1);
  }
  part.shape.K = kGranule;
  run_all_rows(part, out, a_pad.data(), b_pad.data());
}

// The product over chunks of its depth: int32 partial sums added exactly, then C (+)=
// float(sum) * col_scale[n] as the fused post-ops compute it (s3r/gemm/matmul.hpp).
void run_all_depth(const Call& call, void* C, const void* A, const void* B) {
  const MatmulShape& s = call.shape;
  const auto MN = static_cast<size_t>(s.M * s.N);
  thread_local std::vector<int32_t> sum, part;
  sum.assign(MN, 0);
  part.resize(MN);
  for (const auto& [k0, depth] : chunks(s.K)) {
    run_depth(call, part.data(), static_cast<const char*>(A), static_cast<const char*>(B), k0, depth);
    for (size_t i = 0; i < MN; ++i) sum[i] += part[i];
  }
  const int64_t N = s.N, ldc = s.ldc;
  const int32_t* total = sum.data();  // thread_local: the other threads' `sum` is their own
  parallel_blocks(s.M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int32_t* in = total + m * N;
      if (call.c == Type::kS32) {
        std::copy(in, in + N, static_cast<int32_t*>(C) + m * ldc);
        continue;
      }
      float* out = static_cast<float*>(C) + m * ldc;
      for (int64_t n = 0; n < N; ++n) {
        const float v = call.col_scale ? static_cast<float>(in[n]) * call.col_scale[n] : static_cast<float>(in[n]);
        out[n] = call.accumulate ? out[n] + v : v;
      }
    }
  });
}

}  // namespace

void run_int8_bucketed(const Call& call, void* C, const void* A, const void* B) {
  const MatmulShape& s = call.shape;
  if (s.K % kGranule != 0) return run_all_depth(call, C, A, B);
  if (s.M % kGranule != 0) return run_all_rows(call, C, A, B);
  run(call, C, A, B);
}

}  // namespace s3r::gemm::onednn
