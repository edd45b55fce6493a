// s3r's own linear layer on tensors from a file, for tests/torch/test_s3r_torch.py: the numbers
// s3r_torch.Linear must reproduce bit for bit. Runs QuantLinear as the model does
// (src/model/model.cpp: prepare_input, prepare_weight, linear_forward, linear_backward with the
// layer key fold_in(fold_in(key(seed), step), layer) and the batch's first global token).
//
// Usage: s3r_linear_golden RECIPE T K N S SEED STEP LAYER FIRST_TOKEN IN OUT
//   IN:  X (T, K), W (K, N) (s3r's layout: the transpose of nn.Linear's weight), G (T, N): raw f32
//   OUT: Y (T, N), dX (T, K), dW (K, N): raw f32
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/nn/recipe.hpp"
#include "s3r/rng/threefry.hpp"

int main(int argc, char** argv) try {
  if (argc != 12) {
    std::cerr << "usage: s3r_linear_golden RECIPE T K N S SEED STEP LAYER FIRST_TOKEN IN OUT\n";
    return 2;
  }
  const s3r::nn::Recipe recipe = s3r::nn::Recipe::parse(argv[1]);
  const int64_t T = std::stoll(argv[2]), K = std::stoll(argv[3]), N = std::stoll(argv[4]), S = std::stoll(argv[5]);
  const auto seed = static_cast<uint32_t>(std::stoul(argv[6])), step = static_cast<uint32_t>(std::stoul(argv[7])),
             layer = static_cast<uint32_t>(std::stoul(argv[8]));
  const uint64_t first_token = std::stoull(argv[9]);
  s3r::AlignedVector<float> x(T * K), w(K * N), g(T * N), y(T * N), dx(T * K), dw(K * N);
  std::ifstream in(argv[10], std::ios::binary);
  for (s3r::AlignedVector<float>* v : {&x, &w, &g}) in.read(reinterpret_cast<char*>(v->data()), 4 * v->size());
  if (!in || in.peek() != EOF) throw s3r::Error(std::string(argv[10]) + ": not T K + K N + T N floats");

  s3r::nn::LinearInput xin;
  s3r::nn::LinearWeight win;
  s3r::nn::prepare_input(xin, x, T, K, recipe.projections(), "X");
  s3r::nn::prepare_weight(win, w, K, N, recipe.projections(), "W");
  s3r::nn::linear_forward(y, xin, win);
  s3r::nn::LinearBackwardConfig config;
  config.correction = recipe.correction();
  config.tokens_per_example = S;
  config.layer_key = s3r::fold_in(s3r::fold_in(s3r::key_from_seed(seed), step), layer);
  config.placement.first_token = first_token;
  s3r::nn::LinearWorkspace ws;
  s3r::nn::linear_backward(dx, dw, g, xin, win, config, ws);

  std::ofstream out(argv[11], std::ios::binary);
  for (const s3r::AlignedVector<float>* v : {&y, &dx, &dw}) {
    out.write(reinterpret_cast<const char*>(v->data()), 4 * v->size());
  }
  return out ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "s3r_linear_golden: " << e.what() << "\n";
  return 1;
}
