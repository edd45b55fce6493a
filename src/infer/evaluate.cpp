// `s3r eval` over every window; see s3r/infer/evaluate.hpp.
#include "s3r/infer/evaluate.hpp"

#include <cmath>
#include <limits>
#include <numbers>

#include "s3r/core/error.hpp"

namespace s3r::infer {

double EvalResult::perplexity() const { return std::exp(loss()); }

double EvalResult::bits_per_byte() const {
  if (bytes <= 0) return std::numeric_limits<double>::quiet_NaN();
  return nats / std::numbers::ln2 / static_cast<double>(bytes);
}

namespace {

// A model of `batch` windows holding the checkpoint's weights, in the precision's recipe.
std::unique_ptr<model::Model> model_for(const LoadedCheckpoint& c, Precision precision, int64_t batch) {
  model::ModelConfig cfg = c.info.model;
  cfg.batch = batch;
  auto m = std::make_unique<model::Model>(cfg, inference_recipe(c.info.recipe, precision));
  const auto src = c.model->params();
  std::copy(src.begin(), src.end(), m->params().begin());  // the same parameter table
  return m;
}

}  // namespace

EvalResult evaluate_stream(const LoadedCheckpoint& c, std::span<const int32_t> tokens, Precision precision,
                           int64_t batch, const data::Tokenizer* tokenizer,
                           const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t S = c.info.model.seq_len, V = c.info.model.vocab;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (batch < 1) throw Error("eval: --batch must be >= 1, got " + std::to_string(batch));
  if (n < S + 1) {
    throw Error("eval: the text holds " + std::to_string(n) + " tokens, fewer than one window of S + 1 = " +
                std::to_string(S + 1));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw Error("eval: token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                  " is outside the model's vocabulary of " + std::to_string(V));
    }
  }
  EvalResult r;
  r.stream_tokens = n;
  r.windows = (n - 1) / S;
  batch = std::min(batch, r.windows);
  std::unique_ptr<model::Model> full = model_for(c, precision, batch), rest;
  std::vector<int32_t> in, tg;
  int64_t done = 0;
  while (done < r.windows) {
    const int64_t b = std::min(batch, r.windows - done);
    model::Model* m = full.get();
    if (b < batch) {
      if (!rest) rest = model_for(c, precision, b);
      m = rest.get();
    }
    in.resize(static_cast<size_t>(b * S));
    tg.resize(static_cast<size_t>(b * S));
    for (int64_t w = 0; w < b; ++w) {
      const int64_t start = (done + w) * S;
      std::copy(tokens.begin() + start, tokens.begin() + start + S, in.begin() + w * S);
      std::copy(tokens.begin() + start + 1, tokens.begin() + start + S + 1, tg.begin() + w * S);
    }
    const double mean = m->forward(in, tg);
    r.nats += mean * static_cast<double>(b * S);
    if (tokenizer) {
      for (int32_t t : tg) r.bytes += tokenizer->byte_length(t);
    }
    done += b;
    if (progress) progress(done, r.windows);
  }
  r.tokens = r.windows * S;
  return r;
}

}  // namespace s3r::infer
