// oneDNN matmul with a primitive cache keyed by (types, shape, layout, fused ops).
#include "gemm/onednn_matmul.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/core/cpu_features.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::gemm::onednn {

namespace {

using dt = dnnl::memory::data_type;

dt to_dt(Type t) {
  switch (t) {
    case Type::kF32: return dt::f32;
    case Type::kBf16: return dt::bf16;
    case Type::kS8: return dt::s8;
    case Type::kS32: return dt::s32;
  }
  return dt::undef;
}

struct PrimitiveKey {
  Type a, b, c;
  int64_t M, N, K;
  bool ta, tb, col_scale, accumulate;
  int64_t lda, ldb, ldc;
  // Planned for one thread (make_primitive): a float product under gemm::thread_invariant(),
  // which a process may switch (bench step's configurations do), so it is part of the key.
  bool one_thread;
  auto tie() const {
    return std::tie(a, b, c, M, N, K, ta, tb, col_scale, accumulate, lda, ldb, ldc, one_thread);
  }
  bool operator<(const PrimitiveKey& o) const { return tie() < o.tie(); }
};

PrimitiveKey key_of(const Call& call) {
  const MatmulShape& s = call.shape;
  return PrimitiveKey{call.a, call.b, call.c, s.M, s.N, s.K, s.a_transposed, s.b_transposed,
                      call.col_scale != nullptr, call.accumulate, s.lda, s.ldb, s.ldc,
                      call.c == Type::kF32 && call.a != Type::kS8 && gemm::thread_invariant()};
}

// The S3R_MAX_ISA cap, applied before oneDNN dispatches anything (it may be set only once).
void cap_onednn_isa() {
  const std::string& cap = cpu_features().cap;
  if (cap.empty()) return;
  // avx512_bf16: avx512_core_bf16, which includes VNNI and excludes AMX.
  const dnnl::cpu_isa isa = cap == "reference" ? dnnl::cpu_isa::sse41
                            : cap == "avx2"    ? dnnl::cpu_isa::avx2
                            : cap == "avx512"  ? dnnl::cpu_isa::avx512_core
                                               : dnnl::cpu_isa::avx512_core_bf16;
  try {
    dnnl::set_max_cpu_isa(isa);
  } catch (const dnnl::error& e) {
    throw Error("S3R_MAX_ISA=" + cap + ": oneDNN refused the ISA cap: " + e.what());
  }
}

// A matmul primitive and the scratchpad each execution of it needs.
struct Primitive {
  dnnl::matmul matmul;
  dnnl::memory::desc scratchpad;
};

struct Context {
  Context() : engine((cap_onednn_isa(), dnnl::engine::kind::cpu), 0) {}
  dnnl::engine engine;
  std::mutex mutex;
  std::map<PrimitiveKey, Primitive> cache;
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
  return dnnl::memory::desc({k.M, k.K}, to_dt(k.a),
                            k.ta ? dnnl::memory::dims{1, k.lda} : dnnl::memory::dims{k.lda, 1});
}
dnnl::memory::desc b_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({k.K, k.N}, to_dt(k.b),
                            k.tb ? dnnl::memory::dims{1, k.ldb} : dnnl::memory::dims{k.ldb, 1});
}
dnnl::memory::desc c_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({k.M, k.N}, to_dt(k.c), dnnl::memory::dims{k.ldc, 1});
}
dnnl::memory::desc col_scale_desc(const PrimitiveKey& k) {
  return dnnl::memory::desc({1, k.N}, dt::f32, dnnl::memory::dims{k.N, 1});
}

Primitive make_primitive(const PrimitiveKey& key, const dnnl::engine& engine) {
  // The column scale is a (1 x N) binary-multiply post-op: oneDNN 2.6 runs it in its brgemm
  // kernels, whereas run-time output scales send int8 products to the slower gemm:jit kernel.
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (key.col_scale) ops.append_binary(dnnl::algorithm::binary_mul, col_scale_desc(key));
  if (key.accumulate) ops.append_sum(1.0f);
  attr.set_post_ops(ops);
  // The caller passes each execution its own scratchpad (run(): one buffer per thread), so that
  // products may run concurrently from an OpenMP parallel region; the library's scratchpad is
  // shared between executions.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Float products run as fixed tiles, one thread each (matmul.cpp). oneDNN plans a primitive
  // for the threads it sees when it is created (OMP_NUM_THREADS, also inside a parallel region),
  // and a plan for two threads may split K and add the halves even when one thread executes it:
  // planned for one thread, the bits do not depend on the thread count. (Int8 sums are exact.)
  const bool one_thread_plan = key.one_thread;
  const int threads = omp_get_max_threads();
  if (one_thread_plan) omp_set_num_threads(1);
  try {
    const dnnl::matmul::desc desc(a_desc(key), b_desc(key), c_desc(key));
    const dnnl::matmul::primitive_desc pd(desc, attr, engine);
    Primitive p{dnnl::matmul(pd), pd.scratchpad_desc()};
    if (one_thread_plan) omp_set_num_threads(threads);
    return p;
  } catch (const dnnl::error& e) {
    if (one_thread_plan) omp_set_num_threads(threads);
    std::ostringstream msg;
    msg << "oneDNN cannot create a matmul for M x N x K = " << key.M << " x " << key.N << " x "
        << key.K << " (a_transposed=" << key.ta << ", b_transposed=" << key.tb << "): " << e.what();
    throw Error(msg.str());
  }
}

const Primitive& cached_primitive(const PrimitiveKey& key) {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto it = ctx.cache.find(key);
  if (it != ctx.cache.end()) return it->second;
  return ctx.cache.emplace(key, make_primitive(key, ctx.engine)).first->second;
}

// oneDNN 2.6's AMX int8 kernels (brgemm) take no transposed A: an int8 product with a
// transposed A (the dW product Xq^T Q) falls to its gemm:jit kernel. Where the CPU has AMX
// int8, such an A is first copied row-major into a per-thread buffer by s3r's transpose_s8 kernel
// (medians of 31 interleaved copies, 2 threads, Emerald Rapids: 0.28 / 1.34 / 0.14 / 0.49 ms at
// M x K = 1024 x 2048 / 4096 x 2048 / 256 x 4096 / 768 x 4096, where oneDNN's s8 reorder took
// 0.36 / 3.49 / 0.16 / 0.60 ms), and the AMX kernel runs on the copy. The copy pays only over
// enough columns: medians of 35 interleaved calls, 2 threads, Emerald Rapids with AMX (copy by
// the oneDNN reorder + AMX against gemm:jit): M x N x K = 256 x 256 x 4096
// 0.82-0.91x, 768 x 256 x 4096 0.88-0.90x, 256 x 768 x 4096 1.07-1.10x, 1024 x 1024 x 2048
// 1.38x, 1024 x 4096 x 2048 1.34x, 4096 x 1024 x 2048 1.19-1.21x; hence N >= 512. The int32
// sums are exact and the scaling post-ops the same, so the result has the same bits as the
// product on the strided A.
bool copies_transposed_a(const PrimitiveKey& key) {
  return key.a == Type::kS8 && key.ta && key.N >= 512 && cpu_features().amx_int8;
}

// The same product with A read from a packed row-major (M, K) copy.
PrimitiveKey with_row_major_a(PrimitiveKey key) {
  key.ta = false;
  key.lda = key.K;
  return key;
}

// Copies the transposed int8 A of `key` (stored as K rows of M codes, row stride lda)
// row-major into `dst` (M x K), threaded over bands of 64 stored rows (whole cache lines of
// dst per thread).
void copy_row_major(const PrimitiveKey& key, const void* A, int8_t* dst) {
  constexpr int64_t kBand = 64;
  const auto transpose = kernels::active_kernels().transpose_s8;
  const auto* src = static_cast<const int8_t*>(A);
  parallel_blocks(key.K, kBand, [&](int64_t r0, int64_t r1) {
    transpose(dst, key.K, src, key.lda, r0, r1, key.M);
  });
}

}  // namespace

void run(const Call& call, void* C, const void* A, const void* B, bool cached) {
  PrimitiveKey key = key_of(call);
  Context& ctx = context();
  dnnl::stream& stream = thread_stream();
  if (copies_transposed_a(key)) {
    thread_local std::vector<int8_t> row_major_a;  // grown once per thread, reused
    const auto size = static_cast<size_t>(key.M * key.K);
    if (row_major_a.size() < size) row_major_a.resize(size);
    copy_row_major(key, A, row_major_a.data());
    key = with_row_major_a(key);
    A = row_major_a.data();
  }
  Primitive uncached;
  if (!cached) uncached = make_primitive(key, ctx.engine);
  const Primitive& p = cached ? cached_primitive(key) : uncached;
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(a_desc(key), ctx.engine, const_cast<void*>(A))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(b_desc(key), ctx.engine, const_cast<void*>(B))},
      {DNNL_ARG_DST, dnnl::memory(c_desc(key), ctx.engine, C)},
  };
  if (call.col_scale != nullptr) {
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 dnnl::memory(col_scale_desc(key), ctx.engine, const_cast<float*>(call.col_scale)));
  }
  thread_local std::vector<uint8_t> scratch;  // grown once per thread, reused
  if (scratch.size() < p.scratchpad.get_size()) scratch.resize(p.scratchpad.get_size());
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratchpad, ctx.engine, scratch.data()));
  p.matmul.execute(stream, args);
  stream.wait();
}

int64_t primitive_count() {
  Context& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  return static_cast<int64_t>(ctx.cache.size());
}

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace s3r::gemm::onednn
