// `s3r data prepare`: every input format, a small end-to-end run, and its faults:
// bad, truncated and binary inputs, plain tokenizer-training errors, and a failed or killed run
// that leaves an existing dataset byte-identical.
#include "s3r/data/prepare.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"
#include "temp_dir.hpp"

namespace s3r::data {
namespace {

namespace fs = std::filesystem;

// A fresh folder `name` inside this process's own scratch folder: the same test run twice at once
// (ctest -j, a capped rerun beside the plain one) must not share datasets.
fs::path temp_dir(const std::string& name) {
  const fs::path dir = testing::process_temp_dir("s3r_prepare_test") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_gzip(const fs::path& p, const std::string& text) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// 400 documents of 30 words from a 16-word vocabulary, blank-line separated.
void write_corpus(const fs::path& p, unsigned seed = 1, int documents = 400) {
  std::mt19937 gen(seed);
  const std::vector<std::string> words = {"the", "quantized", "gradient", "rounds", "up", "down",
                                          "stochastic", "shared", "threshold", "token", "error",
                                          "mean", "layer", "model", "training", "loss"};
  std::ofstream out(p);
  for (int d = 0; d < documents; ++d) {
    for (int w = 0; w < 30; ++w) out << words[gen() % words.size()] << (w % 10 == 9 ? ".\n" : " ");
    out << "\n";
  }
}

// Every file under `dir` (relative name -> bytes): equal snapshots are byte-identical folders.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? read(e.path()) : "(folder)";
  }
  return files;
}

// Entries beside `dir` whose name starts with its name and a dot (OUT.tmp-*, OUT.old-*).
std::vector<std::string> siblings(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir.parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(dir.filename().string() + ".", 0) == 0) found.push_back(name);
  }
  return found;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "expected '" << (part) << "' in: " << (text)

const auto quiet = [](const std::string&) {};

// A dataset in `dir`/out from `dir`/corpus.txt (vocabulary 300).
PrepareOptions small_dataset(const fs::path& dir, int64_t vocab = 300) {
  write_corpus(dir / "corpus.txt");
  PrepareOptions o;
  o.inputs = {(dir / "corpus.txt").string()};
  o.out_dir = (dir / "out").string();
  o.vocab_size = vocab;
  o.val_fraction = 0.1;
  return o;
}

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

TEST(Prepare, ReadsMarkdownAndTextExtensionsAndDropsAByteOrderMark) {
  const fs::path dir = temp_dir("extensions");
  write(dir / "a.md", "\xEF\xBB\xBF# title\n\nbody\n");
  write(dir / "b.TEXT", "upper case extension\n");
  write_gzip(dir / "c.txt.gz", "compressed text\n");
  const std::vector<std::string> expected = {"# title", "body", "upper case extension", "compressed text"};
  EXPECT_EQ(read_documents({dir.string()}), expected);
}

// zlib's gzread returns 0 at a truncated stream as at a clean end; the old reader took the
// shorter text as the whole corpus.
TEST(Prepare, TruncatedGzipIsAnErrorNamingTheFile) {
  const fs::path dir = temp_dir("truncated_gzip");
  std::string text;
  std::mt19937 gen(3);
  for (int i = 0; i < 5000; ++i) text += "{\"text\": \"document " + std::to_string(gen()) + "\"}\n";
  write_gzip(dir / "whole.jsonl.gz", text);
  const std::string gz = read(dir / "whole.jsonl.gz");
  ASSERT_EQ(read_documents({(dir / "whole.jsonl.gz").string()}).size(), 5000u);
  // Cut in the middle of the deflate data, and cut only the 8-byte trailer (CRC and size) short.
  for (const size_t keep : {gz.size() / 2, gz.size() - 4}) {
    SCOPED_TRACE("kept " + std::to_string(keep) + " of " + std::to_string(gz.size()) + " bytes");
    write(dir / "cut.jsonl.gz", gz.substr(0, keep));
    const std::string e = error_of([&] { read_documents({dir.string() + "/cut.jsonl.gz"}); });
    EXPECT_CONTAINS(e, "cut.jsonl.gz' is a truncated or corrupt gzip file");
  }
  // Corrupt data inside the stream (its CRC no longer matches, or the deflate data is invalid).
  std::string bad = gz;
  for (size_t i = bad.size() / 3; i < bad.size() / 3 + 16; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5A);
  write(dir / "corrupt.jsonl.gz", bad);
  EXPECT_CONTAINS(error_of([&] { read_documents({(dir / "corrupt.jsonl.gz").string()}); }),
                  "corrupt.jsonl.gz' is a truncated or corrupt gzip file");
}

TEST(Prepare, GzipNameWithoutGzipContentIsAnError) {
  const fs::path dir = temp_dir("not_gzip");
  write(dir / "plain.jsonl.gz", "{\"text\": \"not compressed\"}\n");
  write(dir / "empty.txt.gz", "");
  for (const char* name : {"plain.jsonl.gz", "empty.txt.gz"}) {
    const std::string e = error_of([&] { read_documents({(dir / name).string()}); });
    EXPECT_CONTAINS(e, std::string(name) + "' is not gzip-compressed");
  }
}

TEST(Prepare, FolderSkipsUnknownBinaryAndHiddenFilesWithAWarning) {
  const fs::path dir = temp_dir("folder_skips");
  write(dir / "a.txt", "kept text\n");
  write(dir / "image.png", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
  write(dir / "table.csv", "text,that,is,not,read\n");
  write(dir / ".notes.txt", "hidden\n");
  fs::create_directories(dir / ".git");
  write(dir / ".git" / "HEAD.txt", "hidden folder\n");
  fs::create_directories(dir / "sub");
  write(dir / "sub" / "b.jsonl", "{\"text\": \"kept json\"}\n");
  write(dir / "sub" / "model.tar.gz", std::string("\x1f\x8b\x08\0\0\0\0\0", 8));
  std::vector<std::string> warnings;
  const std::vector<std::string> expected = {"kept text", "kept json"};
  EXPECT_EQ(read_documents({dir.string()}, &warnings), expected);
  ASSERT_EQ(warnings.size(), 5u);
  std::string all;
  for (const auto& w : warnings) all += w + "\n";
  for (const char* name : {"image.png'", "table.csv'", ".notes.txt'", ".git'", "model.tar.gz'"}) EXPECT_CONTAINS(all, name);
  // prepare passes them on through the progress callback and in its result.
  write_corpus(dir / "sub" / "corpus.txt");
  PrepareOptions o;
  o.inputs = {dir.string()};
  o.out_dir = (temp_dir("folder_skips_out") / "out").string();
  o.vocab_size = 300;
  std::vector<std::string> messages;
  const PrepareResult r = prepare(o, [&](const std::string& m) { messages.push_back(m); });
  EXPECT_EQ(r.warnings.size(), 5u);
  EXPECT_EQ(std::count_if(messages.begin(), messages.end(),
                          [](const std::string& m) { return m.rfind("warning: skipping", 0) == 0; }),
            5);
}

TEST(Prepare, BinaryOrNonUtf8FileUnderATextNameIsAnError) {
  const fs::path dir = temp_dir("binary_text");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nul.txt", std::string("line one\nline\0two\n", 18)},   // NUL byte
      {"latin1.txt", "caf\xE9 au lait\n"},                    // ISO-8859-1
      {"overlong.md", "a\xC0\x80 b\n"},                       // overlong NUL
      {"surrogate.jsonl", "{\"text\": \"\xED\xA0\x80\"}\n"},  // UTF-16 surrogate
      {"cut.txt", "ends mid character \xE2\x82"},             // truncated sequence
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    fs::remove_all(dir / "in");
    fs::create_directories(dir / "in");
    write(dir / "in" / name, bytes);
    const std::string e = error_of([&] { read_documents({(dir / "in").string()}); });
    EXPECT_CONTAINS(e, name + "'");
    EXPECT_CONTAINS(e, name == "nul.txt" ? "holds a NUL byte at byte 13 (line 2)" : "is not valid UTF-8 at byte");
  }
  write(dir / "fine.txt", "na\xC3\xAFve \xE2\x82\xAC \xF0\x9F\x98\x80\n");  // 2-, 3- and 4-byte characters
  EXPECT_EQ(read_documents({(dir / "fine.txt").string()}).size(), 1u);
}

TEST(Prepare, ExplicitFileWithAnUnknownExtensionIsReadAsTextIfItIsText) {
  const fs::path dir = temp_dir("explicit_unknown");
  write(dir / "corpus.dat", "some text\n\nmore text\n");
  write(dir / "blob.dat", std::string("\x7f" "ELF\2\1\1\0\0\0", 10));
  const std::vector<std::string> expected = {"some text", "more text"};
  EXPECT_EQ(read_documents({(dir / "corpus.dat").string()}), expected);
  EXPECT_CONTAINS(error_of([&] { read_documents({(dir / "blob.dat").string()}); }), "blob.dat' holds a NUL byte");
}

TEST(Prepare, VocabularyTooLargeOrTooSmallAndBadFractionArePlainMessages) {
  const fs::path dir = temp_dir("plain_errors");
  PrepareOptions o = small_dataset(dir);
  const auto message = [&](const PrepareOptions& opt) {
    const std::string e = error_of([&] { prepare(opt, quiet); });
    EXPECT_EQ(e.find(".cc("), std::string::npos) << "SentencePiece's internals leak: " << e;
    EXPECT_EQ(e.rfind("data prepare: ", 0), 0u) << e;
    return e;
  };
  o.vocab_size = 5000;  // the corpus has 16 words: SentencePiece finds fewer pieces
  std::string e = message(o);
  EXPECT_CONTAINS(e, "--vocab 5000 is too large for this text");
  EXPECT_CONTAINS(e, "hint: use --vocab ");
  o.vocab_size = 270;  // 256 bytes + 2 specials + more than 12 distinct characters
  e = message(o);
  EXPECT_CONTAINS(e, "--vocab 270 is too small for this text");
  EXPECT_CONTAINS(e, "hint: use --vocab 2");
  for (const int64_t v : {int64_t{0}, int64_t{100}, kMinVocab - 1, kMaxVocab + 1, int64_t{3000000000}}) {
    o.vocab_size = v;
    EXPECT_CONTAINS(message(o), "--vocab " + std::to_string(v) + " is out of range");
  }
  o.vocab_size = 300;
  for (const double f : {0.0, 1.0, -0.5, std::nan("")}) {
    o.val_fraction = f;
    EXPECT_CONTAINS(message(o), "--val-fraction");
  }
  o.val_fraction = 0.1;
  write(dir / "empty.txt", "\n\n   \n");
  o.inputs = {(dir / "empty.txt").string()};
  EXPECT_CONTAINS(message(o), "the inputs hold no documents");
  write(dir / "one.txt", "a single document\n");
  o.inputs = {(dir / "one.txt").string()};
  EXPECT_CONTAINS(message(o), "too few to split off a validation set");
  o.inputs = {(dir / "corpus.txt").string()};
  o.tokenizer_model = (dir / "corpus.txt").string();
  EXPECT_CONTAINS(message(o), "is not a SentencePiece model");
  o.tokenizer_model = (dir / "missing.model").string();
  EXPECT_CONTAINS(message(o), "missing.model' does not exist");
  EXPECT_FALSE(fs::exists(o.out_dir));
  EXPECT_TRUE(siblings(o.out_dir).empty());
}

// SentencePiece drops training sentences longer than 4192 bytes; documents of one long line
// (common in C4) left it nothing to learn from.
TEST(Prepare, LongLinesStillTrainTheTokenizer) {
  const fs::path dir = temp_dir("long_lines");
  std::mt19937 gen(5);
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"};
  {
    std::ofstream out(dir / "long.jsonl");
    for (int d = 0; d < 40; ++d) {
      std::string doc;
      while (doc.size() < 6000) doc += words[gen() % words.size()] + " ";
      if (d % 2) doc.erase(std::remove(doc.begin(), doc.end(), ' '), doc.end());  // no space to cut at
      out << "{\"text\": \"" << doc << "\"}\n";
    }
  }
  PrepareOptions o;
  o.inputs = {(dir / "long.jsonl").string()};
  o.out_dir = (dir / "out").string();
  o.vocab_size = 300;
  EXPECT_EQ(prepare(o, quiet).vocab, 300u);
}

// The dataset is replaced all or nothing: failures before or after the tokenizer is trained
// leave it as it was, and nothing beside it.
TEST(Prepare, FailedPrepareLeavesTheDatasetByteIdentical) {
  const fs::path dir = temp_dir("failed_keeps");
  const PrepareOptions o = small_dataset(dir);
  prepare(o, quiet);
  const auto before = snapshot(o.out_dir);
  ASSERT_EQ(before.size(), 5u);  // tokenizer.model, tokenizer.vocab, train.bin, val.bin, info.json
  write_corpus(dir / "other.txt", 7);
  const auto expect_kept = [&](const std::string& what) {
    EXPECT_EQ(snapshot(o.out_dir), before) << what;
    EXPECT_TRUE(siblings(o.out_dir).empty()) << what;
  };

  PrepareOptions bad_input = o;  // a bad file among the inputs
  write(dir / "bad.txt", std::string("text\0binary", 11));
  bad_input.inputs = {(dir / "other.txt").string(), (dir / "bad.txt").string()};
  EXPECT_CONTAINS(error_of([&] { prepare(bad_input, quiet); }), "bad.txt' holds a NUL byte");
  expect_kept("bad input");

  PrepareOptions too_large = o;  // fails inside SentencePiece training
  too_large.inputs = {(dir / "other.txt").string()};
  too_large.vocab_size = 5000;
  EXPECT_CONTAINS(error_of([&] { prepare(too_large, quiet); }), "too large for this text");
  expect_kept("vocabulary too large");

  PrepareOptions injected = o;  // fails after everything is written and verified
  injected.inputs = {(dir / "other.txt").string()};
  injected.vocab_size = 320;
  std::string seen;
  injected.before_swap = [&](const std::string& temp) {
    seen = temp;
    EXPECT_NE(fs::weakly_canonical(temp), fs::weakly_canonical(o.out_dir));
    EXPECT_EQ(read_shard(temp + "/train.bin").vocab, 320u);
    EXPECT_TRUE(fs::exists(temp + "/tokenizer.model"));
    throw Error("injected failure");
  };
  EXPECT_EQ(error_of([&] { prepare(injected, quiet); }), "injected failure");
  EXPECT_FALSE(seen.empty());
  EXPECT_FALSE(fs::exists(seen));
  expect_kept("failure injected before the swap");

  injected.before_swap = nullptr;  // and without the failure, the new dataset replaces the old
  EXPECT_EQ(prepare(injected, quiet).vocab, 320u);
  EXPECT_EQ(read_shard(o.out_dir + "/val.bin").vocab, 320u);
  EXPECT_NE(snapshot(o.out_dir), before);
  EXPECT_TRUE(siblings(o.out_dir).empty());
}

// A child process killed (SIGKILL) at the last moment before the swap: the dataset is intact,
// and the next prepare into the same folder removes what the killed one left.
TEST(Prepare, KilledPrepareLeavesTheDatasetAndTheNextRunCleansUp) {
  const fs::path dir = temp_dir("killed");
  const PrepareOptions o = small_dataset(dir);
  prepare(o, quiet);
  const auto before = snapshot(o.out_dir);
  PrepareOptions killed = o;
  killed.tokenizer_model = o.out_dir + "/tokenizer.model";  // no training threads in the child
  write_corpus(dir / "other.txt", 9);
  killed.inputs = {(dir / "other.txt").string()};
  killed.before_swap = [](const std::string&) { ::raise(SIGKILL); };
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      prepare(killed, quiet);
    } catch (...) {
    }
    ::_exit(3);  // not reached when the kill happens
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  EXPECT_EQ(snapshot(o.out_dir), before);
  const std::vector<std::string> left = siblings(o.out_dir);
  ASSERT_EQ(left, std::vector<std::string>{"out.tmp-" + std::to_string(child)});
  // A leftover of a process that is still running (pid 1) is left alone.
  fs::create_directories(dir / "out.tmp-1");
  killed.before_swap = nullptr;
  std::vector<std::string> messages;
  prepare(killed, [&](const std::string& m) { messages.push_back(m); });
  EXPECT_EQ(siblings(o.out_dir), std::vector<std::string>{"out.tmp-1"});
  EXPECT_EQ(read(o.out_dir + "/tokenizer.model"), before.at("tokenizer.model"));
  EXPECT_NE(read(o.out_dir + "/train.bin"), before.at("train.bin"));
  std::string all;
  for (const auto& m : messages) all += m + "\n";
  EXPECT_CONTAINS(all, "removed '" + (fs::weakly_canonical(dir) / left[0]).string() + "', left by a killed prepare");
  EXPECT_CONTAINS(all, "warning: leaving");
}

// The two-rename swap (file systems without RENAME_EXCHANGE) killed between its renames leaves
// the old dataset under OUT.old-<pid>; the next prepare puts it back before anything else, so
// a failing next prepare still leaves it intact.
TEST(Prepare, DatasetMovedAsideByAKilledSwapIsRestored) {
  const fs::path dir = temp_dir("restore");
  PrepareOptions o = small_dataset(dir);
  prepare(o, quiet);
  const auto before = snapshot(o.out_dir);
  const fs::path aside = dir / "out.old-999999999";  // no such process (above Linux's pid_max)
  fs::rename(o.out_dir, aside);
  fs::create_directories(dir / "out.tmp-999999998");
  o.before_swap = [](const std::string&) { throw Error("injected failure"); };
  EXPECT_EQ(error_of([&] { prepare(o, quiet); }), "injected failure");
  EXPECT_EQ(snapshot(o.out_dir), before);
  EXPECT_TRUE(siblings(o.out_dir).empty());
}

// Byte-identical output for the same input, also when the tokenizer trains on a sample of it.
TEST(Prepare, SameInputGivesTheSameDataset) {
  const fs::path dir = temp_dir("deterministic");
  PrepareOptions o = small_dataset(dir);
  o.max_training_sentences = 300;  // of 1200 lines
  prepare(o, quiet);
  const auto first = snapshot(o.out_dir);
  o.out_dir = (dir / "again").string();
  prepare(o, quiet);
  EXPECT_EQ(snapshot(o.out_dir), first);
}

TEST(Prepare, TokenizerInsideTheOutputFolderIsKept) {
  const fs::path dir = temp_dir("tokenizer_inside");
  PrepareOptions o = small_dataset(dir);
  prepare(o, quiet);
  const std::string model = read(o.out_dir + "/tokenizer.model");
  write_corpus(dir / "other.txt", 11);
  o.inputs = {(dir / "other.txt").string()};
  o.tokenizer_model = o.out_dir + "/tokenizer.model";
  const PrepareResult r = prepare(o, quiet);
  EXPECT_EQ(r.vocab, 300u);
  EXPECT_EQ(read(o.out_dir + "/tokenizer.model"), model);
  EXPECT_EQ(read_shard(o.out_dir + "/train.bin").tokens.size(), static_cast<size_t>(r.train_tokens));
  // A relative, un-normalized spelling of the same file works as well.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  o.out_dir = "out/";
  o.tokenizer_model = "./out/../out/tokenizer.model";
  EXPECT_NO_THROW(prepare(o, quiet));
  fs::current_path(cwd);
  EXPECT_EQ(read(dir / "out" / "tokenizer.model"), model);
  EXPECT_TRUE(siblings(dir / "out").empty());
}

// Preparing a folder into a subfolder of itself: the second run must not read the first's
// info.json (as JSON lines) or shards.
TEST(Prepare, OutputFolderInsideAnInputFolderIsSkipped) {
  const fs::path dir = temp_dir("out_inside_input");
  write_corpus(dir / "corpus.txt");
  PrepareOptions o;
  o.inputs = {dir.string()};
  o.out_dir = (dir / "data").string();
  o.vocab_size = 300;
  const PrepareResult first = prepare(o, quiet);
  const PrepareResult second = prepare(o, quiet);
  EXPECT_EQ(second.documents, first.documents);
  ASSERT_EQ(second.warnings.size(), 1u);
  EXPECT_CONTAINS(second.warnings[0], "it is the output folder");
}

TEST(Prepare, RefusesToReplaceAFolderItDidNotWrite) {
  const fs::path dir = temp_dir("refuse");
  PrepareOptions o = small_dataset(dir);
  fs::create_directories(o.out_dir);
  write(fs::path(o.out_dir) / "notes.txt", "mine\n");
  EXPECT_CONTAINS(error_of([&] { prepare(o, quiet); }), "holds 'notes.txt', which s3r data prepare does not write");
  EXPECT_EQ(read(fs::path(o.out_dir) / "notes.txt"), "mine\n");
  fs::remove(fs::path(o.out_dir) / "notes.txt");
  fs::create_directories(fs::path(o.out_dir) / "run");  // a subfolder (a training run, say)
  EXPECT_CONTAINS(error_of([&] { prepare(o, quiet); }), "holds 'run'");
  EXPECT_TRUE(fs::is_directory(fs::path(o.out_dir) / "run"));
  fs::remove(fs::path(o.out_dir) / "run");
  write(dir / "file", "a file\n");
  PrepareOptions onto_file = o;
  onto_file.out_dir = (dir / "file").string();
  EXPECT_CONTAINS(error_of([&] { prepare(onto_file, quiet); }), "exists and is not a folder");
  EXPECT_EQ(read(dir / "file"), "a file\n");
  EXPECT_NO_THROW(prepare(o, quiet));  // an empty folder is replaced
  EXPECT_TRUE(fs::exists(fs::path(o.out_dir) / "train.bin"));
}

}  // namespace
}  // namespace s3r::data
