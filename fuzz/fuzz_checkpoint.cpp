// libFuzzer target: bytes -> a checkpoint folder -> ckpt::read_checkpoint_info, then (for a tiny
// configuration) a Model of it and ckpt::load_checkpoint_weights / load_checkpoint
// (include/s3r/ckpt/checkpoint.hpp).
//
// Input: meta.json, model.safetensors, optimizer.safetensors and tokenizer.model joined by
// kSeparator; a file whose part is absent is not written (the "missing file" paths). Version 1
// metas carry no checksums, so mutated tensor files reach the safetensors reader; version 2 and 3
// seeds exercise the checksum checks, version 3 also the "architecture" and "tokenizer" records
// and the tensors' shapes (fuzz/make_seeds.cpp).
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "s3r/core/error.hpp"
#include "s3r/model/model.hpp"
#include "s3r/ckpt/checkpoint.hpp"

namespace {

constexpr std::string_view kSeparator = "\n--s3r-fuzz-file--\n";

// Configurations whose Model stays below a few MB: a meta.json may claim any size, and a
// Model of it would allocate that much (a finding about the meta reader only when it throws
// something other than s3r::Error, which read_checkpoint_info has already returned from).
bool tiny(const s3r::model::ModelConfig& c) {
  return c.layers <= 2 && c.width <= 64 && c.heads <= 64 && c.ffn_width <= 256 && c.vocab <= 512 &&
         c.seq_len <= 64 && c.batch <= 8;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest = s3r::fuzz::as_view(data, size);
  const auto dir = s3r::fuzz::scratch() / "checkpoint";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  for (const char* name : {"meta.json", "model.safetensors", "optimizer.safetensors", "tokenizer.model"}) {
    const size_t cut = rest.find(kSeparator);
    s3r::fuzz::write_file(dir / name, rest.substr(0, cut));
    if (cut == std::string_view::npos) break;
    rest.remove_prefix(cut + kSeparator.size());
  }
  try {
    const s3r::ckpt::CheckpointInfo info = s3r::ckpt::read_checkpoint_info(dir.string());
    if (!tiny(info.model)) return 0;
    s3r::model::Model model(info.model, info.recipe);
    s3r::ckpt::load_checkpoint_weights(dir.string(), model);
    std::vector<float> m(model.params().size()), v(model.params().size());
    (void)s3r::ckpt::load_checkpoint(dir.string(), model, m, v);
  } catch (const s3r::Error&) {
  }
  return 0;
}
