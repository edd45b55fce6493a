// Token shards (format, validation, atomic writes) and the seeded dataloader.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "temp_dir.hpp"
#include "s3r/data/dataloader.hpp"
#include "s3r/data/token_shard.hpp"

namespace s3r::data {
namespace {

std::string temp_path(const std::string& name) {
  return (testing::process_temp_dir("s3r_data_test") / name).string();
}

std::string error_of(const std::string& path) {
  try {
    read_shard(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenShard, RoundTripsBothWidths) {
  for (uint32_t vocab : {300u, 70000u}) {
    std::vector<uint32_t> tokens;
    for (uint32_t i = 0; i < 1000; ++i) tokens.push_back((i * 7919u) % vocab);
    const std::string path = temp_path("rt_" + std::to_string(vocab) + ".bin");
    write_shard(path, tokens, vocab);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    EXPECT_EQ(std::filesystem::file_size(path), 32u + 1000u * (vocab <= 65536 ? 2u : 4u));
    const TokenShard shard = read_shard(path);
    EXPECT_EQ(shard.vocab, vocab);
    EXPECT_EQ(shard.tokens, tokens);
  }
}

TEST(TokenShard, CorruptFilesAreRejectedWithTheReason) {
  const std::string path = temp_path("bad.bin");
  write_shard(path, {1, 2, 3, 4}, 10);
  // Truncated: one byte short.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  EXPECT_NE(error_of(path).find("truncated"), std::string::npos) << error_of(path);
  // Bad magic.
  write_shard(path, {1, 2, 3, 4}, 10);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.write("X", 1);
  }
  EXPECT_NE(error_of(path).find("bad magic"), std::string::npos) << error_of(path);
  // A token at or above the vocabulary.
  write_shard(path, {1, 2, 3, 4}, 10);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24);
    const uint32_t vocab = 3;
    f.write(reinterpret_cast<const char*>(&vocab), 4);
  }
  EXPECT_NE(error_of(path).find("not below the vocabulary size 3"), std::string::npos) << error_of(path);
  EXPECT_NE(error_of(temp_path("missing.bin")).find("cannot open"), std::string::npos);
  EXPECT_THROW(write_shard(path, {10}, 10), Error);
}

// Overwrites `bytes` of `path` at `offset`.
void patch(const std::string& path, std::streamoff offset, const void* bytes, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

// A count with a high bit flipped wraps count * width around to the true payload size: the old
// check (size == 32 + count * width) passed and resize(count) threw std::length_error (an
// internal error) instead of naming the file.
TEST(TokenShard, CountThatOverflowsTheSizeIsAnErrorNotAnAllocation) {
  const std::string path = temp_path("overflow.bin");
  write_shard(path, {1, 2, 3, 4}, 10);  // width 2: 8 bytes of tokens
  const uint64_t wraps2 = 4 | (uint64_t{1} << 63);  // 2 * count == 8 (mod 2^64)
  patch(path, 16, &wraps2, 8);
  std::string error = error_of(path);
  EXPECT_NE(error.find("more than any file holds"), std::string::npos) << error;
  EXPECT_NE(error.find("overflow.bin"), std::string::npos) << error;
  write_shard(path, {1, 2, 3, 4}, 70000);  // width 4: 16 bytes of tokens
  const uint64_t wraps4 = 4 | (uint64_t{1} << 62);  // 4 * count == 16 (mod 2^64)
  patch(path, 16, &wraps4, 8);
  error = error_of(path);
  EXPECT_NE(error.find("more than any file holds"), std::string::npos) << error;
  // Large but not overflowing: the sizes are named.
  write_shard(path, {1, 2, 3, 4}, 10);
  const uint64_t large = uint64_t{1} << 40;
  patch(path, 16, &large, 8);
  error = error_of(path);
  EXPECT_NE(error.find("promises 1099511627776 tokens of 2 bytes = 2199023255584 bytes"), std::string::npos)
      << error;
}

TEST(TokenShard, EveryHeaderFieldIsChecked) {
  const std::string path = temp_path("fields.bin");
  write_shard(path, {1, 2, 3, 4}, 10);
  const uint32_t version = 7;
  patch(path, 8, &version, 4);
  EXPECT_NE(error_of(path).find("version 7"), std::string::npos) << error_of(path);
  write_shard(path, {1, 2, 3, 4}, 10);
  const uint32_t width = 3;
  patch(path, 12, &width, 4);
  EXPECT_NE(error_of(path).find("bytes per token is 3"), std::string::npos) << error_of(path);
  write_shard(path, {1, 2, 3, 4}, 10);
  const uint32_t vocab = 0;
  patch(path, 24, &vocab, 4);
  EXPECT_NE(error_of(path).find("vocabulary size is 0"), std::string::npos) << error_of(path);
  std::filesystem::resize_file(path, 31);
  EXPECT_NE(error_of(path).find("shorter than the 32-byte header"), std::string::npos) << error_of(path);
  // A folder is not a shard.
  EXPECT_NE(error_of(std::filesystem::temp_directory_path().string()).find("cannot open"), std::string::npos);
}

TEST(TokenShard, EmptyShardRoundTrips) {
  const std::string path = temp_path("empty.bin");
  write_shard(path, {}, 10);
  EXPECT_TRUE(read_shard(path).tokens.empty());
}

TokenShard counting_shard(uint32_t n) {
  TokenShard s;
  s.vocab = n + 1;
  for (uint32_t i = 0; i < n; ++i) s.tokens.push_back(i);
  return s;
}

TEST(DataLoader, EveryWindowOncePerEpochWithShiftedTargets) {
  const TokenShard shard = counting_shard(8 * 25 + 1);  // 25 windows of S = 8
  DataLoader loader(shard, 8, 42);
  ASSERT_EQ(loader.windows(), 25);
  std::vector<int32_t> in(8 * 5), tg(8 * 5);
  std::set<int32_t> starts;
  for (int batch = 0; batch < 5; ++batch) {
    loader.next_batch(in, tg, 5);
    for (int b = 0; b < 5; ++b) {
      EXPECT_EQ(in[b * 8] % 8, 0);
      starts.insert(in[b * 8]);
      for (int s = 0; s < 8; ++s) EXPECT_EQ(tg[b * 8 + s], in[b * 8 + s] + 1);
    }
  }
  EXPECT_EQ(starts.size(), 25u);
  EXPECT_EQ(loader.position(), (LoaderPosition{0, 25}));
  loader.next_batch(std::span(in).first(8), std::span(tg).first(8), 1);  // into epoch 1
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 1}));
}

// The order itself, pinned: the windows served for 25 windows of S = 8, seed 42, 10 batches of 5
// (two epochs). bench/peer/threefry.py computes the same order independently from SPEC section 3
// (Fisher-Yates over Threefry words, the epoch folded in) and checks these values too, so a
// change of the loader's order fails here and in the peer's known answers.
TEST(DataLoader, ServesTheKnownOrder) {
  const TokenShard shard = counting_shard(8 * 25 + 1);
  DataLoader loader(shard, 8, 42);
  const std::vector<int32_t> expect = {9,  13, 4,  2,  10, 15, 22, 1,  23, 21, 11, 6,  17, 19, 7,  18, 8,
                                       12, 3,  16, 0,  24, 5,  20, 14, 15, 13, 14, 5,  22, 1,  21, 0,  10,
                                       17, 19, 4,  24, 20, 9,  18, 2,  12, 6,  3,  8,  23, 7,  16, 11};
  std::vector<int32_t> in(8 * 5), tg(8 * 5), got;
  for (int batch = 0; batch < 10; ++batch) {
    loader.next_batch(in, tg, 5);
    for (int b = 0; b < 5; ++b) got.push_back(in[b * 8] / 8);
  }
  EXPECT_EQ(got, expect);
}

TEST(DataLoader, OrderDependsOnSeedAndResumesFromAPosition) {
  const TokenShard shard = counting_shard(16 * 40 + 1);
  DataLoader a(shard, 16, 1), b(shard, 16, 2);
  std::vector<int32_t> ia(16 * 4), ta(16 * 4), ib(16 * 4), tb(16 * 4);
  a.next_batch(ia, ta, 4);
  b.next_batch(ib, tb, 4);
  EXPECT_NE(ia, ib);
  // Straight run vs. resume from a saved position, across an epoch boundary.
  DataLoader straight(shard, 16, 7), first(shard, 16, 7);
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 25; ++i) {
    straight.next_batch(ia, ta, 4);
    expected.push_back(ia);
  }
  for (int i = 0; i < 12; ++i) first.next_batch(ia, ta, 4);
  DataLoader resumed(shard, 16, 7);
  resumed.set_position(first.position());
  for (int i = 12; i < 25; ++i) {
    resumed.next_batch(ia, ta, 4);
    EXPECT_EQ(ia, expected[i]) << "batch " << i;
  }
  EXPECT_THROW(resumed.set_position({0, 41}), Error);
  EXPECT_THROW(DataLoader(counting_shard(16), 16, 0), Error);
}

}  // namespace
}  // namespace s3r::data
