// `s3r diag grad-error`: how far each rounding configuration's gradients are from the backward
// pass with unquantized gradients through the same quantized forward (the paper's Table II), on
// one checkpoint and one fixed batch, averaged over threshold keys; plus per-layer rounding
// telemetry (the step D and the share of gradient elements that round to 0 under rtne).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "diag_common.hpp"
#include "memory_check.hpp"
#include "option_checks.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/dataloader.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/backward_probe.hpp"
#include "s3r/train/trainer.hpp"

namespace s3r::tools {

namespace {

using nn::Correction;
using nn::LinearMode;

struct DiagConfig {
  std::string name;
  nn::Recipe recipe;
  std::optional<GradRounding> dw_rounding;  // causal ablation: G quantized again for dW
  bool exact = false;                        // unquantized G through the int8 forward
};

// The table's default rows: every int8 named recipe, then the paper's causal ablation: which
// product's shared threshold costs accuracy. "bcast" is one threshold per example (s3r-bcast);
// G is quantized separately for the two products.
const std::vector<DiagConfig>& all_configs() {
  static const std::vector<DiagConfig> c = [] {
    std::vector<DiagConfig> v;
    for (const nn::NamedRecipe& r : nn::named_recipes()) {
      if (nn::is_int8(r.recipe.projections())) v.push_back({r.recipe.name(), r.recipe, {}});
    }
    v.push_back({"dX=s3r/dW=bcast", nn::Recipe::make(LinearMode::kS3r, Correction::kNone), GradRounding::kS3rBcast});
    v.push_back({"dX=bcast/dW=s3r", nn::Recipe::make(LinearMode::kS3rBcast, Correction::kNone), GradRounding::kS3r});
    return v;
  }();
  return c;
}

// The gradients the table compares, copied out of a model after backward().
struct Grads {
  AlignedVector<float> dx_first, dx_last, emb;
  std::vector<AlignedVector<float>> w_first;  // the projections of block 0, in model::Projection order
};

AlignedVector<float> param_grad(model::Model& m, const std::string& name) {
  const model::ParamInfo& p = m.param_info(name);
  return {m.grads().begin() + p.offset, m.grads().begin() + p.offset + p.size};
}

// Projection j of block 0 in the model's schema: "blocks.0.attn.q", ..., and with a mixture of
// experts "blocks.0.ffn.experts.gate" (every expert's, stacked) for the FFN's.
const model::ParamInfo& first_block_param(const model::Model& m, uint32_t j) {
  for (const model::ParamInfo& p : m.param_table()) {
    if (p.block == 0 && p.role == model::ParamRole::kProjection && static_cast<uint32_t>(p.projection) == j) return p;
  }
  throw Error("diag grad-error: block 0 has no " + std::string(model::to_string(static_cast<model::Projection>(j))) +
              " projection");
}

Grads collect(model::Model& m) {
  Grads g;
  const auto first = m.block_input_grad(0), last = m.block_input_grad(m.config().layers - 1);
  g.dx_first.assign(first.begin(), first.end());
  g.dx_last.assign(last.begin(), last.end());
  g.emb = param_grad(m, "tok_emb");
  for (uint32_t j = 0; j < model::kProjectionsPerBlock; ++j) g.w_first.push_back(param_grad(m, first_block_param(m, j).name));
  return g;
}

// ||a - b|| / ||b|| over the concatenation of the pairs, in double.
double rel_error(const std::vector<std::span<const float>>& a, const std::vector<std::span<const float>>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[i].size(); ++j) {
      const double d = static_cast<double>(a[i][j]) - b[i][j];
      num += d * d;
      den += static_cast<double>(b[i][j]) * b[i][j];
    }
  }
  return den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
}

double rel_error(const std::vector<const AlignedVector<float>*>& a, const std::vector<const AlignedVector<float>*>& b) {
  std::vector<std::span<const float>> sa, sb;
  for (const auto* v : a) sa.emplace_back(*v);
  for (const auto* v : b) sb.emplace_back(*v);
  return rel_error(sa, sb);
}

// A mixture of experts' block 0: expert e's share of the stacked gate, up and down gradients.
std::vector<std::span<const float>> expert_slices(const Grads& g, int64_t e, int64_t experts) {
  std::vector<std::span<const float>> out;
  for (auto p : {model::Projection::kGate, model::Projection::kUp, model::Projection::kDown}) {
    const AlignedVector<float>& w = g.w_first[static_cast<size_t>(p)];
    const size_t n = w.size() / static_cast<size_t>(experts);
    out.emplace_back(w.data() + static_cast<size_t>(e) * n, n);
  }
  return out;
}

// The quantities of the table: name -> pointers into a Grads.
struct Quantity {
  std::string key, title;
  std::vector<const AlignedVector<float>*> (*pick)(const Grads&);
};

std::vector<Quantity> quantities() {
  return {
      {"dx_first_block", "dX block 0",
       [](const Grads& g) { return std::vector<const AlignedVector<float>*>{&g.dx_first}; }},
      {"dx_last_block", "dX last block",
       [](const Grads& g) { return std::vector<const AlignedVector<float>*>{&g.dx_last}; }},
      {"dw_first_block", "dW block 0", [](const Grads& g) {
         std::vector<const AlignedVector<float>*> v;
         for (const auto& w : g.w_first) v.push_back(&w);
         return v;
       }},
      {"embedding", "embedding", [](const Grads& g) { return std::vector<const AlignedVector<float>*>{&g.emb}; }},
  };
}

struct Stat {
  double mean = 0, sd = 0, of_mean = 0;  // over keys; of_mean: error of the key-averaged gradient
};

constexpr int kMaxKeys = 1000000;

// Bytes the diagnostic holds at its peak: one model at a time (the widest operand copies of the
// configurations it builds), the checkpoint's weights, the reference, one key's and the summed
// gradients it compares, and the exact-gradient probe's dequantized operands.
double estimate_diag_bytes(const model::ModelConfig& cfg, const nn::Recipe& trained, bool bf16_reference) {
  const double L = static_cast<double>(cfg.layers), C = static_cast<double>(cfg.width),
               F = static_cast<double>(cfg.ffn_width), V = static_cast<double>(cfg.vocab),
               T = static_cast<double>(cfg.tokens()), G = std::max(C, F);
  double model = std::max(estimate_model_bytes(cfg, nn::Recipe::make(LinearMode::kRtne, Correction::kNone), false),
                          estimate_model_bytes(cfg, trained, false));
  if (bf16_reference) {
    model = std::max(model, estimate_model_bytes(cfg, nn::Recipe::make(LinearMode::kBf16, Correction::kNone), false));
  }
  const double E = cfg.traits().moe ? static_cast<double>(cfg.experts) : 1.0;  // FFN matrices per block
  const double weights = 4.0 * (2.0 * V * C + L * (4.0 * C * C + 3.0 * C * F * E + 2.0 * C) + C);
  const double grads = 4.0 * (2.0 * T * C + V * C + 4.0 * C * C + 3.0 * C * F * E);  // one Grads
  const double probe = 4.0 * (L + 1.0) * (T * G + C * G);
  return model + weights + 3.0 * grads + probe;
}

struct Options {
  std::string checkpoint, data_dir = "data/nlp-corpus", reference = "quantized-forward", json_path, configs;
  int keys = 16;
  int64_t batch_index = 0;
  uint32_t seed = 0;
};

// The mean and the sample standard deviation of v (sd 0 for a single value); of_mean is left 0.
Stat mean_and_sd(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0.0;
  return s;
}

// sum += g, element by element; both collected from models of one configuration.
void add_grads(Grads& sum, const Grads& g) {
  auto add = [](AlignedVector<float>& a, const AlignedVector<float>& b) {
    for (size_t j = 0; j < a.size(); ++j) a[j] += b[j];
  };
  add(sum.dx_first, g.dx_first), add(sum.dx_last, g.dx_last), add(sum.emb, g.emb);
  for (int p = 0; p < 7; ++p) add(sum.w_first[p], g.w_first[p]);
}

// g /= n, element by element.
void divide_grads(Grads& g, int n) {
  auto scale = [n](AlignedVector<float>& a) {
    for (float& x : a) x /= static_cast<float>(n);
  };
  scale(g.dx_first), scale(g.dx_last), scale(g.emb);
  for (auto& w : g.w_first) scale(w);
}

// Every check that needs neither the batch nor the weights, in this order, throwing s3r::Error
// at the first that fails: --reference, --json's file, the checkpoint's info, --data's val.bin
// and its vocabulary against the checkpoint's, and the memory of the whole diagnostic. (--keys,
// --seed and --batch-index were range-checked as they were parsed.)
DiagInputs read_and_check_inputs(const Options& o) {
  if (o.reference != "quantized-forward" && o.reference != "bf16") {
    throw Error("diag grad-error: --reference must be quantized-forward or bf16, got '" +
                o.reference + "'");
  }
  if (!o.json_path.empty()) check_output_file("diag grad-error", "--json", o.json_path);
  DiagInputs in = read_diag_inputs("diag grad-error", o.checkpoint, o.data_dir);
  const model::ModelConfig& cfg = in.info.model;
  check_memory(estimate_diag_bytes(cfg, in.info.recipe, o.reference == "bf16"),
               "diag grad-error: the checkpoint's model (" + cfg.describe() + ")",
               "run it on a machine with more memory", 1.0);
  return in;
}

// The configurations a comma-separated list names, in its order (an empty list: all_configs()):
// the ablation rows by name, else int8 recipes (nn::Recipe::parse, as `s3r train --recipe`).
// Throws s3r::Error at the first name that is neither.
std::vector<DiagConfig> parse_configs(const std::string& names) {
  if (names.empty()) return all_configs();
  std::vector<DiagConfig> configs;
  std::stringstream list(names);
  std::string name;
  while (std::getline(list, name, ',')) {
    const auto row = std::find_if(all_configs().begin(), all_configs().end(),
                                  [&](const DiagConfig& c) { return c.name == name; });
    if (row != all_configs().end()) {
      configs.push_back(*row);
      continue;
    }
    nn::Recipe recipe;
    try {
      recipe = nn::Recipe::parse(name);
    } catch (const Error& e) {
      throw Error("diag grad-error: --configs: unknown configuration '" + name + "' (" + e.what() + ")");
    }
    if (!nn::is_int8(recipe.projections())) {
      throw Error("diag grad-error: --configs: '" + name + "' is not an int8 recipe; the table compares int8 "
                  "gradient roundings");
    }
    configs.push_back({name, recipe, {}});
  }
  return configs;
}

// The table's rows in order: with --reference bf16 first the exact-gradient row (unquantized G
// through the int8 forward), then those of --configs.
std::vector<DiagConfig> table_configs(const Options& o) {
  std::vector<DiagConfig> configs = parse_configs(o.configs);
  if (o.reference == "bf16") {
    configs.insert(configs.begin(),
                   {"exact G, int8 forward", nn::Recipe::make(LinearMode::kRtne, Correction::kNone), {}, true});
  }
  return configs;
}

// Prints what the run is on: the checkpoint, model, batch, keys, reference and machine.
void print_header(const Options& o, const ckpt::CheckpointInfo& info) {
  const model::ModelConfig& cfg = info.model;
  std::printf("s3r diag grad-error\n  checkpoint  %s (step %lld, trained as %s)\n", o.checkpoint.c_str(),
              static_cast<long long>(info.step + 1), info.recipe.name().c_str());
  std::printf("  model       %s\n", cfg.describe().c_str());
  std::printf("  batch       validation batch %lld of %s (%lld tokens)\n",
              static_cast<long long>(o.batch_index), o.data_dir.c_str(),
              static_cast<long long>(cfg.tokens()));
  std::printf("  keys        %d (step keys fold_in(key(%u), k), k < %d)\n", o.keys, o.seed, o.keys);
  std::printf("  reference   %s\n", o.reference == "bf16"
                                        ? "the bf16 model's backward (bf16 forward and gradients)"
                                        : "unquantized gradients through the same int8 forward");
  std::printf("  machine     %s\n", machine_line().c_str());
  std::fflush(stdout);
}

// What every model of the run is built from and runs on.
struct Workload {
  const model::ModelConfig& cfg;
  const AlignedVector<float>& weights;  // load_trained_weights()
  const Batch& batch;
};

// The gradients the table measures against, and what the exact-gradient pass records.
struct Reference {
  Grads grads;
  std::vector<nn::GradTelemetry> telemetry;  // of the exact-gradient pass, by layer_index
  double loss_int8 = 0.0;                    // the int8 forward's loss
  double loss_ref = 0.0;                     // the reference's forward's loss
};

// The exact-gradient pass: unquantized G through the int8 (rtne) forward, with the step key
// key_from_seed(seed). Appends the per-layer telemetry to *telemetry, copies the gradients to
// *grads unless grads is nullptr, and returns the loss.
double exact_gradient_pass(const Workload& w, uint32_t seed,
                           std::vector<nn::GradTelemetry>* telemetry, Grads* grads) {
  model::Model m(w.cfg, nn::Recipe::make(LinearMode::kRtne, Correction::kNone));
  std::copy(w.weights.begin(), w.weights.end(), m.params().begin());
  nn::BackwardProbe probe;
  probe.exact_grad = true;
  probe.telemetry = telemetry;
  m.set_backward_probe(&probe);
  m.set_capture_input_grads(true);
  const double loss = m.forward(w.batch.in, w.batch.tg);
  m.backward(key_from_seed(seed));
  if (grads != nullptr) *grads = collect(m);
  return loss;
}

// The bf16 model's forward and backward (bf16 gradients), with the step key key_from_seed(seed):
// copies the gradients to grads and returns the loss.
double bf16_pass(const Workload& w, uint32_t seed, Grads& grads) {
  model::Model m(w.cfg, nn::Recipe::make(LinearMode::kBf16, Correction::kNone));
  std::copy(w.weights.begin(), w.weights.end(), m.params().begin());
  m.set_capture_input_grads(true);
  const double loss = m.forward(w.batch.in, w.batch.tg);
  m.backward(key_from_seed(seed));
  grads = collect(m);
  return loss;
}

// The reference of --reference: the exact-gradient pass's gradients (quantized-forward) or the
// bf16 model's (bf16). The exact-gradient pass runs either way, for its telemetry and loss.
Reference compute_reference(const Options& o, const Workload& w) {
  Reference r;
  const bool bf16 = o.reference == "bf16";
  r.loss_int8 = exact_gradient_pass(w, o.seed, &r.telemetry, bf16 ? nullptr : &r.grads);
  r.loss_ref = bf16 ? bf16_pass(w, o.seed, r.grads) : r.loss_int8;
  std::stable_sort(r.telemetry.begin(), r.telemetry.end(),  // a mixture's experts stay in order
            [](const nn::GradTelemetry& a, const nn::GradTelemetry& b) {
              return a.layer_index < b.layer_index;
            });
  return r;
}

// Prints the loss line (with --reference bf16 also the bf16 forward's loss) and a blank line.
void print_losses(const Options& o, const Reference& r) {
  const std::string bf16 =
      o.reference == "bf16" ? ", " + std::to_string(r.loss_ref) + " (bf16 forward)" : "";
  std::printf("  loss        %.5f (int8 forward)%s\n\n", r.loss_int8, bf16.c_str());
}

// Prints the error table's title and column heads.
void print_table_header(int keys) {
  std::printf("relative L2 error ||g - g_ref|| / ||g_ref||, mean +- sd over %d keys\n", keys);
  std::printf("%-24s", "configuration");
  for (const Quantity& q : quantities()) std::printf("  %-19s", q.title.c_str());
  std::printf("  | error of the %d-key mean: dX block 0, dW block 0\n", keys);
  std::fflush(stdout);
}

// One configuration's relative errors against the reference, key by key, and its gradients
// averaged over the keys.
struct KeyErrors {
  int keys = 0;
  std::vector<std::vector<double>> per_quantity;    // [quantity][key], quantities() order
  std::vector<std::vector<double>> per_projection;  // [projection][key], model::Projection order
  std::vector<std::vector<double>> per_expert;      // [expert][key], block 0 of a mixture of experts
  std::vector<int64_t> expert_rows;                 // block 0's rows per expert in the forward
  Grads mean;
};

// Runs configuration c: one forward, then a backward for each key k < --keys (one key for the
// exact-gradient row) with the step key fold_in(key_from_seed(--seed), k), each measured
// against ref.
KeyErrors measure_config(const DiagConfig& c, const Options& o, const Workload& w,
                         const Grads& ref) {
  model::Model m(w.cfg, c.recipe);
  std::copy(w.weights.begin(), w.weights.end(), m.params().begin());
  nn::BackwardProbe probe;
  probe.exact_grad = c.exact;
  probe.dw_rounding = c.dw_rounding;
  m.set_backward_probe(&probe);
  m.set_capture_input_grads(true);
  m.forward(w.batch.in, w.batch.tg);
  const auto qs = quantities();
  KeyErrors e;
  e.keys = c.exact ? 1 : o.keys;
  e.per_quantity.resize(qs.size());
  e.per_projection.resize(7);
  const int64_t E = w.cfg.traits().moe ? w.cfg.experts : 0;
  if (E > 0) e.expert_rows = m.moe_telemetry().rows.front();
  e.per_expert.resize(static_cast<size_t>(E));
  for (int k = 0; k < e.keys; ++k) {
    m.backward(fold_in(key_from_seed(o.seed), static_cast<uint32_t>(k)));
    const Grads g = collect(m);
    for (size_t i = 0; i < qs.size(); ++i) {
      e.per_quantity[i].push_back(rel_error(qs[i].pick(g), qs[i].pick(ref)));
    }
    for (int p = 0; p < 7; ++p) {
      e.per_projection[p].push_back(rel_error({&g.w_first[p]}, {&ref.w_first[p]}));
    }
    for (int64_t x = 0; x < E; ++x) e.per_expert[x].push_back(rel_error(expert_slices(g, x, E), expert_slices(ref, x, E)));
    if (k == 0) {
      e.mean = g;
    } else {
      add_grads(e.mean, g);
    }
  }
  divide_grads(e.mean, e.keys);
  return e;
}

// Configuration c's row of the JSON: its settings; per quantity the mean and sd of the error
// over keys, the error of the key-averaged gradients and the per-key errors; and the same but
// the per-key errors for each projection of block 0's dW.
nlohmann::json config_row(const DiagConfig& c, const KeyErrors& e, const Grads& ref) {
  nlohmann::json row = {{"configuration", c.name},
                        {"recipe", c.recipe.name()},
                        {"mode", std::string(nn::to_string(c.recipe.projections()))},
                        {"correction", std::string(nn::to_string(c.recipe.correction()))},
                        {"keys", e.keys}};
  if (c.dw_rounding) row["dw_rounding"] = std::string(to_string(*c.dw_rounding));
  if (c.exact) row["exact_gradients"] = true;
  const auto qs = quantities();
  for (size_t i = 0; i < qs.size(); ++i) {
    Stat s = mean_and_sd(e.per_quantity[i]);
    s.of_mean = rel_error(qs[i].pick(e.mean), qs[i].pick(ref));
    row[qs[i].key] = {{"mean", s.mean},
                      {"sd", s.sd},
                      {"error_of_key_mean", s.of_mean},
                      {"per_key", e.per_quantity[i]}};
  }
  nlohmann::json per = nlohmann::json::object();
  for (uint32_t p = 0; p < model::kProjectionsPerBlock; ++p) {
    Stat s = mean_and_sd(e.per_projection[p]);
    s.of_mean = rel_error({&e.mean.w_first[p]}, {&ref.w_first[p]});
    per["blocks.0." + std::string(model::to_string(static_cast<model::Projection>(p)))] = {
        {"mean", s.mean}, {"sd", s.sd}, {"error_of_key_mean", s.of_mean}};
  }
  row["dw_first_block_per_projection"] = per;
  if (!e.per_expert.empty()) {  // gate, up and down of each expert together
    nlohmann::json experts = nlohmann::json::array();
    const auto E = static_cast<int64_t>(e.per_expert.size());
    for (int64_t x = 0; x < E; ++x) {
      Stat s = mean_and_sd(e.per_expert[x]);
      s.of_mean = rel_error(expert_slices(e.mean, x, E), expert_slices(ref, x, E));
      experts.push_back({{"expert", x}, {"rows", e.expert_rows[x]}, {"mean", s.mean}, {"sd", s.sd},
                         {"error_of_key_mean", s.of_mean}});
    }
    row["dw_first_block_per_expert"] = experts;
  }
  return row;
}

// Prints a configuration's line of the error table from its JSON row (config_row()).
void print_config_row(const nlohmann::json& row) {
  std::printf("%-24s", row.at("configuration").get<std::string>().c_str());
  for (const Quantity& q : quantities()) {
    std::printf("  %.4f +- %-9.4f", row.at(q.key).at("mean").get<double>(),
                row.at(q.key).at("sd").get<double>());
  }
  std::printf("  | %.4f, %.4f\n", row.at("dx_first_block").at("error_of_key_mean").get<double>(),
              row.at("dw_first_block").at("error_of_key_mean").get<double>());
  std::fflush(stdout);
}

// Measures configuration c, prints its line of the table and returns its JSON row.
nlohmann::json evaluate_config(const DiagConfig& c, const Options& o, const Workload& w,
                               const Grads& ref) {
  const nlohmann::json row = config_row(c, measure_config(c, o, w, ref), ref);
  print_config_row(row);
  return row;
}

// A mixture of experts: block 0's dW error per expert (its gate, up and down together), one
// column per configuration, from the JSON rows (config_row()).
void print_expert_table(const nlohmann::json& rows) {
  std::printf("\ndW error per expert of block 0 (gate, up, down), mean over keys\n%-8s %6s", "expert", "rows");
  for (const auto& row : rows) std::printf("  %16.16s", row.at("configuration").get<std::string>().c_str());
  std::printf("\n");
  const auto& first = rows.at(0).at("dw_first_block_per_expert");
  for (size_t x = 0; x < first.size(); ++x) {
    std::printf("%-8zu %6lld", x, static_cast<long long>(first[x].at("rows").get<int64_t>()));
    for (const auto& row : rows) std::printf("  %16.4f", row.at("dw_first_block_per_expert")[x].at("mean").get<double>());
    std::printf("\n");
  }
}

// "blocks.0.ffn.gate", or for a mixture's expert 3 "blocks.0.ffn.gate[3]".
std::string telemetry_name(const nn::GradTelemetry& t) {
  return layer_name(t.layer_index) + (t.expert >= 0 ? "[" + std::to_string(t.expert) + "]" : "");
}

// Prints the per-layer rounding telemetry table, in the order given.
void print_telemetry(const std::vector<nn::GradTelemetry>& telemetry) {
  std::printf("\nrounding telemetry per layer (G of the exact-gradient pass): D = max|G'|/127, "
              "and the share of\nG' with |G'|/D <= 1/2, which rtne rounds to 0\n");
  std::printf("%-22s %8s %8s %12s %18s\n", "layer", "tokens", "N", "D", "share <= D/2");
  for (const nn::GradTelemetry& t : telemetry) {
    std::printf("%-22s %8lld %8lld %12.4e %17.2f%%\n", telemetry_name(t).c_str(),
                static_cast<long long>(t.tokens), static_cast<long long>(t.channels), t.step,
                100.0 * t.share_below_half_step);
  }
}

// The telemetry as the JSON's "telemetry" array, in the order given.
nlohmann::json telemetry_json(const std::vector<nn::GradTelemetry>& telemetry) {
  nlohmann::json tele = nlohmann::json::array();
  for (const nn::GradTelemetry& t : telemetry) {
    tele.push_back({{"layer", layer_name(t.layer_index)}, {"index", t.layer_index},
                    {"tokens", t.tokens}, {"channels", t.channels}, {"step", t.step},
                    {"share_below_half_step", t.share_below_half_step}});
    if (t.expert >= 0) tele.back()["expert"] = t.expert;
  }
  return tele;
}

// Writes the run's settings, the rows and the telemetry to --json (atomically: the file is
// whole or absent) and names it on stdout.
void write_json(const Options& o, const ckpt::CheckpointInfo& info, const Reference& r,
                const nlohmann::json& rows) {
  const nlohmann::json out = {
      {"checkpoint", o.checkpoint}, {"step", info.step + 1}, {"model", info.model.describe()},
      {"batch_index", o.batch_index}, {"data", o.data_dir}, {"keys", o.keys}, {"seed", o.seed},
      {"reference", o.reference}, {"loss_int8_forward", r.loss_int8},
      {"loss_reference", r.loss_ref}, {"machine", machine_line()}, {"rows", rows},
      {"telemetry", telemetry_json(r.telemetry)}};
  io::write_file_atomic(o.json_path, [&](std::ostream& f) { f << out.dump(1) << "\n"; });
  std::printf("json: %s\n", o.json_path.c_str());
}

// All the input checks come first (read_and_check_inputs, the batch index, the configuration
// names), before any model is built; then the work, printing as it goes. Throws s3r::Error.
void run(const Options& o) {
  const DiagInputs inputs = read_and_check_inputs(o);
  const model::ModelConfig& cfg = inputs.info.model;
  const Batch batch = load_validation_batch("diag grad-error", o.data_dir, o.batch_index, inputs.val, cfg);
  const std::vector<DiagConfig> configs = table_configs(o);
  print_header(o, inputs.info);
  const AlignedVector<float> weights = load_trained_weights(o.checkpoint, inputs.info);
  const Workload work{cfg, weights, batch};
  const Reference ref = compute_reference(o, work);
  print_losses(o, ref);
  print_table_header(o.keys);
  nlohmann::json rows = nlohmann::json::array();
  for (const DiagConfig& c : configs) rows.push_back(evaluate_config(c, o, work, ref.grads));
  if (cfg.traits().moe) print_expert_table(rows);
  print_telemetry(ref.telemetry);
  if (!o.json_path.empty()) write_json(o, inputs.info, ref, rows);
}

}  // namespace

void register_diag_grad_error(CLI::App& diag) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = diag.add_subcommand(
      "grad-error", "gradient errors of every rounding configuration on one checkpoint (paper, Table II)");
  add_source_options(cmd, o->checkpoint, o->data_dir, o->keys, kMaxKeys, o->seed, o->batch_index);
  cmd->add_option("--reference", o->reference,
                  "quantized-forward (unquantized gradients, same int8 forward) | bf16 (full bf16 model)")
      ->capture_default_str();
  std::string rows;
  for (const DiagConfig& c : all_configs()) rows += (rows.empty() ? "" : ", ") + c.name;
  cmd->add_option("--configs", o->configs,
                  "comma-separated rows (default: all of " + rows + "); also any int8 recipe as s3r train --recipe "
                  "names it, MODE[+CORRECTION][/head-int8]");
  cmd->add_option("--json", o->json_path, "also write the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace s3r::tools
