// Model::estimate_bytes against the resident memory a model really takes once it has run a
// training step (the trainer's check before step 0 relies on it).
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "s3r/model/model.hpp"

namespace s3r::model {
namespace {

// Resident bytes of this process (/proc/self/statm).
double resident_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// With a fixed mmap threshold, every buffer over 128 KiB is mmapped by malloc and returned on
// free (glibc otherwise raises the threshold after the first free and keeps later buffers in the
// heap), so the resident growth over one model's construction and step is that model's memory.
TEST(ModelMemory, EstimateMatchesTheResidentMemoryOfAStep) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's allocator (shadow memory, quarantine, no mallopt) makes resident memory "
                  "no measure of the model's; the release build runs this test";
#endif
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 128 * 1024), 1);
  ModelConfig c = preset("small");
  c.layers = 2;
  c.batch = 8;
  for (nn::LinearMode mode : {nn::LinearMode::kS3r, nn::LinearMode::kBf16, nn::LinearMode::kF32}) {
    const double before = resident_bytes();
    double grown = 0.0;
    {
      Model model(c, nn::Recipe::make(mode, nn::Recipe::default_correction(mode)));
      model.init_weights(1);
      std::vector<int32_t> tokens(c.tokens());
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % c.vocab);
      model.forward(tokens, tokens);
      model.backward(key_from_seed(1));
      grown = resident_bytes() - before;
    }
    const double estimate = static_cast<double>(Model::estimate_bytes(c, nn::Recipe::make(mode, nn::Recipe::default_correction(mode))));
    std::printf("%-5s estimate %.1f MB, resident growth %.1f MB (ratio %.2f)\n",
                std::string(nn::to_string(mode)).c_str(), estimate / 1e6, grown / 1e6, estimate / grown);
    // Within 30% (the contract in model.hpp); a forgotten (T, V) or (T, F) buffer family moves it
    // by more than that at this shape.
    EXPECT_GT(estimate, 0.7 * grown) << nn::to_string(mode);
    EXPECT_LT(estimate, 1.3 * grown) << nn::to_string(mode);
  }
}

}  // namespace
}  // namespace s3r::model
