// The SentencePiece tokenizer; see s3r/data/tokenizer.hpp.
#include "s3r/data/tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <type_traits>

#include "s3r/core/error.hpp"

namespace s3r::data {

// SentencePiece's ids are int; s3r's are int32_t: the same type here, so ids pass without a copy.
static_assert(std::is_same_v<int, int32_t>);

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl, std::string path) : impl_(std::move(impl)), path_(std::move(path)) {}

Tokenizer::Tokenizer(const std::string& path) : path_(path) {
  if (!std::filesystem::is_regular_file(path)) throw Error("tokenizer '" + path + "' does not exist");
  std::string why;
  std::unique_ptr<Tokenizer> loaded = try_load(path, &why);
  if (!loaded) throw Error("tokenizer '" + path + "' is not a SentencePiece model: " + why);
  impl_ = std::move(loaded->impl_);
}

std::unique_ptr<Tokenizer> Tokenizer::try_load(const std::string& path, std::string* why) {
  auto impl = std::make_unique<Impl>();
  if (const auto status = impl->sp.Load(path); !status.ok()) {
    if (why) *why = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl), path));
}

Tokenizer::~Tokenizer() = default;

int64_t Tokenizer::vocab() const { return impl_->sp.GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
int32_t Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t Tokenizer::unk_id() const { return impl_->sp.unk_id(); }
int32_t Tokenizer::pad_id() const { return impl_->sp.pad_id(); }
int32_t Tokenizer::document_start_id() const { return bos_id() >= 0 ? bos_id() : eos_id(); }

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  if (!impl_->sp.Encode(text, &ids).ok()) throw Error("tokenizer '" + path_ + "': cannot encode the text");
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  if (!impl_->sp.Decode(ids, &text).ok()) throw Error("tokenizer '" + path_ + "': cannot decode the ids");
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

}  // namespace s3r::data
