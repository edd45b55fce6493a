#pragma once
// One training step of a data-parallel run (SPEC section 6, docs/DISTRIBUTED.md): how the global
// batch of B examples is cut into reduction leaves, ranks and micro-batches, and the forward and
// backward passes of this rank's share, with every gradient summed so that the result is the same
// bits for any number of ranks.
//
// Two ways to run a step:
//   whole batch (micro_batch == B, the default): every rank runs B/R examples at once; the int8
//     projections share D (a max all-reduce) and add their int32 dW sums over all ranks (exact);
//     float gradients (LM head, embedding, norm gains, and every matrix in the float modes) are
//     per-rank subtrees of the leaf tree, completed by Communicator::tree_sum.
//   micro-batches (micro_batch = b < B, b <= B/R): every rank runs its B/R examples as B/(R b)
//     micro-batches one after the other (gradient accumulation: activations for b examples only).
//     D is then the max over one micro-batch (each micro-batch quantizes on its own), and every
//     gradient of a micro-batch is a node of the tree; nodes are added in the tree's order.
// Both give bit-identical steps for any R that the plan accepts (a power of two whose ranks own
// whole subtrees). The two ways give the same bits as each other in the f32 and bf16 modes when
// b is a multiple of B/U; in the int8 modes D differs (per micro-batch rather than per step).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/model/model.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::train {

struct StepPlan {
  int ranks = 1, rank = 0;
  int64_t batch = 1;        // B, the global batch (examples per optimizer step)
  int64_t micro_batch = 1;  // b: examples per forward/backward; == batch: the whole batch at once
  int64_t leaves = 1;       // U: reduction leaves of the global batch (dist/tree_sum.hpp)

  bool whole_batch() const { return micro_batch == batch; }
  // Examples of the Model this rank builds (its batch dimension).
  int64_t model_batch() const { return whole_batch() ? batch / ranks : micro_batch; }
  int64_t micro_batches_per_rank() const { return whole_batch() ? 1 : batch / ranks / micro_batch; }
  int64_t leaves_per_forward() const { return leaves * model_batch() / batch; }
  int64_t first_example() const { return batch / ranks * rank; }
  std::string describe() const;
};

// Checks that B, b (0: B) and R fit the tree (each rank and micro-batch a whole subtree), and
// that each rank's share of a whole batch is a multiple of gemm::kFloatTileRows tokens (S =
// seq_len), and returns the plan; throws s3r::Error naming the option and what would work.
StepPlan make_step_plan(int64_t batch, int64_t micro_batch, int ranks, int rank, int64_t seq_len);

struct StepResult {
  double loss = 0.0;  // the step's mean loss over its B*S tokens; NaN if not finite on any rank
  bool ok = true;     // false: a non-finite loss or gradient on some rank (every rank agrees)
  std::string why;    // when !ok
};

class StepRunner {
 public:
  // `model` was built with batch plan.model_batch(); `world` holds plan.ranks ranks.
  StepRunner(model::Model& model, dist::Communicator& world, const StepPlan& plan);
  // in, tg: the global batch's B*S token ids (the same on every rank). Runs this rank's share:
  // forward only when step_key is null (validation), else forward and backward, after which
  // model.grads() holds the step's complete gradient, the same bits on every rank. Collective:
  // every rank calls it with the same arguments.
  StepResult run(std::span<const int32_t> in, std::span<const int32_t> tg, const Key* step_key);
  // Bytes this rank sent to others so far (benchmarks).
  int64_t bytes_sent() const { return world_.bytes_sent(); }
  // Tokens this rank's forward passes saw so far, in training steps (step_key given) and in
  // validations: its share of each global batch, B*S/R per step (the tests check the split).
  int64_t tokens_trained() const { return tokens_trained_; }
  int64_t tokens_evaluated() const { return tokens_evaluated_; }

 private:
  void complete_gradient();  // the float partials of the whole-batch way, over the ranks
  void accumulate(int64_t micro);  // micro-batch `micro`'s gradient into the tree's stack

  model::Model& model_;
  dist::Communicator& world_;
  StepPlan plan_;
  std::vector<double> leaf_loss_, all_leaf_loss_;
  std::vector<AlignedVector<float>> stack_;  // micro-batch tree: pending left nodes per level
  AlignedVector<float> carry_;
  // The whole-batch way: runs of consecutive parameters whose gradient is a float partial.
  std::vector<std::pair<int64_t, int64_t>> partial_runs_;
  int64_t tokens_trained_ = 0, tokens_evaluated_ = 0;
};

}  // namespace s3r::train
