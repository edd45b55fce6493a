#pragma once
// Subcommands of the `s3r` tool: each registers its options on a CLI11 subcommand and runs.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "s3r/model/config.hpp"

namespace s3r::tools {

// --preset and the per-field overrides --layers, --width, --heads, --ffn, --vocab, --seq-len,
// --batch (0: the preset's value).
struct ModelOptions {
  std::string preset = "small";
  int64_t layers = 0, width = 0, heads = 0, ffn = 0, vocab = 0, seq = 0, batch = 0;
  void add_to(CLI::App* cmd);
  model::ModelConfig config() const;  // validated; throws s3r::Error naming the bad field
};

// `s3r bench ffn`: forward + backward of one SwiGLU block per configuration (paper, Table III).
void register_bench_ffn(CLI::App& bench);

// `s3r bench step`: one full training step per configuration (paper, Table IV).
void register_bench_step(CLI::App& bench);

// `s3r diag grad-error`: gradient errors per configuration on a checkpoint (paper, Table II).
void register_diag_grad_error(CLI::App& diag);

// `s3r data prepare`: text -> tokenizer -> token shards.
void register_data_prepare(CLI::App& data);

// `s3r train`: the main job.
void register_train(CLI::App& app);

}  // namespace s3r::tools
