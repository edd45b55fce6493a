// data::Tokenizer: the pieces' byte lengths and types, ids equal to those `s3r data prepare`
// writes, and load errors that name the file.
#include "s3r/data/tokenizer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/data/prepare.hpp"
#include "s3r/data/token_shard.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

namespace s3r::data {
namespace {

namespace fs = std::filesystem;

const fs::path& dir() {
  static const fs::path d = testing::process_temp_dir("s3r_tokenizer_test");
  return d;
}

// The first document of the test corpus: its ids open the training shard.
const std::string kFirstDocument = "the quantized gradient rounds. shared threshold token error";

// A 300-piece tokenizer trained by `s3r data prepare` on a small corpus (once per process); the
// dataset lies beside it in dir()/data.
const std::string& tokenizer_path() {
  static const std::string path = [] {
    std::ofstream text(dir() / "corpus.txt");
    text << kFirstDocument << "\n\n";
    testing::write_word_corpus(text);
    text.close();
    PrepareOptions o;
    o.inputs = {(dir() / "corpus.txt").string()};
    o.out_dir = (dir() / "data").string();
    o.vocab_size = 300;
    prepare(o, nullptr);
    return (dir() / "data" / "tokenizer.model").string();
  }();
  return path;
}

using testing::error_of;

TEST(Tokenizer, ByteLengthsAddUpToTheText) {
  Tokenizer tok(tokenizer_path());
  const std::string text = "the quantized gradient rounds; shared thresholds";
  int64_t bytes = 0;
  for (int32_t id : tok.encode(text)) bytes += tok.byte_length(id);
  EXPECT_EQ(bytes, static_cast<int64_t>(text.size()) + 1);  // + SentencePiece's leading space
  EXPECT_EQ(tok.byte_length(tok.eos_id()), 0);
  EXPECT_EQ(tok.type(tok.eos_id()), PieceType::kControl);
  EXPECT_EQ(tok.document_start_id(), tok.eos_id());  // no BOS in s3r's tokenizers
  EXPECT_TRUE(tok.adds_space_prefix());               // SentencePiece's default
}

TEST(Tokenizer, IdsAreThoseOfThePreparedShardAndDecodeBack) {
  Tokenizer tok(tokenizer_path());
  EXPECT_EQ(tok.vocab(), 300);
  const std::vector<int32_t> ids = tok.encode(kFirstDocument);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(tok.decode(ids), kFirstDocument);
  // The training shard starts with the first document and its end-of-text.
  const TokenShard train = read_shard((dir() / "data" / "train.bin").string());
  ASSERT_GT(train.tokens.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(train.tokens[i], static_cast<uint32_t>(ids[i])) << "token " << i;
  EXPECT_EQ(train.tokens[ids.size()], static_cast<uint32_t>(tok.eos_id()));
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  const std::string missing = (dir() / "missing.model").string();
  EXPECT_EQ(error_of([&] { Tokenizer t(missing); }), "tokenizer '" + missing + "' does not exist");
  const std::string text = (dir() / "not_a_model.txt").string();
  std::ofstream(text) << "not a model\n";
  EXPECT_NE(error_of([&] { Tokenizer t(text); }).find("tokenizer '" + text + "' is not a SentencePiece model: "),
            std::string::npos);
  std::string why;
  EXPECT_EQ(Tokenizer::try_load(text, &why), nullptr);
  EXPECT_FALSE(why.empty());
  const auto loaded = Tokenizer::try_load(tokenizer_path(), &why);
  ASSERT_NE(loaded, nullptr);
  EXPECT_EQ(loaded->path(), tokenizer_path());
  EXPECT_EQ(loaded->serialized(), Tokenizer(tokenizer_path()).serialized());
}

}  // namespace
}  // namespace s3r::data
