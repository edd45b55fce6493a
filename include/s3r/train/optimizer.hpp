#pragma once
// AdamW's moments over a Model's parameter arena, whole or sharded over the ranks of a
// data-parallel run (docs/DISTRIBUTED.md), with the same bits either way.
//
// Whole (the default): every rank keeps m and v of every parameter (8 bytes each) and runs
// optim::adamw_step on the gradient, which is the same bits on every rank.
//
// Sharded (`s3r train --shard-optimizer`): the norm's chunks (optim::kNormChunk elements of a
// tensor, tensors in parameter order) are cut into R contiguous ranges, so rank r's share is one
// contiguous range of the parameter arena; rank r keeps the moments of its share only (8/R
// bytes per parameter) and updates those weights, then the shares are all-gathered in place.
// The gradient norm is the sum of every chunk's term in the whole list's order (the terms
// all-gathered), the finiteness check an "any" over ranks, and each element's update the same
// operations: weights, moments, norms and skipped steps are the same bits as the whole
// optimizer's for any R. Communication: 4 (R-1)/R bytes per parameter more per step (the
// weights; the gradients are still all-reduced whole). A checkpoint gathers the whole moments
// on rank 0 while it is written (8 bytes per parameter there, for that time).
#include <cstdint>
#include <span>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/model/model.hpp"
#include "s3r/optim/adamw.hpp"

namespace s3r::train {

class Optimizer {
 public:
  // `world` must outlive the optimizer; with shard == false it is used only by set_moments.
  Optimizer(model::Model& model, dist::Communicator& world, bool shard);
  Optimizer(const Optimizer&) = delete;  // refs_ point into this object's m_ and v_
  Optimizer& operator=(const Optimizer&) = delete;

  // One AdamW step at 1-based step t over the model's gradient (every rank calls it with the same
  // gradient). Returns false, changing nothing, when the step is skipped (as optim::adamw_step);
  // *norm receives the gradient norm before clipping.
  bool step(const optim::AdamWConfig& config, float lr, int64_t t, double* norm);

  // The whole moments: every rank calls; rank 0 gets m and v of every parameter (the arena's
  // layout; when sharded, gathered into `storage`, freed with the object); the other ranks get
  // empty spans. For a checkpoint; and to resume: rank 0 loads into them, then every rank calls
  // set_moments.
  struct Whole {
    std::span<float> m, v;
    AlignedVector<float> storage;
    Whole() = default;
    Whole(Whole&&) = default;  // moves keep the spans' storage; copies would not
    Whole& operator=(Whole&&) = default;
    Whole(const Whole&) = delete;
  };
  Whole whole_moments();
  // Sets every rank's moments from rank 0's whole m and v: every rank calls; only rank 0's
  // arguments are read (the others may pass empty spans).
  void set_moments(std::span<const float> m, std::span<const float> v);

  bool sharded() const { return shard_; }
  // Moment elements this rank keeps (each of m and v): the parameter count, or its share.
  int64_t kept() const { return static_cast<int64_t>(m_.size()); }

 private:
  // Rank r's share of m (which = 0) or v (1), between rank r's own moments and the whole copy
  // on rank 0 (whole_on_rank0, the arena's layout; read on rank 0 only), broadcast from `root`:
  // r to gather, 0 to scatter. Every rank calls it with the same r, which and root.
  void move_share(int r, int which, float* whole_on_rank0, int root, AlignedVector<float>& passing);

  model::Model& model_;
  dist::Communicator& world_;
  bool shard_;
  AlignedVector<float> m_, v_;           // whole, or this rank's share
  optim::AdamWBounds bounds_;            // of m_ and v_ (adamw.hpp); dropped when they are written from outside
  std::vector<optim::ParamRef> refs_;  // whole tensors, or the parts of them in this rank's share
  std::vector<int64_t> share_;         // R + 1 arena offsets: rank r's share is [share_[r], share_[r+1])
  std::vector<int64_t> chunks_;        // R + 1 offsets into the list of the norm's chunks
};

}  // namespace s3r::train
