#pragma once
// Subcommands of the `s3r` tool: each registers its options on a CLI11 subcommand and runs.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "s3r/dist/communicator.hpp"
#include "s3r/model/config.hpp"
#include "s3r/nn/moe.hpp"
#include "s3r/nn/recipe.hpp"

namespace s3r::tools {

// --preset and the per-field overrides --layers, --width, --heads, --kv-heads, --head-size, --ffn, --vocab,
// --seq-len, --batch (unset: the preset's value; --kv-heads unset: equal to the heads). Each override is checked as it is parsed: an integer in
// [1, 2^24] (2^31 - 1 for --vocab: token ids are int32), else s3r::Error naming the option
// ("train: --batch must be >= 1, got 0"); config() then checks the combination (heads divide C,
// an even head size, kv heads dividing the heads, and a total size whose int64 arithmetic cannot overflow).
struct ModelOptions {
  std::string preset = "small";
  std::string arch = "llama";  // --arch: model::parse_family
  std::optional<int64_t> layers, width, heads, kv_heads, head_size, ffn, vocab, seq, batch, window;
  std::optional<int64_t> experts, experts_used;  // --experts, --experts-used (qwen3moe)
  double moe_aux_loss = 0.001, moe_z_loss = 0.0;  // --moe-aux-loss, --moe-z-loss (qwen3moe)
  std::string head = "default";  // --head default | int8 (nn::HeadChoice; part of the recipe)
  void add_to(CLI::App* cmd);
  model::ModelConfig config() const;  // validated; throws s3r::Error naming the bad field
  nn::HeadChoice head_choice() const { return nn::parse_head_choice(head); }
  nn::MoeLossWeights moe_losses() const {
    return {static_cast<float>(moe_aux_loss), static_cast<float>(moe_z_loss)};
  }
  // The options as given, to pass on to a child `s3r` process ("--preset tiny --batch 2").
  std::string command_line() const;
};

// `s3r bench ffn`: forward + backward of one SwiGLU block per configuration (paper, Table III).
void register_bench_ffn(CLI::App& bench);

// `s3r bench step`: one full training step per configuration (paper, Table IV).
void register_bench_step(CLI::App& bench);

// `s3r bench cores`: the core check alone (s3r/gemm/roofline.hpp), for scripts that time other programs.
void register_bench_cores(CLI::App& bench);

// `s3r diag grad-error`: gradient errors per configuration on a checkpoint (paper, Table II).
void register_diag_grad_error(CLI::App& diag);

// `s3r diag second-moment`: the rounding's share of AdamW's second moment on a checkpoint.
void register_diag_second_moment(CLI::App& diag);

// `s3r data prepare`: text -> tokenizer -> token shards.
void register_data_prepare(CLI::App& data);

// `s3r train`: the main job; data parallel over `world`'s ranks when started by mpirun.
void register_train(CLI::App& app, dist::Communicator& world);

// `s3r generate`, `s3r eval`, `s3r export`: use a trained checkpoint.
void register_generate(CLI::App& app);
void register_eval(CLI::App& app);
void register_export(CLI::App& app);

}  // namespace s3r::tools
