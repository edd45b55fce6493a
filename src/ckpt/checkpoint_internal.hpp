#pragma once
// Shared by the files of the checkpoint module, one concern each: checkpoint_meta.cpp (meta.json,
// the format's versions, checksums), checkpoint_folder.cpp (a run folder's checkpoint/, .tmp/ and
// .old/: the swap, finding the newest complete one, tidying after a crash) and checkpoint.cpp
// (saving and loading tensors). The public API: s3r/ckpt/checkpoint.hpp.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "s3r/ckpt/checkpoint.hpp"

namespace s3r::ckpt::detail {

namespace fs = std::filesystem;

constexpr int kVersion = 3;
constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors"};
constexpr const char* kTokenizerFile = "tokenizer.model";

// meta.json's "config", "tokenizer" and "architecture" objects.
nlohmann::json to_json(const RunConfig& c);
nlohmann::json to_json(const TokenizerRecord& t);
nlohmann::json architecture(const RunConfig& c);

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
// CRC-32 (zlib) and size of a file; throws s3r::Error naming it when it cannot be read.
FileSum file_sum(const fs::path& path);

// The record of a SentencePiece tokenizer.model whose vocabulary must be `vocab`; throws
// s3r::Error naming the file and `who` otherwise.
TokenizerRecord checked_tokenizer(const std::string& path, int64_t vocab, const std::string& who);

// A checkpoint folder checked whole: meta.json parses and has every field, and the tensor files
// are there with their recorded size and checksum. Throws s3r::Error naming the file.
CheckpointInfo inspect(const fs::path& dir);

// checkpoint.tmp/ (complete) replaces checkpoint/ in the run folder, crash-safely.
void swap_in_checkpoint(const fs::path& run);

}  // namespace s3r::ckpt::detail
