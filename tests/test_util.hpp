#pragma once
// Helpers shared by the test suites: ISA and thread-count sweeps, known-answer files.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"

namespace s3r::testing {

// n int8 codes drawn uniformly from [-127, 127] (never -128, as s3r's quantizers never make it).
inline std::vector<int8_t> random_s8(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(d(gen));
  return v;
}

// Records on the running test that `isa` was not exercised and why: a test property
// "skipped_tier_<name>" (in the XML/JSON report) and one line on stdout per test and tier.
inline void record_skipped_tier(Isa isa, const std::string& why) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  static std::set<std::string> reported;
  if (!reported.insert(test + "/" + std::string(isa_name(isa))).second) return;
  if (info != nullptr) ::testing::Test::RecordProperty("skipped_tier_" + std::string(isa_name(isa)), why);
  std::printf("[ SKIPPED TIER ] %s: %s not tested: %s\n", test.c_str(),
              std::string(isa_name(isa)).c_str(), why.c_str());
}

// Every tier this machine can run, reference first. Each tier it cannot run is recorded as
// skipped on the running test, with the reason (never a silent reference-only pass).
inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> isas;
  for (Isa isa : all_isas()) {
    std::string why;
    if (isa_supported(isa, &why)) {
      isas.push_back(isa);
    } else {
      record_skipped_tier(isa, why);
    }
  }
  return isas;
}

// The runnable tiers other than the reference: the twins that a comparison test holds against
// it. Use with S3R_SKIP_WITHOUT_VECTOR_TIERS so that a CPU with none skips visibly.
inline std::vector<Isa> vector_isas() {
  std::vector<Isa> isas;
  for (Isa isa : runnable_isas()) {
    if (isa != Isa::kReference) isas.push_back(isa);
  }
  return isas;
}

#define S3R_SKIP_WITHOUT_VECTOR_TIERS(isas)                                                    \
  if ((isas).empty())                                                                          \
  GTEST_SKIP() << "no vectorized kernel tier runs on this CPU: nothing to compare with the " \
                  "reference"

// Sets the OpenMP thread count for a scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(previous_); }

 private:
  int previous_;
};

// Known-answer files live in tests/known_answers/ (S3R_TESTDATA_DIR; provenance in its README.md).
// A missing or unreadable file reads as no lines, and the tests that read it then fail.

// One line of random123_kat.txt: name rounds words... (hex).
struct KatLine {
  std::string name;
  int rounds = 0;
  std::vector<uint32_t> words;
};

// The lines of a known-answer file that are neither empty nor comments ('#').
inline std::vector<std::string> read_data_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  return lines;
}

inline std::vector<KatLine> read_kat_file(const std::string& path) {
  std::vector<KatLine> lines;
  for (const auto& line : read_data_lines(path)) {
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

// One line of jax_threefry.txt: kind ("bits32" or "uniform") seed index expected, decimal; the
// expected value is kept as text (a uint32 for bits32, a float32 written in decimal for uniform).
struct JaxLine {
  std::string kind;
  uint32_t seed = 0;
  uint64_t index = 0;
  std::string expected;
};

inline std::vector<JaxLine> read_jax_file(const std::string& path) {
  std::vector<JaxLine> lines;
  for (const auto& line : read_data_lines(path)) {
    std::istringstream ss(line);
    JaxLine j;
    ss >> j.kind >> j.seed >> j.index >> j.expected;
    lines.push_back(j);
  }
  return lines;
}

inline std::string jax_path() { return std::string(S3R_TESTDATA_DIR) + "/jax_threefry.txt"; }

// The message of the s3r::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A small English-like corpus for training tiny tokenizers (`s3r data prepare`): 200 documents
// of 30 words from a 16-word vocabulary, sentences of 9 words, documents separated by blank lines.
inline void write_word_corpus(std::ostream& text) {
  const char* words[] = {"the", "quantized", "gradient", "rounds", "shared", "threshold", "token", "error",
                         "layer", "model", "training", "loss", "correction", "channel", "width", "stochastic"};
  for (int d = 0; d < 200; ++d) {
    for (int w = 0; w < 30; ++w) text << words[(d * 7 + w * w * 3) % 16] << (w % 9 == 8 ? ". " : " ");
    text << "\n\n";
  }
}

}  // namespace s3r::testing
