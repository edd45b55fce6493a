#pragma once
// The training loop of `s3r train` (issue 4, in progress): AdamW over a Model, periodic
// validation, a metrics JSONL, and checkpoints (safetensors weights and optimizer moments plus
// JSON metadata) written atomically, from which a run continues bit-exactly.
//
// Out directory layout:
//   metrics.jsonl               one JSON object per step ({"step", "loss", "lr", "grad_norm",
//                               "ms", "tokens_per_s", "skipped"}) and per validation ({"step",
//                               "val_loss"})
//   checkpoint/model.safetensors, checkpoint/optimizer.safetensors, checkpoint/meta.json
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "s3r/data/dataloader.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/model/config.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/optim/adamw.hpp"

namespace s3r::train {

struct TrainOptions {
  model::ModelConfig model = model::preset("small");
  nn::LinearMode mode = nn::LinearMode::kS3r;
  nn::Correction correction = nn::Correction::kDx;
  uint32_t seed = 0;
  int64_t steps = 1000;
  optim::LrSchedule lr{3e-3f, 3e-4f, 50, 1000};
  optim::AdamWConfig adamw;
  int64_t eval_every = 100;      // 0: only at the end
  int64_t eval_batches = 8;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int max_bad_steps = 5;         // consecutive skipped steps that stop the run
  std::string out_dir;           // empty: no files
  bool quiet = false;            // no per-step lines
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;
  float lr = 0.0f;
  double grad_norm = 0.0;
  double ms = 0.0;
  bool skipped = false;
};

struct TrainResult {
  std::vector<StepRecord> steps;                          // this invocation's steps
  std::vector<std::pair<int64_t, double>> validation;     // (step, loss)
  double unigram_entropy = 0.0;  // nats: the loss of the best token-frequency model
};

// Mean -sum p log p of the token frequencies of `shard`, in nats.
double unigram_entropy(const data::TokenShard& shard);

// AdamW moments over a Model's parameter arena, and the per-tensor views adamw_step takes.
struct Optimizer {
  std::vector<float> m, v;
  std::vector<optim::ParamRef> refs;
};
Optimizer make_optimizer(model::Model& model);

// What a checkpoint's meta.json records about its run (tools that read a run folder).
struct CheckpointInfo {
  model::ModelConfig model;
  nn::LinearMode mode = nn::LinearMode::kS3r;
  nn::Correction correction = nn::Correction::kNone;
  uint32_t seed = 0;
  int64_t step = 0;  // the last step the checkpoint covers (0-based)
};
// `dir` is a run folder (with checkpoint/) or the checkpoint folder itself. Throw s3r::Error
// naming the file when it is missing, not an s3r checkpoint, or a tensor is missing or misshaped.
CheckpointInfo read_checkpoint_info(const std::string& dir);
void load_checkpoint_weights(const std::string& dir, model::Model& model);

// Trains from scratch, or, with resume_dir non-empty, continues the checkpoint found there
// (throws s3r::Error if it is missing, corrupt, or of another configuration).
TrainResult train(const TrainOptions& options, const data::TokenShard& train_shard,
                  const data::TokenShard& val_shard, const std::string& resume_dir,
                  std::ostream& log);

}  // namespace s3r::train
