#pragma once
// The SentencePiece tokenizer of a model, for generation, evaluation and export.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "s3r/ckpt/checkpoint.hpp"

namespace s3r::infer {

// How a piece is used, with GGUF's numbering (tokenizer.ggml.token_type).
enum class PieceType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

class Tokenizer {
 public:
  // Loads a SentencePiece model file. Throws s3r::Error naming the file when it is missing or not
  // a SentencePiece model.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  const std::string& path() const { return path_; }
  int64_t vocab() const;
  int32_t eos_id() const;  // -1: none
  int32_t bos_id() const;
  int32_t unk_id() const;
  int32_t pad_id() const;
  // The id that starts a document: s3r's data puts end-of-text between documents, so the model
  // has seen end-of-text before every document but the first; BOS where the tokenizer has one.
  int32_t document_start_id() const;

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;
  float score(int32_t id) const;
  PieceType type(int32_t id) const;
  // UTF-8 bytes of text that the piece stands for: a byte piece 1, a control piece 0, "▁" 1.
  int64_t byte_length(int32_t id) const;
  // Whether encoding puts a space ("▁") before the text (SentencePiece's add_dummy_prefix,
  // GGUF's tokenizer.ggml.add_space_prefix): read off the encoding of "x".
  bool adds_space_prefix() const;
  // The serialized model (tokenizer.model's bytes).
  std::string serialized() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// The tokenizer for a checkpoint: `given` (a --tokenizer option) when not empty, else the
// checkpoint's own tokenizer.model, else `fallback` (e.g. a dataset's tokenizer.model) when it
// exists. Throws s3r::Error when there is none ("no tokenizer: ...; pass --tokenizer") or when
// its vocabulary differs from the model's V. `what` prefixes messages ("generate").
std::unique_ptr<Tokenizer> tokenizer_for(const ckpt::CheckpointInfo& info, const std::string& given,
                                         const std::string& fallback, const std::string& what);

}  // namespace s3r::infer
