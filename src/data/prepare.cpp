// `s3r data prepare` (see s3r/data/prepare.hpp): the options checked, the documents read
// (text_input.cpp), the SentencePiece tokenizer trained or loaded, every document encoded into the
// train and validation shards, all written into a temporary dataset folder that is verified and
// swapped in (dataset_folder.cpp). SentencePiece failures come back as plain messages with a hint.
#include "s3r/data/prepare.hpp"

#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "data/dataset_folder.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/test_pause.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/data/tokenizer.hpp"
#include "s3r/io/atomic_file.hpp"

// SentencePiece prints "Running command: ..." to stderr before it parses --minloglevel; its own
// SetMinLogLevel silences that too. 0.1.97 exports it from libsentencepiece without declaring it
// in a public header, so it is declared weak here: a build whose library lacks it skips the call.
namespace sentencepiece::logging {
[[gnu::weak]] void SetMinLogLevel(int v);
}

namespace s3r::data {

namespace fs = std::filesystem;

namespace {

// Longest line handed to the tokenizer trainer: SentencePiece silently drops sentences longer
// than its max_sentence_length (4192 bytes), so longer lines are cut at a space (or a character
// boundary) below it.
constexpr size_t kMaxTrainingLineBytes = 4000;

// The documents as training sentences for SentencePiece: each non-blank line, lines longer than
// kMaxTrainingLineBytes cut at a space (else at a character boundary). The documents are valid
// UTF-8 (checked on reading, or produced by the JSON parser).
class TrainingLines : public sentencepiece::SentenceIterator {
 public:
  explicit TrainingLines(const std::vector<std::string>& docs) : docs_(docs) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (doc_ < docs_.size()) {
      const std::string& d = docs_[doc_];
      if (pos_ >= d.size()) {
        ++doc_, pos_ = 0;
        continue;
      }
      size_t end = d.find('\n', pos_);
      if (end == std::string::npos) end = d.size();
      size_t stop = end, next = end + 1;
      if (end - pos_ > kMaxTrainingLineBytes) {
        stop = pos_ + kMaxTrainingLineBytes;
        const size_t space = d.rfind(' ', stop);
        if (space != std::string::npos && space > pos_) {
          stop = space, next = space + 1;
        } else {
          while (stop > pos_ + 1 && (static_cast<unsigned char>(d[stop]) & 0xC0) == 0x80) --stop;
          next = stop;
        }
      }
      line_.assign(d, pos_, stop - pos_);
      if (!line_.empty() && line_.back() == '\r') line_.pop_back();
      pos_ = next;
      if (line_.find_first_not_of(" \t\r") != std::string::npos) return;
    }
    done_ = true;
  }

  const std::vector<std::string>& docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
  bool done_ = false;
};

// SentencePiece's status text without its source location and check expression.
std::string plain_status(const std::string& sp) {
  const std::string plain = std::regex_replace(sp, std::regex(R"(^[A-Za-z ]+: \S+\(\d+\) \[[^\]]*\] *)"), "");
  return plain;
}

// `path` loaded as --tokenizer `given` (a copy of it, or the file itself); a plain message with a
// hint when SentencePiece cannot load it.
std::unique_ptr<Tokenizer> load_given_tokenizer(const std::string& path, const std::string& given) {
  std::string status;
  std::unique_ptr<Tokenizer> tok = Tokenizer::try_load(path, &status);
  if (tok) return tok;
  const std::string why = plain_status(status);
  throw Error("data prepare: --tokenizer '" + given + "' is not a SentencePiece model (" +
              (why.empty() ? "it does not parse as one" : why) + "); hint: give a tokenizer.model file");
}

// SentencePiece's status text ("Internal: ./src/trainer_interface.cc(580) [cond] message") as a
// plain message with a hint.
std::string explain_training_failure(const std::string& sp, int64_t vocab) {
  const std::string v = std::to_string(vocab);
  std::smatch m;
  if (std::regex_search(sp, m, std::regex(R"(smaller than required_chars\. *\d+ vs (\d+))"))) {
    const int64_t need = std::stoll(m[1].str());
    return "data prepare: --vocab " + v + " is too small for this text: a byte-fallback tokenizer needs 256 byte "
           "pieces, <unk> and end-of-text, plus one piece per distinct character (" + std::to_string(need - 258) +
           " here), " + std::to_string(need) + " in all; hint: use --vocab " + std::to_string(need) + " or more";
  }
  if (std::regex_search(sp, m, std::regex(R"(Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+))"))) {
    return "data prepare: --vocab " + v + " is too large for this text: SentencePiece finds only " + m[1].str() +
           " distinct pieces in it; hint: use --vocab " + m[1].str() + " or less, or give more text";
  }
  if (sp.find("sentences_.empty()") != std::string::npos) {
    return "data prepare: the inputs hold no sentence the tokenizer can learn from; hint: check that they hold text";
  }
  std::string plain = plain_status(sp);
  if (plain.empty()) plain = sp;
  return "data prepare: training the tokenizer failed: " + plain +
         "; hint: check --vocab (" + v + ") against the size of the text";
}

// The options checked before anything is read, a --tokenizer loaded once to see that it is one.
void check_options(const PrepareOptions& o) {
  if (o.out_dir.empty()) throw Error("data prepare: --out is required");
  if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0)) {
    std::ostringstream v;
    v << o.val_fraction;
    throw Error("data prepare: --val-fraction " + v.str() +
                " must be in (0, 1); hint: 0.05 holds out 5% of the documents");
  }
  const bool train_tokenizer = o.tokenizer_model.empty();
  if (train_tokenizer && (o.vocab_size < kMinVocab || o.vocab_size > kMaxVocab)) {
    throw Error("data prepare: --vocab " + std::to_string(o.vocab_size) + " is out of range: a byte-fallback "
                "tokenizer needs at least " + std::to_string(kMinVocab) + " pieces (256 byte pieces, <unk>, "
                "end-of-text and the characters of the text), and at most " + std::to_string(kMaxVocab) +
                " are allowed; hint: 4096 to 65536 suits most uses");
  }
  if (train_tokenizer && o.max_training_sentences <= 100) {  // SentencePiece's own minimum
    throw Error("data prepare: the number of tokenizer training sentences must be > 100, not " +
                std::to_string(o.max_training_sentences));
  }
  if (!train_tokenizer) {  // checked before the long part
    if (!fs::is_regular_file(o.tokenizer_model)) {
      throw Error("data prepare: --tokenizer '" + o.tokenizer_model + "' does not exist or is not a file");
    }
    load_given_tokenizer(o.tokenizer_model, o.tokenizer_model);
  }
}

// A byte-fallback BPE tokenizer of o.vocab_size pieces trained on the documents, written to
// `model_path`. SentencePiece's trainer: the one use of SentencePiece outside data/tokenizer.cpp.
void train_tokenizer_model(const std::vector<std::string>& docs, const PrepareOptions& o, const fs::path& model_path) {
  // No --model_prefix: the model comes back serialized, so that it records no (temporary) path
  // and the same input gives the same bytes.
  std::ostringstream args;
  args << "--vocab_size=" << o.vocab_size << " --model_type=bpe --character_coverage=1.0"
       << " --byte_fallback=true --pad_id=-1 --unk_id=0 --bos_id=-1 --eos_id=1"
       << " --input_sentence_size=" << o.max_training_sentences << " --shuffle_input_sentence=true"
       << " --minloglevel=3 --num_threads=2";
  if (sentencepiece::logging::SetMinLogLevel) sentencepiece::logging::SetMinLogLevel(3);
  sentencepiece::SetRandomGeneratorSeed(1);  // for the sample of sentences (0.1.97 fixes it anyway)
  TrainingLines lines(docs);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args.str(), &lines, &model);
  if (!status.ok()) throw Error(explain_training_failure(status.ToString(), o.vocab_size));
  io::write_file_atomic(model_path.string(), [&](std::ostream& s) {
    s.write(model.data(), static_cast<std::streamsize>(model.size()));
  });
}

// Every document encoded and followed by `eos`: the first `n_train` into train.bin, the rest into
// val.bin (in `tmp`). Returns what was written, info.json aside.
WrittenDataset write_shards(const std::vector<std::string>& docs, int64_t n_train, const Tokenizer& tok,
                            uint32_t eos, const fs::path& tmp, const Progress& say) {
  WrittenDataset written;
  written.vocab = static_cast<uint32_t>(tok.vocab());
  std::vector<uint32_t> train, val;
  for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(docs[i]);
    } catch (const Error&) {
      throw Error("data prepare: encoding document " + std::to_string(i) + " failed");
    }
    std::vector<uint32_t>& dst = i < n_train ? train : val;
    for (int32_t id : ids) dst.push_back(static_cast<uint32_t>(id));
    dst.push_back(eos);
    if ((i + 1) % 20000 == 0) {
      say("encoded " + std::to_string(i + 1) + " / " + std::to_string(docs.size()) + " documents");
    }
  }
  write_shard((tmp / "train.bin").string(), train, written.vocab);
  write_shard((tmp / "val.bin").string(), val, written.vocab);
  test_pause("prepare-write");  // info.json not yet written
  written.train_tokens = static_cast<int64_t>(train.size());
  written.val_tokens = static_cast<int64_t>(val.size());
  written.train_digest = token_digest(train);
  written.val_digest = token_digest(val);
  return written;
}

PrepareResult prepare_impl(const PrepareOptions& o, const Progress& progress) {
  const Progress say = [&](const std::string& m) {
    if (progress) progress(m);
  };
  check_options(o);
  const bool train_tokenizer = o.tokenizer_model.empty();
  const fs::path out = dataset_path(o.out_dir);
  clean_leftovers(out, say);
  check_replaceable(out, o.out_dir);

  say("reading inputs");
  std::vector<std::string> warnings;
  const std::vector<std::string> docs =
      read_documents(o.inputs, &warnings, [&](const fs::path& p) { return is_dataset_or_temporary(out, p); });
  constexpr size_t kShownWarnings = 20;
  for (size_t i = 0; i < warnings.size() && i < kShownWarnings; ++i) say("warning: " + warnings[i]);
  if (warnings.size() > kShownWarnings) {
    say("warning: ... and " + std::to_string(warnings.size() - kShownWarnings) + " more skipped");
  }
  say("read " + std::to_string(docs.size()) + " documents");
  const int64_t n_val = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(docs.size()) * o.val_fraction));
  const int64_t n_train = static_cast<int64_t>(docs.size()) - n_val;
  if (n_train < 1) {
    throw Error("data prepare: " + std::to_string(docs.size()) + " document(s) are too few to split off a "
                "validation set; hint: give at least 2 documents (blank lines separate documents in text files)");
  }

  // Everything is written into a temporary sibling of OUT, removed on any failure.
  const TempDatasetFolder temp_folder(out);
  const fs::path& tmp = temp_folder.path();
  const fs::path model_path = tmp / "tokenizer.model";

  std::unique_ptr<Tokenizer> tok;
  if (train_tokenizer) {
    say("training a " + std::to_string(o.vocab_size) + "-token SentencePiece BPE tokenizer");
    train_tokenizer_model(docs, o, model_path);
    std::string status;
    tok = Tokenizer::try_load(model_path.string(), &status);
    if (!tok) throw Error("data prepare: cannot load the trained tokenizer '" + model_path.string() + "': " + status);
    // The pieces and their scores, one a line, as SentencePiece's own .vocab.
    io::write_file_atomic((tmp / "tokenizer.vocab").string(), [&](std::ostream& s) {
      for (int32_t i = 0; i < tok->vocab(); ++i) s << tok->piece(i) << "\t" << tok->score(i) << "\n";
    });
  } else {
    // Copied first: --tokenizer may be OUT/tokenizer.model itself.
    fs::copy_file(o.tokenizer_model, model_path);
    tok = load_given_tokenizer(model_path.string(), o.tokenizer_model);
  }
  const uint32_t vocab = static_cast<uint32_t>(tok->vocab());
  if (train_tokenizer && vocab != static_cast<uint32_t>(o.vocab_size)) {
    throw Error("data prepare: the trained tokenizer has " + std::to_string(vocab) + " pieces, not --vocab " +
                std::to_string(o.vocab_size));
  }
  const int32_t eos = tok->eos_id() >= 0 ? tok->eos_id() : 0;

  WrittenDataset written = write_shards(docs, n_train, *tok, static_cast<uint32_t>(eos), tmp, say);
  PrepareResult result;
  result.documents = static_cast<int64_t>(docs.size());
  result.vocab = vocab;
  result.warnings = warnings;
  result.train_tokens = written.train_tokens;
  result.val_tokens = written.val_tokens;
  const nlohmann::json info = {{"documents", docs.size()}, {"train_documents", n_train},
                               {"val_documents", n_val}, {"train_tokens", result.train_tokens},
                               {"val_tokens", result.val_tokens}, {"vocab", vocab}, {"eos_id", eos}};
  io::write_file_atomic((tmp / "info.json").string(), [&](std::ostream& s) { s << info.dump(2) << "\n"; });
  written.info = info;
  verify_and_sync(tmp, written);  // what is on disk, before it replaces anything
  if (o.before_swap) o.before_swap(tmp.string());
  test_pause("prepare-before-swap");

  check_replaceable(out, o.out_dir);  // again: it may have changed while this ran
  swap_in(tmp, out, say);
  say("wrote " + std::to_string(result.train_tokens) + " training and " + std::to_string(result.val_tokens) +
      " validation tokens (vocabulary " + std::to_string(vocab) + ") to '" + o.out_dir + "'");
  return result;
}

}  // namespace

PrepareResult prepare(const PrepareOptions& options, const Progress& progress) {
  try {
    return prepare_impl(options, progress);
  } catch (const fs::filesystem_error& e) {
    throw Error(std::string("data prepare: ") + e.what());
  }
}

}  // namespace s3r::data
