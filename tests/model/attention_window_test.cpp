// The fused attention's sliding window (Gemma's local layers: row i attends to keys
// i - W < j <= i): against the double reference with the same window and its data-derived bounds,
// which reject a window off by one; every tier bit for bit; W >= S the same bits as no window;
// keys outside a row's window change nothing of it; any thread count.
#include <gtest/gtest.h>

#include "attention_test_support.hpp"

namespace s3r::model {
namespace {

using namespace attention_testing;

// Windows smaller than a block, around it and around S; S around and off the block of 32.
const std::vector<Shape>& window_sweep() {
  static const std::vector<Shape> shapes = {
      {2, 100, 2, 64, 1},  {2, 100, 2, 64, 5},  {2, 100, 2, 64, 31}, {2, 100, 2, 64, 32},
      {2, 100, 2, 64, 33}, {2, 100, 2, 64, 40}, {1, 100, 1, 24, 64}, {1, 100, 1, 24, 99},
      {2, 37, 3, 8, 7},    {1, 65, 1, 40, 33},  {1, 130, 2, 16, 20}, {1, 33, 1, 2, 2}};
  return shapes;
}

TEST(FlashAttentionWindow, MatchesDoubleReference) {
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : window_sweep()) {
      const Inputs in = make_inputs(s, 81, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const DVec dout = to_double(in.dout);
      const RefForward ref = reference_forward(s, q, k, v);
      const RefGrads g = reference_backward(s, q, k, v, dout, ref);
      const Bounds eb = error_bounds(s, q, k, v, dout, ref);
      for (Isa isa : testing::runnable_isas()) {
        const Result r = run_flash(s, in, isa);
        const std::string where = std::string(isa_name(isa)) + (sigma > 1.0f ? "/x4" : "");
        expect_within("out", s, r.out, ref.out, eb.out, where);
        expect_within("lse", s, r.lse, ref.lse, eb.lse, where);
        expect_within("dq", s, r.dq, g.dq, eb.dq, where);
        expect_within("dk", s, r.dk, g.dk, eb.dk, where);
        expect_within("dv", s, r.dv, g.dv, eb.dv, where);
      }
    }
  }
}

// The bounds reject a window one key too wide (row i also sees key i - W) by 10x or more, in the
// forward and the backward.
TEST(FlashAttentionWindow, BoundsCatchWindowOffByOne) {
  for (const Shape& s : {Shape{2, 100, 2, 64, 5}, Shape{2, 37, 3, 8, 33}}) {
    const Inputs in = make_inputs(s, 81);
    const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
    const DVec dout = to_double(in.dout);
    const RefForward ref = reference_forward(s, q, k, v), wide = reference_forward(s, q, k, v, 0, 1);
    const RefGrads g = reference_backward(s, q, k, v, dout, ref), gw = reference_backward(s, q, k, v, dout, wide);
    const Bounds eb = error_bounds(s, q, k, v, dout, ref);
    EXPECT_GT(worst_ratio(wide.out, ref.out, eb.out), 10.0) << s.str();
    EXPECT_GT(worst_ratio(wide.lse, ref.lse, eb.lse), 10.0) << s.str();
    EXPECT_GT(worst_ratio(gw.dq, g.dq, eb.dq), 10.0) << s.str();
    EXPECT_GT(worst_ratio(gw.dk, g.dk, eb.dk), 10.0) << s.str();
  }
}

TEST(FlashAttentionWindow, TiersAgreeBitForBit) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  expect_tiers_agree(window_sweep(), 91, tiers);
}

// A window of S or more keys covers every row's causal keys: the same bits as no window.
TEST(FlashAttentionWindow, WindowOfAtLeastSIsNoWindow) {
  for (Isa isa : testing::runnable_isas()) {
    for (int64_t W : {100, 101, 1000}) {
      const Shape none{2, 100, 2, 24}, windowed{2, 100, 2, 24, W};
      const Inputs in = make_inputs(none, 93);
      const Result a = run_flash(none, in, isa), b = run_flash(windowed, in, isa);
      const std::string ctx = std::string(isa_name(isa)) + " W=" + std::to_string(W);
      expect_same_result(a, b, ctx);
    }
  }
}

// Changing the key and value of token t of example 1 leaves the output, lse and dq of every row
// i >= t + W of that example bit for bit the same (t is outside their windows, though inside
// blocks they visit), and does change row t + W - 1, the last row that sees it.
TEST(FlashAttentionWindow, KeysOutsideTheWindowChangeNothing) {
  for (Isa isa : testing::runnable_isas()) {
    for (int64_t W : {3, 20, 40}) {
      const Shape s{2, 100, 2, 16, W};
      for (int64_t t : {0, 10, 31, 33}) {
        const Inputs in = make_inputs(s, 95);
        Inputs changed = in;
        const FVec fresh = random_vec(s.C(), 96 + static_cast<uint32_t>(t), 30.0f);
        for (int64_t c = 0; c < s.C(); ++c) {
          changed.k[at(s, 1, t, 0, c)] = fresh[c];
          changed.v[at(s, 1, t, 0, c)] = -fresh[c];
        }
        const Result a = run_flash(s, in, isa), b = run_flash(s, changed, isa);
        const std::string ctx = std::string(isa_name(isa)) + " W=" + std::to_string(W) + " t=" + std::to_string(t);
        const size_t from = at(s, 1, t + W, 0, 0);  // rows t + W .. of example 1
        expect_same_bits("out", FVec(a.out.begin() + from, a.out.end()), FVec(b.out.begin() + from, b.out.end()), ctx);
        expect_same_bits("dq", FVec(a.dq.begin() + from, a.dq.end()), FVec(b.dq.begin() + from, b.dq.end()), ctx);
        for (int64_t h = 0; h < s.NH; ++h) {
          for (int64_t i = t + W; i < s.S; ++i) {
            const size_t r = static_cast<size_t>((s.NH + h) * s.S + i);
            EXPECT_EQ(std::bit_cast<uint32_t>(a.lse[r]), std::bit_cast<uint32_t>(b.lse[r])) << ctx << " i=" << i;
          }
        }
        bool last_changed = false;
        for (int64_t c = 0; c < s.C(); ++c) last_changed |= a.out[at(s, 1, t + W - 1, 0, c)] != b.out[at(s, 1, t + W - 1, 0, c)];
        EXPECT_TRUE(last_changed) << ctx << ": row t + W - 1 did not see key t (vacuous test)";
      }
    }
  }
}

TEST(FlashAttentionWindow, SameBitsForAnyThreadCount) {
  for (Isa isa : testing::runnable_isas()) {
    for (const Shape& s : {Shape{3, 100, 2, 24, 17}, Shape{1, 130, 2, 16, 40}}) {
      const Inputs in = make_inputs(s, 97);
      Result one;
      {
        testing::ScopedThreads threads(1);
        one = run_flash(s, in, isa);
      }
      for (int n : {2, 3}) {
        testing::ScopedThreads threads(n);
        const Result r = run_flash(s, in, isa);
        const std::string ctx = std::string(isa_name(isa)) + " " + s.str() + " threads=" + std::to_string(n);
        expect_same_result(one, r, ctx);
      }
    }
  }
}

TEST(FlashAttentionWindow, NegativeWindowIsAnError) {
  const Shape s{1, 4, 1, 2};
  const Inputs in = make_inputs(s, 1);
  FVec out(s.acts()), lse(s.rows());
  try {
    flash_attention_forward(out, lse, in.q, in.k, in.v, s.S, 1, 1, s.HD, -1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "flash_attention_forward: window must be >= 0 (0: none), got -1");
  }
}

}  // namespace
}  // namespace s3r::model
