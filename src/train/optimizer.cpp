#include "s3r/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "s3r/core/error.hpp"

namespace s3r::train {

Optimizer::Optimizer(model::Model& model, dist::Communicator& world, bool shard)
    : model_(model), world_(world), shard_(shard && world.size() > 1) {
  const std::span<float> params = model.params(), grads = model.grads();
  const std::vector<model::ParamInfo>& table = model.param_table();
  if (!shard_) {
    m_.assign(params.size(), 0.0f);
    v_.assign(params.size(), 0.0f);
    for (const model::ParamInfo& p : table) {
      refs_.push_back({p.name, params.subspan(p.offset, p.size), grads.subspan(p.offset, p.size),
                       std::span<float>(m_).subspan(p.offset, p.size), std::span<float>(v_).subspan(p.offset, p.size),
                       p.decay});
    }
    return;
  }
  // The norm's chunks, tensors in order, each [begin, end) of the arena with its tensor.
  struct Chunk {
    size_t param;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < table.size(); ++i) {
    const int64_t offset = static_cast<int64_t>(table[i].offset), size = static_cast<int64_t>(table[i].size);
    for (int64_t c = 0; c < size; c += optim::kNormChunk) {
      chunks.push_back({i, offset + c, offset + std::min(size, c + optim::kNormChunk)});
    }
  }
  const int64_t R = world.size(), K = static_cast<int64_t>(chunks.size());
  ranges_.resize(R);
  chunks_.assign(R, 0);
  elements_.assign(R, 0);
  std::vector<std::vector<size_t>> range_param(R);  // the tensor of each range
  for (int64_t r = 0; r < R; ++r) {
    // Rank r: chunks [K r / R, K (r+1) / R), merged into one range per tensor.
    for (int64_t c = K * r / R; c < K * (r + 1) / R; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      if (!range_param[r].empty() && range_param[r].back() == ch.param && ranges_[r].back().end == ch.begin) {
        ranges_[r].back().end = ch.end;
      } else {
        ranges_[r].push_back({ch.begin, ch.end});
        range_param[r].push_back(ch.param);
      }
      chunks_[r] += 1;
      elements_[r] += ch.end - ch.begin;
    }
  }
  const int me = world.rank();
  m_.assign(static_cast<size_t>(elements_[me]), 0.0f);
  v_.assign(static_cast<size_t>(elements_[me]), 0.0f);
  int64_t kept = 0;
  for (size_t j = 0; j < ranges_[me].size(); ++j) {
    const Range& g = ranges_[me][j];
    const model::ParamInfo& p = table[range_param[me][j]];
    const size_t n = static_cast<size_t>(g.end - g.begin);
    refs_.push_back({p.name, params.subspan(g.begin, n), grads.subspan(g.begin, n),
                     std::span<float>(m_).subspan(kept, n), std::span<float>(v_).subspan(kept, n), p.decay});
    kept += static_cast<int64_t>(n);
  }
}

bool Optimizer::step(const optim::AdamWConfig& config, float lr, int64_t t, double* norm_out) {
  if (!shard_) return optim::adamw_step(refs_, config, lr, t, norm_out);
  std::vector<float>().swap(whole_m_);  // a checkpoint's gathered moments are no longer needed
  std::vector<float>().swap(whole_v_);
  if (t < 1) throw Error("Optimizer::step: step t must be >= 1, got " + std::to_string(t));
  if (!std::isfinite(lr)) throw Error("Optimizer::step: the learning rate is not finite (" + std::to_string(lr) + ")");
  // The norm: every chunk's term, all-gathered, added in the whole list's order.
  const std::vector<double> mine = optim::grad_sums_of_squares(refs_);
  const int64_t most = *std::max_element(chunks_.begin(), chunks_.end());
  std::vector<double> padded(static_cast<size_t>(most), 0.0), all(static_cast<size_t>(most * world_.size()));
  std::copy(mine.begin(), mine.end(), padded.begin());
  world_.all_gather<double>(padded, all);
  double total = 0.0;
  for (int r = 0; r < world_.size(); ++r) {
    for (int64_t i = 0; i < chunks_[r]; ++i) total += all[static_cast<size_t>(r * most + i)];
  }
  const double norm = std::sqrt(total);
  if (norm_out) *norm_out = norm;
  if (!std::isfinite(norm)) return false;  // the same norm, so the same decision, on every rank
  const optim::AdamWScalars s = optim::adamw_scalars(config, lr, t, norm);
  if (world_.any(!optim::adamw_keeps_finite(refs_, config, s))) return false;
  optim::adamw_apply(refs_, config, s);
  all_gather_weights();
  return true;
}

void Optimizer::all_gather_weights() {
  const std::span<float> params = model_.params();
  const int64_t most = *std::max_element(elements_.begin(), elements_.end());
  std::vector<float> mine(static_cast<size_t>(most), 0.0f), all(static_cast<size_t>(most * world_.size()));
  int64_t at = 0;
  for (const Range& g : ranges_[world_.rank()]) {
    std::copy(params.begin() + g.begin, params.begin() + g.end, mine.begin() + at);
    at += g.end - g.begin;
  }
  world_.all_gather<float>(mine, all);
  for (int r = 0; r < world_.size(); ++r) {
    if (r == world_.rank()) continue;
    const float* from = all.data() + r * most;
    for (const Range& g : ranges_[r]) {
      std::copy(from, from + (g.end - g.begin), params.begin() + g.begin);
      from += g.end - g.begin;
    }
  }
}

void Optimizer::broadcast_share(int r, int root, std::vector<float>& buffer) {
  buffer.resize(static_cast<size_t>(2 * elements_[r]));
  world_.broadcast<float>(buffer, root);
}

Optimizer::Whole Optimizer::whole_moments() {
  const bool rank0 = world_.rank() == 0;
  if (!shard_) return rank0 ? Whole{m_, v_} : Whole{};
  const int64_t n = static_cast<int64_t>(model_.params().size());
  if (rank0) {
    whole_m_.assign(static_cast<size_t>(n), 0.0f);
    whole_v_.assign(static_cast<size_t>(n), 0.0f);
  }
  std::vector<float> buffer;
  for (int r = 0; r < world_.size(); ++r) {  // rank r's share to rank 0 (through every rank)
    if (world_.rank() == r) {
      buffer = m_;
      buffer.insert(buffer.end(), v_.begin(), v_.end());
    }
    broadcast_share(r, r, buffer);
    if (!rank0) continue;
    const float* m = buffer.data();
    const float* v = buffer.data() + elements_[r];
    for (const Range& g : ranges_[r]) {
      std::copy(m, m + (g.end - g.begin), whole_m_.begin() + g.begin);
      std::copy(v, v + (g.end - g.begin), whole_v_.begin() + g.begin);
      m += g.end - g.begin;
      v += g.end - g.begin;
    }
  }
  return rank0 ? Whole{whole_m_, whole_v_} : Whole{};
}

void Optimizer::set_moments(std::span<const float> m, std::span<const float> v) {
  const bool rank0 = world_.rank() == 0;
  const size_t n = model_.params().size();
  if (rank0 && (m.size() != n || v.size() != n)) {
    throw Error("Optimizer::set_moments: m and v have " + std::to_string(m.size()) + " and " +
                std::to_string(v.size()) + " elements, the parameters " + std::to_string(n));
  }
  if (!shard_) {
    if (rank0 && m.data() != m_.data()) {
      std::copy(m.begin(), m.end(), m_.begin());
      std::copy(v.begin(), v.end(), v_.begin());
    }
    if (world_.size() > 1) {
      world_.broadcast<float>(m_, 0);
      world_.broadcast<float>(v_, 0);
    }
    return;
  }
  std::vector<float> buffer;
  for (int r = 0; r < world_.size(); ++r) {  // rank 0 sends rank r its share (through every rank)
    if (rank0) {
      buffer.clear();
      for (std::span<const float> x : {m, v}) {
        for (const Range& g : ranges_[r]) buffer.insert(buffer.end(), x.begin() + g.begin, x.begin() + g.end);
      }
    }
    broadcast_share(r, 0, buffer);
    if (world_.rank() == r) {
      std::copy(buffer.begin(), buffer.begin() + elements_[r], m_.begin());
      std::copy(buffer.begin() + elements_[r], buffer.end(), v_.begin());
    }
  }
  std::vector<float>().swap(whole_m_);
  std::vector<float>().swap(whole_v_);
}

}  // namespace s3r::train
