#pragma once
// AdamW's moments over a Model's parameter arena, whole or sharded over the ranks of a
// data-parallel run (issue 12, docs/DISTRIBUTED.md), with the same bits either way.
//
// Whole (the default): every rank keeps m and v of every parameter (8 bytes each) and runs
// optim::adamw_step on the gradient, which is the same bits on every rank.
//
// Sharded (`s3r train --shard-optimizer`): the norm's chunks (optim::kNormChunk elements of a
// tensor, tensors in parameter order) are cut into R contiguous ranges; rank r keeps the moments
// of range r only (8/R bytes per parameter) and updates those weights, then every rank's
// weights are all-gathered. The gradient norm is the sum of every chunk's term in the whole
// list's order (the terms all-gathered), the finiteness check an "any" over ranks, and each
// element's update the same operations: weights, moments, norms and skipped steps are the same
// bits as the whole optimizer's for any R. Communication: 4 (R-1)/R bytes per parameter more
// per step (the weights; the gradients are still all-reduced whole).
#include <cstdint>
#include <span>
#include <vector>

#include "s3r/dist/communicator.hpp"
#include "s3r/model/model.hpp"
#include "s3r/optim/adamw.hpp"

namespace s3r::train {

class Optimizer {
 public:
  // `world` must outlive the optimizer; with shard == false it is used only by set_moments.
  Optimizer(model::Model& model, dist::Communicator& world, bool shard);

  // One AdamW step at 1-based step t over the model's gradient (every rank calls it with the same
  // gradient). Returns false, changing nothing, when the step is skipped (as optim::adamw_step);
  // *norm receives the gradient norm before clipping.
  bool step(const optim::AdamWConfig& config, float lr, int64_t t, double* norm);

  // The whole moments: every rank calls; rank 0 gets m and v of every parameter (the arena's
  // layout), valid until the next call of step or set_moments; the other ranks get empty spans.
  // For a checkpoint; and to resume: rank 0 loads into them, then every rank calls set_moments.
  struct Whole {
    std::span<float> m, v;
  };
  Whole whole_moments();
  // Sets every rank's moments from rank 0's whole m and v: every rank calls; only rank 0's
  // arguments are read (the others may pass empty spans).
  void set_moments(std::span<const float> m, std::span<const float> v);

  bool sharded() const { return shard_; }
  // Moment elements this rank keeps (each of m and v): the parameter count, or its share.
  int64_t kept() const { return static_cast<int64_t>(m_.size()); }

 private:
  struct Range {
    int64_t begin = 0, end = 0;  // elements of the parameter arena
  };
  void all_gather_weights();
  // rank r's moments (m then v), broadcast from `root`; fills `buffer` on every rank.
  void broadcast_share(int r, int root, std::vector<float>& buffer);

  model::Model& model_;
  dist::Communicator& world_;
  bool shard_;
  std::vector<float> m_, v_;             // whole, or this rank's share (its ranges, in order)
  std::vector<optim::ParamRef> refs_;    // whole tensors, or this rank's parts of them
  std::vector<std::vector<Range>> ranges_;  // per rank: the arena ranges it owns, in order
  std::vector<int64_t> chunks_;          // per rank: its chunks of the norm
  std::vector<int64_t> elements_;        // per rank: its elements
  std::vector<float> whole_m_, whole_v_;   // rank 0's gathered moments (sharded)
};

}  // namespace s3r::train
