#pragma once
// Subcommands of the `s3r` tool: each registers its options on a CLI11 subcommand and runs.
#include <CLI/CLI.hpp>

namespace s3r::tools {

// `s3r bench ffn`: forward + backward of one SwiGLU block per configuration (paper, Table III).
void register_bench_ffn(CLI::App& bench);

// `s3r data prepare`: text -> tokenizer -> token shards.
void register_data_prepare(CLI::App& data);

// `s3r train`: the main job.
void register_train(CLI::App& app);

}  // namespace s3r::tools
