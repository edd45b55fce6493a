// The batch generators equal the scalar definitions for every index range, ISA and thread count;
// each tier's kernels give the same words for any piece of a range, wherever it starts.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/dispatch.hpp"
#include "s3r/core/isa.hpp"
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

// An empty span is a call that writes nothing: here as an empty slice of a larger buffer (what
// span.subspan(k, 0) passes), at addresses that are and are not 16-byte aligned and at the ends of
// the index range, every word of the buffer must keep its value; and the empty span of a vector
// without storage (a null pointer) must not be written at all.
TEST(RandomBits, EmptySpanIsFine) {
  constexpr uint32_t kGuard = 0xA5A5A5A5u;
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    std::vector<uint32_t> buffer(16, kGuard);
    for (size_t at : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{8}, size_t{16}}) {
      for (uint64_t first : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 1, ~uint64_t{0}}) {
        random_bits32(key_from_seed(0), first, std::span<uint32_t>(buffer.data() + at, 0));
        philox_bits32(PhiloxKey{1, 2}, first, std::span<uint32_t>(buffer.data() + at, 0));
        for (size_t j = 0; j < buffer.size(); ++j) {
          ASSERT_EQ(buffer[j], kGuard) << "isa=" << isa_name(isa) << ": an empty span at word " << at
                                       << " (first=" << first << ") wrote word " << j;
        }
      }
    }
    std::vector<uint32_t> none;  // data() is null: any write faults
    random_bits32(key_from_seed(0), 5, std::span<uint32_t>(none));
    philox_bits32(PhiloxKey{1, 2}, 5, std::span<uint32_t>(none));
  }
}

// The drivers hand the kernels pieces of a range (first + j0, out + j0, j1 - j0), and callers
// slice their own buffers: a piece that starts mid-range, at an output address that is not 16-
// or 32-byte aligned, and ends before the range does, must give exactly the words of the same
// positions of the whole-range call, and write nothing outside its piece. Each tier's kernel
// directly (the batch functions above only ever start at a fresh, aligned allocation).
template <typename KeyT, typename Kernel>
void check_pieces(const char* name, KeyT key, Kernel kernel_of) {
  constexpr uint32_t kGuard = 0xA5A5A5A5u;
  constexpr int64_t n = 160;
  for (Isa isa : testing::runnable_isas()) {
    const auto kernel = kernel_of(kernels::kernels_for(isa));
    for (uint64_t first : {uint64_t{0}, (uint64_t{1} << 32) - 21}) {  // the second crosses 2^32
      std::vector<uint32_t> whole(n);
      kernel(key, first, whole.data(), n);
      for (int64_t j0 : {1, 2, 3, 5, 7, 9, 13, 17, 31, 33, 63}) {
        for (int64_t j1 : {j0 + 1, j0 + 7, j0 + 8, j0 + 9, j0 + 37, n - 3, n}) {
          std::vector<uint32_t> piece(n + 1, kGuard);
          kernel(key, first + static_cast<uint64_t>(j0), piece.data() + j0, j1 - j0);
          for (int64_t j = 0; j <= n; ++j) {
            const bool inside = j >= j0 && j < j1;
            ASSERT_EQ(piece[j], inside ? whole[j] : kGuard)
                << name << " isa=" << isa_name(isa) << " first=" << first << " piece [" << j0
                << ", " << j1 << ") at " << j << (inside ? "" : " (outside the piece)");
          }
        }
      }
    }
  }
}

TEST(RandomBits, KernelPiecesStartingMidRangeGiveTheWholeRangesWords) {
  check_pieces("threefry", fold_in(key_from_seed(3), 11),
               [](const kernels::KernelTable& k) { return k.threefry_bits; });
  check_pieces("philox", PhiloxKey{0x243f6a88u, 0x85a308d3u},
               [](const kernels::KernelTable& k) { return k.philox_bits; });
}

}  // namespace
}  // namespace s3r
