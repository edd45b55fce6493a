#pragma once
// Facts about the machine that benchmarks print beside their numbers.
#include <cstdint>
#include <string>

namespace s3r {

// The first "model name" of /proc/cpuinfo, or "unknown CPU".
std::string cpu_model_name();

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_memory_bytes();

// This process's peak resident set (VmHWM of /proc/self/status) in bytes, or -1.
int64_t peak_resident_bytes();

// One line: CPU model, logical cores and features, the kernel tier, the GEMM backend of each
// type (int8, bf16 native or emulated, f32), OpenMP threads, oneDNN version.
std::string machine_line();

}  // namespace s3r
