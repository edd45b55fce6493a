// The training loop; see s3r/train/trainer.hpp.
#include "s3r/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/io/safetensors.hpp"
#include "s3r/model/model.hpp"
#include "s3r/quant/grad_quant.hpp"

namespace s3r::train {

namespace fs = std::filesystem;

double unigram_entropy(const data::TokenShard& shard) {
  std::vector<int64_t> counts(shard.vocab, 0);
  for (uint32_t t : shard.tokens) ++counts[t];
  const double n = static_cast<double>(shard.tokens.size());
  double h = 0.0;
  for (int64_t c : counts) {
    if (c > 0) h -= (c / n) * std::log(c / n);
  }
  return h;
}

namespace {

nlohmann::json config_json(const TrainOptions& o) {
  const model::ModelConfig& m = o.model;
  return {{"layers", m.layers}, {"width", m.width}, {"heads", m.heads}, {"ffn_width", m.ffn_width},
          {"vocab", m.vocab}, {"seq_len", m.seq_len}, {"batch", m.batch},
          {"mode", std::string(nn::to_string(o.mode))},
          {"correction", std::string(nn::to_string(o.correction))}, {"seed", o.seed}};
}

}  // namespace

Optimizer make_optimizer(model::Model& model) {
  Optimizer opt;
  opt.m.assign(model.params().size(), 0.0f);
  opt.v.assign(model.params().size(), 0.0f);
  for (const model::ParamInfo& p : model.param_table()) {
    opt.refs.push_back({p.name, model.params().subspan(p.offset, p.size),
                        model.grads().subspan(p.offset, p.size),
                        std::span<float>(opt.m).subspan(p.offset, p.size),
                        std::span<float>(opt.v).subspan(p.offset, p.size), p.decay});
  }
  return opt;
}

namespace {

std::vector<io::TensorView> views(const model::Model& model, std::span<const float> arena) {
  std::vector<io::TensorView> out;
  for (const model::ParamInfo& p : model.param_table()) {
    out.push_back({p.name, {p.size}, arena.subspan(p.offset, p.size)});
  }
  return out;
}

// Writes out/checkpoint atomically: into checkpoint.tmp, then swapped in by renames.
void save_checkpoint(const std::string& out, const TrainOptions& o, model::Model& model,
                     const Optimizer& opt, int64_t step, const data::LoaderPosition& pos,
                     int bad_steps) {
  const fs::path dir = fs::path(out) / "checkpoint", tmp = fs::path(out) / "checkpoint.tmp",
                 old = fs::path(out) / "checkpoint.old";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  io::write_safetensors((tmp / "model.safetensors").string(), views(model, model.params()));
  std::vector<io::TensorView> moments;
  for (const model::ParamInfo& p : model.param_table()) {
    moments.push_back({p.name + ".m", {p.size}, std::span<const float>(opt.m).subspan(p.offset, p.size)});
    moments.push_back({p.name + ".v", {p.size}, std::span<const float>(opt.v).subspan(p.offset, p.size)});
  }
  io::write_safetensors((tmp / "optimizer.safetensors").string(), moments);
  nlohmann::json meta = {{"format", "s3r-checkpoint"}, {"version", 1}, {"step", step},
                         {"config", config_json(o)}, {"loader_epoch", pos.epoch},
                         {"loader_cursor", pos.cursor}, {"bad_steps", bad_steps}};
  {
    std::ofstream f(tmp / "meta.json");
    f << meta.dump(2) << "\n";
    if (!f) throw Error("checkpoint: writing " + (tmp / "meta.json").string() + " failed");
  }
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  fs::remove_all(old);
}

struct Resumed {
  int64_t step = -1;
  data::LoaderPosition pos;
  int bad_steps = 0;
};

// meta.json of a checkpoint folder, checked to be an s3r checkpoint of version 1. Errors start
// with `context` (e.g. "--resume: ") and name the file.
nlohmann::json read_meta(const fs::path& dir, const std::string& context) {
  const fs::path meta_path = dir / "meta.json";
  std::ifstream f(meta_path);
  if (!f) throw Error(context + "no checkpoint at '" + meta_path.string() + "'");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(context + "'" + meta_path.string() + "' is not valid JSON: " + e.what());
  }
  if (meta.value("format", "") != "s3r-checkpoint" || meta.value("version", 0) != 1) {
    throw Error(context + "'" + meta_path.string() + "' is not an s3r checkpoint of version 1");
  }
  return meta;
}

// Copies tensor `name` (of `size` elements) of a safetensors file into dst.
void copy_tensor(const io::SafetensorsFile& file, const fs::path& path, const std::string& name, float* dst,
                 int64_t size, const std::string& context) {
  const auto it = file.tensors.find(name);
  if (it == file.tensors.end() || static_cast<int64_t>(it->second.data.size()) != size) {
    throw Error(context + "tensor '" + name + "' is missing from '" + path.string() +
                "' or does not have " + std::to_string(size) + " elements");
  }
  std::copy(it->second.data.begin(), it->second.data.end(), dst);
}

Resumed load_checkpoint(const std::string& resume_dir, const TrainOptions& o, model::Model& model,
                        Optimizer& opt) {
  const std::string context = "--resume: ";
  const fs::path dir = fs::path(resume_dir) / "checkpoint";
  const nlohmann::json meta = read_meta(dir, context);
  const nlohmann::json want = config_json(o);
  if (meta["config"] != want) {
    throw Error(context + "the checkpoint's configuration " + meta["config"].dump() +
                " differs from this run's " + want.dump());
  }
  const fs::path weights_path = dir / "model.safetensors", moments_path = dir / "optimizer.safetensors";
  const io::SafetensorsFile weights = io::read_safetensors(weights_path.string());
  const io::SafetensorsFile moments = io::read_safetensors(moments_path.string());
  for (const model::ParamInfo& p : model.param_table()) {
    copy_tensor(weights, weights_path, p.name, model.params().data() + p.offset, p.size, context);
    copy_tensor(moments, moments_path, p.name + ".m", opt.m.data() + p.offset, p.size, context);
    copy_tensor(moments, moments_path, p.name + ".v", opt.v.data() + p.offset, p.size, context);
  }
  Resumed r;
  r.step = meta.at("step").get<int64_t>();
  r.pos = {meta.at("loader_epoch").get<int64_t>(), meta.at("loader_cursor").get<int64_t>()};
  r.bad_steps = meta.value("bad_steps", 0);
  return r;
}

double evaluate(model::Model& model, const data::TokenShard& val, const TrainOptions& o) {
  data::DataLoader loader(val, o.model.seq_len, 0x5eed);  // the same batches at every evaluation
  std::vector<int32_t> in(o.model.tokens()), tg(o.model.tokens());
  double total = 0.0;
  for (int64_t i = 0; i < o.eval_batches; ++i) {
    loader.next_batch(in, tg, o.model.batch);
    try {
      total += model.forward(in, tg);
    } catch (const NonFiniteError&) {  // weights gone bad: reported as a NaN validation loss
      return std::nan("");
    }
  }
  return total / static_cast<double>(o.eval_batches);
}

// Keeps the metrics lines of steps <= last_step (those the checkpoint covers).
void truncate_metrics(const fs::path& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", int64_t{0}) <= last_step) kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

}  // namespace

namespace {

fs::path checkpoint_folder(const std::string& dir) {
  const fs::path d(dir);
  return fs::is_regular_file(d / "meta.json") ? d : d / "checkpoint";
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const nlohmann::json meta = read_meta(checkpoint_folder(dir), "");
  const std::string meta_path = (checkpoint_folder(dir) / "meta.json").string();
  try {
    const nlohmann::json& c = meta.at("config");
    CheckpointInfo info;
    info.model = model::ModelConfig{c.at("layers").get<int64_t>(), c.at("width").get<int64_t>(),
                                    c.at("heads").get<int64_t>(), c.at("ffn_width").get<int64_t>(),
                                    c.at("vocab").get<int64_t>(), c.at("seq_len").get<int64_t>(),
                                    c.at("batch").get<int64_t>()};
    info.model.validate();
    info.mode = nn::parse_linear_mode(c.at("mode").get<std::string>());
    info.correction = nn::parse_correction(c.at("correction").get<std::string>());
    info.seed = c.at("seed").get<uint32_t>();
    info.step = meta.at("step").get<int64_t>();
    return info;
  } catch (const nlohmann::json::exception& e) {
    throw Error("'" + meta_path + "': missing or malformed field: " + e.what());
  }
}

void load_checkpoint_weights(const std::string& dir, model::Model& model) {
  const fs::path path = checkpoint_folder(dir) / "model.safetensors";
  const io::SafetensorsFile weights = io::read_safetensors(path.string());
  for (const model::ParamInfo& p : model.param_table()) {
    copy_tensor(weights, path, p.name, model.params().data() + p.offset, p.size, "");
  }
}

TrainResult train(const TrainOptions& o, const data::TokenShard& train_shard,
                  const data::TokenShard& val_shard, const std::string& resume_dir,
                  std::ostream& log) {
  o.model.validate();
  for (const auto* s : {&train_shard, &val_shard}) {
    if (static_cast<int64_t>(s->vocab) != o.model.vocab) {
      throw Error("the token shards' vocabulary (" + std::to_string(s->vocab) +
                  ") differs from the model's V = " + std::to_string(o.model.vocab));
    }
  }
  if (o.steps < 1) throw Error("--steps must be >= 1");
  model::Model model(o.model, o.mode, o.correction);
  model.init_weights(o.seed);
  Optimizer opt = make_optimizer(model);
  data::DataLoader loader(train_shard, o.model.seq_len, o.seed);
  TrainResult result;
  result.unigram_entropy = unigram_entropy(train_shard);

  int64_t first = 0;
  int bad = 0;
  std::ofstream metrics;
  if (!o.out_dir.empty()) fs::create_directories(o.out_dir);
  const fs::path metrics_path = fs::path(o.out_dir) / "metrics.jsonl";
  if (!resume_dir.empty()) {
    const Resumed r = load_checkpoint(resume_dir, o, model, opt);
    loader.set_position(r.pos);
    first = r.step + 1;
    bad = r.bad_steps;
    if (!o.out_dir.empty()) truncate_metrics(metrics_path, r.step);
    log << "resumed from " << resume_dir << " at step " << first << "\n";
  }
  if (!o.out_dir.empty()) {
    metrics.open(metrics_path, resume_dir.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics) throw Error("cannot write '" + metrics_path.string() + "'");
  }

  const Key seed_key = key_from_seed(o.seed);
  std::vector<int32_t> in(o.model.tokens()), tg(o.model.tokens());
  const auto run_start = std::chrono::steady_clock::now();
  for (int64_t step = first; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    loader.next_batch(in, tg, o.model.batch);
    StepRecord rec{step, 0.0, o.lr.at(step), 0.0, 0.0, false};
    try {
      rec.loss = model.forward(in, tg);
      if (!std::isfinite(rec.loss)) throw NonFiniteError("non-finite loss " + std::to_string(rec.loss));
      model.backward(fold_in(seed_key, static_cast<uint32_t>(step)));
      rec.skipped = !optim::adamw_step(opt.refs, o.adamw, rec.lr, step + 1, &rec.grad_norm);
    } catch (const NonFiniteError& e) {  // a NaN/Inf activation, loss or gradient
      rec.skipped = true;
      log << "step " << step << ": skipped (" << e.what() << ")\n";
    }
    bad = rec.skipped ? bad + 1 : 0;
    rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    result.steps.push_back(rec);
    const double tps = o.model.tokens() / (rec.ms / 1000.0);
    if (metrics.is_open()) {
      metrics << nlohmann::json{{"step", step}, {"loss", rec.loss}, {"lr", rec.lr},
                                {"grad_norm", rec.grad_norm}, {"ms", rec.ms},
                                {"tokens_per_s", tps}, {"skipped", rec.skipped}}.dump()
              << "\n";
    }
    if (!o.quiet) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = elapsed / (step - first + 1) * (o.steps - step - 1);
      char line[200];
      std::snprintf(line, sizeof line,
                    "step %6lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %7.1f ms  %8.0f tok/s  eta %5.0f s\n",
                    static_cast<long long>(step + 1), static_cast<long long>(o.steps), rec.loss, rec.lr,
                    rec.grad_norm, rec.ms, tps, eta);
      log << line << std::flush;
    }
    if (bad >= o.max_bad_steps) {
      if (!o.out_dir.empty()) {  // skipped steps left the weights and moments untouched
        metrics.flush();
        save_checkpoint(o.out_dir, o, model, opt, step, loader.position(), bad);
        log << "checkpoint of the last good state: " << o.out_dir << "/checkpoint\n";
      }
      throw Error(std::to_string(bad) + " consecutive steps had a non-finite loss or gradient "
                  "(last at step " + std::to_string(step) + "); lower --lr or check the data");
    }
    const bool last = step + 1 == o.steps;
    if ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last) {
      const double val = evaluate(model, val_shard, o);
      result.validation.emplace_back(step, val);
      if (metrics.is_open()) metrics << nlohmann::json{{"step", step}, {"val_loss", val}}.dump() << "\n";
      if (!o.quiet) log << "step " << step + 1 << ": validation loss " << val << "\n";
    }
    if (!o.out_dir.empty() && (last || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0))) {
      metrics.flush();
      save_checkpoint(o.out_dir, o, model, opt, step, loader.position(), bad);
    }
  }
  return result;
}

}  // namespace s3r::train
