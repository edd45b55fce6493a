// `s3r bench step`: median wall time of one full training step (forward, backward, AdamW) of a
// preset per configuration (the paper's Table IV), interleaved repeats after a warm-up, speed
// relative to bf16 and to sr measured in the same process, and the peak resident memory of each
// configuration measured in a child process of its own.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "memory_check.hpp"
#include "option_checks.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"
#include "s3r/core/machine.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/gemm/roofline.hpp"
#include "roofline_table.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/model/model.hpp"
#include "s3r/optim/adamw.hpp"
#include "s3r/rng/threefry.hpp"
#include "s3r/train/optimizer.hpp"
#include "s3r/train/trainer.hpp"

namespace s3r::tools {

namespace {

// A configuration of the table: a recipe as --configs names it (the row's name), with --head,
// and how its f32 and bf16 products run: as fixed tiles, one thread each, as s3r train runs them
// (s3r/gemm/matmul.hpp: set_thread_invariant), or with oneDNN's own threading.
struct StepConfig {
  std::string name;
  nn::Recipe recipe;
  bool fixed_tiles;
};

constexpr int kMaxRepeats = 1000000;

struct Options {
  ModelOptions model;
  std::string configs = "bf16,rtne,sr,s3r,s3r+two-way,s3r+dx";
  int repeats = 5, warmup = 2, threads = 0;
  bool memory = true;
  bool breakdown = false;
  bool fixed_tiles = false;  // the bf16 and f32 modes' float products too as s3r train runs them
  std::string json_path;
  std::string memory_of;  // internal: measure this configuration's peak memory and exit
};

// The recipes a comma-separated list names (nn::Recipe::parse), each with --head: an int8 LM
// head applies to the int8 recipes, bf16 and f32 keep their own. The int8 recipes' float
// products (a bf16 LM head) run as s3r train runs them, in fixed tiles: what is timed is the
// step a user trains with. The bf16 and f32 modes are the baselines, at their fastest with
// oneDNN's own threading unless `all_fixed` (--fixed-tiles). Throws s3r::Error at the first
// name that is no recipe.
std::vector<StepConfig> select(const std::string& list_text, nn::HeadChoice head, bool all_fixed) {
  std::vector<StepConfig> out;
  std::stringstream list(list_text);
  std::string name;
  while (std::getline(list, name, ',')) {
    try {
      const nn::Recipe recipe = nn::Recipe::parse(name);
      const bool int8 = nn::is_int8(recipe.projections());
      out.push_back({name, int8 && head == nn::HeadChoice::kInt8 ? recipe.with_head(head) : recipe,
                     int8 || all_fixed});
    } catch (const Error& e) {
      throw Error("bench step: --configs: unknown configuration '" + name + "' (" + e.what() + ")");
    }
  }
  if (out.empty()) throw Error("bench step: --configs is empty");
  return out;
}

// One model, its optimizer and a fixed synthetic batch: the state a training step touches.
struct StepRunner {
  model::Model model;
  train::Optimizer opt;
  std::vector<int32_t> in, tg;
  optim::AdamWConfig adamw;
  int64_t t = 0;
  // --breakdown: phase times and page faults summed over the timed steps.
  model::StepBreakdown phases;
  work::Phase optimizer;
  double timed_steps = 0.0, minor_faults = 0.0;
  bool fixed_tiles;

  StepRunner(const model::ModelConfig& cfg, const StepConfig& c)
      : model(cfg, c.recipe), opt(model, dist::single_process(), false), in(cfg.tokens()), tg(cfg.tokens()),
        fixed_tiles(c.fixed_tiles) {
    model.init_weights(0);
    std::vector<uint32_t> bits(cfg.tokens() + 1);
    random_bits32(key_from_seed(7), 0, bits);  // uniform tokens: the step's cost ignores the text
    for (int64_t i = 0; i < cfg.tokens(); ++i) {
      in[i] = static_cast<int32_t>(bits[i] % cfg.vocab);
      tg[i] = static_cast<int32_t>(bits[i + 1] % cfg.vocab);
    }
  }
  // forward, backward and AdamW as in s3r train; returns milliseconds. With `record`, adds the
  // step's phase times, optimizer time and minor page faults (memory touched for the first time).
  double step(bool record = false) {
    gemm::set_thread_invariant(fixed_tiles);  // this configuration's float products (select)
    model.set_breakdown(record ? &phases : nullptr);
    const int64_t faults_before = minor_page_faults();
    const auto start = std::chrono::steady_clock::now();
    model.forward(in, tg);
    model.backward(fold_in(key_from_seed(0), static_cast<uint32_t>(t)));
    const auto optimizer_start = std::chrono::steady_clock::now();
    const work::Counts optimizer_work = work::snapshot();
    double norm = 0.0;
    opt.step(adamw, 1e-4f, ++t, &norm);
    const auto end = std::chrono::steady_clock::now();
    if (record) {
      optimizer.ms += std::chrono::duration<double, std::milli>(end - optimizer_start).count();
      optimizer.work += work::snapshot() - optimizer_work;
      minor_faults += static_cast<double>(minor_page_faults() - faults_before);
      timed_steps += 1.0;
    }
    return std::chrono::duration<double, std::milli>(end - start).count();
  }
  static int64_t minor_page_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  }
};

// Peak memory of one configuration: a child `s3r bench step --memory-of NAME` builds it, runs
// the warm-up steps and prints its VmHWM (so no other configuration's buffers are counted).
int64_t measure_memory(const Options& o, const StepConfig& c) {
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::ostringstream cmd;
  cmd << "'" << exe << "' bench step " << o.model.command_line() << " --warmup " << o.warmup << " --memory-of '"
      << c.name << "'";
  if (o.threads) cmd << " --threads " << o.threads;
  if (o.fixed_tiles) cmd << " --fixed-tiles";
  FILE* p = popen(cmd.str().c_str(), "r");
  if (p == nullptr) return -1;
  long long bytes = -1;
  char line[256];
  while (std::fgets(line, sizeof line, p)) std::sscanf(line, "peak_rss_bytes %lld", &bytes);
  return pclose(p) == 0 ? bytes : -1;
}

// The rows of the breakdown: the step's phases (their sum is the step), then the projections'
// own split of 'attn projections' + 'ffn (swiglu)' (indented).
struct PhaseRow {
  const char* name;
  const work::Phase& (*get)(const StepRunner&);
  bool in_sum;
};
const PhaseRow kPhaseRows[] = {
    {"embedding", [](const StepRunner& r) -> const work::Phase& { return r.phases.embedding; }, true},
    {"rmsnorm", [](const StepRunner& r) -> const work::Phase& { return r.phases.norms; }, true},
    {"attn projections", [](const StepRunner& r) -> const work::Phase& { return r.phases.projections; }, true},
    {"rope", [](const StepRunner& r) -> const work::Phase& { return r.phases.rope; }, true},
    {"attention", [](const StepRunner& r) -> const work::Phase& { return r.phases.attention; }, true},
    {"residual adds", [](const StepRunner& r) -> const work::Phase& { return r.phases.residual; }, true},
    {"ffn (swiglu)", [](const StepRunner& r) -> const work::Phase& { return r.phases.ffn; }, true},
    {"lm head", [](const StepRunner& r) -> const work::Phase& { return r.phases.lm_head; }, true},
    {"cross-entropy", [](const StepRunner& r) -> const work::Phase& { return r.phases.cross_entropy; }, true},
    {"zero grads", [](const StepRunner& r) -> const work::Phase& { return r.phases.zeroing; }, true},
    {"optimizer", [](const StepRunner& r) -> const work::Phase& { return r.optimizer; }, true},
    {"  projections: prepare", [](const StepRunner& r) -> const work::Phase& { return r.phases.projection_phases.prepare; }, false},
    {"  projections: gemm", [](const StepRunner& r) -> const work::Phase& { return r.phases.projection_phases.gemm; }, false},
    {"  projections: quantize dY", [](const StepRunner& r) -> const work::Phase& { return r.phases.projection_phases.quantize_grad; }, false},
    {"  projections: correction", [](const StepRunner& r) -> const work::Phase& { return r.phases.projection_phases.correction; }, false},
    {"  ffn element-wise", [](const StepRunner& r) -> const work::Phase& { return r.phases.projection_phases.elementwise; }, false},
    {"  ffn routing (experts)", [](const StepRunner& r) -> const work::Phase& { return r.phases.projection_phases.routing; }, false},
};

// One step's mean time and work per phase row, then the whole step (the sum of the phases).
std::vector<RooflineRow> mean_phases(const StepRunner& r) {
  std::vector<RooflineRow> rows;
  work::Phase step;
  for (const PhaseRow& row : kPhaseRows) {
    const work::Phase p = row.get(r).mean_of(r.timed_steps);
    if (row.in_sum) step += p;
    rows.push_back({row.name, p});
  }
  rows.push_back({"step (sum of phases)", step});
  return rows;
}

// Mean milliseconds per step of each phase (rows) per configuration (columns) and its share of
// the step, then each configuration's roofline; returns both as JSON.
nlohmann::json print_breakdown(const std::vector<StepConfig>& configs,
                               const std::vector<std::unique_ptr<StepRunner>>& runners,
                               const std::vector<double>& core_checks) {
  std::vector<std::vector<RooflineRow>> phases;
  for (const auto& r : runners) phases.push_back(mean_phases(*r));
  std::printf("\nbreakdown: mean ms per step (share of the step), over the timed repeats\n%-27s", "phase");
  for (const StepConfig& c : configs) std::printf(" %16s", c.name.c_str());
  std::printf("\n");
  nlohmann::json out = nlohmann::json::array();
  for (size_t row = 0; row < phases[0].size(); ++row) {
    std::printf("%-27s", phases[0][row].phase.c_str());
    nlohmann::json j = {{"phase", phases[0][row].phase}};
    for (size_t i = 0; i < configs.size(); ++i) {
      const double ms = phases[i][row].per_step.ms;
      std::printf(" %8.1f (%4.1f%%)", ms, 100.0 * ms / phases[i].back().per_step.ms);
      j[configs[i].name] = ms;
    }
    std::printf("\n");
    out.push_back(j);
  }
  std::printf("%-27s", "minor page faults");
  nlohmann::json faults = {{"phase", "minor page faults per step"}};
  for (size_t i = 0; i < configs.size(); ++i) {
    const double f = runners[i]->minor_faults / runners[i]->timed_steps;
    std::printf(" %16.0f", f);
    faults[configs[i].name] = f;
  }
  out.push_back(faults);
  std::printf("\n(indented rows split 'attn projections' + 'ffn (swiglu)' into the projections' phases:\n"
              " operand preparation (quantize or round X and W), GEMMs, quantizing dY with its statistics,\n"
              " S3R-EC corrections, SwiGLU's activation, and a mixture of experts' router, sort, gathers\n"
              " and combine; page faults: memory touched for the first time, i.e. allocations that reach\n"
              " the kernel)\n");
  // Measured again now that the timed steps are done; each limit the higher of the two.
  const gemm::RooflineLimits& limits = gemm::remeasure_roofline_limits();
  std::printf("\n%s\n", gemm::limits_line(limits).c_str());
  const std::string cores = gemm::core_check_line(core_checks, "around the timed repeats");
  if (!cores.empty()) std::printf("%s\n", cores.c_str());
  nlohmann::json roofline = nlohmann::json::object();
  for (size_t i = 0; i < configs.size(); ++i) {
    roofline[configs[i].name] = print_roofline("roofline of " + configs[i].name + " (per step)", phases[i], limits);
  }
  print_roofline_legend();
  return {{"phases", out}, {"roofline", roofline}, {"limits", limits_json(limits)}, {"core_check", core_checks}};
}

// The table of medians, minima, tokens/s, speed against bf16 and sr (where measured) and peak
// memory (-1: not measured) per configuration; returns its rows as JSON.
nlohmann::json print_results(const std::vector<StepConfig>& configs, const std::vector<std::vector<double>>& ms,
                             const std::vector<int64_t>& memory, int64_t tokens) {
  auto index_of = [&](const char* name) -> int {
    for (size_t i = 0; i < configs.size(); ++i) {
      if (std::string(configs[i].name) == name) return static_cast<int>(i);
    }
    return -1;
  };
  const int bf16 = index_of("bf16"), sr = index_of("sr");
  std::printf("\n%-14s %10s %10s %11s %9s %9s %12s\n", "configuration", "median ms", "min ms", "tokens/s",
              "vs bf16", "vs sr", "peak MB");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < configs.size(); ++i) {
    const double med = median(ms[i]);
    const double min = *std::min_element(ms[i].begin(), ms[i].end());
    const double vs_bf16 = bf16 >= 0 ? median(ms[bf16]) / med : 0.0;
    const double vs_sr = sr >= 0 ? median(ms[sr]) / med : 0.0;
    char a[32] = "-", b[32] = "-", mem[32] = "-";
    if (bf16 >= 0) std::snprintf(a, sizeof a, "%.2fx", vs_bf16);
    if (sr >= 0) std::snprintf(b, sizeof b, "%.2fx", vs_sr);
    if (memory[i] >= 0) std::snprintf(mem, sizeof mem, "%.1f", memory[i] / 1e6);
    std::printf("%-14s %10.1f %10.1f %11.0f %9s %9s %12s\n", configs[i].name.c_str(), med, min,
                tokens / (med / 1000.0), a, b, mem);
    nlohmann::json row = {{"configuration", configs[i].name}, {"median_ms", med}, {"min_ms", min},
                          {"ms", ms[i]}, {"tokens_per_s", tokens / (med / 1000.0)},
                          {"fixed_tiles", configs[i].fixed_tiles}};
    if (bf16 >= 0) row["speedup_vs_bf16"] = vs_bf16;
    if (sr >= 0) row["speedup_vs_sr"] = vs_sr;
    if (memory[i] >= 0) row["peak_rss_bytes"] = memory[i];
    rows.push_back(row);
  }
  std::printf("(vs bf16, vs sr: that configuration's median time divided by this one's; > 1 is faster.\n"
              " peak MB: the peak resident memory of a process that builds only that configuration and\n"
              " runs its warm-up steps: model, optimizer, activations, oneDNN scratch and the program)\n");
  return rows;
}

// How the float products run: oneDNN's in fixed tiles, one thread each, as s3r train runs them
// (the int8 recipes' LM head), or with oneDNN's own threading (the bf16 and f32 modes, unless
// --fixed-tiles); s3r's own bf16 GEMMs (dpbf16, amx) need no tiles and run as s3r train runs them.
std::string products_line(bool fixed_tiles) {
  if (gemm::own_bf16(gemm::bf16_backend())) {
    return std::string("f32 and bf16 products: the bf16 ones (every LM head, the bf16 mode's) by s3r's own GEMM, the "
                       "same bits for any thread count without tiles, as s3r train runs them; the f32 mode's ") +
           (fixed_tiles ? "in fixed tiles, one thread each, as s3r train runs them (--fixed-tiles)"
                        : "with oneDNN's own threading (--fixed-tiles: in fixed tiles, as s3r train runs them)");
  }
  return fixed_tiles ? "f32 and bf16 products: fixed tiles, one thread each, as s3r train runs them (--fixed-tiles)"
                     : "f32 and bf16 products: the int8 recipes' (LM head) in fixed tiles, one thread each, as s3r "
                       "train runs them; the bf16 and f32 modes' with oneDNN's own threading (--fixed-tiles: "
                       "theirs in tiles too)";
}

// What is timed, on which machine and how; with --breakdown the roofline's limits, measured here,
// before any model exists, on idle cores.
void print_header(const Options& o, const model::ModelConfig& cfg) {
  std::printf("s3r bench step: one training step (forward, backward, AdamW) of preset %s\n", o.model.preset.c_str());
  const char* head = o.model.head_choice() == nn::HeadChoice::kInt8 ? " head=int8" : "";  // of int8 recipes
  std::printf("model: %s%s (%lld tokens per step)\n", cfg.describe().c_str(), head,
              static_cast<long long>(cfg.tokens()));
  std::printf("%d threads, %d warm-up steps, medians of %d interleaved repeats\nmachine: %s\n",
              omp_get_max_threads(), o.warmup, o.repeats, machine_line().c_str());
  std::printf("%s\n", products_line(o.fixed_tiles).c_str());
  if (o.breakdown) std::printf("%s\n", gemm::limits_line(gemm::roofline_limits()).c_str());
  std::fflush(stdout);
}

// The timed repeats, each running every configuration once (the order rotated: none always
// first); returns each configuration's step times. With --breakdown, the core check before the
// first repeat and after each goes to *core_checks.
std::vector<std::vector<double>> time_repeats(const Options& o, const std::vector<std::unique_ptr<StepRunner>>& runners,
                                              std::vector<double>* core_checks) {
  const size_t n = runners.size();
  std::vector<std::vector<double>> ms(n);
  if (o.breakdown) core_checks->push_back(gemm::core_check(gemm::roofline_limits()));
  for (int rep = 0; rep < o.repeats; ++rep) {
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (j + rep) % n;
      ms[i].push_back(runners[i]->step(o.breakdown));
    }
    std::printf("repeat %d/%d done", rep + 1, o.repeats);
    if (o.breakdown) {
      core_checks->push_back(gemm::core_check(gemm::roofline_limits()));
      if (core_checks->back() >= 0) std::printf(" (core check %.2f)", core_checks->back());
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return ms;
}

void run(const Options& o) {
  // Each value was range-checked as it was parsed; here the combinations, the output file and
  // the memory, all before any work.
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const model::ModelConfig cfg = o.model.config();
  if (!o.memory_of.empty()) {
    StepRunner r(cfg, select(o.memory_of, o.model.head_choice(), o.fixed_tiles).at(0));
    for (int i = 0; i < std::max(1, o.warmup); ++i) r.step();
    std::printf("peak_rss_bytes %lld\n", static_cast<long long>(peak_resident_bytes()));
    return;
  }
  const std::vector<StepConfig> configs = select(o.configs, o.model.head_choice(), o.fixed_tiles);
  if (!o.json_path.empty()) check_output_file("bench step", "--json", o.json_path);
  // Every configuration's model and optimizer are alive together during the timed steps.
  double need = 0.0;
  for (const StepConfig& c : configs) need += estimate_model_bytes(cfg, c.recipe, true);
  check_memory(need, "bench step: one model per configuration (" + std::to_string(configs.size()) + " of " +
                         cfg.describe() + ")",
               "pass fewer --configs or a smaller model", 1.0);
  print_header(o, cfg);

  std::vector<int64_t> memory(configs.size(), -1);
  if (o.memory) {
    int64_t total = 0;
    for (size_t i = 0; i < configs.size(); ++i) {
      memory[i] = measure_memory(o, configs[i]);
      if (memory[i] < 0) throw Error(std::string("bench step: measuring the memory of ") + configs[i].name + " failed");
      total += memory[i];
      std::printf("peak memory of %-12s %8.1f MB\n", configs[i].name.c_str(), memory[i] / 1e6);
      std::fflush(stdout);
    }
    const int64_t available = usable_memory_bytes();
    if (available > 0 && total > 0.9 * static_cast<double>(available)) {
      std::ostringstream msg;
      msg << "bench step: the " << configs.size() << " configurations need about " << total / 1e9
          << " GB together, but only " << available / 1e9 << " GB are available; pass fewer --configs";
      throw Error(msg.str());
    }
  }

  std::vector<std::unique_ptr<StepRunner>> runners;
  for (const StepConfig& c : configs) runners.push_back(std::make_unique<StepRunner>(cfg, c));
  for (int w = 0; w < o.warmup; ++w) {
    for (auto& r : runners) r->step();
  }
  std::vector<double> core_checks;  // with --breakdown: before the first repeat and after each
  const std::vector<std::vector<double>> ms = time_repeats(o, runners, &core_checks);

  const nlohmann::json rows = print_results(configs, ms, memory, cfg.tokens());
  nlohmann::json breakdown = nlohmann::json::array();
  if (o.breakdown) breakdown = print_breakdown(configs, runners, core_checks);
  if (!o.json_path.empty()) {
    nlohmann::json out = {{"preset", o.model.preset}, {"model", cfg.describe()}, {"tokens_per_step", cfg.tokens()},
                                {"threads", omp_get_max_threads()}, {"warmup", o.warmup},
                                {"repeats", o.repeats}, {"machine", machine_line()},
                                {"fixed_tiles", o.fixed_tiles}, {"rows", rows}};
    if (o.breakdown) out["breakdown"] = breakdown;
    io::write_file_atomic(o.json_path, [&](std::ostream& f) { f << out.dump(1) << "\n"; });
    std::printf("json: %s\n", o.json_path.c_str());
  }
}

}  // namespace

void register_bench_step(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "step", "one full training step per configuration, against bf16 and sr (paper, Table IV)");
  o->model.add_to(cmd);
  cmd->add_option("--configs", o->configs,
                  "comma-separated recipes, MODE[+CORRECTION][/head-int8] (as s3r train --recipe): " +
                      nn::named_recipe_list() + "; --head int8 applies to the int8 ones")
      ->capture_default_str();
  add_integer_option(cmd, "--repeats", o->repeats, "timed steps per configuration", 1, kMaxRepeats);
  add_integer_option(cmd, "--warmup", o->warmup, "untimed steps per configuration first", 0, kMaxRepeats);
  add_integer_option(cmd, "--threads", o->threads, "OpenMP threads (0: all cores)", 0, omp_get_num_procs(),
                     "0: all of the " + std::to_string(omp_get_num_procs()) + " processors");
  cmd->add_flag("!--no-memory", o->memory, "skip the per-configuration peak-memory children");
  cmd->add_flag("--breakdown", o->breakdown, "also print the time per phase of the step");
  cmd->add_flag("--fixed-tiles", o->fixed_tiles,
                "run the bf16 and f32 modes' products too as s3r train does (fixed tiles that give the "
                "same bits for any thread count) instead of with oneDNN's own threading; the int8 "
                "recipes' always run so");
  cmd->add_option("--json", o->json_path, "also write the results as JSON");
  cmd->add_option("--memory-of", o->memory_of)->group("");  // internal (measure_memory)
  cmd->callback([o] { run(*o); });
}

}  // namespace s3r::tools
