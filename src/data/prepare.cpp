// `s3r data prepare`: see s3r/data/prepare.hpp.
#include "s3r/data/prepare.hpp"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"
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

using Progress = std::function<void(const std::string&)>;

// The files prepare writes into OUT; a folder holding only these may be replaced.
const std::set<std::string> kDatasetFiles = {"tokenizer.model", "tokenizer.vocab", "train.bin",
                                             "val.bin", "info.json",
                                             "tokenizer_corpus.txt"};  // (written by earlier versions)

// Longest line handed to the tokenizer trainer: SentencePiece silently drops sentences longer
// than its max_sentence_length (4192 bytes), so longer lines are cut at a space (or a character
// boundary) below it.
constexpr size_t kMaxTrainingLineBytes = 4000;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

enum class Kind { kText, kJson, kUnknown };

// By the file name, ignoring case and a trailing .gz.
Kind kind_of(const fs::path& path) {
  std::string name = lower(path.filename().string());
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  for (const char* ext : {".txt", ".text", ".md"}) {
    if (ends_with(name, ext)) return Kind::kText;
  }
  for (const char* ext : {".json", ".jsonl"}) {
    if (ends_with(name, ext)) return Kind::kJson;
  }
  return Kind::kUnknown;
}

bool is_gzip_name(const fs::path& path) { return ends_with(lower(path.filename().string()), ".gz"); }

// A .gz file, decompressed. Truncated or corrupt streams are errors: gzread returns 0 at a
// truncated stream as at a clean end, and only gzerror / gzclose tell the two apart; a file that
// is not gzip at all would be passed through as is ("transparent" reading), so gzdirect refuses it.
std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error("data prepare: cannot open '" + path + "': " + std::strerror(errno));
  if (gzdirect(f)) {
    gzclose(f);
    throw Error("data prepare: '" + path +
                "' is not gzip-compressed (no gzip header); hint: rename it without .gz if it is plain text");
  }
  std::string out;
  std::vector<char> buf(1 << 16);
  int n;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
    out.append(buf.data(), static_cast<size_t>(n));
  }
  int err = Z_OK;
  const char* zmsg = gzerror(f, &err);
  const std::string what = zmsg ? zmsg : "";
  const int closed = gzclose(f);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    throw Error("data prepare: '" + path + "' is a truncated or corrupt gzip file (zlib: " + what +
                ", after " + std::to_string(out.size()) + " decompressed bytes); hint: download or compress it again");
  }
  if (closed != Z_OK) {
    throw Error("data prepare: '" + path + "' is a truncated or corrupt gzip file (zlib error " +
                std::to_string(closed) + " at its end); hint: download or compress it again");
  }
  return out;
}

std::string read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("data prepare: cannot open '" + path + "': " + std::strerror(errno));
  std::string out;
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    out.append(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw Error("data prepare: reading '" + path + "' failed: " + std::strerror(errno));
  return out;
}

// Offset of the first NUL byte or invalid UTF-8 sequence (overlong forms, surrogates and code
// points above U+10FFFF included), or npos.
size_t first_non_text_byte(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      if (c == 0) return i;
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c == 0xE0) {
      len = 3, lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      len = 3;
    } else if (c == 0xED) {
      len = 3, hi = 0x9F;
    } else if (c == 0xF0) {
      len = 4, lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
      len = 4;
    } else if (c == 0xF4) {
      len = 4, hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string::npos;
}

// Refuses binary or non-UTF-8 content, naming the file, the byte and the line.
void check_text(const std::string& path, const std::string& text) {
  const size_t bad = first_non_text_byte(text);
  if (bad == std::string::npos) return;
  const int64_t line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
  const std::string where = "at byte " + std::to_string(bad) + " (line " + std::to_string(line) + ")";
  if (text[bad] == '\0') {
    throw Error("data prepare: '" + path + "' holds a NUL byte " + where +
                ": it is binary, not text; hint: remove it from the inputs");
  }
  throw Error("data prepare: '" + path + "' is not valid UTF-8 " + where +
              "; hint: convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)");
}

void parse_json(const std::string& path, const std::string& text, std::vector<std::string>& docs) {
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
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        throw Error("data prepare: '" + path + "' line " + std::to_string(no) + " has no string field \"text\"");
      }
      docs.push_back(j["text"].get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      throw Error("data prepare: '" + path + "' line " + std::to_string(no) + " is not valid JSON: " + e.what());
    }
  }
}

// Plain text: documents are separated by blank lines.
void parse_text(const std::string& text, std::vector<std::string>& docs) {
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

void add_file(const std::string& path, Kind kind, std::vector<std::string>& docs) {
  std::string text = is_gzip_name(path) ? read_gzip(path) : read_plain(path);
  check_text(path, text);
  if (starts_with(text, "\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte-order mark
  if (kind == Kind::kJson) {
    parse_json(path, text, docs);
  } else {
    parse_text(text, docs);
  }
}

struct InputFile {
  std::string path;
  Kind kind;
};

// The files to read, in order: explicit files as given; folders recursively, in name order,
// skipping (with a warning) what is not a known text format, hidden entries, non-regular files,
// and `exclude` (the output folder and its temporary siblings).
std::vector<InputFile> collect_files(const std::vector<std::string>& inputs,
                                     const std::function<bool(const fs::path&)>& exclude,
                                     std::vector<std::string>& warnings) {
  if (inputs.empty()) throw Error("data prepare: no input files given");
  std::vector<InputFile> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (!fs::exists(st)) throw Error("data prepare: input '" + in + "' does not exist");
    if (!fs::is_directory(st)) {
      const Kind kind = kind_of(in);
      files.push_back({in, kind == Kind::kUnknown ? Kind::kText : kind});
      continue;
    }
    std::vector<InputFile> found;
    std::vector<std::string> skipped;
    fs::recursive_directory_iterator it(in, ec), end;
    if (ec) throw Error("data prepare: cannot list folder '" + in + "': " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) throw Error("data prepare: cannot list folder '" + in + "': " + ec.message());
      const fs::directory_entry& e = *it;
      const fs::path& p = e.path();
      const bool dir = e.is_directory(ec);
      if (dir && exclude && exclude(p)) {
        it.disable_recursion_pending();
        skipped.push_back("skipping " + quoted(p) + ": it is the output folder or one of its temporary folders");
      } else if (starts_with(p.filename().string(), ".")) {
        if (dir) it.disable_recursion_pending();
        skipped.push_back("skipping hidden " + std::string(dir ? "folder " : "file ") + quoted(p));
      } else if (dir && e.is_symlink(ec)) {
        skipped.push_back("skipping " + quoted(p) + ": a symbolic link to a folder (name the folder itself)");
      } else if (dir) {
        continue;
      } else if (!e.is_regular_file(ec)) {
        skipped.push_back("skipping " + quoted(p) + ": not a regular file");
      } else if (const Kind kind = kind_of(p); kind == Kind::kUnknown) {
        skipped.push_back("skipping " + quoted(p) +
                          ": not a .txt, .text, .md, .json or .jsonl file (nor one of these .gz)");
      } else {
        found.push_back({p.string(), kind});
      }
    }
    std::sort(found.begin(), found.end(), [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
    std::sort(skipped.begin(), skipped.end());
    files.insert(files.end(), found.begin(), found.end());
    warnings.insert(warnings.end(), skipped.begin(), skipped.end());
  }
  return files;
}

std::vector<std::string> read_all(const std::vector<std::string>& inputs,
                                  const std::function<bool(const fs::path&)>& exclude,
                                  std::vector<std::string>& warnings) {
  const std::vector<InputFile> files = collect_files(inputs, exclude, warnings);
  std::vector<std::string> docs;
  for (const InputFile& f : files) add_file(f.path, f.kind, docs);
  if (docs.empty()) {
    throw Error("data prepare: the inputs hold no documents (" + std::to_string(files.size()) + " files read, " +
                std::to_string(warnings.size()) + " skipped); hint: give text (.txt, .md), JSONL with a \"text\" "
                "field (.jsonl, .json) or these .gz");
  }
  return docs;
}

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

void check_tokenizer_loaded(const sentencepiece::util::Status& status, const std::string& path) {
  if (status.ok()) return;
  const std::string why = plain_status(status.ToString());
  throw Error("data prepare: --tokenizer '" + path + "' is not a SentencePiece model (" +
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

uint64_t digest(const std::vector<uint32_t>& tokens) {  // FNV-1a over the token values
  uint64_t h = 1469598103934665603ull;
  for (uint32_t t : tokens) h = (h ^ t) * 1099511628211ull;
  return h;
}

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// The pid in NAME.tmp-<pid> / NAME.old-<pid>, or -1.
long leftover_pid(const std::string& entry, const std::string& prefix) {
  if (!starts_with(entry, prefix) || entry.size() == prefix.size() || entry.size() - prefix.size() > 9) return -1;
  const std::string digits = entry.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stol(digits);
}

// Cleans what a killed prepare into `out` left beside it: OUT.old-<pid> (the old dataset, moved
// aside by the two-rename swap) goes back to OUT when OUT is missing; other OUT.old-<pid> and
// OUT.tmp-<pid> folders of processes that are gone are removed.
void clean_leftovers(const fs::path& out, const Progress& say) {
  const fs::path parent = out.parent_path();
  const std::string name = out.filename().string();
  std::vector<std::pair<fs::path, bool>> found;  // (path, is .old)
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    const long tmp_pid = leftover_pid(entry, name + ".tmp-"), old_pid = leftover_pid(entry, name + ".old-");
    const long pid = std::max(tmp_pid, old_pid);
    std::error_code e2;
    // (This process's own temporary folder is replaced by prepare itself.)
    if (pid < 0 || pid == static_cast<long>(::getpid()) || !it->is_directory(e2) || it->is_symlink(e2)) continue;
    if (process_alive(pid)) {
      say("warning: leaving " + quoted(it->path()) + ": process " + std::to_string(pid) +
          " that wrote it is still running (another prepare into the same folder?)");
      continue;
    }
    found.push_back({it->path(), old_pid >= 0});
  }
  std::sort(found.begin(), found.end());
  for (const auto& [path, is_old] : found) {
    if (is_old && !fs::exists(fs::symlink_status(out))) {
      fs::rename(path, out);
      io::sync_parent(out.string());
      say("restored " + quoted(out) + " from " + quoted(path) + ", left by a killed prepare");
    } else {
      fs::remove_all(path);
      say("removed " + quoted(path) + ", left by a killed prepare");
    }
  }
}

// Throws unless `out` is missing, an empty folder, or a folder of dataset files only.
void check_replaceable(const fs::path& out, const std::string& given) {
  const fs::file_status st = fs::symlink_status(out);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) {
    throw Error("data prepare: --out '" + given + "' exists and is not a folder; hint: choose another --out");
  }
  for (const auto& e : fs::directory_iterator(out)) {
    std::string name = e.path().filename().string();
    const std::string base = ends_with(name, ".tmp") ? name.substr(0, name.size() - 4) : name;
    if (!kDatasetFiles.count(base) || !fs::is_regular_file(e.symlink_status())) {
      throw Error("data prepare: --out '" + given + "' holds '" + name +
                  "', which s3r data prepare does not write, so it will not replace that folder; hint: give a new "
                  "or empty folder as --out, or move '" + name + "' away");
    }
  }
}

// Removes a folder when it goes out of scope (the temporary folder on any failure).
struct RemoveOnExit {
  fs::path path;
  ~RemoveOnExit() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

// Puts `tmp` in place of `out`; on return the old content of `out` (if any) is in `tmp` or gone.
void swap_in(const fs::path& tmp, const fs::path& out, const Progress& say) {
  if (!fs::exists(fs::symlink_status(out))) {
    if (::rename(tmp.c_str(), out.c_str()) != 0) {
      throw Error("data prepare: cannot rename " + quoted(tmp) + " to " + quoted(out) + ": " + std::strerror(errno));
    }
    io::sync_parent(out.string());
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    io::sync_parent(out.string());  // the old dataset is now under `tmp`, removed by the caller
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP) {
    throw Error("data prepare: cannot swap " + quoted(tmp) + " in as " + quoted(out) + ": " + std::strerror(errno));
  }
  // No atomic exchange on this file system: two renames. A kill between them leaves the old
  // dataset under OUT.old-<pid>, which clean_leftovers puts back.
  const fs::path old = out.parent_path() / (out.filename().string() + ".old-" + std::to_string(::getpid()));
  if (::rename(out.c_str(), old.c_str()) != 0) {
    throw Error("data prepare: cannot rename " + quoted(out) + " to " + quoted(old) + ": " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::rename(old.c_str(), out.c_str());
    throw Error("data prepare: cannot rename " + quoted(tmp) + " to " + quoted(out) + ": " + why);
  }
  io::sync_parent(out.string());
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec) say("warning: cannot remove the old dataset " + quoted(old) + ": " + ec.message());
}

PrepareResult prepare_impl(const PrepareOptions& o, const Progress& progress) {
  const Progress say = [&](const std::string& m) {
    if (progress) progress(m);
  };
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
    sentencepiece::SentencePieceProcessor given;
    check_tokenizer_loaded(given.Load(o.tokenizer_model), o.tokenizer_model);
  }

  const fs::path out = fs::weakly_canonical(fs::absolute(o.out_dir));
  if (out.filename().empty() || out == out.root_path()) {
    throw Error("data prepare: --out '" + o.out_dir + "' cannot be a file system root");
  }
  const std::string name = out.filename().string();
  clean_leftovers(out, say);
  check_replaceable(out, o.out_dir);

  say("reading inputs");
  std::vector<std::string> warnings;
  const auto is_output = [&](const fs::path& p) {
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(p, ec);
    if (ec) return false;
    const std::string n = c.filename().string();
    return c == out || (c.parent_path() == out.parent_path() &&
                        (starts_with(n, name + ".tmp-") || starts_with(n, name + ".old-")));
  };
  const std::vector<std::string> docs = read_all(o.inputs, is_output, warnings);
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
  const fs::path tmp = out.parent_path() / (name + ".tmp-" + std::to_string(::getpid()));
  fs::create_directories(out.parent_path());
  fs::remove_all(tmp);
  RemoveOnExit remove_tmp{tmp};
  fs::create_directory(tmp);
  const fs::path model_path = tmp / "tokenizer.model";

  if (train_tokenizer) {
    say("training a " + std::to_string(o.vocab_size) + "-token SentencePiece BPE tokenizer");
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
  } else {
    // Copied first: --tokenizer may be OUT/tokenizer.model itself.
    fs::copy_file(o.tokenizer_model, model_path);
  }
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(model_path.string()); !status.ok()) {
    if (train_tokenizer) {
      throw Error("data prepare: cannot load the trained tokenizer " + quoted(model_path) + ": " + status.ToString());
    }
    check_tokenizer_loaded(status, o.tokenizer_model);
  }
  if (train_tokenizer) {  // the pieces and their scores, one a line, as SentencePiece's own .vocab
    io::write_file_atomic((tmp / "tokenizer.vocab").string(), [&](std::ostream& s) {
      for (int i = 0; i < sp.GetPieceSize(); ++i) s << sp.IdToPiece(i) << "\t" << sp.GetScore(i) << "\n";
    });
  }
  const uint32_t vocab = static_cast<uint32_t>(sp.GetPieceSize());
  if (train_tokenizer && vocab != static_cast<uint32_t>(o.vocab_size)) {
    throw Error("data prepare: the trained tokenizer has " + std::to_string(vocab) + " pieces, not --vocab " +
                std::to_string(o.vocab_size));
  }
  const int eos = sp.eos_id() >= 0 ? sp.eos_id() : 0;

  PrepareResult result;
  result.documents = static_cast<int64_t>(docs.size());
  result.vocab = vocab;
  result.warnings = warnings;
  uint64_t digests[2];
  {
    std::vector<uint32_t> train, val;
    std::vector<int> ids;
    for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
      if (!sp.Encode(docs[i], &ids).ok()) {
        throw Error("data prepare: encoding document " + std::to_string(i) + " failed");
      }
      std::vector<uint32_t>& dst = i < n_train ? train : val;
      for (int id : ids) dst.push_back(static_cast<uint32_t>(id));
      dst.push_back(static_cast<uint32_t>(eos));
      if ((i + 1) % 20000 == 0) {
        say("encoded " + std::to_string(i + 1) + " / " + std::to_string(docs.size()) + " documents");
      }
    }
    write_shard((tmp / "train.bin").string(), train, vocab);
    write_shard((tmp / "val.bin").string(), val, vocab);
    result.train_tokens = static_cast<int64_t>(train.size());
    result.val_tokens = static_cast<int64_t>(val.size());
    digests[0] = digest(train);
    digests[1] = digest(val);
  }
  const nlohmann::json info = {{"documents", docs.size()}, {"train_documents", n_train},
                               {"val_documents", n_val}, {"train_tokens", result.train_tokens},
                               {"val_tokens", result.val_tokens}, {"vocab", vocab}, {"eos_id", eos}};
  io::write_file_atomic((tmp / "info.json").string(), [&](std::ostream& s) { s << info.dump(2) << "\n"; });

  // Verify what is on disk before it replaces anything.
  const char* shard_names[2] = {"train.bin", "val.bin"};
  const int64_t counts[2] = {result.train_tokens, result.val_tokens};
  for (int k = 0; k < 2; ++k) {
    const TokenShard s = read_shard((tmp / shard_names[k]).string());
    if (s.vocab != vocab || static_cast<int64_t>(s.tokens.size()) != counts[k] || digest(s.tokens) != digests[k]) {
      throw Error("data prepare: verifying " + quoted(tmp / shard_names[k]) + " failed: it reads back with " +
                  std::to_string(s.tokens.size()) + " tokens of vocabulary " + std::to_string(s.vocab) + ", written " +
                  std::to_string(counts[k]) + " of " + std::to_string(vocab) + " (disk or file system fault?)");
    }
  }
  {
    std::ifstream in(tmp / "info.json");
    const nlohmann::json back = nlohmann::json::parse(in, nullptr, false);
    if (back != info) {
      throw Error("data prepare: verifying " + quoted(tmp / "info.json") + " failed: it reads back differently");
    }
  }
  for (const char* f : {"tokenizer.model", "tokenizer.vocab", "train.bin", "val.bin", "info.json"}) {
    if (fs::exists(tmp / f)) io::sync_path((tmp / f).string());
  }
  io::sync_path(tmp.string());
  if (o.before_swap) o.before_swap(tmp.string());

  check_replaceable(out, o.out_dir);  // again: it may have changed while this ran
  swap_in(tmp, out, say);
  say("wrote " + std::to_string(result.train_tokens) + " training and " + std::to_string(result.val_tokens) +
      " validation tokens (vocabulary " + std::to_string(vocab) + ") to '" + o.out_dir + "'");
  return result;
}

}  // namespace

std::vector<std::string> read_documents(const std::vector<std::string>& inputs, std::vector<std::string>* warnings) {
  std::vector<std::string> local;
  try {
    return read_all(inputs, nullptr, warnings ? *warnings : local);
  } catch (const fs::filesystem_error& e) {
    throw Error(std::string("data prepare: ") + e.what());
  }
}

PrepareResult prepare(const PrepareOptions& options, const Progress& progress) {
  try {
    return prepare_impl(options, progress);
  } catch (const fs::filesystem_error& e) {
    throw Error(std::string("data prepare: ") + e.what());
  }
}

}  // namespace s3r::data
