// oneDNN matmul wrappers with a primitive cache keyed by (types, shape, layout, fused ops).
#include "s3r/gemm/matmul.hpp"

#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "s3r/core/error.hpp"

namespace s3r::gemm {

namespace {

using dt = dnnl::memory::data_type;

struct PrimitiveKey {
  dt a, b, c;
  int64_t M, N, K;
  bool ta, tb, col_scale, accumulate;
  int64_t lda, ldb, ldc;  // resolved (never 0)
  auto tie() const {
    return std::tie(a, b, c, M, N, K, ta, tb, col_scale, accumulate, lda, ldb, ldc);
  }
  bool operator<(const PrimitiveKey& o) const { return tie() < o.tie(); }
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<PrimitiveKey, dnnl::matmul> cache;
};

Context& context() {
  static Context ctx;
  return ctx;
}

// oneDNN streams are not to be shared between threads: one per thread.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream{context().engine};
  return stream;
}

dnnl::memory::desc a_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({k.M, k.K}, k.a, k.ta ? dnnl::memory::dims{1, k.lda} : dnnl::memory::dims{k.lda, 1});
}
dnnl::memory::desc b_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({k.K, k.N}, k.b, k.tb ? dnnl::memory::dims{1, k.ldb} : dnnl::memory::dims{k.ldb, 1});
}
dnnl::memory::desc c_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({k.M, k.N}, k.c, dnnl::memory::dims{k.ldc, 1});
}
dnnl::memory::desc col_scale_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({1, k.N}, dt::f32, dnnl::memory::dims{k.N, 1});
}

dnnl::matmul& primitive(const PrimitiveKey& key) {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto it = ctx.cache.find(key);
  if (it != ctx.cache.end()) return it->second;
  // The column scale is a (1 x N) binary-multiply post-op: oneDNN 2.6 runs it in its brgemm
  // kernels, whereas run-time output scales send int8 products to the slower gemm:jit kernel.
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (key.col_scale) ops.append_binary(dnnl::algorithm::binary_mul, col_scale_desc(key));
  if (key.accumulate) ops.append_sum(1.0f);
  attr.set_post_ops(ops);
  try {
    const dnnl::matmul::desc desc(a_desc(key), b_desc(key), c_desc(key));
    const dnnl::matmul::primitive_desc pd(desc, attr, ctx.engine);
    return ctx.cache.emplace(key, dnnl::matmul(pd)).first->second;
  } catch (const dnnl::error& e) {
    std::ostringstream msg;
    msg << "oneDNN cannot create a matmul for M x N x K = " << key.M << " x " << key.N << " x "
        << key.K << " (a_transposed=" << key.ta << ", b_transposed=" << key.tb << "): " << e.what();
    throw Error(msg.str());
  }
}

void check_shape(const MatmulShape& s) {
  if (s.M < 1 || s.N < 1 || s.K < 1) {
    std::ostringstream msg;
    msg << "matmul: every dimension must be >= 1, got M x N x K = " << s.M << " x " << s.N << " x "
        << s.K;
    throw Error(msg.str());
  }
}

void run(const PrimitiveKey& key, void* C, const void* A, const void* B, const float* col_scale) {
  dnnl::matmul& mm = primitive(key);
  Context& ctx = context();
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(a_desc(key), ctx.engine, const_cast<void*>(A))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(b_desc(key), ctx.engine, const_cast<void*>(B))},
      {DNNL_ARG_DST, dnnl::memory(c_desc(key), ctx.engine, C)},
  };
  if (key.col_scale) {
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 dnnl::memory(col_scale_desc(key), ctx.engine, const_cast<float*>(col_scale)));
  }
  dnnl::stream& stream = thread_stream();
  mm.execute(stream, args);
  stream.wait();
}

PrimitiveKey make_key(dt a, dt b, dt c, const MatmulShape& s, bool col_scale, bool acc) {
  check_shape(s);
  const int64_t lda = s.lda ? s.lda : (s.a_transposed ? s.M : s.K);
  const int64_t ldb = s.ldb ? s.ldb : (s.b_transposed ? s.K : s.N);
  const int64_t ldc = s.ldc ? s.ldc : s.N;
  if (lda < (s.a_transposed ? s.M : s.K) || ldb < (s.b_transposed ? s.K : s.N) || ldc < s.N) {
    std::ostringstream msg;
    msg << "matmul: leading dimensions (" << lda << ", " << ldb << ", " << ldc
        << ") are shorter than the stored rows";
    throw Error(msg.str());
  }
  return PrimitiveKey{a, b, c, s.M, s.N, s.K, s.a_transposed, s.b_transposed, col_scale, acc,
                      lda, ldb, ldc};
}

}  // namespace

void matmul_f32(float* C, const float* A, const float* B, const MatmulShape& shape,
                bool accumulate) {
  run(make_key(dt::f32, dt::f32, dt::f32, shape, false, accumulate), C, A, B, nullptr);
}

void matmul_bf16(float* C, const bf16* A, const bf16* B, const MatmulShape& shape,
                 bool accumulate) {
  run(make_key(dt::bf16, dt::bf16, dt::f32, shape, false, accumulate), C, A, B, nullptr);
}

void matmul_bf16(bf16* C, const bf16* A, const bf16* B, const MatmulShape& shape) {
  run(make_key(dt::bf16, dt::bf16, dt::bf16, shape, false, false), C, A, B, nullptr);
}

void matmul_s8(int32_t* C, const int8_t* A, const int8_t* B, const MatmulShape& shape) {
  run(make_key(dt::s8, dt::s8, dt::s32, shape, false, false), C, A, B, nullptr);
}

void matmul_s8_scaled(float* C, const int8_t* A, const int8_t* B, const MatmulShape& shape,
                      const float* row_scale, const float* col_scale, bool accumulate) {
  if (row_scale == nullptr) {  // fully fused: column scale and accumulation are post-ops
    run(make_key(dt::s8, dt::s8, dt::f32, shape, col_scale != nullptr, accumulate), C, A, B,
        col_scale);
    return;
  }
  // oneDNN 2.6 (Debian 12) runs a per-row (M x 1) binary post-op only in its reference int8
  // kernel, about 1000x slower than its brgemm kernels, so the row scale is one extra pass.
  const int64_t M = shape.M, N = shape.N;
  float* out = C;
  if (accumulate) {
    thread_local std::vector<float> scratch;  // grown once, reused: no per-call allocation
    if (scratch.size() < static_cast<size_t>(M * N)) scratch.resize(static_cast<size_t>(M * N));
    out = scratch.data();
  }
  run(make_key(dt::s8, dt::s8, dt::f32, shape, col_scale != nullptr, false), out, A, B, col_scale);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const float r = row_scale[m];
    float* c = C + m * N;
    const float* o = out + m * N;
    if (accumulate) {
      for (int64_t n = 0; n < N; ++n) c[n] += r * o[n];
    } else {
      for (int64_t n = 0; n < N; ++n) c[n] = r * o[n];
    }
  }
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

int64_t matmul_primitive_count() {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  return static_cast<int64_t>(ctx.cache.size());
}

}  // namespace s3r::gemm
