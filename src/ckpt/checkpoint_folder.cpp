// A run folder's checkpoints: checkpoint/, and the checkpoint.tmp/ and checkpoint.old/ a crash
// may leave; the swap that replaces one with the next, and finding and tidying after a crash.
// See s3r/ckpt/checkpoint.hpp.
#include <algorithm>
#include <optional>
#include <vector>

#include "ckpt/checkpoint_internal.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/test_pause.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::ckpt {

using namespace detail;

namespace {

struct Candidate {
  fs::path dir;
  std::optional<CheckpointInfo> info;
  std::string problem;  // why it is not complete
};

// checkpoint/, checkpoint.tmp/, checkpoint.old/ of a run folder: those that exist, inspected.
std::vector<Candidate> candidates(const fs::path& run) {
  std::vector<Candidate> out;
  for (const char* name : {"checkpoint", "checkpoint.tmp", "checkpoint.old"}) {
    const fs::path dir = run / name;
    if (!fs::exists(dir)) continue;
    Candidate c{dir, std::nullopt, ""};
    try {
      c.info = inspect(dir);
    } catch (const Error& e) {
      c.problem = e.what();
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The newest complete candidate (ties: the earlier in the list above), or an s3r::Error.
const Candidate& newest(const std::vector<Candidate>& all, const fs::path& run) {
  const Candidate* best = nullptr;
  for (const Candidate& c : all) {
    if (c.info && (!best || c.info->step > best->info->step)) best = &c;
  }
  if (best) return *best;
  if (all.empty()) throw Error("no checkpoint at '" + (run / "checkpoint" / "meta.json").string() + "'");
  std::string why;
  for (const Candidate& c : all) why += (why.empty() ? "" : "; ") + c.problem;
  throw Error("no complete checkpoint in '" + run.string() + "': " + why);
}

void sync_renamed(const fs::path& run) { io::sync_path(run.string()); }

}  // namespace

namespace detail {

// checkpoint.tmp/ (complete) replaces checkpoint/, which is checkpoint.old/ meanwhile. After each
// rename the run folder is synced, so the order holds on disk too; a crash at any moment leaves a
// complete checkpoint that tidy_checkpoints finds.
void swap_in_checkpoint(const fs::path& run) {
  const fs::path dir = run / "checkpoint", tmp = run / "checkpoint.tmp", old = run / "checkpoint.old";
  fs::remove_all(old);
  if (fs::exists(dir)) {
    fs::rename(dir, old);
    sync_renamed(run);
  }
  test_pause("checkpoint-swap-renames");
  fs::rename(tmp, dir);
  sync_renamed(run);
  test_pause("checkpoint-swapped");
  fs::remove_all(old);
  sync_renamed(run);
}

}  // namespace detail

std::string checkpoint_folder(const std::string& dir) {
  const fs::path d(dir);
  if (fs::is_regular_file(d / "meta.json")) return d.string();
  return find_checkpoint(dir);
}

bool has_checkpoint(const std::string& run_dir) {
  const fs::path run(run_dir);
  return fs::exists(run / "checkpoint") || fs::exists(run / "checkpoint.tmp") || fs::exists(run / "checkpoint.old");
}

std::string find_checkpoint(const std::string& run_dir) {
  return newest(candidates(run_dir), run_dir).dir.string();
}

std::string tidy_checkpoints(const std::string& run_dir) {
  const fs::path run(run_dir), dir = run / "checkpoint";
  const std::vector<Candidate> all = candidates(run);
  if (all.empty()) return "";
  const Candidate& best = newest(all, run);
  std::string did;
  if (best.dir != dir) {
    if (fs::exists(dir)) {
      const bool corrupt = std::any_of(all.begin(), all.end(), [&](const Candidate& c) { return c.dir == dir && !c.info; });
      if (corrupt) {
        fs::remove_all(run / "checkpoint.corrupt");
        fs::rename(dir, run / "checkpoint.corrupt");
        did = "kept the corrupt checkpoint/ as checkpoint.corrupt/ (" +
              std::find_if(all.begin(), all.end(), [&](const Candidate& c) { return c.dir == dir; })->problem + "); ";
      } else {
        fs::remove_all(dir);  // complete but older than the leftover
      }
      sync_renamed(run);
    }
    fs::rename(best.dir, dir);
    sync_renamed(run);
    did += "recovered the checkpoint of step " + std::to_string(best.info->step + 1) + " from " +
           best.dir.filename().string() + "/ (a crash interrupted a save)";
  }
  for (const char* name : {"checkpoint.tmp", "checkpoint.old"}) {
    if (fs::exists(run / name)) {
      fs::remove_all(run / name);
      did += std::string(did.empty() ? "" : "; ") + "removed the leftover " + name + "/";
    }
  }
  if (!did.empty()) sync_renamed(run);
  return did;
}

CheckpointInfo read_checkpoint_info(const std::string& dir) { return inspect(checkpoint_folder(dir)); }

}  // namespace s3r::ckpt
