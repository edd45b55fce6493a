// `s3r bench ffn`: forward + backward of one SwiGLU FFN block at the shapes of the paper's
// Table III, for bf16 and every int8 configuration; interleaved repeats after a warm-up, medians,
// speed relative to bf16 measured in the same process.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "memory_check.hpp"
#include "option_checks.hpp"
#include "roofline_table.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/gemm/matmul.hpp"
#include "s3r/gemm/roofline.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/nn/recipe.hpp"
#include "s3r/nn/swiglu.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::tools {

namespace {

struct FfnShape {
  const char* name;
  int64_t H, D;  // model width C = H, FFN width F = D
};

// Table III of the paper: models of 1B to 70B parameters.
constexpr FfnShape kShapes[] = {{"W1", 512, 2048},    {"W2", 1024, 4096},   {"W3", 2048, 8192},
                                {"W4", 3072, 12288},  {"W5", 3840, 15360},  {"W6", 4096, 12288},
                                {"W7", 4096, 14336},  {"W8", 5120, 17920},  {"W9", 8192, 28672}};

// The configurations, in the order each repeat runs them: the benchmarked named recipes, bf16
// (the baseline) first and f32 last, shown for reference only: on oneDNN 2.6 its f32 kernel
// outruns its bf16 one on some CPUs, and a reader should see that beside the ratios.
const std::vector<nn::Recipe>& configs() {
  static const std::vector<nn::Recipe> c = [] {
    std::vector<nn::Recipe> v;
    for (const nn::NamedRecipe& r : nn::named_recipes()) {
      if (r.benchmarked) v.push_back(r.recipe);
    }
    return v;
  }();
  return c;
}

// The index of the configuration named `name` in configs().
size_t config_index(std::string_view name) {
  for (size_t c = 0; c < configs().size(); ++c) {
    if (configs()[c].name() == name) return c;
  }
  throw Error("bench ffn: no configuration named '" + std::string(name) + "'");
}

// Bounds of the options (checked as they are parsed; see register_bench_ffn).
constexpr int64_t kMaxTokens = int64_t{1} << 32;  // far beyond memory: the estimate refuses first
constexpr int64_t kMaxRepeats = 1000000;

struct Options {
  int64_t tokens = 2048;
  int64_t seq_len = 0;  // S; 0: one example of all tokens
  std::string shapes;   // comma-separated names; empty: every shape that fits in memory
  int threads = 0;      // 0: OpenMP's default
  int repeats = 5;
  int warmup = 1;
  std::string json_path;
  bool breakdown = false;
};

// Bytes one block of this shape needs (all configurations share the buffers): f32 weights and
// gradients (24 HD), their int8 and bf16 copies (9 HD), six (T, D) f32 activations and their
// copies (~41 TD), and (T, H) tensors (~25 TH); plus 10% for oneDNN's scratch.
double estimate_bytes(const FfnShape& s, int64_t T) {
  const double H = static_cast<double>(s.H), D = static_cast<double>(s.D), t = static_cast<double>(T);
  return 1.1 * (33.0 * H * D + 41.0 * t * D + 25.0 * t * H);
}

std::vector<FfnShape> select_shapes(const Options& o) {
  const double available = static_cast<double>(usable_memory_bytes());
  std::vector<FfnShape> out;
  if (o.shapes.empty()) {
    for (const FfnShape& s : kShapes) {
      if (available < 0 || estimate_bytes(s, o.tokens) < 0.85 * available) out.push_back(s);
    }
    if (out.empty()) throw Error("bench ffn: not even W1 fits in the available memory");
    return out;
  }
  std::stringstream list(o.shapes);
  std::string name;
  while (std::getline(list, name, ',')) {
    const auto it = std::find_if(std::begin(kShapes), std::end(kShapes),
                                 [&](const FfnShape& s) { return name == s.name; });
    if (it == std::end(kShapes)) {
      throw Error("bench ffn: --shapes: unknown shape '" + name + "'; expected W1 .. W9");
    }
    const double need = estimate_bytes(*it, o.tokens);
    if (available >= 0 && need > 0.95 * available) {
      std::ostringstream msg;
      msg.precision(3);
      msg << "bench ffn: shape " << it->name << " (H=" << it->H << ", D=" << it->D << ") at "
          << o.tokens << " tokens needs about " << need / 1e9 << " GB, but only "
          << available / 1e9 << " GB are available; use fewer --tokens or smaller --shapes";
      throw Error(msg.str());
    }
    out.push_back(*it);
  }
  return out;
}

// Uniform values in [-scale, scale), from Threefry (fast enough for the largest shapes).
void fill_uniform(AlignedVector<float>& v, size_t n, float scale, uint32_t stream) {
  v.resize(n);
  std::vector<uint32_t> bits(1 << 20);
  const Key key = fold_in(key_from_seed(2026), stream);
  for (size_t i = 0; i < n; i += bits.size()) {
    const size_t m = std::min(bits.size(), n - i);
    random_bits32(key, i, std::span<uint32_t>(bits.data(), m));
    for (size_t j = 0; j < m; ++j) v[i + j] = scale * (2.0f * uniform23(bits[j]) - 1.0f);
  }
}

struct ShapeResult {
  FfnShape shape;
  std::vector<std::vector<double>> ms;  // [configuration][timed repeat]
  std::vector<nn::PhaseTimes> phases;   // [configuration], summed over timed repeats
  std::vector<work::Phase> block;       // [configuration], the whole block, summed likewise
  std::vector<double> core_checks;      // with --breakdown: after each timed repeat
};

ShapeResult run_shape(const FfnShape& s, const Options& o) {
  const int64_t T = o.tokens, C = s.H, F = s.D;
  const int64_t S = o.seq_len ? o.seq_len : T;
  AlignedVector<float> x, w1, w3, w2, dy;
  fill_uniform(x, T * C, 1.0f, 1);
  fill_uniform(w1, C * F, 1.0f / std::sqrt(static_cast<float>(C)), 2);
  fill_uniform(w3, C * F, 1.0f / std::sqrt(static_cast<float>(C)), 3);
  fill_uniform(w2, F * C, 1.0f / std::sqrt(static_cast<float>(F)), 4);
  fill_uniform(dy, T * C, 1e-3f, 5);
  AlignedVector<float> y(T * C), dx(T * C), dw1(C * F), dw3(C * F), dw2(F * C);
  nn::SwigluState state;
  nn::SwigluScratch scratch;
  const size_t n = configs().size();
  ShapeResult result{s, std::vector<std::vector<double>>(n), std::vector<nn::PhaseTimes>(n),
                     std::vector<work::Phase>(n), {}};
  const int total = o.warmup + o.repeats;
  for (int rep = 0; rep < total; ++rep) {
    const bool timed = rep >= o.warmup;
    for (size_t c = 0; c < n; ++c) {
      const nn::Recipe& cfg = configs()[c];
      nn::PhaseTimes phases;
      state.times = &phases;
      const work::Counts work_before = work::snapshot();
      const auto start = std::chrono::steady_clock::now();
      nn::swiglu_forward(y, x, {w1, w3, w2}, T, C, F, cfg.projections(), state, scratch);
      nn::swiglu_backward(dx, {dw1, dw3, dw2}, dy, cfg.correction(), S,
                          fold_in(key_from_seed(7), static_cast<uint32_t>(rep)), 0, state, scratch);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      state.times = nullptr;
      if (timed) {
        result.ms[c].push_back(ms);
        result.phases[c] += phases;
        result.block[c] += work::Phase{ms, work::snapshot() - work_before};
      }
      std::fprintf(stderr, "\r  %s %s %-12s %8.1f ms   ", s.name,
                   timed ? ("repeat " + std::to_string(rep - o.warmup + 1) + "/" +
                            std::to_string(o.repeats)).c_str()
                         : "warm-up   ",
                   cfg.name().c_str(), ms);
      std::fflush(stderr);
    }
    if (timed && o.breakdown) result.core_checks.push_back(gemm::core_check(gemm::roofline_limits()));
  }
  std::fprintf(stderr, "\r%*s\r", 60, "");
  return result;
}

// bf16's time over a configuration's within each repeat (the two ran back to back), per shape:
// the median and the range over the repeats, the run's own noise beside its ratios.
std::vector<double> paired_ratios(const ShapeResult& r, std::string_view name) {
  const std::vector<double>& base = r.ms[config_index("bf16")];
  const std::vector<double>& other = r.ms[config_index(name)];
  std::vector<double> out;
  for (size_t i = 0; i < base.size(); ++i) out.push_back(base[i] / other[i]);
  return out;
}

void print_spread(const std::vector<ShapeResult>& results) {
  std::printf("\nspread over the repeats of bf16 / configuration, paired within each repeat: median [min, max]\n");
  std::printf("%-6s %-22s %-22s %-22s\n", "shape", "s3r", "s3r+dx", "f32");
  for (const ShapeResult& r : results) {
    std::printf("%-6s", r.shape.name);
    for (const char* name : {"s3r", "s3r+dx", "f32"}) {
      const std::vector<double> v = paired_ratios(r, name);
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.2fx [%.2f, %.2f]", median(v), *std::min_element(v.begin(), v.end()),
                    *std::max_element(v.begin(), v.end()));
      std::printf(" %-22s", cell);
    }
    std::printf("\n");
  }
}

void print_table(const std::vector<ShapeResult>& results, const Options& o) {
  std::printf("\n%-22s %10s %8s %8s %8s %10s %8s %10s %8s\n", "shape (H, D)", "bf16 ms", "rtne",
              "sr", "s3r", "+two-way", "+dx", "s3r-bcast", "f32");
  for (const ShapeResult& r : results) {
    const auto med = [&](std::string_view name) { return median(r.ms[config_index(name)]); };
    const double bf16 = med("bf16"), s3r = med("s3r");
    char label[64];
    std::snprintf(label, sizeof label, "%s (%lld, %lld)", r.shape.name,
                  static_cast<long long>(r.shape.H), static_cast<long long>(r.shape.D));
    std::printf("%-22s %10.1f %7.2fx %7.2fx %7.2fx %+9.1f%% %+7.1f%% %9.2fx %7.2fx\n", label, bf16,
                bf16 / med("rtne"), bf16 / med("sr"), bf16 / s3r, 100.0 * (med("s3r+two-way") / s3r - 1.0),
                100.0 * (med("s3r+dx") / s3r - 1.0), bf16 / med("s3r-bcast"), bf16 / med("f32"));
  }
  std::printf("speed = bf16 median / configuration median (higher is faster); +two-way and +dx:\n"
              "time added to s3r by each correction. Medians of %d interleaved repeats.\n",
              o.repeats);
  print_spread(results);
  if (!o.breakdown) return;
  std::printf("\nmean ms per phase (other = total - phases: allocation, bookkeeping)\n");
  std::printf("%-6s %-12s %9s %9s %9s %9s %9s %9s %9s\n", "shape", "config", "total", "gemm",
              "prepare", "quant-g", "correct", "elementw", "other");
  for (const ShapeResult& r : results) {
    for (size_t c = 0; c < configs().size(); ++c) {
      const double n = static_cast<double>(r.ms[c].size());
      const nn::PhaseTimes& p = r.phases[c];
      const double total = r.block[c].ms;
      const double other = total - p.gemm.ms - p.prepare.ms - p.quantize_grad.ms - p.correction.ms - p.elementwise.ms;
      std::printf("%-6s %-12s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", r.shape.name,
                  configs()[c].name().c_str(), total / n, p.gemm.ms / n, p.prepare.ms / n, p.quantize_grad.ms / n,
                  p.correction.ms / n, p.elementwise.ms / n, other / n);
    }
  }
}

// The phases of one configuration's block as roofline rows: mean time and work per repeat.
std::vector<RooflineRow> roofline_rows(const ShapeResult& r, size_t c) {
  const nn::PhaseTimes& p = r.phases[c];
  const double n = static_cast<double>(r.ms[c].size());
  const auto mean = [&](const work::Phase& x) { return x.mean_of(n); };
  return {{"gemm", mean(p.gemm)},           {"prepare", mean(p.prepare)},
          {"quantize dY", mean(p.quantize_grad)}, {"correction", mean(p.correction)},
          {"element-wise", mean(p.elementwise)},  {"block", mean(r.block[c])}};
}

// Each shape's and configuration's roofline; returns them as JSON, keyed by shape and recipe.
nlohmann::json print_rooflines(const std::vector<ShapeResult>& results) {
  // Measured again now that the timed runs are done; each limit the higher of the two.
  const gemm::RooflineLimits& limits = gemm::remeasure_roofline_limits();
  std::printf("\n%s\n", gemm::limits_line(limits).c_str());
  std::vector<double> checks;
  for (const ShapeResult& r : results) checks.insert(checks.end(), r.core_checks.begin(), r.core_checks.end());
  const std::string cores = gemm::core_check_line(checks, "after the timed repeats");
  if (!cores.empty()) std::printf("%s\n", cores.c_str());
  nlohmann::json out = nlohmann::json::object();
  for (const ShapeResult& r : results) {
    for (size_t c = 0; c < configs().size(); ++c) {
      const std::string name = configs()[c].name();
      out[r.shape.name][name] =
          print_roofline(std::string("roofline of ") + r.shape.name + ", " + name + " (per block)", roofline_rows(r, c),
                         limits);
    }
  }
  print_roofline_legend();
  return out;
}

void write_json(const std::vector<ShapeResult>& results, const Options& o, const nlohmann::json& roofline) {
  nlohmann::json j;
  j["command"] = "s3r bench ffn";
  j["machine"] = machine_line();
  j["tokens"] = o.tokens;
  j["seq_len"] = o.seq_len ? o.seq_len : o.tokens;
  j["threads"] = omp_get_max_threads();
  j["repeats"] = o.repeats;
  j["warmup"] = o.warmup;
  for (const ShapeResult& r : results) {
    nlohmann::json s;
    s["name"] = r.shape.name;
    s["H"] = r.shape.H;
    s["D"] = r.shape.D;
    if (o.breakdown) s["core_check"] = r.core_checks;
    for (size_t c = 0; c < configs().size(); ++c) {
      const std::string name = configs()[c].name();
      s["median_ms"][name] = median(r.ms[c]);
      s["runs_ms"][name] = r.ms[c];
      const double n = static_cast<double>(r.ms[c].size());
      const nn::PhaseTimes& p = r.phases[c];
      s["phase_mean_ms"][name] = {{"gemm", p.gemm.ms / n},
                                 {"prepare", p.prepare.ms / n},
                                 {"quantize_grad", p.quantize_grad.ms / n},
                                 {"correction", p.correction.ms / n},
                                 {"elementwise", p.elementwise.ms / n}};
    }
    j["shapes"].push_back(s);
  }
  if (o.breakdown) {
    j["roofline"] = roofline;
    j["limits"] = limits_json(gemm::roofline_limits());
  }
  io::write_file_atomic(o.json_path, [&](std::ostream& out) { out << j.dump(2) << "\n"; });
  std::printf("wrote %s\n", o.json_path.c_str());
}

void run(const Options& o) {
  // The f32 and bf16 baselines as oneDNN runs them: its own threading (training runs them in
  // thread-count invariant tiles instead; s3r/gemm/matmul.hpp).
  gemm::set_thread_invariant(false);
  // Each value was range-checked as it was parsed; what remains are the combinations and the
  // output file, all before any work.
  if (o.seq_len > 0 && o.tokens % o.seq_len != 0) {
    throw Error("bench ffn: --seq-len " + std::to_string(o.seq_len) + " does not divide --tokens " +
                std::to_string(o.tokens));
  }
  if (!o.json_path.empty()) check_output_file("bench ffn", "--json", o.json_path);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const std::vector<FfnShape> shapes = select_shapes(o);
  std::printf("s3r bench ffn: one SwiGLU block, forward + backward, %lld tokens (S = %lld), "
              "%d threads, %d warm-up + %d interleaved repeats\nmachine: %s\n",
              static_cast<long long>(o.tokens), static_cast<long long>(o.seq_len ? o.seq_len : o.tokens),
              omp_get_max_threads(), o.warmup, o.repeats, machine_line().c_str());
  if (o.breakdown) std::printf("%s\n", gemm::limits_line(gemm::roofline_limits()).c_str());  // on idle cores
  std::fflush(stdout);
  std::vector<ShapeResult> results;
  for (const FfnShape& s : shapes) {
    std::fprintf(stderr, "%s (H=%lld, D=%lld): ~%.1f GB\n", s.name, static_cast<long long>(s.H),
                 static_cast<long long>(s.D), estimate_bytes(s, o.tokens) / 1e9);
    results.push_back(run_shape(s, o));
  }
  print_table(results, o);
  const nlohmann::json roofline = o.breakdown ? print_rooflines(results) : nlohmann::json();
  if (!o.json_path.empty()) write_json(results, o, roofline);
}

}  // namespace

void register_bench_ffn(CLI::App& bench) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "ffn", "time forward + backward of one SwiGLU block per configuration (paper, Table III)");
  add_integer_option(cmd, "--tokens", opts->tokens, "tokens T per block (B*S)", 1, kMaxTokens);
  add_integer_option(cmd, "--seq-len", opts->seq_len, "example length S (0: T, one example); must divide T", 0,
                     kMaxTokens, "0: one example of all tokens");
  cmd->add_option("--shapes", opts->shapes,
                  "comma-separated shapes W1..W9 (default: every shape that fits in memory)");
  add_integer_option(cmd, "--threads", opts->threads, "OpenMP threads (0: all cores)", 0, omp_get_num_procs(),
                     "0: all of the " + std::to_string(omp_get_num_procs()) + " processors");
  add_integer_option(cmd, "--repeats", opts->repeats, "timed repeats per configuration", 1, kMaxRepeats);
  add_integer_option(cmd, "--warmup", opts->warmup, "untimed warm-up rounds", 0, kMaxRepeats);
  cmd->add_option("--json", opts->json_path, "also write the results as JSON to this file");
  cmd->add_flag("--breakdown", opts->breakdown, "print the time per phase");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace s3r::tools
