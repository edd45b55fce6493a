// The model-shape options shared by `s3r train` and `s3r bench step`; see commands.hpp.
#include "commands.hpp"

namespace s3r::tools {

void ModelOptions::add_to(CLI::App* cmd) {
  cmd->add_option("--preset", preset, "tiny | small | wide | paper")->capture_default_str();
  cmd->add_option("--layers", layers, "L (default: the preset's)");
  cmd->add_option("--width", width, "C");
  cmd->add_option("--heads", heads, "attention heads");
  cmd->add_option("--ffn", ffn, "F");
  cmd->add_option("--vocab", vocab, "V (training: must equal the tokenizer's)");
  cmd->add_option("--seq-len", seq, "S");
  cmd->add_option("--batch", batch, "B");
}

model::ModelConfig ModelOptions::config() const {
  model::ModelConfig m = model::preset(preset);
  if (layers) m.layers = layers;
  if (width) m.width = width;
  if (heads) m.heads = heads;
  if (ffn) m.ffn_width = ffn;
  if (vocab) m.vocab = vocab;
  if (seq) m.seq_len = seq;
  if (batch) m.batch = batch;
  m.validate();
  return m;
}

}  // namespace s3r::tools
