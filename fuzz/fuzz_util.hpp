#pragma once
// Shared by the libFuzzer targets (fuzz/*.cpp, scripts/fuzz.sh): a scratch folder private to the
// process (so that parallel fuzzers do not share files), and bytes written to a file in it.
//
// Contract of every target: the input reaches a library reader as a file; s3r::Error is the
// expected answer to a malformed input and is swallowed; anything else (another exception, a
// sanitizer report, an allocation past libFuzzer's -malloc_limit_mb, a timeout) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace s3r::fuzz {

// $TMPDIR/s3r_fuzz_<pid>, created on first use and removed at exit.
inline const std::filesystem::path& scratch() {
  struct Dir {
    std::filesystem::path path;
    Dir() : path(std::filesystem::temp_directory_path() / ("s3r_fuzz_" + std::to_string(getpid()))) {
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes `bytes` to `path` (replacing it). A failure here is the harness's, not the library's:
// it aborts with a message rather than reporting a bogus finding silently.
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  // Unlinked first: truncating a file in place makes ext4 flush it on close (auto_da_alloc),
  // which slows the fuzzers tenfold.
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write '%s'\n", path.c_str());
    std::abort();
  }
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace s3r::fuzz
