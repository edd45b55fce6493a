#include "s3r/core/machine.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "s3r/core/error.hpp"

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

namespace {

// The first number in FILE, or -1 (unreadable, or "max": no limit).
int64_t read_number(const std::string& file) {
  std::ifstream in(file);
  int64_t v = -1;
  if (!(in >> v)) return -1;
  return v;
}

// The value of "KEY N" in a cgroup memory.stat, or 0.
int64_t stat_field(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  int64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

// What the cgroup's memory limit leaves (reclaimable file pages counted as free), or -1 without
// a limit.
int64_t cgroup_headroom() {
  const int64_t max2 = read_number("/sys/fs/cgroup/memory.max");
  if (max2 > 0) {
    const int64_t used = read_number("/sys/fs/cgroup/memory.current");
    if (used < 0) return -1;
    return std::max<int64_t>(0, max2 - used + stat_field("/sys/fs/cgroup/memory.stat", "inactive_file"));
  }
  const int64_t max1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (max1 > 0 && max1 < (int64_t{1} << 60)) {  // v1 says "no limit" with a huge number
    const int64_t used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (used < 0) return -1;
    return std::max<int64_t>(
        0, max1 - used + stat_field("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"));
  }
  return -1;
}

}  // namespace

int64_t usable_memory_bytes() {
  const int64_t host = available_memory_bytes(), cgroup = cgroup_headroom();
  if (host < 0) return cgroup;
  if (cgroup < 0) return host;
  return std::min(host, cgroup);
}

void check_memory(double need_bytes, const std::string& what, const std::string& hint, double fraction) {
  const int64_t usable = usable_memory_bytes();
  if (usable < 0 || need_bytes <= fraction * static_cast<double>(usable)) return;
  std::ostringstream msg;
  msg.setf(std::ios::fixed);
  msg.precision(1);
  msg << what << " needs about " << need_bytes / 1e9 << " GB, but only " << static_cast<double>(usable) / 1e9
      << " GB are available";
  if (!hint.empty()) msg << "; " << hint;
  throw Error(msg.str());
}

}  // namespace s3r
