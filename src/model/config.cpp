#include "s3r/model/config.hpp"

#include <algorithm>
#include <sstream>

#include "s3r/core/error.hpp"

namespace s3r::model {

void ModelConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v < 1) throw Error(std::string("model config: ") + name + " must be >= 1, got " + std::to_string(v));
  };
  positive("layers", layers);
  positive("width", width);
  positive("heads", heads);
  positive("ffn_width", ffn_width);
  positive("vocab", vocab);
  positive("seq_len", seq_len);
  positive("batch", batch);
  // Bounds far beyond any machine, so that every size computed from a configuration (a corrupt
  // meta.json can hold anything) fits in int64 and no allocation is attempted for it.
  auto at_most = [](const char* name, int64_t v, int64_t max) {
    if (v > max) {
      throw Error(std::string("model config: ") + name + " must be <= " + std::to_string(max) + ", got " +
                  std::to_string(v));
    }
  };
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  at_most("layers", layers, kMaxDim);
  at_most("width", width, kMaxDim);
  at_most("heads", heads, kMaxDim);
  at_most("ffn_width", ffn_width, kMaxDim);
  at_most("vocab", vocab, (int64_t{1} << 31) - 1);
  at_most("seq_len", seq_len, kMaxDim);
  at_most("batch", batch, kMaxDim);
  const double T = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double widest = std::max({static_cast<double>(width), static_cast<double>(ffn_width), static_cast<double>(vocab)});
  const double per_layer = static_cast<double>(width) * (4.0 * width + 3.0 * ffn_width);
  const double params = 2.0 * static_cast<double>(vocab) * width + static_cast<double>(layers) * per_layer;
  const double attention = T * static_cast<double>(seq_len) * static_cast<double>(heads) * static_cast<double>(layers);
  if (std::max({T * widest, params, attention}) > 1e15) {
    throw Error("model config: " + describe() + " needs more than 1e15 values (tensors of T x max(C, F, V), " +
                "parameters, or attention), beyond any machine");
  }
  if (width % heads != 0) {
    throw Error("model config: width C = " + std::to_string(width) + " is not divisible by heads = " +
                std::to_string(heads));
  }
  if (head_dim() % 2 != 0) {
    throw Error("model config: head size C / heads = " + std::to_string(head_dim()) +
                " must be even for RoPE");
  }
}

std::string ModelConfig::describe() const {
  std::ostringstream s;
  s << "L=" << layers << " C=" << width << " heads=" << heads << " F=" << ffn_width
    << " V=" << vocab << " S=" << seq_len << " B=" << batch;
  return s.str();
}

ModelConfig preset(std::string_view name) {
  if (name == "tiny") return ModelConfig{2, 64, 4, 192, 256, 32, 4};
  if (name == "small") return ModelConfig{6, 256, 4, 768, 4096, 256, 16};
  if (name == "wide") return ModelConfig{4, 1024, 8, 4096, 4096, 256, 8};
  if (name == "paper") return ModelConfig{12, 768, 12, 2048, 32000, 2048, 8};
  throw Error("unknown preset '" + std::string(name) + "'; expected one of: tiny, small, wide, paper");
}

}  // namespace s3r::model
