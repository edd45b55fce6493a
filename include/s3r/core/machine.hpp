#pragma once
// Facts about the machine: what benchmarks print beside their numbers (the whole line, with what
// s3r chose on it: s3r/gemm/machine_line.hpp), and the memory a job may still take.
#include <cstdint>
#include <string>

namespace s3r {

// The first "model name" of /proc/cpuinfo, or "unknown CPU".
std::string cpu_model_name();

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_memory_bytes();

// This process's peak resident set (VmHWM of /proc/self/status) in bytes, or -1.
int64_t peak_resident_bytes();

// Memory this process can still take, in bytes: MemAvailable of /proc/meminfo, lowered to what
// the cgroup's memory limit leaves when one applies (v2: memory.max - memory.current +
// inactive_file of memory.stat; v1 likewise). -1 when neither can be read.
int64_t usable_memory_bytes();

// The one memory check before large allocations, so that a job too large for this machine is one
// clear error at the start instead of std::bad_alloc or the OOM killer after a minute of work:
// throws s3r::Error "WHAT needs about X GB, but only Y GB are available; HINT" when need_bytes
// exceeds `fraction` of usable_memory_bytes(); does nothing when that cannot be read.
void check_memory(double need_bytes, const std::string& what, const std::string& hint, double fraction = 0.9);

}  // namespace s3r
