#pragma once
// Helpers shared by the test suites: ISA and thread-count sweeps, known-answer files.
#include <omp.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "s3r/core/isa.hpp"

namespace s3r::testing {

// Every ISA this machine can run (reference always; avx512 where supported).
inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> isas{Isa::kReference};
  if (cpu_has_avx512()) isas.push_back(Isa::kAvx512);
  return isas;
}

// Sets the OpenMP thread count for a scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(previous_); }

 private:
  int previous_;
};

// One line of ../shared/testdata/random123_kat.txt: name rounds words... (hex).
struct KatLine {
  std::string name;
  int rounds = 0;
  std::vector<uint32_t> words;
};

inline std::vector<KatLine> read_kat_file(const std::string& path) {
  std::ifstream in(path);
  std::vector<KatLine> lines;
  if (!in) return lines;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    KatLine k;
    ss >> k.name >> k.rounds;
    std::string w;
    while (ss >> w) k.words.push_back(static_cast<uint32_t>(std::stoul(w, nullptr, 16)));
    lines.push_back(k);
  }
  return lines;
}

inline std::string kat_path() { return std::string(S3R_TESTDATA_DIR) + "/random123_kat.txt"; }

}  // namespace s3r::testing
