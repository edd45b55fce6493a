// The tokenizer of a checkpoint; see s3r/infer/tokenizer.hpp.
#include "s3r/infer/tokenizer.hpp"

#include <filesystem>

#include "s3r/core/error.hpp"

namespace s3r::infer {

std::unique_ptr<data::Tokenizer> tokenizer_for(const ckpt::CheckpointInfo& info, const std::string& given,
                                               const std::string& fallback, const std::string& what) {
  std::string path = given;
  if (path.empty() && !info.tokenizer_model.empty()) path = info.tokenizer_model;
  if (path.empty() && !fallback.empty() && std::filesystem::is_regular_file(fallback)) path = fallback;
  if (path.empty()) {
    throw Error(what + ": no tokenizer: the checkpoint holds no tokenizer.model (checkpoint version " +
                std::to_string(info.version) + "); pass --tokenizer DATA/tokenizer.model (the one of the data "
                "the model was trained on)");
  }
  auto tok = std::make_unique<data::Tokenizer>(path);
  if (tok->vocab() != info.model.vocab) {
    throw Error(what + ": tokenizer '" + path + "' has " + std::to_string(tok->vocab()) +
                " pieces, but the model's vocabulary V is " + std::to_string(info.model.vocab) +
                " (another tokenizer than the model was trained with?)");
  }
  if (info.tokenizer && given == path && info.tokenizer->vocab == tok->vocab()) {
    // A tokenizer given beside the checkpoint's own: it must be the same one.
    const std::string mine = data::Tokenizer(info.tokenizer_model).serialized();
    if (mine != tok->serialized()) {
      throw Error(what + ": tokenizer '" + path + "' differs from the checkpoint's own '" + info.tokenizer_model +
                  "' (leave --tokenizer out to use the checkpoint's)");
    }
  }
  return tok;
}

}  // namespace s3r::infer
