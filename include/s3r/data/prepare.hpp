#pragma once
// `s3r data prepare` (issue 4): text -> SentencePiece BPE tokenizer -> train and validation
// token shards.
//
// Inputs (files or folders, read recursively in name order): plain text (.txt; one document per
// blank-line-separated paragraph), JSONL with a "text" field per line (.jsonl, .json, and the
// same with .gz, the C4 format), or a .json file holding one array of strings. A tokenizer is
// trained on the input unless `tokenizer_model` names an existing SentencePiece model (such as
// Llama's tokenizer.model). Every document is encoded and followed by the end-of-text id; the
// last `val_fraction` of the documents (in input order) forms the validation shard.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace s3r::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;               // receives tokenizer.model, train.bin, val.bin, info.json
  std::string tokenizer_model;       // existing model to use; empty: train one
  int64_t vocab_size = 4096;         // of a trained tokenizer
  double val_fraction = 0.05;
  int64_t max_training_sentences = 2000000;  // SentencePiece's input_sentence_size
};

struct PrepareResult {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0;
  uint32_t vocab = 0;
};

// Reads every document of the inputs; throws s3r::Error naming the file and line at fault.
std::vector<std::string> read_documents(const std::vector<std::string>& inputs);

PrepareResult prepare(const PrepareOptions& options,
                      const std::function<void(const std::string&)>& progress);

}  // namespace s3r::data
