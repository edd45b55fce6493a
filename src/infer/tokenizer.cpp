// The SentencePiece tokenizer of a model; see s3r/infer/tokenizer.hpp.
#include "s3r/infer/tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "s3r/core/error.hpp"

namespace s3r::infer {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  if (!std::filesystem::is_regular_file(path)) throw Error("tokenizer '" + path + "' does not exist");
  if (const auto status = impl_->sp.Load(path); !status.ok()) {
    throw Error("tokenizer '" + path + "' is not a SentencePiece model: " + status.ToString());
  }
}

Tokenizer::~Tokenizer() = default;

int64_t Tokenizer::vocab() const { return impl_->sp.GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
int32_t Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t Tokenizer::unk_id() const { return impl_->sp.unk_id(); }
int32_t Tokenizer::pad_id() const { return impl_->sp.pad_id(); }
int32_t Tokenizer::document_start_id() const { return bos_id() >= 0 ? bos_id() : eos_id(); }

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  if (!impl_->sp.Encode(text, &ids).ok()) throw Error("tokenizer '" + path_ + "': cannot encode the text");
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  if (!impl_->sp.Decode(v, &text).ok()) throw Error("tokenizer '" + path_ + "': cannot decode the ids");
  return text;
}

std::string Tokenizer::piece(int32_t id) const { return impl_->sp.IdToPiece(id); }
float Tokenizer::score(int32_t id) const { return impl_->sp.GetScore(id); }

PieceType Tokenizer::type(int32_t id) const {
  const auto& sp = impl_->sp;
  if (sp.IsUnknown(id)) return PieceType::kUnknown;
  if (sp.IsControl(id)) return PieceType::kControl;
  if (sp.IsByte(id)) return PieceType::kByte;
  if (sp.IsUnused(id)) return PieceType::kUnused;
  return PieceType::kNormal;
}

int64_t Tokenizer::byte_length(int32_t id) const {
  switch (type(id)) {
    case PieceType::kControl: return 0;
    case PieceType::kByte: return 1;
    case PieceType::kUnknown: return 1;  // stands for at least one character
    default: break;
  }
  // "▁" (U+2581, 3 bytes in UTF-8) stands for one space.
  const std::string p = piece(id);
  static const std::string kSpace = "\xe2\x96\x81";
  int64_t n = 0;
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, kSpace.size(), kSpace) == 0) {
      n += 1;
      i += kSpace.size();
    } else {
      n += 1;
      i += 1;
    }
  }
  return n;
}

bool Tokenizer::adds_space_prefix() const {
  const std::vector<int32_t> ids = encode("x");
  return !ids.empty() && piece(ids[0]).rfind("\xe2\x96\x81", 0) == 0;
}

std::string Tokenizer::serialized() const { return impl_->sp.serialized_model_proto(); }

std::unique_ptr<Tokenizer> tokenizer_for(const ckpt::CheckpointInfo& info, const std::string& given,
                                         const std::string& fallback, const std::string& what) {
  std::string path = given;
  if (path.empty() && !info.tokenizer_model.empty()) path = info.tokenizer_model;
  if (path.empty() && !fallback.empty() && std::filesystem::is_regular_file(fallback)) path = fallback;
  if (path.empty()) {
    throw Error(what + ": no tokenizer: the checkpoint holds no tokenizer.model (checkpoint version " +
                std::to_string(info.version) + "); pass --tokenizer DATA/tokenizer.model (the one of the data "
                "the model was trained on)");
  }
  auto tok = std::make_unique<Tokenizer>(path);
  if (tok->vocab() != info.model.vocab) {
    throw Error(what + ": tokenizer '" + path + "' has " + std::to_string(tok->vocab()) +
                " pieces, but the model's vocabulary V is " + std::to_string(info.model.vocab) +
                " (another tokenizer than the model was trained with?)");
  }
  if (info.tokenizer && given == path && info.tokenizer->vocab == tok->vocab()) {
    // A tokenizer given beside the checkpoint's own: it must be the same one.
    const std::string mine = Tokenizer(info.tokenizer_model).serialized();
    if (mine != tok->serialized()) {
      throw Error(what + ": tokenizer '" + path + "' differs from the checkpoint's own '" + info.tokenizer_model +
                  "' (leave --tokenizer out to use the checkpoint's)");
    }
  }
  return tok;
}

}  // namespace s3r::infer
