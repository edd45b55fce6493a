#pragma once
// The roofline tables of `s3r bench step --breakdown` and `s3r bench ffn --breakdown`: per phase,
// its time, its work (s3r/core/work.hpp), the shortest time that work can take on this CPU
// (s3r/gemm/roofline.hpp) and the share of that limit the phase reaches.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "s3r/core/work.hpp"
#include "s3r/gemm/roofline.hpp"

namespace s3r::tools {

struct RooflineRow {
  std::string phase;
  work::Phase per_step;  // mean time and work of one step (or block)
};

// Prints `title` and one line per row; returns the rows as JSON objects (phase, ms, mac_s8,
// mac_bf16, mac_f32, bytes, bound_ms, share, bound: "compute" | "memory").
nlohmann::json print_roofline(const std::string& title, const std::vector<RooflineRow>& rows,
                              const gemm::RooflineLimits& limits);

// The limits as JSON: per type its rate per second and the instruction measured, and the threads.
nlohmann::json limits_json(const gemm::RooflineLimits& limits);

// The note under the tables: what the columns mean.
void print_roofline_legend();

// The median of repeated timings (the mean of the middle two for an even count); v not empty.
double median(std::vector<double> v);

}  // namespace s3r::tools
