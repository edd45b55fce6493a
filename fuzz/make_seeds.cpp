// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): small valid inputs made with
// the library's own writers, so that the fuzzers start from files the readers accept.
//   build/fuzz/fuzz/fuzz_make_seeds fuzz/corpus      (scripts/fuzz.sh --make-seeds)
// Each seed stays well under 20 KB. Inputs that once crashed a reader are kept beside them by hand
// as regress_* (this program leaves them alone).
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/io/safetensors.hpp"
#include "s3r/model/model.hpp"
#include "s3r/ckpt/checkpoint.hpp"

namespace fs = std::filesystem;

namespace {

constexpr const char* kSeparator = "\n--s3r-fuzz-file--\n";  // as in fuzz_checkpoint.cpp

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  if (bytes.size() > 20000) throw s3r::Error("seed '" + path.string() + "' is over 20 KB");
  std::cout << path.string() << ": " << bytes.size() << " bytes\n";
}

std::string gzip(const std::string& text, const fs::path& scratch) {
  const std::string tmp = (scratch / "seed.gz").string();
  gzFile f = gzopen(tmp.c_str(), "wb9");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  return slurp(tmp);
}

// Token shards: both widths and the empty shard.
void shard_seeds(const fs::path& out, const fs::path& scratch) {
  const auto shard = [&](const std::string& name, std::vector<uint32_t> tokens, uint32_t vocab) {
    s3r::data::write_shard((scratch / name).string(), tokens, vocab);
    put(out / "fuzz_token_shard" / name, slurp(scratch / name));
  };
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 64; ++i) tokens.push_back((i * 37) % 300);
  shard("width2.bin", tokens, 300);
  shard("width4.bin", {0, 1, 65536, 69999, 12345}, 70000);
  shard("empty.bin", {}, 1);
}

// safetensors: two tensors with metadata, a zero-size tensor, one scalar-like tensor.
void safetensors_seeds(const fs::path& out, const fs::path& scratch) {
  const auto safetensors = [&](const std::string& name, const std::vector<s3r::io::TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata) {
    s3r::io::write_safetensors((scratch / name).string(), tensors, metadata);
    put(out / "fuzz_safetensors" / name, slurp(scratch / name));
  };
  const std::vector<float> six = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f}, one = {7.0f}, none;
  safetensors("two.safetensors", {{"a", {2, 3}, six}, {"b", {1}, one}}, {{"step", "12"}, {"note", "seed"}});
  safetensors("empty_tensor.safetensors", {{"e", {0, 4}, none}, {"w", {3, 2}, six}}, {});
  safetensors("one.safetensors", {{"x", {1}, one}}, {});
}

// Text inputs: the first byte picks the reader (see fuzz_text_reader.cpp).
void text_seeds(const fs::path& out, const fs::path& scratch) {
  const std::string jsonl = "{\"text\": \"first document\\nwith two lines\"}\n"
                            "{\"text\": \"second \\u00e9 document\", \"url\": \"x\"}\n";
  put(out / "fuzz_text_reader" / "plain.txt", std::string(1, '\0') + "A paragraph.\nStill it.\n\nAnother one.\n");
  put(out / "fuzz_text_reader" / "lines.jsonl", std::string(1, '\1') + jsonl);
  put(out / "fuzz_text_reader" / "array.json", std::string(1, '\2') + "[\"one\", \"two \\\"quoted\\\"\", \"three\"]\n");
  put(out / "fuzz_text_reader" / "lines.json.gz", std::string(1, '\3') + gzip(jsonl, scratch));
}

// {"bytes", "crc32"} of a file's bytes, as meta.json records them.
nlohmann::json file_sum(const std::string& bytes) {
  const auto crc = crc32_z(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  return nlohmann::json{{"bytes", bytes.size()}, {"crc32", static_cast<uint32_t>(crc)}};
}

// The version 2 and 1 checkpoints of `model` (flat tensors, no "architecture" or "tokenizer";
// version 1 without checksums, rope_theta, norm_eps or lm_head), from version 3's meta.json.
void old_checkpoint_seeds(const fs::path& out, const fs::path& scratch, s3r::model::Model& model,
                          const std::vector<float>& m, const std::vector<float>& v, const nlohmann::json& meta3) {
  std::vector<s3r::io::TensorView> flat_weights, flat_moments;
  const std::span<const float> params = model.params();
  for (const s3r::model::ParamInfo& p : model.param_table()) {
    flat_weights.push_back({p.name, {p.size}, params.subspan(p.offset, p.size)});
    flat_moments.push_back({p.name + ".m", {p.size}, std::span<const float>(m).subspan(p.offset, p.size)});
    flat_moments.push_back({p.name + ".v", {p.size}, std::span<const float>(v).subspan(p.offset, p.size)});
  }
  s3r::io::write_safetensors((scratch / "model2.safetensors").string(), flat_weights, {});
  s3r::io::write_safetensors((scratch / "optimizer2.safetensors").string(), flat_moments, {});
  const std::string weights2 = slurp(scratch / "model2.safetensors");
  const std::string moments2 = slurp(scratch / "optimizer2.safetensors");
  nlohmann::json meta2 = meta3;
  meta2["version"] = 2;
  meta2.erase("architecture");
  meta2.erase("tokenizer");
  meta2["files"] = {{"model.safetensors", file_sum(weights2)}, {"optimizer.safetensors", file_sum(moments2)}};
  put(out / "fuzz_checkpoint" / "v2", meta2.dump(2) + kSeparator + weights2 + kSeparator + moments2);

  nlohmann::json meta1 = meta2;
  meta1["version"] = 1;
  meta1.erase("files");
  for (const char* key : {"rope_theta", "norm_eps", "lm_head"}) meta1["config"].erase(key);
  put(out / "fuzz_checkpoint" / "v1", meta1.dump() + kSeparator + weights2 + kSeparator + moments2);
  put(out / "fuzz_checkpoint" / "v1_weights_only", meta1.dump() + kSeparator + weights2 + kSeparator);
}

// Checkpoints of a tiny model (a few KB each) in every version the reader accepts
// (docs/FORMATS.md): version 3 as save_checkpoint writes it (tensors with their shapes,
// "architecture", tokenizer null, checksums); the same with a tokenizer record and a fourth
// part, tokenizer.model (the reader checksums its bytes, never parses them); versions 2 and 1
// (old_checkpoint_seeds; version 1 has no checksums, so mutated tensor files reach the
// safetensors reader), version 1 also without its optimizer file.
void checkpoint_seeds(const fs::path& out, const fs::path& scratch) {
  s3r::ckpt::CheckpointInfo info;
  info.model = s3r::model::ModelConfig{
      {.layers = 1, .width = 8, .heads = 2, .kv_heads = 2, .ffn_width = 16, .vocab = 16}, {.seq_len = 4, .batch = 1}};
  info.recipe = s3r::nn::Recipe::make(s3r::nn::LinearMode::kS3r, s3r::nn::Correction::kDx);
  info.seed = 3;
  info.step = 7;
  s3r::model::Model model(info.model, info.recipe);
  model.init_weights(info.seed);
  const std::vector<float> m(model.params().size(), 0.01f), v(model.params().size(), 0.0001f);
  s3r::ckpt::save_checkpoint((scratch / "run").string(), info, model, m, v);
  const fs::path dir = scratch / "run" / "checkpoint";
  const std::string weights = slurp(dir / "model.safetensors"), moments = slurp(dir / "optimizer.safetensors");
  const std::string meta3 = slurp(dir / "meta.json");
  const nlohmann::json parsed3 = nlohmann::json::parse(meta3);
  if (parsed3.at("version") != 3) {
    throw s3r::Error("save_checkpoint wrote version " + parsed3.at("version").dump() +
                     ", not 3: update fuzz/make_seeds.cpp");
  }
  put(out / "fuzz_checkpoint" / "v3", meta3 + kSeparator + weights + kSeparator + moments);

  const std::string tokenizer = "s3r fuzz seed: tokenizer.model bytes (checksummed, not parsed)\n";
  nlohmann::json with_tokenizer = parsed3;
  with_tokenizer["tokenizer"] = {{"type", "sentencepiece"}, {"file", "tokenizer.model"},
                                 {"vocab", info.model.vocab}, {"eos_id", 1}, {"bos_id", -1},
                                 {"unk_id", 0}, {"pad_id", -1}};
  with_tokenizer["tokenizer"].update(file_sum(tokenizer));
  with_tokenizer["files"]["tokenizer.model"] = file_sum(tokenizer);
  put(out / "fuzz_checkpoint" / "v3_tokenizer",
      with_tokenizer.dump(2) + kSeparator + weights + kSeparator + moments + kSeparator + tokenizer);
  old_checkpoint_seeds(out, scratch, model, m, v, parsed3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds OUT_DIR (e.g. fuzz/corpus)\n";
    return 2;
  }
  try {
    const fs::path out = argv[1];
    const fs::path scratch = fs::temp_directory_path() / "s3r_fuzz_seeds";
    fs::remove_all(scratch);
    fs::create_directories(scratch);
    shard_seeds(out, scratch);
    safetensors_seeds(out, scratch);
    text_seeds(out, scratch);
    checkpoint_seeds(out, scratch);
    fs::remove_all(scratch);
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
