#pragma once
// Subcommands of the `s3r` tool: each registers its options on a CLI11 subcommand and runs.
#include <CLI/CLI.hpp>

namespace s3r::tools {

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
