// Fused causal attention (s3r/model/attention.hpp) against a double-precision reference written
// here from the definition (naive softmax over the full score row), against finite differences
// of that reference, and against the two-pass f32 attention of layers.hpp; the causal mask, S not
// a multiple of the block, thread-count invariance and the kernel tiers bit for bit.
//
// Tolerances are first-order error bounds of each element computed from the data (error_bounds
// below: f32 unit roundoff u = 2^-24, the polynomial exp's 2^-21, the lengths of the fma chains),
// never tuned by eye; each test of a tolerance is paired with mutated references
// (mask off by one, a missing rescale, a dropped D or scale) that it must reject by a wide margin.
#include "s3r/model/attention.hpp"

#include <gtest/gtest.h>

#include "attention_test_support.hpp"

namespace s3r::model {
namespace {

using namespace attention_testing;

// ---- tests
// ----------------------------------------------------------------------------------------

TEST(FlashAttention, ForwardMatchesDoubleReference) {
  const auto tiers = testing::runnable_isas();
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : sweep()) {
      const Inputs in = make_inputs(s, 11, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const RefForward ref = reference_forward(s, q, k, v);
      const Bounds eb = error_bounds(s, q, k, v, {}, ref);
      for (Isa isa : tiers) {
        const Result r = run_flash(s, in, isa);
        const std::string where = std::string(isa_name(isa)) + (sigma > 1.0f ? "/x4" : "");
        expect_within("out", s, r.out, ref.out, eb.out, where);
        expect_within("lse", s, r.lse, ref.lse, eb.lse, where);
      }
    }
  }
}

// The forward bounds reject a causal mask off by one (row i also sees key i + 1) and an online
// softmax that does not rescale its output when the maximum grows, by 10x or more.
TEST(FlashAttention, ForwardBoundsCatchMaskOffByOneAndMissingRescale) {
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : {Shape{2, 37, 3, 8}, Shape{2, 100, 2, 64}}) {
      const Inputs in = make_inputs(s, 11, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const RefForward ref = reference_forward(s, q, k, v);
      const Bounds eb = error_bounds(s, q, k, v, {}, ref);
      const RefForward off = reference_forward(s, q, k, v, 1);
      const std::string ctx = s.str() + (sigma > 1.0f ? " x4" : "");
      EXPECT_GT(worst_ratio(off.out, ref.out, eb.out), 10.0) << "mask off by one, out, " << ctx;
      EXPECT_GT(worst_ratio(off.lse, ref.lse, eb.lse), 10.0) << "mask off by one, lse, " << ctx;
      const DVec bad = forward_without_rescale(s, q, k, v);
      EXPECT_GT(worst_ratio(bad, ref.out, eb.out), 10.0) << "missing rescale, " << ctx;
    }
  }
}

TEST(FlashAttention, BackwardMatchesDoubleReference) {
  const auto tiers = testing::runnable_isas();
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : sweep()) {
      const Inputs in = make_inputs(s, 21, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const DVec dout = to_double(in.dout);
      const RefForward ref = reference_forward(s, q, k, v);
      const RefGrads g = reference_backward(s, q, k, v, dout, ref);
      const Bounds eb = error_bounds(s, q, k, v, dout, ref);
      for (Isa isa : tiers) {
        const Result r = run_flash(s, in, isa);
        const std::string where = std::string(isa_name(isa)) + (sigma > 1.0f ? "/x4" : "");
        expect_within("dq", s, r.dq, g.dq, eb.dq, where);
        expect_within("dk", s, r.dk, g.dk, eb.dk, where);
        expect_within("dv", s, r.dv, g.dv, eb.dv, where);
      }
    }
  }
}

// The backward bounds reject a mask off by one, a missing D_i and a missing 1/sqrt(HD), by 10x.
TEST(FlashAttention, BackwardBoundsCatchPlausibleBugs) {
  for (const Shape& s : {Shape{2, 37, 3, 8}, Shape{2, 100, 2, 64}}) {
    const Inputs in = make_inputs(s, 21);
    const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
    const DVec dout = to_double(in.dout);
    const RefForward ref = reference_forward(s, q, k, v);
    const RefGrads g = reference_backward(s, q, k, v, dout, ref);
    const Bounds eb = error_bounds(s, q, k, v, dout, ref);
    struct Mutant {
      const char* name;
      RefGrads grads;
      bool changes_dv;
    };
    const RefForward off = reference_forward(s, q, k, v, 1);
    const Mutant mutants[] = {
        {"mask off by one", reference_backward(s, q, k, v, dout, off), true},
        {"no D", reference_backward(s, q, k, v, dout, ref, true, false), false},
        {"no scale", reference_backward(s, q, k, v, dout, ref, false, true), false}};
    for (const Mutant& m : mutants) {
      EXPECT_GT(worst_ratio(m.grads.dq, g.dq, eb.dq), 10.0) << m.name << " dq, " << s.str();
      EXPECT_GT(worst_ratio(m.grads.dk, g.dk, eb.dk), 10.0) << m.name << " dk, " << s.str();
      if (m.changes_dv) {
        EXPECT_GT(worst_ratio(m.grads.dv, g.dv, eb.dv), 10.0) << m.name << " dv, " << s.str();
      }
    }
  }
}

// Central differences of L = sum(out * r) through the double forward, on a tiny shape, for every
// element of q, k and v. The double analytic reference must match them to 1e-7 relative (so it
// is a valid reference for the other tests), the f32 kernels within their bound (plus the
// differences' own error: truncation O(h^2) and rounding O(1e-16 / h), below 1e-8 relative).
TEST(FlashAttention, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 5, 2, 4};
  const Inputs in = make_inputs(s, 31);
  DVec x[3] = {to_double(in.q), to_double(in.k), to_double(in.v)};
  const DVec r = to_double(in.dout);
  auto loss = [&] {
    const RefForward f = reference_forward(s, x[0], x[1], x[2]);
    double L = 0.0;
    for (size_t i = 0; i < f.out.size(); ++i) L += f.out[i] * r[i];
    return L;
  };
  const RefForward ref = reference_forward(s, x[0], x[1], x[2]);
  const RefGrads g = reference_backward(s, x[0], x[1], x[2], r, ref);
  const Bounds eb = error_bounds(s, x[0], x[1], x[2], r, ref);
  DVec fd[3];
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < x[t].size(); ++i) {
      const double v0 = x[t][i], h = 1e-5 * (std::fabs(v0) + 1.0);
      x[t][i] = v0 + h;
      const double lp = loss();
      x[t][i] = v0 - h;
      const double lm = loss();
      x[t][i] = v0;
      fd[t].push_back((lp - lm) / (2 * h));
    }
  }
  const char* names[3] = {"dq", "dk", "dv"};
  const DVec* analytic[3] = {&g.dq, &g.dk, &g.dv};
  const DVec* bound[3] = {&eb.dq, &eb.dk, &eb.dv};
  for (int t = 0; t < 3; ++t) {
    const double scale = max_abs(*analytic[t]);
    ASSERT_GT(scale, 0.0) << names[t];
    for (size_t i = 0; i < fd[t].size(); ++i) {
      EXPECT_NEAR((*analytic[t])[i], fd[t][i], 1e-7 * scale)
          << "double reference " << names[t] << "[" << i << "]";
    }
  }
  for (Isa isa : testing::runnable_isas()) {
    const Result res = run_flash(s, in, isa);
    const FVec* flash[3] = {&res.dq, &res.dk, &res.dv};
    for (int t = 0; t < 3; ++t) {
      const double slack = 1e-8 * max_abs(fd[t]);
      for (size_t i = 0; i < fd[t].size(); ++i) {
        EXPECT_NEAR((*flash[t])[i], fd[t][i], (*bound[t])[i] + slack)
            << isa_name(isa) << " " << names[t] << "[" << i << "]";
      }
    }
  }
}

// Against the existing attention_forward / attention_backward (oneDNN f32 products, probabilities
// saved): both are f32 approximations of the same function, with errors of the same kind, so
// they agree within twice our bound; the differences are printed.
TEST(FlashAttention, MatchesTwoPassAttention) {
  for (const Shape& s : {Shape{2, 100, 2, 64}, Shape{2, 256, 2, 64}, Shape{4, 32, 4, 16}}) {
    const Inputs in = make_inputs(s, 41);
    const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
    const DVec dout = to_double(in.dout);
    const RefForward ref = reference_forward(s, q, k, v);
    const Bounds eb = error_bounds(s, q, k, v, dout, ref);
    FVec out(s.acts()), probs(s.rows() * s.S), dq(s.acts()), dk(s.acts()), dv(s.acts());
    attention_forward(out, probs, in.q, in.k, in.v, s.S, s.NH, s.HD);
    attention_backward(dq, dk, dv, in.dout, in.q, in.k, in.v, probs, s.S, s.NH, s.HD);
    const Result r = run_flash(s, in);
    struct Pair {
      const char* name;
      const FVec& flash;
      const FVec& two_pass;
      const DVec& bound;
    };
    const Pair pairs[] = {{"out", r.out, out, eb.out},
                          {"dq", r.dq, dq, eb.dq},
                          {"dk", r.dk, dk, eb.dk},
                          {"dv", r.dv, dv, eb.dv}};
    for (const Pair& p : pairs) {
      expect_within(p.name, s, p.flash, DVec(p.two_pass.begin(), p.two_pass.end()), p.bound,
                    "two-pass", 2.0);
      double worst = 0.0, big = 0.0;
      for (size_t i = 0; i < p.flash.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(p.flash[i]) - p.two_pass[i]));
        big = std::max(big, std::fabs(static_cast<double>(p.two_pass[i])));
      }
      std::printf("  vs two-pass %-26s %-3s max |diff| %.3g = %.3g of max |value| %.3g\n",
                  s.str().c_str(), p.name, worst, worst / big, big);
    }
  }
}

// Changing the key and value of token t of one example leaves every output, lse and dq row
// before t bit for bit the same (and everything in the other examples), and does change row t.
TEST(FlashAttention, CausalMaskFutureTokensChangeNothingEarlier) {
  const Shape s{2, 70, 2, 16};
  for (Isa isa : testing::runnable_isas()) {
    for (int64_t t : {1, 31, 32, 33, 40, 69}) {
      const Inputs in = make_inputs(s, 51);
      Inputs changed = in;
      const FVec fresh = random_vec(s.C(), 52 + static_cast<uint32_t>(t), 30.0f);
      for (int64_t c = 0; c < s.C(); ++c) {
        changed.k[at(s, 1, t, 0, c)] = fresh[c];
        changed.v[at(s, 1, t, 0, c)] = -fresh[c];
      }
      const Result a = run_flash(s, in, isa), b = run_flash(s, changed, isa);
      const std::string ctx = std::string(isa_name(isa)) + " t=" + std::to_string(t);
      const size_t before = at(s, 1, t, 0, 0);  // example 0 and the rows of example 1 before t
      expect_same_bits("out", FVec(a.out.begin(), a.out.begin() + before),
                       FVec(b.out.begin(), b.out.begin() + before), ctx);
      expect_same_bits("dq", FVec(a.dq.begin(), a.dq.begin() + before),
                       FVec(b.dq.begin(), b.dq.begin() + before), ctx);
      for (int64_t h = 0; h < s.NH; ++h) {
        for (int64_t i = 0; i < s.S; ++i) {
          const size_t r0 = static_cast<size_t>(h * s.S + i),
                       r1 = static_cast<size_t>((s.NH + h) * s.S + i);
          EXPECT_EQ(std::bit_cast<uint32_t>(a.lse[r0]), std::bit_cast<uint32_t>(b.lse[r0])) << ctx;
          if (i < t) {
            EXPECT_EQ(std::bit_cast<uint32_t>(a.lse[r1]), std::bit_cast<uint32_t>(b.lse[r1]))
                << ctx << " i=" << i;
          }
        }
      }
      bool row_t_changed = false;
      for (int64_t c = 0; c < s.C(); ++c)
        row_t_changed |= a.out[at(s, 1, t, 0, c)] != b.out[at(s, 1, t, 0, c)];
      EXPECT_TRUE(row_t_changed) << ctx << ": the change did not reach row t (vacuous test)";
    }
  }
}

TEST(FlashAttention, SameBitsForAnyThreadCount) {
  for (Isa isa : testing::runnable_isas()) {
    for (const Shape& s : {Shape{3, 100, 2, 24}, Shape{2, 64, 3, 64}, Shape{1, 37, 1, 6}}) {
      const Inputs in = make_inputs(s, 61);
      Result one;
      {
        testing::ScopedThreads threads(1);
        one = run_flash(s, in, isa);
      }
      for (int n : {2, 3}) {
        testing::ScopedThreads threads(n);
        const Result r = run_flash(s, in, isa);
        const std::string ctx =
            std::string(isa_name(isa)) + " " + s.str() + " threads=" + std::to_string(n);
        expect_same_result(one, r, ctx);
      }
    }
  }
}

// Every vectorized tier gives the reference tier's bits (the same operations in the same order).
TEST(FlashAttention, TiersAgreeBitForBit) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  expect_tiers_agree(sweep(), 71, tiers);
}

}  // namespace
}  // namespace s3r::model
