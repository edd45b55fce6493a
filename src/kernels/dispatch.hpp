#pragma once
// The one dispatch point: the kernel table of the active ISA (s3r/core/isa.hpp).
#include "kernels/kernels.hpp"
#include "s3r/core/isa.hpp"

namespace s3r::kernels {

struct KernelTable {
  decltype(&ref::threefry_bits) threefry_bits;
  decltype(&ref::philox_bits) philox_bits;
  decltype(&ref::quantize_rows_rtne) quantize_rows_rtne;
  decltype(&ref::absmax_cols) absmax_cols;
  decltype(&ref::quantize_cols_rtne) quantize_cols_rtne;
  decltype(&ref::grad_absmax) grad_absmax;
  decltype(&ref::grad_quantize) grad_quantize;
  decltype(&ref::gemv_s8_f32) gemv_s8_f32;
  decltype(&ref::dx_epilogue) dx_epilogue;
  decltype(&ref::swiglu_forward_ew) swiglu_forward_ew;
  decltype(&ref::swiglu_backward_ew) swiglu_backward_ew;
};

const KernelTable& kernels_for(Isa isa);
inline const KernelTable& active_kernels() { return kernels_for(active_isa()); }

}  // namespace s3r::kernels
