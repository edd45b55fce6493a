// `s3r data prepare`: every input format, and a small end-to-end run.
#include "s3r/data/prepare.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"

namespace s3r::data {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "s3r_prepare_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(Prepare, ReadsTextJsonlGzipAndJsonArrays) {
  const fs::path dir = temp_dir("formats");
  write(dir / "a.txt", "first doc\nline two\n\n\nsecond doc\n");
  write(dir / "b.jsonl", "{\"text\": \"third\", \"url\": \"x\"}\n\n{\"text\": \"fourth\"}\n");
  write(dir / "c.json", "[\"fifth\", \"sixth\"]");
  const std::string gz = (dir / "d.json.gz").string();
  gzFile f = gzopen(gz.c_str(), "wb");
  const std::string line = "{\"text\": \"seventh\"}\n";
  gzwrite(f, line.data(), static_cast<unsigned>(line.size()));
  gzclose(f);
  const auto docs = read_documents({dir.string()});
  const std::vector<std::string> expected = {"first doc\nline two", "second doc", "third", "fourth",
                                             "fifth", "sixth", "seventh"};
  EXPECT_EQ(docs, expected);
}

TEST(Prepare, BadInputNamesTheFileAndLine) {
  const fs::path dir = temp_dir("bad");
  write(dir / "x.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  try {
    read_documents({(dir / "x.jsonl").string()});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.jsonl' line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_documents({(dir / "missing.txt").string()}), Error);
}

TEST(Prepare, TrainsATokenizerAndWritesValidShards) {
  const fs::path dir = temp_dir("e2e");
  std::mt19937 gen(1);
  const std::vector<std::string> words = {"the", "quantized", "gradient", "rounds", "up", "down",
                                          "stochastic", "shared", "threshold", "token", "error",
                                          "mean", "layer", "model", "training", "loss"};
  std::ofstream out(dir / "corpus.txt");
  for (int d = 0; d < 400; ++d) {
    for (int w = 0; w < 30; ++w) out << words[gen() % words.size()] << (w % 10 == 9 ? ".\n" : " ");
    out << "\n";
  }
  out.close();
  PrepareOptions o;
  o.inputs = {(dir / "corpus.txt").string()};
  o.out_dir = (dir / "out").string();
  o.vocab_size = 300;
  o.val_fraction = 0.1;
  std::vector<std::string> messages;
  const PrepareResult r = prepare(o, [&](const std::string& m) { messages.push_back(m); });
  EXPECT_EQ(r.documents, 400);
  EXPECT_EQ(r.vocab, 300u);
  EXPECT_FALSE(messages.empty());
  const TokenShard train = read_shard(o.out_dir + "/train.bin");
  const TokenShard val = read_shard(o.out_dir + "/val.bin");
  EXPECT_EQ(train.vocab, 300u);
  EXPECT_EQ(static_cast<int64_t>(train.tokens.size()), r.train_tokens);
  EXPECT_EQ(static_cast<int64_t>(val.tokens.size()), r.val_tokens);
  EXPECT_GT(r.train_tokens, 9 * r.val_tokens / 2);
  // Reusing the trained tokenizer gives the same shards.
  PrepareOptions again = o;
  again.tokenizer_model = o.out_dir + "/tokenizer.model";
  again.out_dir = (dir / "again").string();
  prepare(again, [](const std::string&) {});
  EXPECT_EQ(read_shard(again.out_dir + "/train.bin").tokens, train.tokens);
}

}  // namespace
}  // namespace s3r::data
