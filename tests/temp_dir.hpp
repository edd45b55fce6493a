#pragma once
// A scratch folder per test process. ctest runs each test in its own process, two at a time
// under -j2, and tests of one suite often reuse file names ("fault.safetensors"): a folder shared
// between processes lets one test overwrite or delete the file another is reading.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace s3r::testing {

// temp_directory_path()/<prefix>-<pid>, created on first use and removed when the process exits.
inline const std::filesystem::path& process_temp_dir(const std::string& prefix) {
  static const struct Dir {
    std::filesystem::path path;
    explicit Dir(const std::string& p)
        : path(std::filesystem::temp_directory_path() / (p + "-" + std::to_string(::getpid()))) {
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } dir(prefix);
  return dir.path;
}

}  // namespace s3r::testing
