#include "s3r/core/machine.hpp"

#include <omp.h>

#include <fstream>
#include <sstream>

#include "s3r/core/cpu_features.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      const size_t start = colon == std::string::npos ? colon : line.find_first_not_of(" \t", colon + 1);
      if (start != std::string::npos) return line.substr(start);
    }
  }
  return "unknown CPU";
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

int64_t peak_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string field = "VmHWM:";
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size())) * 1024;
  }
  return -1;
}

std::string machine_line() {
  std::ostringstream s;
  s << cpu_model_name() << ", " << omp_get_num_procs() << " logical cores ("
    << describe(cpu_features()) << "); kernels " << isa_name(active_isa()) << "; "
    << gemm::backends_line() << "; " << omp_get_max_threads() << " OpenMP threads, oneDNN "
    << gemm::onednn_version();
  return s.str();
}

}  // namespace s3r
