#include "s3r/data/dataloader.hpp"

#include <numeric>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::data {

DataLoader::DataLoader(const TokenShard& shard, int64_t seq_len, uint32_t seed)
    : shard_(shard), seq_len_(seq_len), seed_(seed) {
  const int64_t n = static_cast<int64_t>(shard.tokens.size());
  if (seq_len < 1 || n < seq_len + 1) {
    std::ostringstream msg;
    msg << "dataloader: the shard holds " << n << " tokens, fewer than one window of S + 1 = "
        << seq_len + 1;
    throw Error(msg.str());
  }
  order_.resize(static_cast<size_t>((n - 1) / seq_len));
  shuffle_for_epoch();
}

void DataLoader::shuffle_for_epoch() {
  std::iota(order_.begin(), order_.end(), int64_t{0});
  // Fisher-Yates with Threefry words: j uniform in [0, i] by 64-bit multiply-shift (bias below
  // 2^-32 for fewer than 2^32 windows).
  const Key key = fold_in(key_from_seed(seed_), static_cast<uint32_t>(pos_.epoch));
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
    const uint64_t r = random_bits32(key, static_cast<uint64_t>(i));
    const int64_t j = static_cast<int64_t>((r * static_cast<uint64_t>(i + 1)) >> 32);
    std::swap(order_[i], order_[j]);
  }
}

void DataLoader::set_position(const LoaderPosition& pos) {
  if (pos.epoch < 0 || pos.cursor < 0 || pos.cursor > windows()) {
    std::ostringstream msg;
    msg << "dataloader: position (epoch " << pos.epoch << ", cursor " << pos.cursor
        << ") is outside this shard's " << windows() << " windows";
    throw Error(msg.str());
  }
  pos_ = pos;
  shuffle_for_epoch();
}

void DataLoader::next_batch(std::span<int32_t> inputs, std::span<int32_t> targets, int64_t batch) {
  const int64_t S = seq_len_;
  if (inputs.size() != static_cast<size_t>(batch * S) || targets.size() != inputs.size()) {
    throw Error("dataloader: batch buffers must hold B*S = " + std::to_string(batch * S) + " tokens");
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (pos_.cursor == windows()) {
      ++pos_.epoch;
      pos_.cursor = 0;
      shuffle_for_epoch();
    }
    const int64_t start = order_[pos_.cursor++] * S;
    for (int64_t s = 0; s < S; ++s) {
      inputs[b * S + s] = static_cast<int32_t>(shard_.tokens[start + s]);
      targets[b * S + s] = static_cast<int32_t>(shard_.tokens[start + s + 1]);
    }
  }
}

}  // namespace s3r::data
