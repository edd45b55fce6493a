#include "roofline_table.hpp"

#include <algorithm>
#include <cstdio>

namespace s3r::tools {

nlohmann::json print_roofline(const std::string& title, const std::vector<RooflineRow>& rows,
                              const gemm::RooflineLimits& limits) {
  std::printf("\n%s\n%-27s %9s %9s %9s %9s %9s %9s %7s %s\n", title.c_str(), "phase", "ms", "G int8", "G bf16",
              "G f32", "MB", "limit ms", "share", "bound");
  nlohmann::json out = nlohmann::json::array();
  for (const RooflineRow& r : rows) {
    const work::Counts& w = r.per_step.work;
    const gemm::Bound b = gemm::lower_bound(w, limits);
    // a share needs a time, counted work and a limit for all of it
    const bool has_share = b.complete && r.per_step.ms > 0 && b.ms() > 0;
    const double share = has_share ? b.ms() / r.per_step.ms : 0.0;
    char share_text[16] = "-";
    if (has_share) std::snprintf(share_text, sizeof share_text, "%5.1f%%", 100.0 * share);
    const char* kind = b.ms() <= 0 ? "" : b.memory_bound() ? "memory" : "compute";
    std::printf("%-27s %9.2f %9.3f %9.3f %9.3f %9.1f %9.2f %7s %s\n", r.phase.c_str(), r.per_step.ms,
                static_cast<double>(w.mac_s8) / 1e9, static_cast<double>(w.mac_bf16) / 1e9,
                static_cast<double>(w.mac_f32) / 1e9, static_cast<double>(w.bytes) / 1e6, b.ms(), share_text, kind);
    nlohmann::json j = {{"phase", r.phase},        {"ms", r.per_step.ms},     {"mac_s8", w.mac_s8},
                        {"mac_bf16", w.mac_bf16},  {"mac_f32", w.mac_f32},    {"bytes", w.bytes},        {"l2_bytes", w.l2_bytes},  {"llc_bytes", w.llc_bytes},
                        {"bound_ms", b.ms()},      {"bound", kind}};
    if (has_share) j["share"] = share;
    out.push_back(j);
  }
  return out;
}

nlohmann::json limits_json(const gemm::RooflineLimits& l) {
  const auto one = [](const gemm::Limit& x) {
    return nlohmann::json{{"per_s", x.per_s}, {"instruction", x.instruction}};
  };
  return {{"threads", l.threads}, {"measurements", l.measurements}, {"int8_mac", one(l.int8)}, {"bf16_mac", one(l.bf16)},
          {"f32_mac", one(l.f32)}, {"l2_bytes", one(l.l2)}, {"llc_bytes", one(l.llc)}, {"memory_bytes", one(l.memory)}};
}

void print_roofline_legend() {
  std::printf("(roofline: G int8/bf16/f32: billions of multiply-adds of each operand type per step; MB: bytes\n"
              " the phase's kernels read and write, each operand once per call; limit ms: the longer of the\n"
              " compute time at the limits above (each type's multiply-adds over its rate, summed) and the\n"
              " memory time (each call's bytes over the bandwidth of the level they fit in: the threads' L2\n"
              " caches, the last-level cache or memory); share: limit ms / ms, how close the phase\n"
              " runs to what this CPU can do with those instructions; '-': no limit for some of its work.\n"
              " Attention counts 2 P HD multiply-adds forward and 5 P HD backward over its P unmasked\n"
              " (query, key) pairs; docs/TRAINING.md, \"The roofline of a step\")\n");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace s3r::tools
