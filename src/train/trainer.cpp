// The training loop; see s3r/train/trainer.hpp.
#include "s3r/train/trainer.hpp"

#include <sys/statvfs.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/core/machine.hpp"
#include "s3r/core/test_pause.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/io/folder_lock.hpp"
#include "s3r/model/model.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/train/data_parallel.hpp"
#include "s3r/train/optimizer.hpp"

namespace s3r::train {

// The checkpoint format (s3r/ckpt/checkpoint.hpp) this loop saves and resumes from.
using ckpt::CheckpointInfo;
using ckpt::RunConfig;

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

void validate_options(const TrainOptions& o) {
  o.model.validate();
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error(what);
  };
  const auto num = [](double x) { std::ostringstream s; s << x; return s.str(); };
  need(o.steps >= 1, "--steps must be >= 1, got " + std::to_string(o.steps));
  need(std::isfinite(o.lr.max_lr) && o.lr.max_lr > 0.0f && o.lr.max_lr <= 1.0f,
       "--lr must be a number in (0, 1], got " + num(o.lr.max_lr));
  need(std::isfinite(o.lr.min_lr) && o.lr.min_lr >= 0.0f && o.lr.min_lr <= o.lr.max_lr,
       "--min-lr must be a number in [0, --lr], got " + num(o.lr.min_lr));
  need(o.lr.warmup >= 0, "--warmup must be >= 0, got " + std::to_string(o.lr.warmup));
  need(o.lr.total >= 1, "--schedule-steps must be >= 1, got " + std::to_string(o.lr.total));
  need(std::isfinite(o.adamw.weight_decay) && o.adamw.weight_decay >= 0.0f && o.adamw.weight_decay < 1.0f,
       "--weight-decay must be a number in [0, 1), got " + num(o.adamw.weight_decay));
  need(std::isfinite(o.adamw.clip_norm) && o.adamw.clip_norm >= 0.0f,
       "--clip must be a finite number >= 0 (0: no clipping), got " + num(o.adamw.clip_norm));
  need(std::isfinite(o.adamw.beta1) && o.adamw.beta1 >= 0.0f && o.adamw.beta1 < 1.0f &&
           std::isfinite(o.adamw.beta2) && o.adamw.beta2 >= 0.0f && o.adamw.beta2 < 1.0f,
       "AdamW betas must be in [0, 1)");
  need(std::isfinite(o.adamw.eps) && o.adamw.eps > 0.0f, "AdamW eps must be > 0");
  need(o.eval_every >= 0, "--eval-every must be >= 0 (0: only at the end), got " + std::to_string(o.eval_every));
  need(o.eval_batches >= 1, "--eval-batches must be >= 1, got " + std::to_string(o.eval_batches));
  need(o.checkpoint_every >= 0,
       "--checkpoint-every must be >= 0 (0: only at the end), got " + std::to_string(o.checkpoint_every));
  need(o.max_bad_steps >= 1, "max_bad_steps must be >= 1, got " + std::to_string(o.max_bad_steps));
  need(std::isfinite(o.moe_losses.aux) && o.moe_losses.aux >= 0.0f && std::isfinite(o.moe_losses.z_loss) &&
           o.moe_losses.z_loss >= 0.0f,
       "--moe-aux-loss and --moe-z-loss must be numbers >= 0");
  need(o.micro_batch >= 0 && o.micro_batch <= o.model.batch,
       "--micro-batch must be in [0, --batch] (0: the whole batch at once), got " + std::to_string(o.micro_batch));
  const int ranks = o.world ? o.world->size() : 1;
  make_step_plan(o.model.batch, o.micro_batch, ranks, 0, o.model.seq_len);  // throws when B, b, R do not fit
}

namespace {

std::string gigabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}

// One rank's memory (model, gradients, activations of its batch, AdamW moments) against what
// this process may take (s3r::check_memory, the tools' check too); `m` is the rank's model (its
// batch: the plan's model_batch()).
void check_memory(const TrainOptions& o, const model::ModelConfig& m, int ranks, bool rank0) {
  // AdamW's moments, bytes per parameter: sharded, 8/R, and on rank 0 the whole 8 more while it
  // writes a checkpoint (Optimizer::whole_moments).
  const double moments = !o.shard_optimizer ? 8.0 : 8.0 / ranks + (rank0 ? 8.0 : 0.0);
  const double need = static_cast<double>(model::Model::estimate_bytes(m, o.recipe)) +
                      moments * static_cast<double>(model::Model::parameter_count(m));
  s3r::check_memory(need, "the run (" + m.describe() + ", per process)",
                    "use --micro-batch, a smaller --batch or --seq-len, or a smaller model");
}

// The run folder, locked for the whole run (see TrainOptions::overwrite for the rules).
struct RunFolder {
  std::unique_ptr<io::FolderLock> lock;
  bool resume_in_place = false;  // --resume names this same folder
};

bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !a.empty() && !b.empty() && fs::exists(a) && fs::exists(b) && fs::equivalent(a, b, ec);
}

RunFolder open_run_folder(const TrainOptions& o, const std::string& resume_dir, std::ostream& log) {
  RunFolder run;
  if (o.out_dir.empty()) return run;
  const fs::path out(o.out_dir);
  std::error_code ec;
  if (fs::exists(out) && !fs::is_directory(out)) throw Error("--out '" + o.out_dir + "' exists and is not a folder");
  fs::create_directories(out, ec);
  if (ec) throw Error("cannot create the run folder --out '" + o.out_dir + "': " + ec.message());
  run.lock = std::make_unique<io::FolderLock>(o.out_dir);
  run.resume_in_place = same_folder(o.out_dir, resume_dir);
  const bool holds_run = ckpt::has_checkpoint(o.out_dir) || fs::exists(out / "metrics.jsonl");
  if (run.resume_in_place) {
    if (o.overwrite) throw Error("--overwrite and --resume of the same folder '" + o.out_dir + "' contradict each other");
    const std::string did = ckpt::tidy_checkpoints(o.out_dir);
    if (!did.empty()) log << "run folder " << o.out_dir << ": " << did << "\n";
  } else if (holds_run) {
    if (!o.overwrite) {
      throw Error("--out '" + o.out_dir + "' already holds a run (checkpoint or metrics.jsonl); continue it with "
                  "--resume " + o.out_dir + ", or replace it with --overwrite");
    }
    for (const char* name : {"checkpoint", "checkpoint.tmp", "checkpoint.old", "checkpoint.corrupt", "metrics.jsonl",
                             "metrics.jsonl.tmp", "loss_train.dat", "loss_val.dat", "loss.png"}) {
      fs::remove_all(out / name);
    }
    io::sync_path(o.out_dir);
    log << "--overwrite: removed the earlier run in " << o.out_dir << "\n";
  }
  // Room for two checkpoints (the new one is written beside the previous one).
  const double ckpt = 12.0 * static_cast<double>(model::Model::parameter_count(o.model)) + 1e6;
  double existing = 0.0;
  if (fs::exists(out / "checkpoint")) {
    for (const auto& e : fs::recursive_directory_iterator(out / "checkpoint")) {
      if (e.is_regular_file()) existing += static_cast<double>(e.file_size());
    }
  }
  struct statvfs st {};
  if (::statvfs(o.out_dir.c_str(), &st) == 0) {
    const double free_bytes = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
    if (free_bytes < 2.0 * ckpt - existing + 16e6) {
      throw Error("--out '" + o.out_dir + "': " + gigabytes(free_bytes) + " free on its disk, but checkpoints of this model " +
                  "need " + gigabytes(2.0 * ckpt - existing) + " (two of " + gigabytes(ckpt) + " while one replaces the other)");
    }
  }
  return run;
}

// The mean loss over eval_batches global batches; NaN when the weights have gone bad. Every rank
// runs every batch (collective), also after a NaN.
double evaluate(StepRunner& runner, const data::TokenShard& val, const TrainOptions& o) {
  data::DataLoader loader(val, o.model.seq_len, 0x5eed);  // the same batches at every evaluation
  std::vector<int32_t> in(o.model.tokens()), tg(o.model.tokens());
  double total = 0.0;
  for (int64_t i = 0; i < o.eval_batches; ++i) {
    loader.next_batch(in, tg, o.model.batch);
    total += runner.run(in, tg, nullptr).loss;
    test_pause("eval-batch");
  }
  return total / static_cast<double>(o.eval_batches);
}

// Rank 0's training state on every rank (a resumed run): weights and the counters (the moments:
// Optimizer::set_moments).
void broadcast_state(dist::Communicator& world, model::Model& model, data::LoaderPosition& pos,
                     int64_t& first, int& bad, bool& final_validated) {
  world.broadcast<float>(model.params(), 0);
  world.broadcast<data::LoaderPosition>({&pos, 1}, 0);
  int64_t counters[3] = {first, bad, final_validated ? 1 : 0};
  world.broadcast<int64_t>(counters, 0);
  first = counters[0];
  bad = static_cast<int>(counters[1]);
  final_validated = counters[2] != 0;
}

// Keeps the metrics lines of steps <= last_step (those the checkpoint covers), rewritten
// atomically. Returns whether a validation line of last_step is among them.
bool truncate_metrics(const fs::path& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line, kept;
  bool validated = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    if (step > last_step) continue;
    if (step == last_step && j.contains("val_loss")) validated = true;
    kept += line + "\n";
  }
  in.close();
  io::write_file_atomic(path.string(), [&](std::ostream& f) { f << kept; });
  return validated;
}

// The inputs checked before anything is built: options, the shards' vocabulary and length, the
// tokenizer, and this rank's memory. Returns this rank's model configuration (its share of the
// batch: the plan's model_batch()).
model::ModelConfig checked_rank_model(const TrainOptions& o, const StepPlan& plan, const data::TokenShard& train_shard,
                                      const data::TokenShard& val_shard, int ranks, bool rank0) {
  model::ModelConfig rank_model = o.model;
  rank_model.batch = plan.model_batch();
  for (const auto* s : {&train_shard, &val_shard}) {
    if (static_cast<int64_t>(s->vocab) != o.model.vocab) {
      throw Error("the token shards' vocabulary (" + std::to_string(s->vocab) +
                  ") differs from the model's V = " + std::to_string(o.model.vocab));
    }
  }
  const auto window_check = [&](const data::TokenShard& s, const char* which) {
    if (static_cast<int64_t>(s.tokens.size()) < o.model.seq_len + 1) {
      throw Error(std::string("the ") + which + " shard holds " + std::to_string(s.tokens.size()) +
                  " tokens, fewer than one window of S + 1 = " + std::to_string(o.model.seq_len + 1) +
                  "; use a smaller --seq-len or more " + which + " text");
    }
  };
  window_check(train_shard, "training");
  window_check(val_shard, "validation");
  if (!o.tokenizer_model.empty()) ckpt::check_tokenizer(o.tokenizer_model, o.model.vocab);
  check_memory(o, rank_model, ranks, rank0);
  return rank_model;
}

// One invocation of train() on one rank: what it built (model, optimizer, step runner, loader),
// the run folder and metrics file (rank 0's), and where the run stands. Members are declared in
// the order they are built: every check comes before the run folder is touched, the folder
// before the model is allocated.
class Run {
 public:
  Run(const TrainOptions& o, const data::TokenShard& train_shard, const data::TokenShard& val_shard,
      const std::string& resume_dir, std::ostream& rank_log)
      : o_(o), val_shard_(val_shard), resume_dir_(resume_dir), world_(o.world ? *o.world : dist::single_process()),
        rank0_(world_.rank() == 0), log_(rank0_ ? rank_log : null_log_),
        plan_(make_step_plan(o.model.batch, o.micro_batch, world_.size(), world_.rank(), o.model.seq_len)),
        rank_model_(checked_rank_model(o, plan_, train_shard, val_shard, world_.size(), rank0_)),
        out_dir_(rank0_ ? o.out_dir : std::string()),  // rank 0 alone owns the run folder
        folder_(open_run_folder(with_out_dir(o, out_dir_), resume_dir, log_)), model_(rank_model_, o.recipe),
        opt_(model_, world_, o.shard_optimizer), runner_(model_, world_, plan_),
        loader_(train_shard, o.model.seq_len, o.seed), config_{o.model, o.recipe, o.seed},
        metrics_path_(fs::path(o.out_dir) / "metrics.jsonl") {
    model_.init_weights(o.seed);  // (the optimizer and runner hold references, not values)
    model_.set_moe_losses(o.moe_losses);
    result_.unigram_entropy = unigram_entropy(train_shard);
  }

  // Rank 0 reads the checkpoint (its whole moments into the optimizer's), then every rank gets
  // the weights, moments and counters.
  void resume();
  TrainResult loop();

 private:
  static TrainOptions with_out_dir(TrainOptions o, const std::string& dir) {
    o.out_dir = dir;
    return o;
  }
  void open_metrics();
  StepRecord step(int64_t step);  // one optimizer step (or a skipped one) and its log lines
  void log_step(const StepRecord& rec, double tps);
  void stop_if_diverged(int64_t step);
  void validate(int64_t step);
  void save(int64_t step);  // every rank calls it (a sharded optimizer gathers to rank 0)

  const TrainOptions& o_;
  const data::TokenShard& val_shard_;
  const std::string resume_dir_;
  dist::Communicator& world_;
  const bool rank0_;
  std::ostream null_log_{nullptr};  // ranks other than 0 log nothing
  std::ostream& log_;
  const StepPlan plan_;
  const model::ModelConfig rank_model_;
  const std::string out_dir_;
  const RunFolder folder_;
  model::Model model_;
  Optimizer opt_;
  StepRunner runner_;
  data::DataLoader loader_;
  const RunConfig config_;
  const fs::path metrics_path_;
  std::ofstream metrics_;
  TrainResult result_;
  int64_t first_ = 0;  // the first step this invocation runs
  int bad_ = 0;        // consecutive skipped steps
  bool final_validated_ = false;
  Key seed_key_ = key_from_seed(o_.seed);
  std::vector<int32_t> in_, tg_;
  std::chrono::steady_clock::time_point start_;
  model::Model::MoeTelemetry moe_;  // the last step's, over every rank
};

void Run::resume() {
  Optimizer::Whole loaded = opt_.whole_moments();
  if (rank0_) {
    const std::string from = folder_.resume_in_place ? (fs::path(o_.out_dir) / "checkpoint").string()
                                                     : ckpt::find_checkpoint(resume_dir_);
    const CheckpointInfo info = ckpt::read_checkpoint_info(from);
    if (!(info.config() == config_)) {
      throw Error("--resume: the checkpoint's configuration (" + ckpt::describe(info.config()) +
                  ") differs from this run's (" + ckpt::describe(config_) + ")");
    }
    ckpt::load_checkpoint(from, model_, loaded.m, loaded.v);
    loader_.set_position(info.loader);
    first_ = info.step + 1;
    bad_ = info.bad_steps;
    if (folder_.resume_in_place) final_validated_ = truncate_metrics(metrics_path_, info.step);
    if (first_ >= o_.steps && final_validated_) {
      throw Error("--resume: the run in '" + resume_dir_ + "' already finished at step " + std::to_string(first_) +
                  " (--steps " + std::to_string(o_.steps) + "); give a larger --steps to train further");
    }
    log_ << "resumed from " << from << " at step " << first_ << "\n";
  }
  opt_.set_moments(loaded.m, loaded.v);
  loaded = Optimizer::Whole{};  // rank 0's whole copy is no longer needed
  if (world_.size() > 1) {
    data::LoaderPosition pos = loader_.position();
    broadcast_state(world_, model_, pos, first_, bad_, final_validated_);
    loader_.set_position(pos);
  }
}

void Run::open_metrics() {
  if (out_dir_.empty()) return;
  metrics_.open(metrics_path_, folder_.resume_in_place ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw Error("cannot write '" + metrics_path_.string() + "'");
}

void Run::save(int64_t step) {
  const Optimizer::Whole moments = opt_.whole_moments();
  if (!rank0_) return;
  metrics_.flush();
  CheckpointInfo info;
  static_cast<RunConfig&>(info) = config_;
  info.step = step;
  info.loader = loader_.position();
  info.bad_steps = bad_;
  info.tokenizer_model = o_.tokenizer_model;
  ckpt::save_checkpoint(o_.out_dir, info, model_, moments.m, moments.v);
}

StepRecord Run::step(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  loader_.next_batch(in_, tg_, o_.model.batch);  // the global batch; each rank runs its share
  StepRecord rec{step, 0.0, o_.lr.at(step), 0.0, 0.0, false};
  const Key step_key = fold_in(seed_key_, static_cast<uint32_t>(step));
  const int64_t sent_before = runner_.bytes_sent();
  const StepResult r = runner_.run(in_, tg_, &step_key);  // every rank agrees on r.ok
  test_pause("train-step");  // forward and backward done, the update not yet
  rec.loss = r.loss;
  if (!r.ok) {  // a NaN/Inf activation, loss or gradient
    rec.skipped = true;
    log_ << "step " << step << ": skipped (" << r.why << ")\n";
  } else {
    // The gradient is the same bits on every rank, and so is every update.
    rec.skipped = !opt_.step(o_.adamw, rec.lr, step + 1, &rec.grad_norm);
    if (rec.skipped) {
      log_ << "step " << step << ": skipped ("
           << (std::isfinite(rec.grad_norm) ? "the update would make a weight or moment non-finite"
                                             : "non-finite gradient norm")
           << ")\n";
    }
  }
  rec.sent_bytes = runner_.bytes_sent() - sent_before;  // the step and the optimizer's
  if (o_.model.traits().moe) moe_ = model_.moe_telemetry();  // every rank (a collective)
  bad_ = rec.skipped ? bad_ + 1 : 0;
  rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  log_step(rec, o_.model.tokens() / (rec.ms / 1000.0));
  return rec;
}

// The step's metrics line (non-finite numbers are written as JSON null) and its console line.
void Run::log_step(const StepRecord& rec, double tps) {
  if (metrics_.is_open()) {
    nlohmann::json line{{"step", rec.step},          {"loss", rec.loss}, {"lr", rec.lr},
                        {"grad_norm", rec.grad_norm}, {"ms", rec.ms},     {"tokens_per_s", tps},
                        {"skipped", rec.skipped}};
    if (world_.size() > 1) line["sent_bytes"] = rec.sent_bytes;  // rank 0's, as every rank's
    if (o_.model.traits().moe) {  // per block: rows per expert in the step's last forward; balance loss
      nlohmann::json load = nlohmann::json::array();
      for (const nn::ExpertLoad& e : moe_.load) load.push_back({{"min", e.min}, {"max", e.max}, {"cv", e.cv}});
      line["expert_load"] = load;
      line["moe_balance"] = moe_.balance;
    }
    metrics_ << line.dump() << "\n";
  }
  if (o_.quiet) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = elapsed / static_cast<double>(rec.step - first_ + 1) * static_cast<double>(o_.steps - rec.step - 1);
  char line[200];
  std::snprintf(line, sizeof line, "step %6lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %7.1f ms  %8.0f tok/s  eta %5.0f s\n",
                static_cast<long long>(rec.step + 1), static_cast<long long>(o_.steps), rec.loss, rec.lr, rec.grad_norm,
                rec.ms, tps, eta);
  log_ << line;
  if (o_.model.traits().moe) {  // the blocks' widest spread of rows over experts
    nn::ExpertLoad worst;
    for (const nn::ExpertLoad& e : moe_.load) {
      if (e.cv >= worst.cv) worst = e;
    }
    std::snprintf(line, sizeof line, "      experts: rows per expert %lld..%lld (CV %.2f) in the most uneven block\n",
                  static_cast<long long>(worst.min), static_cast<long long>(worst.max), worst.cv);
    log_ << line;
  }
  log_ << std::flush;
}

// After max_bad_steps skipped steps in a row: keep a finite checkpoint and stop with an error.
// Skipped steps leave weights and moments untouched, and adamw_step never makes them non-finite:
// the state is the finite one after the last applied step. It is saved only where no checkpoint
// exists yet; an existing one (an earlier save of this run, or the run resumed from) came from
// steps that were still finite and is kept.
void Run::stop_if_diverged(int64_t step) {
  if (bad_ < o_.max_bad_steps) return;
  if (!o_.out_dir.empty()) {
    if (world_.any(rank0_ && !ckpt::has_checkpoint(o_.out_dir))) {  // rank 0 alone sees the folder
      save(step);
      log_ << "checkpoint of the last finite state: " << o_.out_dir << "/checkpoint\n";
    } else if (rank0_) {
      metrics_.flush();
      log_ << "kept the earlier checkpoint in " << o_.out_dir << "/checkpoint (step "
           << ckpt::read_checkpoint_info(o_.out_dir).step + 1 << ")\n";
    }
  }
  throw Error(std::to_string(bad_) + " consecutive steps had a non-finite loss, gradient or update "
              "(last at step " + std::to_string(step) + "); lower --lr or check the data");
}

void Run::validate(int64_t step) {
  const double val = evaluate(runner_, val_shard_, o_);
  result_.validation.emplace_back(step, val);
  if (metrics_.is_open()) metrics_ << nlohmann::json{{"step", step}, {"val_loss", val}}.dump() << "\n";
  if (!o_.quiet) log_ << "step " << step + 1 << ": validation loss " << val << "\n";
}

TrainResult Run::loop() {
  open_metrics();
  const int64_t sent_at_start = runner_.bytes_sent();  // after the resume's broadcasts
  in_.resize(static_cast<size_t>(o_.model.tokens()));
  tg_.resize(static_cast<size_t>(o_.model.tokens()));
  start_ = std::chrono::steady_clock::now();
  for (int64_t s = first_; s < o_.steps; ++s) {
    result_.steps.push_back(step(s));
    stop_if_diverged(s);
    const bool last = s + 1 == o_.steps;
    if (!last && o_.eval_every > 0 && (s + 1) % o_.eval_every == 0) validate(s);
    // The final checkpoint comes before the final evaluation: nothing after it can lose the run.
    if (!o_.out_dir.empty() && (last || (o_.checkpoint_every > 0 && (s + 1) % o_.checkpoint_every == 0))) save(s);
  }
  // The final validation (also for a resumed run whose final checkpoint was saved but whose
  // final validation was not yet logged).
  validate(o_.steps - 1);
  if (metrics_.is_open()) {
    metrics_.close();
    if (!metrics_) throw Error("writing '" + metrics_path_.string() + "' failed (disk full?)");
    io::sync_path(metrics_path_.string());
  }
  result_.tokens_trained = runner_.tokens_trained();
  result_.tokens_evaluated = runner_.tokens_evaluated();
  result_.moment_elements = opt_.kept();
  result_.bytes_sent = runner_.bytes_sent() - sent_at_start;
  return std::move(result_);
}

}  // namespace

// Everything that could fail late is checked before step 0 (Run's constructor): options, shards,
// memory, the run folder (lock, an earlier run in it, disk space); then the checkpoint to resume
// from.
TrainResult train(const TrainOptions& o, const data::TokenShard& train_shard, const data::TokenShard& val_shard,
                  const std::string& resume_dir, std::ostream& rank_log) {
  validate_options(o);
  Run run(o, train_shard, val_shard, resume_dir, rank_log);
  if (!resume_dir.empty()) run.resume();
  return run.loop();
}

}  // namespace s3r::train
