// `s3r diag second-moment`: the share of AdamW's second moment that each rounding recipe's
// gradient noise makes up, per projection kind and per layer, on one checkpoint (with its
// optimizer state) and one fixed batch. The paper reports at most 0.094 late in training.
// Definitions: s3r/nn/rounding_variance.hpp.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "diag_common.hpp"
#include "memory_check.hpp"
#include "option_checks.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/backward_probe.hpp"
#include "s3r/nn/rounding_variance.hpp"
#include "s3r/optim/adamw.hpp"

namespace s3r::tools {

namespace {

constexpr const char* kCommand = "diag second-moment";
constexpr int kMaxKeys = 100000;

struct Options {
  std::string checkpoint, data_dir = "data/nlp-corpus", json_path;
  std::string configs = "sr,s3r,s3r+dx,s3r+two-way,rtne";
  int keys = 16;
  int64_t batch_index = 0;
  uint32_t seed = 0;
  double beta2 = optim::AdamWConfig{}.beta2, clip = optim::AdamWConfig{}.clip_norm;
};

// The recipes --configs names, in its order: int8 recipes as `s3r train --recipe` names them.
std::vector<nn::Recipe> parse_recipes(const std::string& names) {
  std::vector<nn::Recipe> recipes;
  std::stringstream list(names);
  std::string name;
  while (std::getline(list, name, ',')) {
    nn::Recipe r;
    try {
      r = nn::Recipe::parse(name);
    } catch (const Error& e) {
      throw Error(std::string(kCommand) + ": --configs: unknown recipe '" + name + "' (" + e.what() + ")");
    }
    if (!nn::is_int8(r.projections())) {
      throw Error(std::string(kCommand) + ": --configs: '" + name +
                  "' is not an int8 recipe; the diagnostic measures int8 gradient roundings");
    }
    recipes.push_back(r);
  }
  if (recipes.empty()) throw Error(std::string(kCommand) + ": --configs names no recipe");
  return recipes;
}

// Bytes at the peak: one model at a time, the weights, v, the exact gradient, and per projection
// coordinate a float reference, a double sum and three float shares (all, kind, layer).
double estimate_bytes(const model::ModelConfig& cfg, const nn::Recipe& trained) {
  const double P = static_cast<double>(model::Model::parameter_count(cfg.architecture()));
  return estimate_model_bytes(cfg, trained, false) + 3.0 * 4.0 * P + (4.0 + 8.0 + 12.0) * P;
}

// The projections' parameters, in schema order (blocks, then q, k, v, o, gate, up, down).
std::vector<model::ParamInfo> projections(const model::Model& m) {
  std::vector<model::ParamInfo> out;
  for (const model::ParamInfo& p : m.param_table()) {
    if (p.role == model::ParamRole::kProjection) out.push_back(p);
  }
  return out;
}

// The checkpoint's weights and AdamW second moment v (each the size of the parameters).
struct TrainedState {
  AlignedVector<float> weights, v;
};

TrainedState load_state(const std::string& checkpoint, const ckpt::CheckpointInfo& info) {
  model::Model trained(info.model, info.recipe);
  AlignedVector<float> m(trained.params().size()), v(trained.params().size());
  ckpt::load_checkpoint(checkpoint, trained, m, v);
  return {{trained.params().begin(), trained.params().end()}, std::move(v)};
}

// The gradient of unquantized G through the int8 forward (BackwardProbe::exact_grad) and its
// global norm (over all parameters, as AdamW clips).
struct Exact {
  AlignedVector<float> grads;
  double norm = 0.0, loss = 0.0;
};

Exact exact_gradient(const model::ModelConfig& cfg, const AlignedVector<float>& weights, const Batch& batch,
                     uint32_t seed) {
  model::Model m(cfg, nn::Recipe::make(nn::LinearMode::kRtne, nn::Correction::kNone));
  std::copy(weights.begin(), weights.end(), m.params().begin());
  nn::BackwardProbe probe;
  probe.exact_grad = true;
  m.set_backward_probe(&probe);
  Exact e;
  e.loss = m.forward(batch.in, batch.tg);
  m.backward(key_from_seed(seed));
  e.grads.assign(m.grads().begin(), m.grads().end());
  double sum = 0.0;
  for (float g : e.grads) sum += static_cast<double>(g) * g;
  e.norm = std::sqrt(sum);
  return e;
}

// Everything one recipe's rows are measured with.
struct Context {
  const model::ModelConfig& cfg;
  const TrainedState& state;
  const Batch& batch;
  const Exact& exact;
  double c2, bias2;
};

nlohmann::json summary_json(const nn::ShareSummary& s) {
  return {{"coordinates", s.coordinates}, {"zero_v", s.zero_v}, {"median", s.median}, {"q90", s.q90},
          {"q99", s.q99},  {"max", s.max},  {"aggregate", s.aggregate}};
}

// One recipe's r per projection coordinate (SquaredDeviation::mean(), per parameter).
struct Deviations {
  std::vector<model::ParamInfo> params;  // the projections, in schema order
  std::vector<std::vector<double>> r;    // r of params[i]'s coordinates
  int keys = 0;
};

// One forward, then a backward per key k < keys (one for rtne, whose rounding is deterministic)
// with step key fold_in(key(seed), k), each projection gradient against the exact one.
Deviations squared_deviations(const nn::Recipe& recipe, const Options& o, const Context& c) {
  model::Model m(c.cfg, recipe);
  std::copy(c.state.weights.begin(), c.state.weights.end(), m.params().begin());
  Deviations d{projections(m), {}, recipe.projections() == nn::LinearMode::kRtne ? 1 : o.keys};
  std::vector<nn::SquaredDeviation> dev;
  for (const model::ParamInfo& p : d.params) {
    dev.emplace_back(std::span<const float>(c.exact.grads).subspan(p.offset, p.size));
  }
  m.forward(c.batch.in, c.batch.tg);
  for (int k = 0; k < d.keys; ++k) {
    m.backward(fold_in(key_from_seed(o.seed), static_cast<uint32_t>(k)));
    for (size_t i = 0; i < d.params.size(); ++i) dev[i].add(m.grads().subspan(d.params[i].offset, d.params[i].size));
  }
  for (const nn::SquaredDeviation& x : dev) d.r.push_back(x.mean());
  return d;
}

// One recipe's JSON row: the share over all projections, per kind, and per layer.
nlohmann::json measure_recipe(const nn::Recipe& recipe, const Options& o, const Context& c) {
  const Deviations d = squared_deviations(recipe, o, c);
  nn::ShareAccumulator all(c.c2, c.bias2);
  std::vector<nn::ShareAccumulator> kinds(model::kProjectionsPerBlock, nn::ShareAccumulator(c.c2, c.bias2));
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < d.params.size(); ++i) {
    const model::ParamInfo& p = d.params[i];
    const std::span<const float> v = std::span<const float>(c.state.v).subspan(p.offset, p.size);
    nn::ShareAccumulator layer(c.c2, c.bias2);
    layer.add(d.r[i], v), all.add(d.r[i], v), kinds[static_cast<size_t>(p.projection)].add(d.r[i], v);
    nlohmann::json row = summary_json(layer.summary());
    row["name"] = p.name;
    layers.push_back(row);
  }
  nlohmann::json by_kind = nlohmann::json::object();
  for (uint32_t j = 0; j < model::kProjectionsPerBlock; ++j) {
    by_kind[std::string(model::to_string(static_cast<model::Projection>(j)))] = summary_json(kinds[j].summary());
  }
  return {{"configuration", recipe.name()}, {"keys", d.keys}, {"all", summary_json(all.summary())},
          {"kinds", by_kind}, {"layers", layers}};
}

void print_row(const nlohmann::json& row) {
  auto line = [&](const std::string& kind, const nlohmann::json& s) {
    std::printf("%-14s %-9s %9.4f %9.4f %9.4f %9.4f %10.4f\n", row.at("configuration").get<std::string>().c_str(),
                kind.c_str(), s.at("median").get<double>(), s.at("q90").get<double>(), s.at("q99").get<double>(),
                s.at("max").get<double>(), s.at("aggregate").get<double>());
  };
  for (uint32_t j = 0; j < model::kProjectionsPerBlock; ++j) {
    const std::string kind(model::to_string(static_cast<model::Projection>(j)));
    line(kind, row.at("kinds").at(kind));
  }
  line("all", row.at("all"));
  std::fflush(stdout);
}

void print_header(const Options& o, const ckpt::CheckpointInfo& info, const Exact& e, double c2, double bias2) {
  std::printf("s3r diag second-moment\n  checkpoint  %s (step %lld, trained as %s)\n", o.checkpoint.c_str(),
              static_cast<long long>(info.step + 1), info.recipe.name().c_str());
  std::printf("  model       %s\n", info.model.describe().c_str());
  std::printf("  batch       validation batch %lld of %s (%lld tokens); loss %.5f (int8 forward)\n",
              static_cast<long long>(o.batch_index), o.data_dir.c_str(),
              static_cast<long long>(info.model.tokens()), e.loss);
  std::printf("  keys        %d (rtne: 1, deterministic); step keys fold_in(key(%u), k)\n", o.keys, o.seed);
  std::printf("  AdamW       beta2 %g, t %lld: v_hat = v / %.6f; clip %g, ||g_exact|| %.5f, c^2 = %.5f\n",
              o.beta2, static_cast<long long>(info.step + 1), bias2, o.clip, e.norm, c2);
  std::printf("  machine     %s\n\n", machine_line().c_str());
  std::printf("share of v_hat added by the rounding, c^2 mean_k (g_k - g_exact)^2 / v_hat, per coordinate\n");
  std::printf("%-14s %-9s %9s %9s %9s %9s %10s\n", "configuration", "kind", "median", "q90", "q99", "max",
              "aggregate");
  std::fflush(stdout);
}

// Checks first (options, --json's file, checkpoint, data, batch, recipes, memory), then the
// work, printing each recipe's rows as it finishes. Throws s3r::Error.
void run(const Options& o) {
  if (!(o.beta2 < 1.0)) {
    std::ostringstream got;
    got << o.beta2;
    throw Error(std::string(kCommand) + ": --beta2 must be < 1, got " + got.str());
  }
  if (!o.json_path.empty()) check_output_file(kCommand, "--json", o.json_path);
  const std::vector<nn::Recipe> recipes = parse_recipes(o.configs);
  const DiagInputs in = read_diag_inputs(kCommand, o.checkpoint, o.data_dir);
  const model::ModelConfig& cfg = in.info.model;
  const Batch batch = load_validation_batch(kCommand, o.data_dir, o.batch_index, in.val, cfg);
  check_memory(estimate_bytes(cfg, in.info.recipe), std::string(kCommand) + ": the checkpoint's model (" +
               cfg.describe() + ")", "run it on a machine with more memory", 1.0);
  const TrainedState state = load_state(o.checkpoint, in.info);
  const Exact exact = exact_gradient(cfg, state.weights, batch, o.seed);
  const double c = o.clip > 0.0 && exact.norm > o.clip ? o.clip / exact.norm : 1.0;
  const double bias2 = 1.0 - std::pow(o.beta2, static_cast<double>(in.info.step + 1));
  print_header(o, in.info, exact, c * c, bias2);
  const Context ctx{cfg, state, batch, exact, c * c, bias2};
  nlohmann::json rows = nlohmann::json::array();
  for (const nn::Recipe& r : recipes) {
    rows.push_back(measure_recipe(r, o, ctx));
    print_row(rows.back());
  }
  if (o.json_path.empty()) return;
  const nlohmann::json out = {
      {"checkpoint", o.checkpoint}, {"step", in.info.step + 1}, {"model", cfg.describe()},
      {"trained_as", in.info.recipe.name()}, {"batch_index", o.batch_index}, {"data", o.data_dir},
      {"keys", o.keys}, {"seed", o.seed}, {"beta2", o.beta2}, {"clip", o.clip}, {"grad_norm", exact.norm},
      {"clip_factor", c}, {"loss_int8_forward", exact.loss}, {"machine", machine_line()}, {"rows", rows}};
  io::write_file_atomic(o.json_path, [&](std::ostream& f) { f << out.dump(1) << "\n"; });
  std::printf("json: %s\n", o.json_path.c_str());
}

}  // namespace

void register_diag_second_moment(CLI::App& diag) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = diag.add_subcommand(
      "second-moment", "share of AdamW's second moment that each recipe's gradient rounding adds, per layer");
  add_source_options(cmd, o->checkpoint, o->data_dir, o->keys, kMaxKeys, o->seed, o->batch_index);
  cmd->add_option("--configs", o->configs, "comma-separated int8 recipes, as s3r train --recipe names them")
      ->capture_default_str();
  add_float_option(cmd, "--beta2", o->beta2, "AdamW's beta2 of the run (v_hat = v / (1 - beta2^t))", 0.0, 1.0);
  add_float_option(cmd, "--clip", o->clip, "the run's gradient-norm clip (0: none)", 0.0, 1e30);
  cmd->add_option("--json", o->json_path, "also write the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace s3r::tools
