#pragma once
// A SentencePiece tokenizer.model, loaded: encoding, decoding and the pieces' table. The one
// wrapper of SentencePiece's processor: `s3r data prepare` encodes with it, checkpoints read its
// vocabulary and special ids, and generation, evaluation and export use it for text.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace s3r::data {

// How a piece is used, with GGUF's numbering (tokenizer.ggml.token_type).
enum class PieceType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

class Tokenizer {
 public:
  // Loads a SentencePiece model file. Throws s3r::Error naming the file when it is missing
  // ("tokenizer 'PATH' does not exist") or not a SentencePiece model ("tokenizer 'PATH' is not a
  // SentencePiece model: STATUS", STATUS SentencePiece's own text).
  explicit Tokenizer(const std::string& path);
  // Loads `path` for a caller that words its own error: nullptr when SentencePiece cannot load
  // it, with SentencePiece's status text in *why ("Internal: FILE(LINE) [check] message").
  static std::unique_ptr<Tokenizer> try_load(const std::string& path, std::string* why);
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

  // Throws s3r::Error naming the file when SentencePiece fails.
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
  explicit Tokenizer(std::unique_ptr<Impl> impl, std::string path);
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace s3r::data
