#pragma once
// Seeded shuffling of (S+1)-token windows of a token shard.
//
// The shard is cut into W = (n - 1) / S windows starting at multiples of S; window w gives the
// inputs tokens[w*S .. w*S+S) and the targets tokens[w*S+1 .. w*S+S]. Each epoch visits every
// window once in the order of a permutation drawn from Threefry with key
// fold_in(key(seed), epoch): a pure function of (seed, epoch), so the position (epoch, cursor)
// is all a checkpoint needs to continue bit-exactly.
#include <cstdint>
#include <span>
#include <vector>

#include "s3r/data/token_shard.hpp"

namespace s3r::data {

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t cursor = 0;  // windows of this epoch already served
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

class DataLoader {
 public:
  // Throws s3r::Error if the shard holds fewer than S+1 tokens.
  DataLoader(const TokenShard& shard, int64_t seq_len, uint32_t seed);

  // Fills inputs and targets (B*S each) with the next B windows, moving to the next epoch (a
  // new permutation) when one runs out.
  void next_batch(std::span<int32_t> inputs, std::span<int32_t> targets, int64_t batch);

  int64_t windows() const { return static_cast<int64_t>(order_.size()); }
  LoaderPosition position() const { return pos_; }
  void set_position(const LoaderPosition& pos);  // throws if the cursor is out of range

 private:
  void shuffle_for_epoch();

  const TokenShard& shard_;
  int64_t seq_len_;
  uint32_t seed_;
  LoaderPosition pos_;
  std::vector<int64_t> order_;
};

}  // namespace s3r::data
