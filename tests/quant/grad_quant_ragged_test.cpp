// The backward quantizer on a mixture of experts' rows (RaggedRows): rows keyed by their global
// id, not their position, and examples of any length (none included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "quant/grad_quant_support.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

using namespace grad_quant_testing;

const GradRounding kModes[] = {GradRounding::kRtne, GradRounding::kSr, GradRounding::kS3r,
                               GradRounding::kS3rBcast};
const Key kKey = fold_in(key_from_seed(77), 5);

QuantizedGrad dense(const Problem& p, GradRounding mode, bool stats) {
  QuantizedGrad out;
  quantize_gradient(out, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, GradQuantConfig{mode, p.S, kKey, stats});
  return out;
}

QuantizedGrad ragged(const Problem& p, GradRounding mode, bool stats, const std::vector<uint64_t>& ids,
                     const std::vector<int64_t>& offsets, uint64_t ids_per_example) {
  QuantizedGrad out;
  GradQuantConfig cfg{mode, 0, kKey, stats};
  cfg.ragged = RaggedRows{ids, offsets, ids_per_example};
  quantize_gradient(out, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, cfg);
  return out;
}

// Examples of S rows with ids t: the dense quantization, bit for bit (statistics included), in
// every tier.
TEST(GradQuantRagged, UniformExamplesAreTheDenseQuantization) {
  for (const auto& [T, N, S] : {std::tuple{64, 33, 16}, std::tuple{96, 17, 32}, std::tuple{35, 64, 7}}) {
    const Problem p = make_problem(T, N, S, static_cast<uint32_t>(T + N));
    std::vector<uint64_t> ids(static_cast<size_t>(T));
    std::iota(ids.begin(), ids.end(), uint64_t{0});
    std::vector<int64_t> offsets;
    for (int64_t b = 0; b <= T / S; ++b) offsets.push_back(b * S);
    for (Isa isa : testing::runnable_isas()) {
      ScopedIsa scoped(isa);
      for (GradRounding mode : kModes) {
        const std::string ctx = where(p, mode);
        const QuantizedGrad want = dense(p, mode, true);
        const QuantizedGrad got = ragged(p, mode, true, ids, offsets, static_cast<uint64_t>(S));
        expect_codes_equal(got, want, ctx);
        expect_stats_close(got, want, ctx, /*bit_exact=*/true);
        EXPECT_EQ(got.examples(), T / S) << ctx;
      }
    }
  }
}

// Rows permuted (as a stable sort by expert permutes them), each keeping its id: every row gets
// the codes it gets in place, so a row's thresholds do not depend on where routing put it. Every
// tier and thread count gives the reference's bits.
TEST(GradQuantRagged, ARowsCodesFollowItsIdNotItsPosition) {
  const int64_t T = 120, N = 40;
  const Problem p = make_problem(T, N, T, 5);  // one example: s3r-bcast's threshold is shared by all rows
  std::vector<uint64_t> order(static_cast<size_t>(T));
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [](uint64_t a, uint64_t b) { return (a * 7) % 5 < (b * 7) % 5; });
  Problem sorted = p;
  for (int64_t i = 0; i < T; ++i) {
    sorted.sx[i] = p.sx[order[i]];
    std::copy_n(p.g.begin() + static_cast<int64_t>(order[i]) * N, N, sorted.g.begin() + i * N);
  }
  QuantizedGrad ref[4];
  {
    ScopedIsa scoped(Isa::kReference);
    for (int m = 0; m < 4; ++m) ref[m] = dense(p, kModes[m], false);
  }
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (int threads : {1, 2}) {
      testing::ScopedThreads st(threads);
      for (int m = 0; m < 4; ++m) {
        const QuantizedGrad got = ragged(sorted, kModes[m], false, order, {0, T}, static_cast<uint64_t>(T));
        const std::string ctx = where(p, kModes[m]) + " threads=" + std::to_string(threads);
        ASSERT_EQ(got.step, ref[m].step) << ctx;
        for (int q = 0; q < got.count; ++q) {
          for (int64_t i = 0; i < T; ++i) {
            for (int64_t n = 0; n < N; ++n) {
              ASSERT_EQ(got.codes[q][i * N + n], ref[m].codes[q][static_cast<int64_t>(order[i]) * N + n])
                  << ctx << " sorted row " << i << " (id " << order[i] << ") channel " << n;
            }
          }
        }
      }
    }
  }
}

// Examples of uneven lengths, some empty: the statistics are the means over each example's rows
// (0 without rows), against a direct computation from the codes, in every tier; the tiers agree
// with the reference as in the dense case.
TEST(GradQuantRagged, StatisticsAreMeansOverEachExamplesRows) {
  const int64_t N = 37;
  const std::vector<int64_t> offsets = {0, 5, 5, 45, 46, 46, 80};
  const int64_t T = offsets.back(), B = static_cast<int64_t>(offsets.size()) - 1;
  const Problem p = make_problem(T, N, 1, 9);
  std::vector<uint64_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<uint64_t>(3 * t + 1);
  QuantizedGrad ref[4];
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (int m = 0; m < 4; ++m) {
      const QuantizedGrad out = ragged(p, kModes[m], true, ids, offsets, 50);
      const std::string ctx = where(p, kModes[m]);
      if (isa == Isa::kReference) ref[m] = out;
      expect_codes_equal(out, ref[m], ctx);
      expect_stats_close(out, ref[m], ctx, isa == Isa::kReference);
      const double D = out.step, tol = token_mean_tol(out) + D * 127.0 * 0x1p-24;
      for (int q = 0; q < out.count; ++q) {
        for (int64_t b = 0; b < B; ++b) {
          const int64_t rows = offsets[b + 1] - offsets[b];
          std::vector<double> a(static_cast<size_t>(N), 0.0);
          double grand = 0.0;
          for (int64_t t = offsets[b]; t < offsets[b + 1]; ++t) {
            double c = 0.0;
            for (int64_t n = 0; n < N; ++n) {
              const double e = D * out.codes[q][t * N + n] - double((p.sx[t] * p.g[t * N + n]) * p.sw[n]);
              c += e / N;
              a[n] += e / rows;
              grand += e / (rows * N);
            }
            ASSERT_NEAR(out.stats[q].token_mean[t], c, tol) << ctx << " t=" << t;
          }
          ASSERT_NEAR(out.stats[q].grand_mean[b], grand, tol) << ctx << " b=" << b;
          for (int64_t n = 0; n < N; ++n) {
            ASSERT_NEAR(out.stats[q].channel_mean[b * N + n], a[n], tol) << ctx << " b=" << b << " n=" << n;
          }
          if (rows == 0) {
            EXPECT_EQ(out.stats[q].grand_mean[b], 0.0f) << ctx;
          }
        }
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
  return "";
}

TEST(GradQuantRagged, BadRowsAreRejected) {
  const Problem p = make_problem(10, 8, 1, 1);
  std::vector<uint64_t> ids(10, 0);
  const auto run = [&](std::vector<uint64_t> i, std::vector<int64_t> off, uint64_t per) {
    return message_of([&] { ragged(p, GradRounding::kS3r, true, i, off, per); });
  };
  EXPECT_NE(run({1, 2}, {0, 10}, 4).find("2 ids, expected one per row, T = 10"), std::string::npos);
  EXPECT_NE(run(ids, {0, 9}, 4).find("from 0 to T = 10"), std::string::npos);
  EXPECT_NE(run(ids, {0, 6, 4, 10}, 4).find("decrease at example 1"), std::string::npos);
  EXPECT_NE(run(ids, {0, 10}, 0).find("ids_per_example > 0"), std::string::npos);
}

}  // namespace
}  // namespace s3r
