// The fused backward quantizer: reference vs every tier over a sweep of shapes and on kernel
// blocks that start mid-example, thread-count invariance, the spec's formulas, statistics against
// a direct computation, and bad input.
#include "s3r/quant/grad_quant.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dispatch.hpp"
#include "quant/grad_quant_support.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/quant/thresholds.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

using namespace grad_quant_testing;

const int64_t kSizes[] = {1, 3, 15, 16, 17, 63, 64, 65, 127, 1000};
// Channel counts (N) of the sweep: kSizes plus every tail length around the AVX2 width (8) and
// the AVX-512 width (16), odd and prime ones, so that a wrong lane or tail of a tier fails.
const int64_t kChannels[] = {1, 3, 7, 8, 9, 15, 16, 17, 23, 24, 31, 63, 64, 65, 127, 1000};
const GradRounding kModes[] = {GradRounding::kRtne, GradRounding::kSr, GradRounding::kS3r,
                               GradRounding::kS3rBcast};

std::vector<int64_t> example_lengths(int64_t T) {
  std::vector<int64_t> s = {1, T};
  for (int64_t d : {3, 5, 16}) {
    if (T % d == 0 && d != T) s.push_back(d);
  }
  return s;
}

QuantizedGrad run(const Problem& p, GradRounding mode, bool stats, bool use_bf16 = false,
                  Key key = fold_in(key_from_seed(2024), 7)) {
  QuantizedGrad out;
  const GradQuantConfig cfg{mode, p.S, key, stats};
  if (use_bf16) {
    quantize_gradient(out, std::span<const bf16>(p.g_bf16), p.T, p.N, p.sx, p.sw, cfg);
  } else {
    quantize_gradient(out, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, cfg);
  }
  return out;
}

// The sweep of the issue: T in kSizes, N in kChannels, S dividing T, every mode, statistics on;
// the reference with one thread is the baseline; every ISA with 1 and 2 threads must give the
// same codes and D bit for bit, statistics bit for bit within one ISA and to the stated
// tolerance across ISAs.
TEST(GradQuant, SweepReferenceAvx512AndThreadCounts) {
  for (int64_t T : kSizes) {
    for (int64_t N : kChannels) {
      for (int64_t S : example_lengths(T)) {
        const Problem p = make_problem(T, N, S, static_cast<uint32_t>(T * 7919 + N * 31 + S));
        for (GradRounding mode : kModes) {
          QuantizedGrad ref;
          {
            ScopedIsa isa(Isa::kReference);
            testing::ScopedThreads threads(1);
            ref = run(p, mode, true);
          }
          ASSERT_GT(ref.step, 0.0f);
          for (Isa isa : testing::runnable_isas()) {
            ScopedIsa scoped(isa);
            QuantizedGrad one_thread;
            for (int threads : {1, 2}) {
              testing::ScopedThreads st(threads);
              const QuantizedGrad got = run(p, mode, true);
              const std::string ctx = where(p, mode) + " threads=" + std::to_string(threads);
              expect_codes_equal(got, ref, ctx);
              expect_stats_close(got, ref, ctx, isa == Isa::kReference);
              if (threads == 1) {
                one_thread = got;
              } else {
                expect_stats_close(got, one_thread, ctx + " (vs 1 thread)", true);
              }
              // Without statistics the codes are the same.
              expect_codes_equal(run(p, mode, false), ref, ctx + " (no stats)");
            }
          }
        }
      }
    }
  }
}

TEST(GradQuant, Bf16InputMatchesReferenceAndItsF32Widening) {
  // N: full vectors plus tails of 1..15 lanes of both vector widths.
  for (int64_t N : {7, 9, 15, 23, 65}) {
    const Problem p = make_problem(64, N, 16, static_cast<uint32_t>(99 + N));
    Problem widened = p;
    for (size_t i = 0; i < p.g.size(); ++i) widened.g[i] = to_float(p.g_bf16[i]);
    for (GradRounding mode : kModes) {
      QuantizedGrad ref;
      {
        ScopedIsa isa(Isa::kReference);
        ref = run(p, mode, true, /*use_bf16=*/true);
      }
      for (Isa isa : testing::runnable_isas()) {
        ScopedIsa scoped(isa);
        const QuantizedGrad got = run(p, mode, true, true);
        expect_codes_equal(got, ref, where(p, mode) + " bf16");
        expect_stats_close(got, ref, where(p, mode) + " bf16", isa == Isa::kReference);
        expect_codes_equal(run(widened, mode, true), ref, where(p, mode) + " bf16 vs widened f32");
      }
    }
  }
}

// The kernels directly, on blocks that start mid-example: rows [r0, r1) inside one example of a
// batch that sits at first_token = 30 of the global batch (a rank's or micro-batch's share; not a
// multiple of 4, so a Threefry word's four 7-bit thresholds straddle the batch's rows
// differently than the row index suggests), N odd so that rows start off the lane grid. The driver's blocks start at example boundaries and every 32 tokens
// after; the kernels' contract is any block inside one example. Each block must give, at its
// rows, the codes of the reference's call over the whole example (the random bits of a position
// do not depend on where its block starts) and that tier's own row sums of the whole call, the
// reference's column sums of the same block, and write no other row.
TEST(GradQuant, KernelBlocksStartingMidExampleGiveTheWholeExamplesCodes) {
  static constexpr int64_t S = 10, T = 20, N = 37;
  const Problem prob = make_problem(T, N, S, 77);
  static constexpr int8_t kGuardCode = 0x5A;
  static constexpr float kGuard = -7.0f;
  for (GradRounding mode : kModes) {
    kernels::GradProblem p;
    p.g_f32 = prob.g.data();
    p.sx = prob.sx.data();
    p.sw = prob.sw.data();
    p.tokens = T;
    p.channels = N;
    p.tokens_per_example = S;
    p.first_token = 30;
    p.mode = mode;
    p.count = quantization_count(mode);
    for (int q = 0; q < p.count; ++q) p.keys[q] = fold_in(fold_in(key_from_seed(9), 4), static_cast<uint32_t>(q));
    bool nonfinite = false;
    const float step = kernels::ref::grad_absmax(p, 0, T, &nonfinite) / 127.0f;
    ASSERT_FALSE(nonfinite);
    // A call's outputs, guard-filled: codes (T, N) and row sums (T) with one element past the end
    // each, column sums (N) of the block.
    struct Out {
      std::vector<int8_t> codes[2];
      AlignedVector<float> rows[2], cols[2];
      Out() {
        for (int q = 0; q < 2; ++q) {
          codes[q].assign(T * N + 1, kGuardCode);
          rows[q].assign(T + 1, kGuard);
          cols[q].assign(N + 1, kGuard);
        }
      }
      kernels::GradBlockOut block() {
        kernels::GradBlockOut o;
        for (int q = 0; q < 2; ++q) o.codes[q] = codes[q].data(), o.row_sums[q] = rows[q].data(), o.col_sums[q] = cols[q].data();
        return o;
      }
    };
    const auto whole = [&](const kernels::KernelTable& k) {
      Out o;
      for (int64_t e = 0; e < T; e += S) k.grad_quantize(p, step, e, e + S, o.block());
      return o;
    };
    const Out ref_whole = whole(kernels::kernels_for(Isa::kReference));
    for (Isa isa : testing::runnable_isas()) {
      const kernels::KernelTable& k = kernels::kernels_for(isa);
      const Out own_whole = whole(k);
      for (auto [r0, r1] : {std::pair<int64_t, int64_t>{1, 10}, {3, 4}, {5, 9}, {11, 20}, {14, 19}}) {
        Out got, ref_block;
        k.grad_quantize(p, step, r0, r1, got.block());
        kernels::ref::grad_quantize(p, step, r0, r1, ref_block.block());
        const std::string ctx = std::string(isa_name(isa)) + " " + std::string(to_string(mode)) +
                                " rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")";
        for (int q = 0; q < p.count; ++q) {
          for (int64_t i = 0; i <= T * N; ++i) {
            const bool inside = i >= r0 * N && i < r1 * N;
            ASSERT_EQ(got.codes[q][i], inside ? ref_whole.codes[q][i] : kGuardCode)
                << ctx << " q=" << q << " code [" << i / N << ", " << i % N << "]"
                << (inside ? "" : " (outside the rows)");
          }
          for (int64_t t = 0; t <= T; ++t) {
            const bool inside = t >= r0 && t < r1;
            ASSERT_EQ(got.rows[q][t], inside ? own_whole.rows[q][t] : kGuard)
                << ctx << " q=" << q << " row sum " << t << (inside ? "" : " (outside the rows)");
          }
          for (int64_t n = 0; n <= N; ++n) {
            ASSERT_EQ(got.cols[q][n], ref_block.cols[q][n]) << ctx << " q=" << q << " column sum " << n;
          }
        }
      }
    }
  }
}

// The codes follow SPEC section 2 to the letter: the threshold of each element and its key.
TEST(GradQuant, CodesFollowTheSpecFormulas) {
  const Problem p = make_problem(12, 40, 4, 5);
  const Key layer_key = fold_in(fold_in(key_from_seed(3), 100), 2);  // (seed, step, layer)
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (GradRounding mode : kModes) {
      const QuantizedGrad out = run(p, mode, false, false, layer_key);
      float absmax = 0.0f;
      for (int64_t i = 0; i < p.T * p.N; ++i) {
        absmax = std::max(absmax, std::fabs((p.sx[i / p.N] * p.g[i]) * p.sw[i % p.N]));
      }
      ASSERT_EQ(out.step, absmax / 127.0f);
      for (int q = 0; q < quantization_count(mode); ++q) {
        const Key k = fold_in(layer_key, static_cast<uint32_t>(q));
        for (int64_t t = 0; t < p.T; ++t) {
          for (int64_t n = 0; n < p.N; ++n) {
            const int64_t i = t * p.N + n;
            const float x = ((p.sx[t] * p.g[i]) * p.sw[n]) / out.step;
            float r = 0.0f;
            switch (mode) {
              case GradRounding::kRtne: break;
              case GradRounding::kSr: r = uniform23(random_bits32(k, static_cast<uint64_t>(i))); break;
              case GradRounding::kS3r: r = threshold7(k, static_cast<uint64_t>(t)); break;
              case GradRounding::kS3rBcast: r = threshold7(k, static_cast<uint64_t>(t / p.S)); break;
            }
            const float rounded = mode == GradRounding::kRtne ? std::nearbyint(x) : std::floor(x + r);
            const int expected = static_cast<int>(std::clamp(rounded, -127.0f, 127.0f));
            ASSERT_EQ(out.codes[q][i], expected)
                << where(p, mode) << " q=" << q << " [" << t << ", " << n << "] x=" << x << " r=" << r;
          }
        }
      }
      // The largest |G'| maps to +-127 in rtne.
      if (mode == GradRounding::kRtne) {
        const auto [mn, mx] = std::minmax_element(out.codes[0].begin(), out.codes[0].end());
        EXPECT_TRUE(*mn == -127 || *mx == 127);
      }
    }
  }
}

// Two ranks' share of the same member of a group, without MPI: max() records this rank's values
// and takes the element-wise max with the other rank's (recorded by an earlier call); every other
// collective is unused by quantize_gradient.
class TwoRankMax final : public dist::Communicator {
 public:
  explicit TwoRankMax(int rank, AlignedVector<float> other = {}) : rank_(rank), other_(std::move(other)) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void max(std::span<float> x) override {
    mine.assign(x.begin(), x.end());
    for (size_t i = 0; i < x.size() && i < other_.size(); ++i) x[i] = std::max(x[i], other_[i]);
  }
  void sum(std::span<int32_t>) override { unused(); }
  void tree_sum(std::span<float>) override { unused(); }
  void all_gather_bytes(std::span<const std::byte>, std::span<std::byte>) override { unused(); }
  void all_gather_in_place_bytes(std::span<std::byte>, std::span<const int64_t>, size_t) override { unused(); }
  void broadcast_bytes(std::span<std::byte>, int) override { unused(); }
  void barrier() override { unused(); }
  [[noreturn]] void stop_every_rank(int) override { unused(); }
  AlignedVector<float> mine;

 private:
  [[noreturn]] static void unused() { throw std::logic_error("TwoRankMax: not a collective of quantize_gradient"); }
  int rank_;
  AlignedVector<float> other_;
};

// Data parallel (SPEC section 6): rows [o, o + T/2) quantized as a rank's share (first_token = o,
// D's max over both ranks) give the codes and D of the whole G quantized at once, in every tier,
// every mode, and for splits at several example boundaries; with first_token wrong (0 for the
// second half), the random modes differ. This holds the tiers' global-index arithmetic (the
// sr counter (first_token + t) * N + n, the thresholds of tokens and examples) against the
// reference without MPI.
TEST(GradQuant, ARanksShareQuantizesAsThePartOfTheWhole) {
  for (int64_t N : {9, 33}) {
    const int64_t S = 4, T = 48;
    const Problem whole = make_problem(T, N, S, static_cast<uint32_t>(40 + N));
    for (int64_t split : {S, 5 * S, T / 2}) {
      Problem part[2];
      for (int r = 0; r < 2; ++r) {
        const int64_t lo = r == 0 ? 0 : split, hi = r == 0 ? split : T;
        part[r] = Problem{hi - lo, N, S, {}, {}, whole.sw, {}};
        part[r].g.assign(whole.g.begin() + lo * N, whole.g.begin() + hi * N);
        part[r].sx.assign(whole.sx.begin() + lo, whole.sx.begin() + hi);
      }
      for (Isa isa : testing::runnable_isas()) {
        ScopedIsa scoped(isa);
        for (GradRounding mode : kModes) {
          const std::string ctx = where(whole, mode) + " split at token " + std::to_string(split);
          const QuantizedGrad want = run(whole, mode, false);
          const auto quantize = [&](int r, dist::Communicator& group, uint64_t first_token) {
            QuantizedGrad out;
            GradQuantConfig cfg{mode, S, fold_in(key_from_seed(2024), 7), false};
            cfg.first_token = first_token;
            cfg.group = &group;
            quantize_gradient(out, std::span<const float>(part[r].g), part[r].T, N, part[r].sx, part[r].sw, cfg);
            return out;
          };
          TwoRankMax record0(0), record1(1);
          quantize(0, record0, 0);
          quantize(1, record1, static_cast<uint64_t>(split));
          TwoRankMax rank0(0, record1.mine), rank1(1, record0.mine);
          const QuantizedGrad got[2] = {quantize(0, rank0, 0), quantize(1, rank1, static_cast<uint64_t>(split))};
          for (int q = 0; q < want.count; ++q) {
            ASSERT_EQ(got[0].step, want.step) << ctx;
            ASSERT_EQ(got[1].step, want.step) << ctx;
            AlignedVector<int8_t> joined = got[0].codes[q];
            joined.insert(joined.end(), got[1].codes[q].begin(), got[1].codes[q].end());
            ASSERT_EQ(joined, want.codes[q]) << ctx << " q=" << q;
          }
          if (mode != GradRounding::kRtne) {  // the offset matters: without it, other thresholds
            TwoRankMax rank1_unshifted(1, record0.mine);
            EXPECT_NE(quantize(1, rank1_unshifted, 0).codes[0], got[1].codes[0]) << ctx;
          }
        }
      }
    }
  }
}

// The statistics equal a direct double-precision computation from the codes.
TEST(GradQuant, StatisticsMatchDirectComputationFromCodes) {
  for (int64_t S : {1, 7, 21}) {
    const Problem p = make_problem(42, 129, S, 11);
    const int64_t B = p.T / S;
    for (Isa isa : testing::runnable_isas()) {
      ScopedIsa scoped(isa);
      for (GradRounding mode : kModes) {
        const QuantizedGrad out = run(p, mode, true);
        const double D = out.step;
        for (int q = 0; q < out.count; ++q) {
          std::vector<double> c(p.T, 0.0), a(B * p.N, 0.0), m(B, 0.0);
          for (int64_t t = 0; t < p.T; ++t) {
            for (int64_t n = 0; n < p.N; ++n) {
              const double gp = (p.sx[t] * p.g[t * p.N + n]) * p.sw[n];  // G' as the f32 kernel forms it
              const double e = D * out.codes[q][t * p.N + n] - gp;
              c[t] += e / p.N;
              a[(t / S) * p.N + n] += e / S;
              m[t / S] += e / (S * p.N);
            }
          }
          // Beyond the summation error, each term differs by the f32 rounding of x = G'/D
          // (<= 2^-24 * 127 in units of D).
          const double tol = token_mean_tol(out) + D * 127.0 * 0x1p-24;
          const std::string ctx = where(p, mode) + " q=" + std::to_string(q);
          for (int64_t t = 0; t < p.T; ++t) ASSERT_NEAR(out.stats[q].token_mean[t], c[t], tol) << ctx << " t=" << t;
          for (int64_t i = 0; i < B * p.N; ++i) ASSERT_NEAR(out.stats[q].channel_mean[i], a[i], tol) << ctx << " i=" << i;
          for (int64_t b = 0; b < B; ++b) ASSERT_NEAR(out.stats[q].grand_mean[b], m[b], tol) << ctx << " b=" << b;
        }
      }
    }
  }
}

TEST(GradQuant, ThresholdsDependOnTheKeyAndProduct) {
  const Problem p = make_problem(32, 64, 8, 3);
  const QuantizedGrad a = run(p, GradRounding::kS3r, false, false, key_from_seed(1));
  const QuantizedGrad b = run(p, GradRounding::kS3r, false, false, key_from_seed(2));
  EXPECT_NE(a.codes[0], b.codes[0]);
  const QuantizedGrad sr = run(p, GradRounding::kSr, false);
  EXPECT_NE(sr.codes[0], sr.codes[1]) << "dX and dW codes of sr must use independent thresholds";
  EXPECT_EQ(&sr.codes_for_dw(), &sr.codes[1]);
  EXPECT_EQ(&a.codes_for_dw(), &a.codes[0]);
}

TEST(GradQuant, ZeroGradientGivesZeroCodesAndStatistics) {
  Problem p = make_problem(8, 20, 4, 1);
  std::fill(p.g.begin(), p.g.end(), 0.0f);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (GradRounding mode : kModes) {
      QuantizedGrad out = run(p, mode, true);  // first fill with a non-zero problem's results...
      out = run(make_problem(8, 20, 4, 2), mode, true);
      const GradQuantConfig cfg{mode, 4, key_from_seed(0), true};
      quantize_gradient(out, std::span<const float>(p.g), 8, 20, p.sx, p.sw, cfg);  // ...then reuse
      EXPECT_EQ(out.step, 0.0f);
      for (int q = 0; q < out.count; ++q) {
        for (int8_t v : out.codes[q]) ASSERT_EQ(v, 0);
        for (float v : out.stats[q].token_mean) ASSERT_EQ(v, 0.0f);
        for (float v : out.stats[q].channel_mean) ASSERT_EQ(v, 0.0f);
        for (float v : out.stats[q].grand_mean) ASSERT_EQ(v, 0.0f);
      }
    }
  }
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GradQuant, BadInputIsRejectedWithANamedArgument) {
  const Problem p = make_problem(6, 10, 3, 1);
  auto call = [&](std::span<const float> g, int64_t T, int64_t N, std::span<const float> sx,
                  std::span<const float> sw, int64_t S) {
    return message_of([&] {
      QuantizedGrad out;
      quantize_gradient(out, g, T, N, sx, sw, GradQuantConfig{GradRounding::kS3r, S, {}, true});
    });
  };
  EXPECT_NE(call(p.g, 6, 11, p.sx, p.sw, 3).find("G has 60 elements"), std::string::npos);
  EXPECT_NE(call(p.g, 6, 10, std::span<const float>(p.sx).first(5), p.sw, 3).find("sx has 5"),
            std::string::npos);
  EXPECT_NE(call(p.g, 6, 10, p.sx, std::span<const float>(p.sw).first(9), 3).find("sw has 9"),
            std::string::npos);
  EXPECT_NE(call(p.g, 6, 10, p.sx, p.sw, 4).find("not a multiple of the example length S = 4"),
            std::string::npos);
  EXPECT_NE(call(p.g, 6, 10, p.sx, p.sw, 0).find("S must be >= 1"), std::string::npos);
  AlignedVector<float> bad_sx = p.sx;
  bad_sx[2] = 0.0f;
  EXPECT_NE(call(p.g, 6, 10, bad_sx, p.sw, 3).find("sx[2]"), std::string::npos);
  AlignedVector<float> huge = p.g;
  huge[0] = 3e38f;
  AlignedVector<float> big_scales(6, 1e30f);
  EXPECT_NE(call(huge, 6, 10, big_scales, p.sw, 3).find("overflows"), std::string::npos);
  EXPECT_THROW(parse_grad_rounding("s3r_bcast"), Error);
  EXPECT_EQ(parse_grad_rounding("s3r-bcast"), GradRounding::kS3rBcast);
}

TEST(GradQuant, NonFiniteGradientIsReportedWithItsPosition) {
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      Problem p = make_problem(6, 37, 3, 1);
      p.g[4 * 37 + 33] = bad;
      p.g_bf16[4 * 37 + 33] = to_bf16(bad);
      for (bool use_bf16 : {false, true}) {
        try {
          run(p, GradRounding::kSr, true, use_bf16);
          FAIL() << "expected NonFiniteGradient";
        } catch (const NonFiniteGradient& e) {
          EXPECT_NE(std::string(e.what()).find("G[4, 33]"), std::string::npos) << e.what();
        }
      }
    }
  }
}

// Pass 1 taken by G's writer (GradAbsMax, added over blocks of rows in any order): the same D,
// codes and statistics as quantize_gradient's own pass, in every tier and mode. And the maximum
// given is the one used: twice it doubles D (a quantizer that ignored it would not), and its
// nonfinite flag is the quantizer's own NaN report.
TEST(GradQuant, AMaximumTakenByGsWriterGivesTheSameQuantization) {
  const Problem p = make_problem(45, 37, 15, 4);
  const Key key = fold_in(key_from_seed(2024), 7);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    GradAbsMax whole;
    for (int64_t t0 : {32, 0, 16}) whole.add(grad_absmax_rows(p.g, p.N, p.sx, p.sw, t0, std::min<int64_t>(p.T, t0 + 16)));
    ASSERT_GT(whole.value, 0.0f);
    ASSERT_FALSE(whole.nonfinite);
    for (GradRounding mode : kModes) {
      const std::string ctx = where(p, mode);
      const QuantizedGrad own = run(p, mode, true);
      QuantizedGrad given;
      GradQuantConfig cfg{mode, p.S, key, true};
      cfg.absmax = &whole;
      quantize_gradient(given, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, cfg);
      expect_codes_equal(given, own, ctx);
      expect_stats_close(given, own, ctx, /*bit_exact=*/true);
      GradAbsMax twice = whole;
      twice.value *= 2.0f;
      cfg.absmax = &twice;
      quantize_gradient(given, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, cfg);
      EXPECT_EQ(given.step, twice.value / 127.0f) << ctx;
      EXPECT_EQ(given.step, 2.0f * own.step) << ctx;
      GradAbsMax flagged = whole;
      flagged.nonfinite = true;
      cfg.absmax = &flagged;
      EXPECT_THROW(quantize_gradient(given, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, cfg),
                   NonFiniteGradient) << ctx;
    }
  }
  AlignedVector<float> g = p.g;
  g[3 * p.N + 5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(grad_absmax_rows(g, p.N, p.sx, p.sw, 0, 16).nonfinite);
  EXPECT_FALSE(grad_absmax_rows(g, p.N, p.sx, p.sw, 4, 16).nonfinite);
  EXPECT_NE(message_of([&] { grad_absmax_rows(p.g, p.N, p.sx, p.sw, 40, 46); }).find("rows [40, 46)"),
            std::string::npos);
}

// A CPU without AVX-512 runs the reference kernels through the same public API.
TEST(GradQuant, ForcedScalarFallbackWorks) {
  ScopedIsa scoped(Isa::kReference);
  EXPECT_EQ(active_isa(), Isa::kReference);
  const Problem p = make_problem(16, 33, 4, 8);
  const QuantizedGrad out = run(p, GradRounding::kS3r, true);
  EXPECT_GT(out.step, 0.0f);
  EXPECT_EQ(out.codes[0].size(), 16u * 33u);
}

}  // namespace
}  // namespace s3r
