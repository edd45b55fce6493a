// The batch generators equal the scalar definitions for every index range, ISA and thread count.
#include <gtest/gtest.h>

#include <vector>

#include "s3r/rng/philox.hpp"
#include "s3r/rng/threefry.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

struct Range {
  uint64_t first;
  int64_t length;
};

std::vector<Range> ranges() {
  std::vector<Range> r;
  for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{17}, uint64_t{1000003}}) {
    for (int64_t len = 1; len <= 100; ++len) r.push_back({first, len});
  }
  // Crossing 2^32 (the counter's high word changes inside a vector) and large threaded ranges.
  // Philox's 64-bit block index crosses 2^32 at word 2^34. Lengths around the 8- and 16-lane
  // vectors and the 32- and 64-word iterations.
  for (int64_t len : {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000}) {
    r.push_back({(uint64_t{1} << 32) - 7, len});
    r.push_back({(uint64_t{5} << 32) - 33, len});
    r.push_back({(uint64_t{1} << 34) - 37, len});
  }
  r.push_back({(uint64_t{1} << 32) - 40000, 100000});
  r.push_back({12345, 300001});
  return r;
}

template <typename KeyT, typename Batch, typename Scalar>
void check_batch(const char* name, KeyT key, Batch batch, Scalar scalar) {
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (int threads : {1, 2}) {
      testing::ScopedThreads st(threads);
      for (const Range& rg : ranges()) {
        std::vector<uint32_t> out(static_cast<size_t>(rg.length) + 1, 0xA5A5A5A5u);
        batch(key, rg.first, std::span<uint32_t>(out.data(), static_cast<size_t>(rg.length)));
        for (int64_t j = 0; j < rg.length; ++j) {
          ASSERT_EQ(out[j], scalar(key, rg.first + static_cast<uint64_t>(j)))
              << name << " isa=" << isa_name(isa) << " threads=" << threads
              << " first=" << rg.first << " length=" << rg.length << " j=" << j;
        }
        ASSERT_EQ(out[rg.length], 0xA5A5A5A5u) << name << ": wrote past the end";
      }
    }
  }
}

TEST(RandomBits, ThreefryBatchEqualsScalar) {
  check_batch(
      "threefry", fold_in(key_from_seed(3), 11),
      [](Key k, uint64_t f, std::span<uint32_t> o) { random_bits32(k, f, o); },
      [](Key k, uint64_t i) { return random_bits32(k, i); });
}

TEST(RandomBits, PhiloxBatchEqualsScalar) {
  check_batch(
      "philox", PhiloxKey{0x243f6a88u, 0x85a308d3u},
      [](PhiloxKey k, uint64_t f, std::span<uint32_t> o) { philox_bits32(k, f, o); },
      [](PhiloxKey k, uint64_t i) { return philox_bits32(k, i); });
}

TEST(RandomBits, EmptySpanIsFine) {
  std::vector<uint32_t> none;
  random_bits32(key_from_seed(0), 5, std::span<uint32_t>(none));
  philox_bits32(PhiloxKey{1, 2}, 5, std::span<uint32_t>(none));
  SUCCEED();
}

}  // namespace
}  // namespace s3r
