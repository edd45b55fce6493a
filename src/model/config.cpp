#include "s3r/model/config.hpp"

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
