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
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/io/safetensors.hpp"
#include "s3r/model/model.hpp"
#include "s3r/train/checkpoint.hpp"

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

    // Token shards: both widths and the empty shard.
    const auto shard = [&](const std::string& name, std::vector<uint32_t> tokens, uint32_t vocab) {
      s3r::data::write_shard((scratch / name).string(), tokens, vocab);
      put(out / "fuzz_token_shard" / name, slurp(scratch / name));
    };
    std::vector<uint32_t> tokens;
    for (uint32_t i = 0; i < 64; ++i) tokens.push_back((i * 37) % 300);
    shard("width2.bin", tokens, 300);
    shard("width4.bin", {0, 1, 65536, 69999, 12345}, 70000);
    shard("empty.bin", {}, 1);

    // safetensors: two tensors with metadata, a zero-size tensor, one scalar-like tensor.
    const auto safetensors = [&](const std::string& name, const std::vector<s3r::io::TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
      s3r::io::write_safetensors((scratch / name).string(), tensors, metadata);
      put(out / "fuzz_safetensors" / name, slurp(scratch / name));
    };
    const std::vector<float> six = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f}, one = {7.0f}, none;
    safetensors("two.safetensors", {{"a", {2, 3}, six}, {"b", {1}, one}}, {{"step", "12"}, {"note", "seed"}});
    safetensors("empty_tensor.safetensors", {{"e", {0, 4}, none}, {"w", {3, 2}, six}}, {});
    safetensors("one.safetensors", {{"x", {1}, one}}, {});

    // Text inputs: the first byte picks the reader (see fuzz_text_reader.cpp).
    const std::string jsonl = "{\"text\": \"first document\\nwith two lines\"}\n"
                              "{\"text\": \"second \\u00e9 document\", \"url\": \"x\"}\n";
    put(out / "fuzz_text_reader" / "plain.txt", std::string(1, '\0') + "A paragraph.\nStill it.\n\nAnother one.\n");
    put(out / "fuzz_text_reader" / "lines.jsonl", std::string(1, '\1') + jsonl);
    put(out / "fuzz_text_reader" / "array.json", std::string(1, '\2') + "[\"one\", \"two \\\"quoted\\\"\", \"three\"]\n");
    put(out / "fuzz_text_reader" / "lines.json.gz", std::string(1, '\3') + gzip(jsonl, scratch));

    // Checkpoints of a tiny model (a few KB): version 2 as save_checkpoint writes it (with
    // checksums), and the same as version 1 (no checksums: mutations reach the tensor reader).
    s3r::train::CheckpointInfo info;
    info.model = s3r::model::ModelConfig{1, 8, 2, 16, 16, 4, 1};
    info.mode = s3r::nn::LinearMode::kS3r;
    info.correction = s3r::nn::Correction::kDx;
    info.seed = 3;
    info.step = 7;
    s3r::model::Model model(info.model, info.mode, info.correction);
    model.init_weights(info.seed);
    const std::vector<float> m(model.params().size(), 0.01f), v(model.params().size(), 0.0001f);
    s3r::train::save_checkpoint((scratch / "run").string(), info, model, m, v);
    const fs::path dir = scratch / "run" / "checkpoint";
    const std::string weights = slurp(dir / "model.safetensors"), moments = slurp(dir / "optimizer.safetensors");
    const std::string meta2 = slurp(dir / "meta.json");
    put(out / "fuzz_checkpoint" / "v2", meta2 + kSeparator + weights + kSeparator + moments);
    nlohmann::json meta1 = nlohmann::json::parse(meta2);
    meta1["version"] = 1;
    meta1.erase("files");
    put(out / "fuzz_checkpoint" / "v1", meta1.dump() + kSeparator + weights + kSeparator + moments);
    put(out / "fuzz_checkpoint" / "v1_weights_only", meta1.dump() + kSeparator + weights + kSeparator);
    fs::remove_all(scratch);
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
