#pragma once
// Facts about the machine that benchmarks print beside their numbers (the whole line, with what
// s3r chose on it: s3r/gemm/machine_line.hpp).
#include <cstdint>
#include <string>

namespace s3r {

// The first "model name" of /proc/cpuinfo, or "unknown CPU".
std::string cpu_model_name();

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_memory_bytes();

// This process's peak resident set (VmHWM of /proc/self/status) in bytes, or -1.
int64_t peak_resident_bytes();

}  // namespace s3r
