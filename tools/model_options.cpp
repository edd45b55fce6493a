// The model-shape options shared by `s3r train` and `s3r bench step`; see commands.hpp.
#include <sstream>

#include "commands.hpp"
#include "memory_check.hpp"
#include "option_checks.hpp"
#include "s3r/core/error.hpp"

namespace s3r::tools {

namespace {

// Sizes beyond these are no model this program can hold; the bound keeps products of two
// dimensions far from int64 overflow before config() and the memory estimates look at them.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxVocab = (int64_t{1} << 31) - 1;  // token ids are int32

}  // namespace

void ModelOptions::add_to(CLI::App* cmd) {
  cmd->add_option("--preset", preset, "tiny | small | wide | paper")->capture_default_str();
  cmd->add_option("--arch", arch, "model family: " + model::family_names() + " (the presets keep its ratios)")
      ->capture_default_str();
  add_integer_option(cmd, "--layers", layers, "L (default: the preset's)", 1, kMaxDim);
  add_integer_option(cmd, "--width", width, "C", 1, kMaxDim);
  add_integer_option(cmd, "--heads", heads,
                     "attention heads (must divide C unless --head-size is given; C / heads even)", 1, kMaxDim);
  add_integer_option(cmd, "--head-size", head_size, "size of one attention head, even (default: C / heads)", 1,
                     kMaxDim);
  add_integer_option(cmd, "--kv-heads", kv_heads,
                     "key/value heads (must divide the heads; fewer: grouped-query attention; default: the preset's "
                     "ratio, the heads for llama, half of them for qwen3)", 1,
                     kMaxDim);
  add_integer_option(cmd, "--ffn", ffn, "F", 1, kMaxDim);
  add_integer_option(cmd, "--window", window,
                     "sliding window W of the local layers (gemma3: five of every six layers; below S; default S / 2)",
                     1, kMaxDim);
  add_integer_option(cmd, "--experts", experts, "E, experts of each block's mixture (qwen3moe; default: the preset's)", 1,
                     1 << 16);
  add_integer_option(cmd, "--experts-used", experts_used, "k, experts per token, at most E (qwen3moe; default 2)", 1,
                     1 << 16);
  add_float_option(cmd, "--moe-aux-loss", moe_aux_loss,
                   "coefficient of the load-balancing loss (qwen3moe; Switch's, per example)", 0.0, 1e3);
  add_float_option(cmd, "--moe-z-loss", moe_z_loss, "coefficient of the router z-loss (qwen3moe)", 0.0, 1e3);
  add_integer_option(cmd, "--vocab", vocab, "V (training: must equal the tokenizer's)", 1, kMaxVocab);
  add_integer_option(cmd, "--seq-len", seq, "S", 1, kMaxDim);
  add_integer_option(cmd, "--batch", batch, "B", 1, kMaxDim);
  cmd->add_option("--head", head,
                  "LM head: default (bf16; f32 in f32 mode, as in the paper) or int8 (quantized like the "
                  "projections, in int8 modes only)")
      ->check(CLI::IsMember({"default", "int8"}))
      ->capture_default_str();
}

model::ModelConfig ModelOptions::config() const {
  const model::ModelConfig base = model::preset(preset, model::parse_family(arch));
  model::ModelConfig m = base;
  if (layers) m.layers = *layers;
  if (width) m.width = *width;
  if (heads) m.heads = *heads;
  // Without --kv-heads, the preset's ratio of query to key/value heads (1 for llama, 2 for qwen3).
  if (kv_heads) {
    m.kv_heads = *kv_heads;
  } else if (heads) {
    const int64_t ratio = base.heads / base.kv_heads;
    m.kv_heads = m.heads % ratio == 0 ? m.heads / ratio : m.heads;
  }
  if (head_size) m.head_size = *head_size;
  if (ffn) m.ffn_width = *ffn;
  if (vocab) m.vocab = *vocab;
  if (seq) m.seq_len = *seq;
  if (batch) m.batch = *batch;
  if (window && m.traits().local_period == 0) {
    throw Error("--window " + std::to_string(*window) + ": the " + std::string(m.traits().name) +
                " family has no local layers (--arch gemma3 has)");
  }
  if ((experts || experts_used || moe_aux_loss != 0.001 || moe_z_loss != 0.0) && !m.traits().moe) {
    throw Error("--experts, --experts-used, --moe-aux-loss and --moe-z-loss: the " + std::string(m.traits().name) +
                " family has no mixture of experts (--arch qwen3moe has)");
  }
  if (experts) m.experts = *experts;
  if (experts_used) m.experts_used = *experts_used;
  if (m.traits().local_period > 0) {
    m.window = window ? *window : m.seq_len / 2;
    if (m.window >= m.seq_len) {
      throw Error("--window " + std::to_string(m.window) + " must be below --seq-len " + std::to_string(m.seq_len) +
                  " (a window of S keys or more is none: the local layers would attend like the global ones)");
    }
  }
  m.validate();  // bounded too: every size computed from m fits in int64 (model/config.cpp)
  static_cast<model::Architecture&>(m) = m.architecture().normalized();
  return m;
}

std::string ModelOptions::command_line() const {
  std::ostringstream s;
  s << "--preset '" << preset << "' --arch '" << arch << "' --head " << head;
  const std::pair<const char*, const std::optional<int64_t>*> fields[] = {
      {"--layers", &layers}, {"--width", &width}, {"--heads", &heads}, {"--kv-heads", &kv_heads},
      {"--head-size", &head_size}, {"--ffn", &ffn}, {"--window", &window}, {"--experts", &experts},
      {"--experts-used", &experts_used},
      {"--vocab", &vocab},   {"--seq-len", &seq}, {"--batch", &batch}};
  for (const auto& [name, value] : fields) {
    if (*value) s << " " << name << " " << **value;
  }
  if (moe_aux_loss != 0.001) s << " --moe-aux-loss " << moe_aux_loss;
  if (moe_z_loss != 0.0) s << " --moe-z-loss " << moe_z_loss;
  return s.str();
}

}  // namespace s3r::tools
