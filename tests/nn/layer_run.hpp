#pragma once
// Running the quantized linear layer on a test problem (linear_problem.hpp): its prepared
// operands and workspace, and the backward configuration of a problem's example length.
#include "nn/linear_problem.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::nn::testing {

struct LayerRun {
  LinearInput in;
  LinearWeight weight;
  LinearWorkspace ws;
};

// X and W of `p` prepared for `mode`.
inline void prepare(LayerRun& run, const Problem& p, LinearMode mode) {
  prepare_input(run.in, p.x, p.T, p.K, mode, "test.X");
  prepare_weight(run.weight, p.w, p.K, p.N, mode, "test.W");
}

inline LinearBackwardConfig backward_config(const Problem& p, Correction correction, Key key,
                                            bool accumulate) {
  LinearBackwardConfig config;
  config.correction = correction;
  config.tokens_per_example = p.S;
  config.layer_key = key;
  config.accumulate_dx = accumulate;
  return config;
}

}  // namespace s3r::nn::testing
