// The attention kernels of each tier (kernels/attention_kernels.hpp); the tier itself is chosen
// where every other kernel's is (kernels/dispatch.cpp: active_isa()).
#include <string>

#include "kernels/attention_kernels.hpp"
#include "s3r/core/error.hpp"

namespace s3r::kernels {

const AttentionKernels& attention_kernels_for(Isa isa) {
  static constexpr AttentionKernels kRef{ref::attention_forward_block,
                                         ref::attention_backward_head, attention_backward_scratch};
#ifdef S3R_HAVE_AVX2
  static constexpr AttentionKernels kAvx2{avx2::attention_forward_block,
                                          avx2::attention_backward_head,
                                          attention_backward_scratch_avx2};
#endif
#ifdef S3R_HAVE_AVX512
  static constexpr AttentionKernels kAvx512{avx512::attention_forward_block,
                                            avx512::attention_backward_head,
                                            attention_backward_scratch_copies};
#endif
  switch (isa) {
    case Isa::kReference:
      return kRef;
#ifdef S3R_HAVE_AVX2
    case Isa::kAvx2:
      return kAvx2;
#endif
#ifdef S3R_HAVE_AVX512
    case Isa::kAvx512:
      return kAvx512;
#endif
    default:
      break;
  }
  throw Error("attention_kernels_for: this build has no " + std::string(isa_name(isa)) +
              " kernels");
}

}  // namespace s3r::kernels
