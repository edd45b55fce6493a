// The all-or-nothing dataset folder of `s3r data prepare`: see dataset_folder.hpp (contract) and
// s3r/data/prepare.hpp ("Output, all or nothing"). Linux only: renameat2(RENAME_EXCHANGE), with two
// renames where the file system lacks it; leftovers are recognized by the pid in their names.
#include "data/dataset_folder.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "s3r/core/error.hpp"
#include "s3r/core/test_pause.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::data {

namespace fs = std::filesystem;

namespace {

// The files prepare writes into OUT; a folder holding only these may be replaced.
const std::set<std::string> kDatasetFiles = {"tokenizer.model", "tokenizer.vocab", "train.bin",
                                             "val.bin", "info.json",
                                             "tokenizer_corpus.txt"};  // (written by earlier versions)

// (Appended, not "'" + s + "'": GCC 12 gives a false -Wrestrict warning on that.)
std::string quoted(const fs::path& p) { return std::string(1, '\'').append(p.string()).append(1, '\''); }

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// The pid in NAME.tmp-<pid> / NAME.old-<pid>, or -1.
long leftover_pid(const std::string& entry, const std::string& prefix) {
  if (!entry.starts_with(prefix) || entry.size() == prefix.size() || entry.size() - prefix.size() > 9) return -1;
  const std::string digits = entry.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stol(digits);
}

}  // namespace

fs::path dataset_path(const std::string& given) {
  const fs::path out = fs::weakly_canonical(fs::absolute(given));
  if (out.filename().empty() || out == out.root_path()) {
    throw Error("data prepare: --out '" + given + "' cannot be a file system root");
  }
  return out;
}

bool is_dataset_or_temporary(const fs::path& out, const fs::path& p) {
  const std::string name = out.filename().string();
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  if (ec) return false;
  const std::string n = c.filename().string();
  return c == out || (c.parent_path() == out.parent_path() &&
                      (n.starts_with(name + ".tmp-") || n.starts_with(name + ".old-")));
}

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

void check_replaceable(const fs::path& out, const std::string& given) {
  const fs::file_status st = fs::symlink_status(out);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) {
    throw Error("data prepare: --out '" + given + "' exists and is not a folder; hint: choose another --out");
  }
  for (const auto& e : fs::directory_iterator(out)) {
    std::string name = e.path().filename().string();
    const std::string base = name.ends_with(".tmp") ? name.substr(0, name.size() - 4) : name;
    if (!kDatasetFiles.count(base) || !fs::is_regular_file(e.symlink_status())) {
      throw Error("data prepare: --out '" + given + "' holds '" + name +
                  "', which s3r data prepare does not write, so it will not replace that folder; hint: give a new "
                  "or empty folder as --out, or move '" + name + "' away");
    }
  }
}

TempDatasetFolder::TempDatasetFolder(const fs::path& out)
    : path_(out.parent_path() / (out.filename().string() + ".tmp-" + std::to_string(::getpid()))) {
  fs::create_directories(out.parent_path());
  fs::remove_all(path_);
  fs::create_directory(path_);
}

TempDatasetFolder::~TempDatasetFolder() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

uint64_t token_digest(const std::vector<uint32_t>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t t : tokens) h = (h ^ t) * 1099511628211ull;
  return h;
}

void verify_and_sync(const fs::path& dir, const WrittenDataset& written) {
  const uint32_t vocab = written.vocab;
  const char* shard_names[2] = {"train.bin", "val.bin"};
  const int64_t counts[2] = {written.train_tokens, written.val_tokens};
  const uint64_t digests[2] = {written.train_digest, written.val_digest};
  for (int k = 0; k < 2; ++k) {
    const TokenShard s = read_shard((dir / shard_names[k]).string());
    if (s.vocab != vocab || static_cast<int64_t>(s.tokens.size()) != counts[k] ||
        token_digest(s.tokens) != digests[k]) {
      throw Error("data prepare: verifying " + quoted(dir / shard_names[k]) + " failed: it reads back with " +
                  std::to_string(s.tokens.size()) + " tokens of vocabulary " + std::to_string(s.vocab) + ", written " +
                  std::to_string(counts[k]) + " of " + std::to_string(vocab) + " (disk or file system fault?)");
    }
  }
  {
    std::ifstream in(dir / "info.json");
    const nlohmann::json back = nlohmann::json::parse(in, nullptr, false);
    if (back != written.info) {
      throw Error("data prepare: verifying " + quoted(dir / "info.json") + " failed: it reads back differently");
    }
  }
  for (const char* f : {"tokenizer.model", "tokenizer.vocab", "train.bin", "val.bin", "info.json"}) {
    if (fs::exists(dir / f)) io::sync_path((dir / f).string());
  }
  io::sync_path(dir.string());
}

void swap_in(const fs::path& tmp, const fs::path& out, const Progress& say) {
  if (!fs::exists(fs::symlink_status(out))) {
    if (::rename(tmp.c_str(), out.c_str()) != 0) {
      throw Error("data prepare: cannot rename " + quoted(tmp) + " to " + quoted(out) + ": " + std::strerror(errno));
    }
    io::sync_parent(out.string());
    return;
  }
  // (A test that pauses between the two renames takes that path on any file system.)
  const bool exchange = !test_pause_armed("prepare-swap-renames");
  if (exchange && ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    io::sync_parent(out.string());  // the old dataset is now under `tmp`, removed by the caller
    test_pause("prepare-swapped");
    return;
  }
  if (exchange && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP) {
    throw Error("data prepare: cannot swap " + quoted(tmp) + " in as " + quoted(out) + ": " + std::strerror(errno));
  }
  // No atomic exchange on this file system: two renames. A kill between them leaves the old
  // dataset under OUT.old-<pid>, which clean_leftovers puts back.
  const fs::path old = out.parent_path() / (out.filename().string() + ".old-" + std::to_string(::getpid()));
  if (::rename(out.c_str(), old.c_str()) != 0) {
    throw Error("data prepare: cannot rename " + quoted(out) + " to " + quoted(old) + ": " + std::strerror(errno));
  }
  test_pause("prepare-swap-renames");
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::rename(old.c_str(), out.c_str());
    throw Error("data prepare: cannot rename " + quoted(tmp) + " to " + quoted(out) + ": " + why);
  }
  io::sync_parent(out.string());
  test_pause("prepare-swapped");
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec) say("warning: cannot remove the old dataset " + quoted(old) + ": " + ec.message());
}

}  // namespace s3r::data
