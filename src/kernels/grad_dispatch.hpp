#pragma once
// The run-time choices of one backward-quantizer block (rounding mode, statistics or not, f32 or
// bf16 G) turned into compile-time parameters, once for every vectorized tier, so that a tier's
// inner loop is a template without branches:
//
//   for_grad_variant(p, out, [&]<GradRounding kMode, bool kStats>(const auto* g) { ... });
//
// calls the body with the mode of p, kStats = (out.row_sums[0] != null) and g = p.g_f32 or
// p.g_bf16, whichever is set.
#include "kernels/kernels.hpp"

namespace s3r::kernels {

template <typename Body>
void for_grad_variant(const GradProblem& p, const GradBlockOut& out, Body&& body) {
  const auto with_g = [&](const auto* g) {
    const auto with_stats = [&]<bool kStats>() {
      switch (p.mode) {
        case GradRounding::kRtne: return body.template operator()<GradRounding::kRtne, kStats>(g);
        case GradRounding::kSr: return body.template operator()<GradRounding::kSr, kStats>(g);
        case GradRounding::kS3r: return body.template operator()<GradRounding::kS3r, kStats>(g);
        case GradRounding::kS3rBcast:
          return body.template operator()<GradRounding::kS3rBcast, kStats>(g);
      }
    };
    if (out.row_sums[0] != nullptr) {
      with_stats.template operator()<true>();
    } else {
      with_stats.template operator()<false>();
    }
  };
  if (p.g_f32 != nullptr) {
    with_g(p.g_f32);
  } else {
    with_g(p.g_bf16);
  }
}

}  // namespace s3r::kernels
