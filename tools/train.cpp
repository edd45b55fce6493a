// `s3r train`: train a Llama-style decoder on token shards in any rounding mode.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include "commands.hpp"
#include "option_checks.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/machine.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/model/model.hpp"
#include "s3r/train/data_parallel.hpp"
#include "s3r/train/trainer.hpp"

namespace s3r::tools {

namespace {

// The options of `s3r train`. The numeric ones are bound to the fields of `options`, so their
// defaults are the library's (train::TrainOptions) and cannot drift from them; the model, the
// recipe, the schedule's length and the run folder are set from the rest in run().
struct TrainCli {
  train::TrainOptions options;
  ModelOptions model;
  std::string data_dir = "data/nlp-corpus";
  std::optional<std::string> recipe, mode, correction;  // unset: not given
  bool head_given = false;                               // --head was given
  std::string out = "data/runs/default", resume;
  int64_t schedule_steps = 0;  // 0: options.steps
};

// A PNG of the training and validation loss, drawn by gnuplot when it is installed.
void plot(const std::string& out_dir) {
  namespace fs = std::filesystem;
  const fs::path metrics = fs::path(out_dir) / "metrics.jsonl";
  const fs::path train = fs::path(out_dir) / "loss_train.dat", val = fs::path(out_dir) / "loss_val.dat";
  {
    std::ifstream in(metrics);
    std::ofstream t(train), v(val);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      // Non-finite numbers are null in metrics.jsonl: left out of the curves.
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      const int64_t step = j["step"].get<int64_t>() + 1;
      if (j.contains("val_loss") && j["val_loss"].is_number()) v << step << " " << j["val_loss"].get<double>() << "\n";
      if (j.contains("loss") && j["loss"].is_number() && !j.value("skipped", false)) {
        t << step << " " << j["loss"].get<double>() << "\n";
      }
    }
  }
  const fs::path png = fs::path(out_dir) / "loss.png";
  const std::string script = "set terminal pngcairo size 900,540; set output '" + png.string() +
                             "'; set xlabel 'step'; set ylabel 'loss (nats)'; set grid; plot '" +
                             train.string() + "' with lines title 'train', '" + val.string() +
                             "' with linespoints title 'validation'";
  const std::string cmd = "gnuplot -e \"" + script + "\" 2>/dev/null";
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0 && std::system(cmd.c_str()) == 0) {
    std::printf("loss curve: %s\n", png.string().c_str());
  } else {
    std::printf("loss curve: gnuplot not available; data in %s and %s\n", train.string().c_str(),
                val.string().c_str());
  }
}

// "host, N threads, CPUs a-b,c" of this process.
std::string placement(int threads) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &set)) continue;
      int e = c;
      while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
      cpus += (cpus.empty() ? "" : ",") + std::to_string(c) + (e > c ? "-" + std::to_string(e) : "");
      c = e;
    }
  }
  return std::string(host) + ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
         ", CPUs " + (cpus.empty() ? "?" : cpus);
}

// What one rank did, for rank 0 to print: its peak resident set and its share of the work
// (train::TrainResult), as five numbers.
std::string rank_report(const train::TrainResult& r) {
  return std::to_string(peak_resident_bytes()) + " " + std::to_string(r.tokens_trained) + " " +
         std::to_string(r.tokens_evaluated) + " " + std::to_string(r.moment_elements) + " " +
         std::to_string(r.bytes_sent);
}

// Every rank's share of the work (under mpirun: each rank's tokens are 1/R of the batch, and
// with --shard-optimizer its moments about 1/R of the parameters), then the peak memory line.
void print_rank_reports(const std::vector<std::string>& reports, int64_t parameters) {
  std::vector<double> peaks;
  for (size_t i = 0; i < reports.size(); ++i) {
    double peak = 0.0;
    long long trained = 0, evaluated = 0, moments = 0, sent = 0;
    std::sscanf(reports[i].c_str(), "%lf %lld %lld %lld %lld", &peak, &trained, &evaluated, &moments, &sent);
    peaks.push_back(peak);
    if (reports.size() > 1) {
      std::printf("work of rank %zu: %lld training tokens, %lld validation tokens, AdamW moments of %lld of %lld "
                  "parameters (%.2f MB), %lld bytes sent\n",
                  i, trained, evaluated, moments, static_cast<long long>(parameters), 8.0 * moments / 1e6, sent);
    }
  }
  std::printf("peak memory:");
  for (size_t i = 0; i < peaks.size(); ++i) std::printf("%s rank %zu %.0f MB", i ? "," : "", i, peaks[i] / 1e6);
  std::printf(" (resident set)\n");
}

// The run's recipe: --recipe NAME alone, or --mode (default s3r), --correction (default: the
// mode's, dx in int8 modes and none in bf16 and f32) and --head. Throws s3r::Error "train: ...".
nn::Recipe recipe_of(const TrainCli& c) {
  try {
    if (c.recipe) {
      if (c.mode || c.correction || c.head_given) {
        throw Error("--recipe names the whole recipe; give it without --mode, --correction and --head "
                    "(e.g. --recipe s3r+dx/head-int8)");
      }
      return nn::Recipe::parse(*c.recipe);
    }
    const nn::LinearMode mode = c.mode ? nn::parse_linear_mode(*c.mode) : nn::Recipe().projections();
    const nn::Correction correction =
        c.correction ? nn::parse_correction(*c.correction) : nn::Recipe::default_correction(mode);
    return nn::Recipe::make(mode, correction, c.model.head_choice());
  } catch (const Error& e) {
    throw Error("train: " + std::string(e.what()));
  }
}

void run(const TrainCli& c, dist::Communicator& world) {
  const bool rank0 = world.rank() == 0;
  train::TrainOptions o = c.options;
  o.world = &world;
  o.model = c.model.config();
  o.recipe = recipe_of(c);
  o.moe_losses = c.model.moe_losses();
  o.lr.total = c.schedule_steps ? c.schedule_steps : o.steps;
  o.out_dir = c.out;
  train::validate_options(o);  // before the shards are read
  namespace fs = std::filesystem;
  // Checkpoints carry the data's tokenizer (s3r data prepare writes it) when there is one.
  if (const fs::path tokenizer = fs::path(c.data_dir) / "tokenizer.model"; fs::exists(tokenizer)) {
    o.tokenizer_model = tokenizer.string();
  }
  const data::TokenShard train_shard = data::read_shard((fs::path(c.data_dir) / "train.bin").string());
  const data::TokenShard val_shard = data::read_shard((fs::path(c.data_dir) / "val.bin").string());
  const double h = train::unigram_entropy(train_shard);
  // Every rank says where it runs; rank 0 prints the lines (and everything else).
  const std::vector<std::string> where = world.gather_strings(placement(omp_get_max_threads()));
  if (!rank0) {
    world.gather_strings(rank_report(train::train(o, train_shard, val_shard, c.resume, std::cout)));
    return;
  }
  std::printf("s3r train\n");
  const model::ModelConfig& m = o.model;
  std::printf("  %-12s %s (%s, %lld tokens/step)\n", "model", c.model.preset.c_str(), m.describe().c_str(),
              (long long)m.tokens());
  std::printf("  %-12s %s\n", "recipe", o.recipe.describe().c_str());
  std::printf("  %-12s %lld steps, lr %.2e -> %.2e (warm-up %lld, cosine), AdamW wd %.2f, clip %.2f\n",
              "schedule", (long long)o.steps, o.lr.max_lr, o.lr.min_lr, (long long)o.lr.warmup,
              o.adamw.weight_decay, o.adamw.clip_norm);
  std::printf("  %-12s %u; eval every %lld steps on %lld batches; out %s%s%s\n", "seed", o.seed,
              (long long)o.eval_every, (long long)o.eval_batches,
              c.out.c_str(), c.resume.empty() ? "" : "; resume from ", c.resume.c_str());
  std::printf("  %-12s %s\n", "machine", machine_line().c_str());
  const train::StepPlan plan = train::make_step_plan(m.batch, o.micro_batch, world.size(), 0, m.seq_len);
  std::printf("  %-12s %s%s\n", "parallel", plan.describe().c_str(),
              !o.shard_optimizer ? ""
              : world.size() > 1 ? "; AdamW moments sharded over the ranks"
                                 : "; --shard-optimizer has no effect in one process");
  for (size_t r = 0; r < where.size(); ++r) std::printf("  %-12s %s\n", ("rank " + std::to_string(r)).c_str(), where[r].c_str());
  std::printf("data: %s: %zu training tokens, %zu validation tokens, vocabulary %u\n", c.data_dir.c_str(),
              train_shard.tokens.size(), val_shard.tokens.size(), train_shard.vocab);
  std::printf("reference: unigram entropy %.3f nats (the best token-frequency model); ln V = %.3f\n", h,
              std::log(static_cast<double>(o.model.vocab)));
  std::fflush(stdout);
  const train::TrainResult r = train::train(o, train_shard, val_shard, c.resume, std::cout);
  double ms = 0.0;
  for (const auto& s : r.steps) ms += s.ms;
  const double val = r.validation.empty() ? NAN : r.validation.back().second;
  std::printf("summary: final validation loss %.4f nats (%.3f below the unigram entropy), %.0f tokens/s, out %s\n",
              val, h - val, o.model.tokens() * r.steps.size() / (ms / 1000.0), c.out.c_str());
  if (world.size() > 1 && !r.steps.empty()) {
    std::printf("communication: rank 0 sent %.2f MB per step to the other ranks\n",
                static_cast<double>(r.steps.back().sent_bytes) / 1e6);
  }
  print_rank_reports(world.gather_strings(rank_report(r)), model::Model::parameter_count(m));
  plot(c.out);
}

}  // namespace

void register_train(CLI::App& app, dist::Communicator& world) {
  auto c = std::make_shared<TrainCli>();
  CLI::App* cmd = app.add_subcommand("train", "train a Llama-style decoder with INT8 products in any rounding mode");
  c->model.add_to(cmd);
  cmd->add_option("--data", c->data_dir, "folder with train.bin and val.bin (s3r data prepare)")->capture_default_str();
  cmd->add_option("--recipe", c->recipe,
                  "the numerics in one name, MODE[+CORRECTION][/head-int8], e.g. " + nn::named_recipe_list() +
                      " (default s3r+dx); instead of --mode, --correction and --head");
  cmd->add_option("--mode", c->mode, "f32 | bf16 | rtne | sr | s3r | s3r-bcast (default s3r)");
  cmd->add_option("--correction", c->correction, "none | dx | two-way (default: dx in int8 modes, none in bf16 and f32)");
  // Numbers are checked as they are parsed (tools/option_checks.hpp), and again, with the
  // relations between them, by train::validate_options before the shards are read.
  train::TrainOptions& o = c->options;
  add_integer_option(cmd, "--seed", o.seed, "weights, data order and thresholds", 0, UINT32_MAX);
  add_integer_option(cmd, "--steps", o.steps, "optimizer steps", 1);
  add_integer_option(cmd, "--schedule-steps", c->schedule_steps,
                     "steps of the cosine schedule (0: --steps; set it to run a schedule in parts)", 0, INT64_MAX,
                     "0: --steps");
  add_float_option(cmd, "--lr", o.lr.max_lr, "peak learning rate, in (0, 1]", 0.0, 1.0);
  add_float_option(cmd, "--min-lr", o.lr.min_lr, "learning rate at the end of the cosine decay, in [0, --lr]", 0.0,
                   1.0);
  add_integer_option(cmd, "--warmup", o.lr.warmup, "linear warm-up steps", 0);
  add_float_option(cmd, "--weight-decay", o.adamw.weight_decay, "AdamW decoupled weight decay, in [0, 1)", 0.0, 1.0);
  add_float_option(cmd, "--clip", o.adamw.clip_norm, "global gradient-norm clip (0: none)", 0.0, 1e30, "0: none");
  add_integer_option(cmd, "--eval-every", o.eval_every, "steps between validations (0: only at the end)", 0,
                     INT64_MAX, "0: only at the end");
  add_integer_option(cmd, "--eval-batches", o.eval_batches,
                     "validation batches of B x S tokens (the same windows at every validation)", 1);
  add_integer_option(cmd, "--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: only at the end)",
                     0, INT64_MAX, "0: only at the end");
  cmd->add_option("--out", c->out, "run folder: metrics.jsonl, checkpoint/, loss.png")->capture_default_str();
  cmd->add_option("--resume", c->resume, "continue bit-exactly from the checkpoint in this run folder");
  cmd->add_flag("--overwrite", o.overwrite, "replace an earlier run in --out (without it such a folder is refused)");
  add_integer_option(cmd, "--micro-batch", o.micro_batch,
                     "examples per forward/backward (gradient accumulation; 0: the whole batch at once); "
                     "see docs/DISTRIBUTED.md", 0, INT64_MAX, "0: the whole batch");
  cmd->add_flag("--shard-optimizer", o.shard_optimizer,
                "under mpirun: each rank keeps 1/R of AdamW's moments (the same bits; docs/DISTRIBUTED.md)");
  cmd->callback([c, cmd, &world] {
    c->head_given = cmd->count("--head") > 0;
    run(*c, world);
  });
}

}  // namespace s3r::tools
