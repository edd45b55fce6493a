#pragma once
// Subcommands of the `s3r` tool: each registers its options on a CLI11 subcommand and runs.
#include <CLI/CLI.hpp>

namespace s3r::tools {

// `s3r bench ffn`: forward + backward of one SwiGLU block per configuration (paper, Table III).
void register_bench_ffn(CLI::App& bench);

}  // namespace s3r::tools
