#pragma once
// A scratch folder per test process. ctest runs each test in its own process, two at a time
// under -j2, and the capped reruns run the same test again (same file names) beside the plain
// one; tests of one suite often reuse file names ("fault.safetensors"): a folder shared
// between processes lets one test overwrite or delete the file another is reading.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>

namespace s3r::testing {

// temp_directory_path()/<prefix>-<pid>, created on first use and removed when the process exits.
// One folder per prefix (several suites linked into one test binary each get their own), removed
// only by the process that created it: a forked child that exits normally leaves its parent's
// folders alone.
inline const std::filesystem::path& process_temp_dir(const std::string& prefix) {
  struct Dir {
    std::filesystem::path path;
    pid_t owner;
    explicit Dir(const std::string& p)
        : path(std::filesystem::temp_directory_path() / (p + "-" + std::to_string(::getpid()))),
          owner(::getpid()) {
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      if (::getpid() != owner) return;
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Dir>> dirs;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Dir>& dir = dirs[prefix];
  if (!dir) dir = std::make_unique<Dir>(prefix);
  return dir->path;
}

}  // namespace s3r::testing
