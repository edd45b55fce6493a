// One data-parallel training step; see s3r/train/data_parallel.hpp.
#include "s3r/train/data_parallel.hpp"

#include <cmath>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/dist/tree_sum.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::train {

namespace {

bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

std::string StepPlan::describe() const {
  std::ostringstream s;
  s << ranks << (ranks == 1 ? " rank" : " ranks") << ", batch " << batch << " = ";
  if (whole_batch()) {
    s << ranks << " x " << batch / ranks << " examples at once";
  } else {
    s << ranks << " x " << micro_batches_per_rank() << " micro-batches of " << micro_batch;
  }
  s << ", " << leaves << " reduction leaves";
  return s.str();
}

StepPlan make_step_plan(int64_t batch, int64_t micro_batch, int ranks, int rank, int64_t seq_len) {
  StepPlan p;
  p.ranks = ranks;
  p.rank = rank;
  p.batch = batch;
  p.micro_batch = micro_batch == 0 ? batch : micro_batch;
  const std::string B = std::to_string(batch), R = std::to_string(ranks), b = std::to_string(p.micro_batch);
  if (ranks < 1 || rank < 0 || rank >= ranks) throw Error("rank " + std::to_string(rank) + " of " + R + " ranks");
  if (!power_of_two(ranks)) {
    throw Error(R + " ranks: the number of ranks must be a power of two (1, 2, 4, ...), so that every rank owns "
                "a whole subtree of the fixed summation tree and the sums do not depend on it");
  }
  if (batch % ranks != 0) throw Error("--batch " + B + " is not divisible by the " + R + " ranks");
  if (p.micro_batch < 1 || p.micro_batch > batch) throw Error("--micro-batch " + b + " must be in [1, --batch " + B + "]");
  if (p.whole_batch()) {
    p.leaves = dist::default_leaves(batch);
    const int64_t rows = batch / ranks * seq_len;
    if (ranks > 1 && rows % gemm::kFloatTileRows != 0) {
      throw Error(R + " ranks get " + std::to_string(rows) + " tokens each (--batch " + B + " x --seq-len " +
                  std::to_string(seq_len) + " / " + R + "); the float products' rows come out the same as in one "
                  "process only when each rank's tokens are a multiple of " + std::to_string(gemm::kFloatTileRows) +
                  ": use a larger --batch or fewer ranks, or --micro-batch");
    }
    if (p.leaves % ranks != 0) {
      throw Error("--batch " + B + " splits into " + std::to_string(p.leaves) + " reduction leaves, fewer than the " + R +
                  " ranks; use at most " + std::to_string(p.leaves) + " ranks, a batch divisible by " + R +
                  " x a power of two, or --micro-batch");
    }
    return p;
  }
  if (p.micro_batch * ranks > batch || (batch / ranks) % p.micro_batch != 0 || !power_of_two(batch / p.micro_batch)) {
    throw Error("--micro-batch " + b + " with --batch " + B + " and " + R + " ranks: each rank's " +
                std::to_string(batch / ranks) + " examples must split into a power of two of micro-batches of " + b +
                " (or give --micro-batch " + B + " to run the whole batch at once)");
  }
  p.leaves = std::max(dist::default_leaves(batch), batch / p.micro_batch);
  return p;
}

StepRunner::StepRunner(model::Model& model, dist::Communicator& world, const StepPlan& plan)
    : model_(model), world_(world), plan_(plan) {
  if (world.size() != plan.ranks || world.rank() != plan.rank) {
    throw Error("StepRunner: the plan is for rank " + std::to_string(plan.rank) + " of " + std::to_string(plan.ranks) +
                ", the communicator is rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()));
  }
  if (model.config().batch != plan.model_batch()) {
    throw Error("StepRunner: the model's batch is " + std::to_string(model.config().batch) + ", the plan's " +
                std::to_string(plan.model_batch()));
  }
  const auto& table = model.param_table();
  for (size_t i = 0; i < table.size(); ++i) {
    if (model.reduced_over_group(i)) continue;
    if (!partial_runs_.empty() && partial_runs_.back().first + partial_runs_.back().second == table[i].offset) {
      partial_runs_.back().second += table[i].size;
    } else {
      partial_runs_.emplace_back(table[i].offset, table[i].size);
    }
  }
}

void StepRunner::complete_gradient() {
  for (const auto& [offset, size] : partial_runs_) world_.tree_sum(model_.grads().subspan(offset, size));
}

void StepRunner::accumulate(int64_t micro) {
  // A binary counter over the micro-batches (a power of two of them): micro-batch j's gradient
  // meets its left siblings level by level, so the sums follow the tree exactly.
  std::span<const float> g = model_.grads();
  carry_.assign(g.begin(), g.end());
  size_t level = 0;
  for (int64_t j = micro; j & 1; j >>= 1, ++level) {
    dist::add_into(stack_[level], carry_);  // left + right (float addition commutes)
    std::swap(stack_[level], carry_);
  }
  if (stack_.size() <= level) stack_.resize(level + 1);
  std::swap(stack_[level], carry_);
}

StepResult StepRunner::run(std::span<const int32_t> in, std::span<const int32_t> tg, const Key* step_key) {
  const int64_t S = model_.config().seq_len, T = plan_.batch * S;
  if (in.size() != static_cast<size_t>(T) || tg.size() != static_cast<size_t>(T)) {
    throw Error("StepRunner::run: the global batch must hold B*S = " + std::to_string(T) + " tokens");
  }
  StepResult result;
  const int64_t per = plan_.model_batch() * S;  // tokens per forward
  // The model counts the tokens its forward passes see; the step's are training or validation.
  const int64_t seen_before = model_.tokens_forwarded();
  struct Tally {
    int64_t& into;
    const model::Model& model;
    int64_t before;
    ~Tally() { into += model.tokens_forwarded() - before; }
  } tally{step_key != nullptr ? tokens_trained_ : tokens_evaluated_, model_, seen_before};
  if (plan_.whole_batch()) {
    model_.set_data_parallel({&world_, plan_.first_example(), T, plan_.leaves_per_forward(), true});
    const size_t first = static_cast<size_t>(plan_.first_example() * S);
    try {
      result.loss = model_.forward(in.subspan(first, per), tg.subspan(first, per));
      if (!std::isfinite(result.loss)) throw NonFiniteError("non-finite loss " + std::to_string(result.loss));
      if (step_key != nullptr) {
        model_.backward(*step_key);  // non-finite gradients: thrown on every rank at the same D
        complete_gradient();
        model_.fold_tied_head();  // after the reduction: the same sums for any rank count
      }
    } catch (const NonFiniteError& e) {
      result = {std::nan(""), false, e.what()};
    }
    return result;
  }
  // Micro-batches, one after the other; no communication until the step's gradient is complete.
  const int64_t micro = plan_.micro_batches_per_rank(), L = plan_.leaves_per_forward();
  leaf_loss_.assign(static_cast<size_t>(micro * L), std::nan(""));
  for (int64_t j = 0; j < micro && result.ok; ++j) {
    const int64_t first_example = plan_.first_example() + j * plan_.micro_batch;
    model_.set_data_parallel({nullptr, first_example, T, L, true});
    const size_t first = static_cast<size_t>(first_example * S);
    try {
      model_.forward(in.subspan(first, per), tg.subspan(first, per));
      const auto leaves = model_.leaf_losses();
      std::copy(leaves.begin(), leaves.end(), leaf_loss_.begin() + j * L);
      if (step_key != nullptr) {
        model_.backward(*step_key);
        accumulate(j);
      }
    } catch (const NonFiniteError& e) {
      result = {std::nan(""), false, e.what()};
    }
  }
  // Every rank skips the step if one failed (its loss may have been finite and its backward not).
  if (world_.any(!result.ok) && result.ok) result = {std::nan(""), false, "a non-finite gradient on another rank"};
  // The step's loss from every rank's leaves, in global order; the gradient over the ranks.
  all_leaf_loss_.resize(leaf_loss_.size() * static_cast<size_t>(plan_.ranks));
  world_.all_gather<double>(leaf_loss_, all_leaf_loss_);
  double total = 0.0;
  for (double l : all_leaf_loss_) total += l;
  const double loss = total / static_cast<double>(T);
  if (step_key != nullptr) {
    const size_t level = static_cast<size_t>(std::log2(static_cast<double>(micro)) + 0.5);
    std::span<float> grads = model_.grads();
    if (result.ok) std::copy(stack_[level].begin(), stack_[level].end(), grads.begin());
    world_.tree_sum(grads);  // every rank calls it, also one that failed (its step is skipped)
    model_.fold_tied_head();
  }
  if (result.ok && !std::isfinite(loss)) result = {loss, false, "non-finite loss " + std::to_string(loss)};
  if (result.ok) result.loss = loss;
  return result;
}

}  // namespace s3r::train
