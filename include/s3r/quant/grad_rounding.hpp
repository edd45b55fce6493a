#pragma once
// The rounding modes of the backward gradient (SPEC section 2; s3r/quant/grad_quant.hpp).
namespace s3r {

enum class GradRounding { kRtne, kSr, kS3r, kS3rBcast };

}  // namespace s3r
