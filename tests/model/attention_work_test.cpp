// The work attention reports for the roofline (s3r/core/work.hpp): 2 HD multiply-adds forward and
// 5 HD backward per unmasked (query, key) pair of each (example, head), the pairs counted here by
// visiting every (i, j) with the mask's own definition (kernels/attention_kernels.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/work.hpp"
#include "s3r/model/attention.hpp"

namespace s3r::model {
namespace {

uint64_t unmasked_pairs_by_visiting(int64_t S, int64_t window) {
  uint64_t pairs = 0;
  for (int64_t i = 0; i < S; ++i) {
    for (int64_t j = 0; j < S; ++j) {
      const bool masked = j > i || (window >= 1 && i - j >= window);
      pairs += masked ? 0 : 1;
    }
  }
  return pairs;
}

TEST(AttentionWork, CountsTwoAndFiveHeadDimsPerUnmaskedPair) {
  struct Case {
    int64_t B, S, NH, NKV, HD, window;
  };
  for (const Case& c : {Case{2, 37, 4, 2, 8, 0}, Case{1, 100, 2, 2, 16, 0}, Case{2, 70, 2, 1, 8, 16},
                        Case{1, 33, 1, 1, 4, 1}, Case{1, 20, 2, 2, 8, 64}}) {
    const int64_t T = c.B * c.S, C = c.NH * c.HD, Ckv = c.NKV * c.HD;
    AlignedVector<float> q(T * C, 0.1f), k(T * Ckv, 0.2f), v(T * Ckv, 0.3f), out(T * C), lse(c.B * c.NH * c.S);
    AlignedVector<float> dout(T * C, 0.5f), dq(T * C), dk(T * Ckv), dv(T * Ckv);
    const uint64_t per_pass = static_cast<uint64_t>(c.B * c.NH * c.HD) * unmasked_pairs_by_visiting(c.S, c.window);

    const work::Counts before = work::snapshot();
    flash_attention_forward(out, lse, q, k, v, c.S, c.NH, c.NKV, c.HD, c.window);
    const work::Counts forward = work::snapshot() - before;
    EXPECT_EQ(forward.mac_f32, 2 * per_pass) << "S " << c.S << " window " << c.window;
    EXPECT_EQ(forward.mac_s8 + forward.mac_bf16, 0u);
    // q, k, v read, out and lse written
    EXPECT_EQ(forward.bytes, 4 * (q.size() + k.size() + v.size() + out.size() + lse.size()));

    const work::Counts mid = work::snapshot();
    flash_attention_backward(dq, dk, dv, dout, out, q, k, v, lse, c.S, c.NH, c.NKV, c.HD, c.window);
    const work::Counts backward = work::snapshot() - mid;
    EXPECT_EQ(backward.mac_f32, 5 * per_pass) << "S " << c.S << " window " << c.window;
    EXPECT_EQ(backward.bytes, 4 * (q.size() + k.size() + v.size() + out.size() + lse.size() + dout.size() +
                                   dq.size() + dk.size() + dv.size()));
  }
}

}  // namespace
}  // namespace s3r::model
