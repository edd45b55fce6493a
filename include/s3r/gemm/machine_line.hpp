#pragma once
// The line benchmarks and training runs print about the machine they ran on: what the CPU has
// (s3r/core/machine.hpp, s3r/core/cpu_features.hpp) and what s3r chose on it (the kernel tier,
// the GEMM backend of each type), so it lives above both.
#include <string>

namespace s3r {

// One line: CPU model, logical cores and features, the kernel tier, the GEMM backend of each
// type (int8, bf16 native or emulated, f32), OpenMP threads, oneDNN version.
std::string machine_line();

}  // namespace s3r
