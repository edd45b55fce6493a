#include "s3r/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"

namespace s3r::train {

Optimizer::Optimizer(model::Model& model, dist::Communicator& world, bool shard)
    : model_(model), world_(world), shard_(shard && world.size() > 1) {
  const std::span<float> params = model.params(), grads = model.grads();
  const std::vector<model::ParamInfo>& table = model.param_table();
  const int64_t n = static_cast<int64_t>(params.size());
  const int R = shard_ ? world.size() : 1, me = shard_ ? world.rank() : 0;
  // The norm's chunks in order, by their first arena element (the arena holds the tensors in
  // table order, back to back); rank r takes chunks [K r / R, K (r+1) / R).
  std::vector<int64_t> chunk_begin;
  for (const model::ParamInfo& p : table) {
    for (int64_t c = 0; c < static_cast<int64_t>(p.size); c += optim::kNormChunk) {
      chunk_begin.push_back(static_cast<int64_t>(p.offset) + c);
    }
  }
  const int64_t K = static_cast<int64_t>(chunk_begin.size());
  chunk_begin.push_back(n);
  share_.resize(R + 1);
  chunks_.resize(R + 1);
  for (int r = 0; r <= R; ++r) {
    chunks_[r] = K * r / R;
    share_[r] = chunk_begin[static_cast<size_t>(chunks_[r])];
  }
  const int64_t begin = share_[me], end = share_[me + 1];
  m_.assign(static_cast<size_t>(end - begin), 0.0f);
  v_.assign(static_cast<size_t>(end - begin), 0.0f);
  for (const model::ParamInfo& p : table) {  // each tensor's part in the share
    const int64_t b = std::max(begin, static_cast<int64_t>(p.offset));
    const int64_t e = std::min(end, static_cast<int64_t>(p.offset + p.size));
    if (b >= e) continue;
    const size_t len = static_cast<size_t>(e - b), at = static_cast<size_t>(b - begin);
    refs_.push_back({p.name, params.subspan(static_cast<size_t>(b), len), grads.subspan(static_cast<size_t>(b), len),
                     std::span<float>(m_).subspan(at, len), std::span<float>(v_).subspan(at, len), p.decay});
  }
}

bool Optimizer::step(const optim::AdamWConfig& config, float lr, int64_t t, double* norm_out) {
  if (!shard_) return optim::adamw_step(refs_, config, lr, t, norm_out, &bounds_);
  if (t < 1) throw Error("Optimizer::step: step t must be >= 1, got " + std::to_string(t));
  if (!std::isfinite(lr)) throw Error("Optimizer::step: the learning rate is not finite (" + std::to_string(lr) + ")");
  // The norm: every chunk's term, all-gathered, added in the whole list's order.
  std::vector<double> terms(static_cast<size_t>(chunks_.back()));
  const std::vector<double> mine = optim::grad_sums_of_squares(refs_);
  std::copy(mine.begin(), mine.end(), terms.begin() + chunks_[world_.rank()]);
  world_.all_gather_in_place<double>(terms, chunks_);
  double total = 0.0;
  for (double term : terms) total += term;
  const double norm = std::sqrt(total);
  if (norm_out) *norm_out = norm;
  if (!std::isfinite(norm)) return false;  // the same norm, so the same decision, on every rank
  const optim::AdamWScalars s = optim::adamw_scalars(config, lr, t, norm);
  // Each rank checks its share (proved from its bounds where it can): the same decision as
  // checking every element.
  optim::AdamWBounds after = bounds_;
  if (world_.any(!optim::adamw_update_is_finite(refs_, config, s, norm, &after))) return false;
  bounds_ = after;
  optim::adamw_apply(refs_, config, s);
  world_.all_gather_in_place<float>(model_.params(), share_);
  return true;
}

Optimizer::Whole Optimizer::whole_moments() {
  bounds_.valid = false;  // the caller may write the moments through the spans
  const bool rank0 = world_.rank() == 0;
  Whole whole;
  if (!shard_) {
    if (rank0) {
      whole.m = m_;
      whole.v = v_;
    }
    return whole;
  }
  const size_t n = model_.params().size();
  if (rank0) {
    whole.storage.assign(2 * n, 0.0f);
    whole.m = std::span<float>(whole.storage).first(n);
    whole.v = std::span<float>(whole.storage).subspan(n);
    std::copy(m_.begin(), m_.end(), whole.m.begin() + share_[0]);
    std::copy(v_.begin(), v_.end(), whole.v.begin() + share_[0]);
  }
  AlignedVector<float> passing;
  for (int r = 1; r < world_.size(); ++r) {  // rank r's share to rank 0, straight into place
    move_share(r, 0, whole.m.data(), r, passing);
    move_share(r, 1, whole.v.data(), r, passing);
  }
  return whole;
}

void Optimizer::set_moments(std::span<const float> m, std::span<const float> v) {
  bounds_.valid = false;
  const bool rank0 = world_.rank() == 0;
  const size_t n = model_.params().size();
  if (rank0 && (m.size() != n || v.size() != n)) {
    throw Error("Optimizer::set_moments: m and v have " + std::to_string(m.size()) + " and " +
                std::to_string(v.size()) + " elements, the parameters " + std::to_string(n));
  }
  if (rank0 && m.data() != m_.data()) {  // rank 0's own share (all of it, unsharded)
    std::copy(m.begin() + share_[0], m.begin() + share_[1], m_.begin());
    std::copy(v.begin() + share_[0], v.begin() + share_[1], v_.begin());
  }
  if (!shard_) {
    if (world_.size() > 1) {
      world_.broadcast<float>(m_, 0);
      world_.broadcast<float>(v_, 0);
    }
    return;
  }
  AlignedVector<float> passing;
  for (int r = 1; r < world_.size(); ++r) {  // rank r's share from rank 0, straight into place
    // The root (rank 0) only reads its buffer.
    move_share(r, 0, const_cast<float*>(m.data()), 0, passing);
    move_share(r, 1, const_cast<float*>(v.data()), 0, passing);
  }
}

void Optimizer::move_share(int r, int which, float* whole_on_rank0, int root, AlignedVector<float>& passing) {
  const size_t at = static_cast<size_t>(share_[r]), len = static_cast<size_t>(share_[r + 1] - share_[r]);
  std::span<float> x;
  if (world_.rank() == r) {
    x = which == 0 ? std::span<float>(m_) : std::span<float>(v_);
  } else if (world_.rank() == 0) {
    x = std::span<float>(whole_on_rank0 + at, len);
  } else {  // the share passes through this rank (MPI_Bcast reaches every rank)
    passing.resize(len);
    x = passing;
  }
  world_.broadcast<float>(x, root);
}

}  // namespace s3r::train
