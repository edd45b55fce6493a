// What the `s3r diag` subcommands share; see diag_common.hpp.
#include "diag_common.hpp"

#include <algorithm>
#include <filesystem>

#include "option_checks.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/dataloader.hpp"
#include "s3r/model/model.hpp"

namespace s3r::tools {

DiagInputs read_diag_inputs(const std::string& command, const std::string& checkpoint,
                            const std::string& data_dir) {
  DiagInputs in;
  in.info = ckpt::read_checkpoint_info(checkpoint);
  in.val = data::read_shard((std::filesystem::path(data_dir) / "val.bin").string());
  if (static_cast<int64_t>(in.val.vocab) != in.info.model.vocab) {
    throw Error(command + ": the data's vocabulary (" + std::to_string(in.val.vocab) +
                ") differs from the checkpoint's V = " + std::to_string(in.info.model.vocab));
  }
  return in;
}

Batch load_validation_batch(const std::string& command, const std::string& data_dir, int64_t index,
                            const data::TokenShard& val, const model::ModelConfig& cfg) {
  data::DataLoader loader(val, cfg.seq_len, 0x5eed);
  // Batches past the first epoch of the validation windows repeat its windows (reshuffled), and
  // a huge index would only spin here; so the index stays within one epoch.
  const int64_t batches = std::max<int64_t>(1, loader.windows() / cfg.batch);
  if (index >= batches) {
    throw Error(command + ": --batch-index must be < " + std::to_string(batches) + " (the " +
                data_dir + "/val.bin windows of S+1 tokens make " + std::to_string(batches) +
                " batches of B = " + std::to_string(cfg.batch) + "), got " + std::to_string(index));
  }
  Batch b{std::vector<int32_t>(cfg.tokens()), std::vector<int32_t>(cfg.tokens())};
  for (int64_t i = 0; i <= index; ++i) loader.next_batch(b.in, b.tg, cfg.batch);
  return b;
}

AlignedVector<float> load_trained_weights(const std::string& checkpoint, const ckpt::CheckpointInfo& info) {
  model::Model trained(info.model, info.recipe);
  ckpt::load_checkpoint_weights(checkpoint, trained);
  return {trained.params().begin(), trained.params().end()};
}

void add_source_options(CLI::App* cmd, std::string& checkpoint, std::string& data_dir, int& keys, int max_keys,
                        uint32_t& seed, int64_t& batch_index) {
  cmd->add_option("--checkpoint", checkpoint, "run folder (or its checkpoint/) of s3r train")->required();
  cmd->add_option("--data", data_dir, "folder with val.bin: the batch comes from it")->capture_default_str();
  add_integer_option(cmd, "--keys", keys, "threshold keys to average over", 1, max_keys);
  add_integer_option(cmd, "--seed", seed, "keys are fold_in(key(seed), k)", 0, UINT32_MAX);
  add_integer_option(cmd, "--batch-index", batch_index,
                     "which validation batch (less than the batches in one pass over val.bin)", 0);
}

std::string layer_name(int64_t index) {
  const int64_t per = model::kProjectionsPerBlock;
  return "blocks." + std::to_string(index / per) + "." +
         std::string(model::to_string(static_cast<model::Projection>(index % per)));
}

}  // namespace s3r::tools
