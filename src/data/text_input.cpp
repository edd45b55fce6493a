// Text input of `s3r data prepare` and `s3r eval --text`: files and folders -> documents (see
// s3r/data/text_input.hpp).
// Contract: every file read is checked (gzip integrity, UTF-8 without NUL) before it is parsed;
// errors are s3r::Error naming the file (and line or byte), to which read_documents prefixes the
// command that reads; folders are walked in name order and what is skipped in them is reported
// as warnings, never read.
#include "s3r/data/text_input.hpp"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "s3r/core/error.hpp"

namespace s3r::data {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// (Appended, not "'" + s + "'": GCC 12 gives a false -Wrestrict warning on that.)
std::string quoted(const fs::path& p) { return std::string(1, '\'').append(p.string()).append(1, '\''); }

enum class Kind { kText, kJson, kUnknown };

// By the file name, ignoring case and a trailing .gz.
Kind kind_of(const fs::path& path) {
  std::string name = lower(path.filename().string());
  if (name.ends_with(".gz")) name.resize(name.size() - 3);
  for (const char* ext : {".txt", ".text", ".md"}) {
    if (name.ends_with(ext)) return Kind::kText;
  }
  for (const char* ext : {".json", ".jsonl"}) {
    if (name.ends_with(ext)) return Kind::kJson;
  }
  return Kind::kUnknown;
}

bool is_gzip_name(const fs::path& path) { return lower(path.filename().string()).ends_with(".gz"); }

// A .gz file, decompressed. Truncated or corrupt streams are errors: gzread returns 0 at a
// truncated stream as at a clean end, and only gzerror / gzclose tell the two apart; a file that
// is not gzip at all would be passed through as is ("transparent" reading), so gzdirect refuses it.
std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  if (gzdirect(f)) {
    gzclose(f);
    throw Error("'" + path +
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
    throw Error("'" + path + "' is a truncated or corrupt gzip file (zlib: " + what +
                ", after " + std::to_string(out.size()) + " decompressed bytes); hint: download or compress it again");
  }
  if (closed != Z_OK) {
    throw Error("'" + path + "' is a truncated or corrupt gzip file (zlib error " +
                std::to_string(closed) + " at its end); hint: download or compress it again");
  }
  return out;
}

std::string read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  std::string out;
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    out.append(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw Error("reading '" + path + "' failed: " + std::strerror(errno));
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
    throw Error("'" + path + "' holds a NUL byte " + where +
                ": it is binary, not text; hint: remove it from the inputs");
  }
  throw Error("'" + path + "' is not valid UTF-8 " + where +
              "; hint: convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)");
}

void parse_json(const std::string& path, const std::string& text, std::vector<std::string>& docs) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {  // one array of strings
    try {
      for (const auto& item : nlohmann::json::parse(text)) {
        if (!item.is_string()) throw Error("'" + path + "': array items must be strings");
        docs.push_back(item.get<std::string>());
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error("'" + path + "' is not valid JSON: " + e.what());
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
        throw Error("'" + path + "' line " + std::to_string(no) + " has no string field \"text\"");
      }
      docs.push_back(j["text"].get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      throw Error("'" + path + "' line " + std::to_string(no) + " is not valid JSON: " + e.what());
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
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte-order mark
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
  if (inputs.empty()) throw Error("no input files given");
  std::vector<InputFile> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (!fs::exists(st)) throw Error("input '" + in + "' does not exist");
    if (!fs::is_directory(st)) {
      const Kind kind = kind_of(in);
      files.push_back({in, kind == Kind::kUnknown ? Kind::kText : kind});
      continue;
    }
    std::vector<InputFile> found;
    std::vector<std::string> skipped;
    fs::recursive_directory_iterator it(in, ec), end;
    if (ec) throw Error("cannot list folder '" + in + "': " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) throw Error("cannot list folder '" + in + "': " + ec.message());
      const fs::directory_entry& e = *it;
      const fs::path& p = e.path();
      const bool dir = e.is_directory(ec);
      if (dir && exclude && exclude(p)) {
        it.disable_recursion_pending();
        skipped.push_back("skipping " + quoted(p) + ": it is the output folder or one of its temporary folders");
      } else if (p.filename().string().starts_with(".")) {
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
    throw Error("the inputs hold no documents (" + std::to_string(files.size()) + " files read, " +
                std::to_string(warnings.size()) + " skipped); hint: give text (.txt, .md), JSONL with a \"text\" "
                "field (.jsonl, .json) or these .gz");
  }
  return docs;
}

}  // namespace

std::vector<std::string> read_documents(const std::vector<std::string>& inputs, std::vector<std::string>* warnings,
                                        const std::function<bool(const fs::path&)>& is_output_folder,
                                        const std::string& command) {
  std::vector<std::string> local;
  try {
    return read_all(inputs, is_output_folder, warnings ? *warnings : local);
  } catch (const fs::filesystem_error& e) {
    throw Error(command + ": " + e.what());
  } catch (const Error& e) {  // the messages above name no command: the caller's goes first
    throw Error(command + ": " + e.what());
  }
}

}  // namespace s3r::data
