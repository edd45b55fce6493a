#pragma once
// The training loop of `s3r train`: AdamW over a Model, periodic validation, a metrics JSONL,
// and checkpoints (s3r/ckpt/checkpoint.hpp: durable, atomic, checksummed), from which a run
// continues bit-exactly.
//
// Out directory layout:
//   metrics.jsonl               one JSON object per step ({"step", "loss", "lr", "grad_norm",
//                               "ms", "tokens_per_s", "skipped"}) and per validation ({"step",
//                               "val_loss"}); a non-finite number (the loss of a skipped step,
//                               a diverged validation) is written as null
//   checkpoint/                 model.safetensors, optimizer.safetensors, meta.json
//   .lock                       held (flock) by the s3r process training into the folder
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "s3r/data/dataloader.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/model/config.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/recipe.hpp"
#include "s3r/optim/adamw.hpp"
#include "s3r/ckpt/checkpoint.hpp"

namespace s3r::train {

// The defaults are `s3r train`'s: the command binds its options to a default-constructed
// TrainOptions (tools/train.cpp), so its --help shows these values.
struct TrainOptions {
  static constexpr int64_t kDefaultSteps = 600;
  model::ModelConfig model = model::preset("small");
  nn::Recipe recipe;  // s3r+dx, as `s3r train` without --recipe, --mode or --correction
  uint32_t seed = 0;
  int64_t steps = kDefaultSteps;
  // Peak and final learning rate, warm-up steps, and the cosine's length (`s3r train` sets it
  // to --schedule-steps, else to steps).
  optim::LrSchedule lr{3e-3f, 3e-4f, 30, kDefaultSteps};
  optim::AdamWConfig adamw;  // weight decay 0.1, clip 1.0 (--weight-decay, --clip)
  int64_t eval_every = 100;      // 0: only at the end
  int64_t eval_batches = 8;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int max_bad_steps = 5;         // consecutive skipped steps that stop the run
  std::string out_dir;           // empty: no files
  // The SentencePiece tokenizer.model of the training data, copied into every checkpoint so
  // that generate, eval and export need no --tokenizer (empty: none).
  std::string tokenizer_model;
  // A run folder that already holds a run (a checkpoint, a leftover of one, or metrics.jsonl)
  // is refused unless the run resumes from that same folder or `overwrite` is set (then the
  // earlier run's files are removed first). The folder is locked (out_dir/.lock) for the run.
  bool overwrite = false;
  bool quiet = false;            // no per-step lines
  // Data parallel (s3r/train/data_parallel.hpp, docs/DISTRIBUTED.md): the ranks of the run
  // (nullptr: this process alone) and the examples per forward/backward (0: the whole batch).
  // Every rank calls train() with the same options; rank 0 alone reads and writes the run folder
  // and logs. The result is the same bits for any number of ranks.
  dist::Communicator* world = nullptr;
  int64_t micro_batch = 0;
  // AdamW's moments sharded over the ranks (s3r/train/optimizer.hpp): 8/R bytes per parameter
  // instead of 8, the same bits.
  bool shard_optimizer = false;
  // A mixture of experts' routing losses (--moe-aux-loss, --moe-z-loss; s3r/nn/moe.hpp).
  nn::MoeLossWeights moe_losses{0.001f, 0.0f};
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;
  float lr = 0.0f;
  double grad_norm = 0.0;
  double ms = 0.0;
  bool skipped = false;
  int64_t sent_bytes = 0;  // payload this rank sent to other ranks in the step (0: one process)
};

struct TrainResult {
  std::vector<StepRecord> steps;                          // this invocation's steps
  std::vector<std::pair<int64_t, double>> validation;     // (step, loss)
  double unigram_entropy = 0.0;  // nats: the loss of the best token-frequency model
  // This rank's share of the work in this invocation (the whole of it in one process): tokens
  // its forward passes saw in training steps and in validations, the AdamW moment elements it
  // keeps (each of m and v: every parameter, or its share with shard_optimizer), and the bytes
  // it sent to other ranks.
  int64_t tokens_trained = 0, tokens_evaluated = 0;
  int64_t moment_elements = 0;
  int64_t bytes_sent = 0;
};

// Mean -sum p log p of the token frequencies of `shard`, in nats.
double unigram_entropy(const data::TokenShard& shard);


// Every numeric option finite and in range (learning rates in (0, 1], 0 only where it is a
// documented choice). Throws s3r::Error naming the option as `s3r train` spells it.
void validate_options(const TrainOptions& options);

// Trains from scratch, or, with resume_dir non-empty, continues the newest complete checkpoint
// found there (throws s3r::Error if it is missing, corrupt, or of another configuration).
// Everything that could fail late is checked before step 0 (options, shards holding a window,
// memory, the run folder and its disk space). Every numeric option must be finite and in range
// (s3r::Error naming it). Steps with a non-finite loss, gradient or update are skipped (nothing
// changes); after max_bad_steps in a row the run stops with an s3r::Error, saving the state
// only where no checkpoint exists yet. Only finite states are saved. The final checkpoint is
// written before the final validation. Every logged number is the same for any thread count.
TrainResult train(const TrainOptions& options, const data::TokenShard& train_shard,
                  const data::TokenShard& val_shard, const std::string& resume_dir,
                  std::ostream& log);

}  // namespace s3r::train
