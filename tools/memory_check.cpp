// Memory estimates and the check against the memory available; see memory_check.hpp.
#include "memory_check.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "s3r/core/error.hpp"
#include "s3r/core/machine.hpp"
#include "s3r/model/model.hpp"

namespace s3r::tools {

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

double model_elements(const model::ModelConfig& cfg) {
  const double L = static_cast<double>(cfg.layers), C = static_cast<double>(cfg.width),
               F = static_cast<double>(cfg.ffn_width), V = static_cast<double>(cfg.vocab),
               S = static_cast<double>(cfg.seq_len), B = static_cast<double>(cfg.batch),
               NH = static_cast<double>(cfg.heads), T = B * S;
  return 2.0 * V * C + L * (4.0 * C * C + 3.0 * C * F) + L * B * NH * S * S + T * (3.0 * V + L * (8.0 * C + 6.0 * F));
}

double estimate_model_bytes(const model::ModelConfig& cfg, const nn::Recipe& recipe, bool with_optimizer) {
  const double elements = model_elements(cfg);
  if (!(elements < kMaxModelElements)) return 4.0 * elements;
  double bytes = static_cast<double>(model::Model::estimate_bytes(cfg, recipe));
  if (with_optimizer) bytes += 8.0 * static_cast<double>(model::Model::parameter_count(cfg));
  return bytes;
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

}  // namespace s3r::tools
