#pragma once
// What the `s3r diag` subcommands share: the checkpoint and its validation batch, read and
// checked before any work, and the checkpoint's weights.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "s3r/ckpt/checkpoint.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/model/config.hpp"

namespace s3r::tools {

// The checkpoint's information and --data's val.bin.
struct DiagInputs {
  ckpt::CheckpointInfo info;
  data::TokenShard val;
};

// Reads the checkpoint's info and DATA/val.bin and checks that their vocabularies agree.
// Throws s3r::Error prefixed with `command` ("diag grad-error") at the first that fails.
DiagInputs read_diag_inputs(const std::string& command, const std::string& checkpoint,
                            const std::string& data_dir);

// One batch of B windows of S tokens: the inputs and their next-token targets (B*S each).
struct Batch {
  std::vector<int32_t> in, tg;
};

// Validation batch `index` of val, in the order `s3r train` validates on. Throws s3r::Error
// (prefixed with `command`) when the index is not below the batches of one pass over val's
// windows.
Batch load_validation_batch(const std::string& command, const std::string& data_dir, int64_t index,
                            const data::TokenShard& val, const model::ModelConfig& cfg);

// The checkpoint's weights, loaded into a model of its own configuration and recipe
// (load_checkpoint_weights refuses any other); the diagnostics' models start from copies.
AlignedVector<float> load_trained_weights(const std::string& checkpoint, const ckpt::CheckpointInfo& info);

// The options that name what a diagnostic reads: --checkpoint (required), --data, --keys (in
// [1, max_keys]), --seed and --batch-index, each range-checked as it is parsed.
void add_source_options(CLI::App* cmd, std::string& checkpoint, std::string& data_dir, int& keys, int max_keys,
                        uint32_t& seed, int64_t& batch_index);

// "blocks.L.attn.q" and the like for a projection's layer index 7 L + j.
std::string layer_name(int64_t index);

}  // namespace s3r::tools
