// `s3r data prepare`: see s3r/data/prepare.hpp.
#include "s3r/data/prepare.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"

namespace s3r::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The whole file, gunzipped when it ends in .gz.
std::string read_file(const std::string& path) {
  if (ends_with(path, ".gz")) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) throw Error("data prepare: cannot open '" + path + "'");
    std::string out;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    const bool bad = n < 0;
    gzclose(f);
    if (bad) throw Error("data prepare: '" + path + "' is not a valid gzip file");
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("data prepare: cannot open '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void add_file(const std::string& path, std::vector<std::string>& docs) {
  const std::string text = read_file(path);
  const std::string base = ends_with(path, ".gz") ? path.substr(0, path.size() - 3) : path;
  if (ends_with(base, ".json") || ends_with(base, ".jsonl")) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '[') {  // one array of strings
      try {
        for (const auto& item : nlohmann::json::parse(text)) {
          if (!item.is_string()) throw Error("data prepare: '" + path + "': array items must be strings");
          docs.push_back(item.get<std::string>());
        }
      } catch (const nlohmann::json::exception& e) {
        throw Error("data prepare: '" + path + "' is not valid JSON: " + e.what());
      }
      return;
    }
    std::istringstream lines(text);
    std::string line;
    for (int64_t no = 1; std::getline(lines, line); ++no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("text") || !j["text"].is_string()) {
          throw Error("data prepare: '" + path + "' line " + std::to_string(no) + " has no string field \"text\"");
        }
        docs.push_back(j["text"].get<std::string>());
      } catch (const nlohmann::json::exception& e) {
        throw Error("data prepare: '" + path + "' line " + std::to_string(no) + " is not valid JSON: " + e.what());
      }
    }
    return;
  }
  // Plain text: documents are separated by blank lines.
  std::istringstream lines(text);
  std::string line, doc;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!doc.empty()) docs.push_back(doc), doc.clear();
    } else {
      doc += doc.empty() ? line : "\n" + line;
    }
  }
  if (!doc.empty()) docs.push_back(doc);
}

}  // namespace

std::vector<std::string> read_documents(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw Error("data prepare: no input files given");
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        if (e.is_regular_file()) found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(in)) {
      files.push_back(in);
    } else {
      throw Error("data prepare: input '" + in + "' does not exist");
    }
  }
  std::vector<std::string> docs;
  for (const std::string& f : files) add_file(f, docs);
  if (docs.empty()) throw Error("data prepare: the inputs hold no documents");
  return docs;
}

PrepareResult prepare(const PrepareOptions& o,
                      const std::function<void(const std::string&)>& progress) {
  if (o.out_dir.empty()) throw Error("data prepare: --out is required");
  if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0)) throw Error("data prepare: --val-fraction must be in (0, 1)");
  fs::create_directories(o.out_dir);
  progress("reading inputs");
  const std::vector<std::string> docs = read_documents(o.inputs);
  progress("read " + std::to_string(docs.size()) + " documents");
  const std::string model_path = (fs::path(o.out_dir) / "tokenizer.model").string();
  if (o.tokenizer_model.empty()) {
    const std::string corpus = (fs::path(o.out_dir) / "tokenizer_corpus.txt").string();
    {
      std::ofstream out(corpus);
      for (const std::string& d : docs) {
        std::string line = d;
        std::replace(line.begin(), line.end(), '\n', ' ');
        out << line << "\n";
      }
    }
    progress("training a " + std::to_string(o.vocab_size) + "-token SentencePiece BPE tokenizer");
    std::ostringstream args;
    args << "--input=" << corpus << " --model_prefix=" << (fs::path(o.out_dir) / "tokenizer").string()
         << " --vocab_size=" << o.vocab_size << " --model_type=bpe --character_coverage=1.0"
         << " --byte_fallback=true --pad_id=-1 --unk_id=0 --bos_id=-1 --eos_id=1"
         << " --input_sentence_size=" << o.max_training_sentences << " --shuffle_input_sentence=true"
         << " --minloglevel=2 --num_threads=2";
    const auto status = sentencepiece::SentencePieceTrainer::Train(args.str());
    if (!status.ok()) throw Error("data prepare: SentencePiece training failed: " + status.ToString());
    fs::remove(corpus);
  } else if (fs::absolute(o.tokenizer_model) != fs::absolute(model_path)) {
    fs::copy_file(o.tokenizer_model, model_path, fs::copy_options::overwrite_existing);
  }
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(model_path);
  if (!status.ok()) throw Error("data prepare: cannot load tokenizer '" + model_path + "': " + status.ToString());
  const uint32_t vocab = static_cast<uint32_t>(sp.GetPieceSize());
  const int eos = sp.eos_id() >= 0 ? sp.eos_id() : 0;
  const int64_t n_val = std::max<int64_t>(1, static_cast<int64_t>(docs.size() * o.val_fraction));
  const int64_t n_train = static_cast<int64_t>(docs.size()) - n_val;
  if (n_train < 1) throw Error("data prepare: too few documents to split off a validation set");
  std::vector<uint32_t> train, val;
  std::vector<int> ids;
  for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
    if (!sp.Encode(docs[i], &ids).ok()) throw Error("data prepare: encoding document " + std::to_string(i) + " failed");
    std::vector<uint32_t>& dst = i < n_train ? train : val;
    for (int id : ids) dst.push_back(static_cast<uint32_t>(id));
    dst.push_back(static_cast<uint32_t>(eos));
    if ((i + 1) % 20000 == 0) progress("encoded " + std::to_string(i + 1) + " / " + std::to_string(docs.size()) + " documents");
  }
  write_shard((fs::path(o.out_dir) / "train.bin").string(), train, vocab);
  write_shard((fs::path(o.out_dir) / "val.bin").string(), val, vocab);
  nlohmann::json info = {{"documents", docs.size()}, {"train_documents", n_train},
                         {"val_documents", n_val}, {"train_tokens", train.size()},
                         {"val_tokens", val.size()}, {"vocab", vocab}, {"eos_id", eos}};
  std::ofstream(fs::path(o.out_dir) / "info.json") << info.dump(2) << "\n";
  progress("wrote " + std::to_string(train.size()) + " training and " + std::to_string(val.size()) +
           " validation tokens (vocabulary " + std::to_string(vocab) + ")");
  return PrepareResult{static_cast<int64_t>(docs.size()), static_cast<int64_t>(train.size()),
                       static_cast<int64_t>(val.size()), vocab};
}

}  // namespace s3r::data
