#pragma once
// `s3r eval`: loss, perplexity and bits per byte of a checkpoint on every window of a token
// stream.
//
// Windows as the trainer's data loader cuts them (s3r/data/dataloader.hpp): W = (n - 1) / S
// windows starting at multiples of S, inputs tokens[w S .. w S + S), targets one further; every
// window is scored once, in file order (the trainer's validation scores a shuffled sample of
// them). The forward is the model's own (Model::forward), in batches of B windows and the
// remaining W mod B windows in one smaller batch, so the numbers equal what the trainer's
// validation computes on the same windows: precision `trained` is the checkpoint's own mode,
// `f32` the same weights in an f32 model (every product and the LM head in f32).
//
// loss = the mean cross-entropy over the W S scored tokens (nats); perplexity = exp(loss);
// bits per byte = (sum of the tokens' cross-entropies) / ln 2 / (UTF-8 bytes of the scored
// targets, data::Tokenizer::byte_length: the text a piece stands for, "▁" one space, control pieces
// such as end-of-text none).
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "s3r/infer/decoder.hpp"
#include "s3r/data/tokenizer.hpp"

namespace s3r::infer {

struct EvalResult {
  int64_t windows = 0;
  int64_t tokens = 0;        // scored tokens, W S
  int64_t stream_tokens = 0; // tokens in the stream (the tail after the last window is not scored)
  double nats = 0;           // sum of the scored tokens' cross-entropies
  int64_t bytes = 0;         // UTF-8 bytes of the scored targets (0 without a tokenizer)
  double loss() const { return tokens ? nats / static_cast<double>(tokens) : 0.0; }
  double perplexity() const;
  double bits_per_byte() const;  // NaN without bytes
};

// progress(done_windows, total_windows) after each batch. `batch`: windows per forward (> 0).
// Throws s3r::Error when the stream is shorter than one window of S + 1 tokens or holds an id
// outside the vocabulary.
EvalResult evaluate_stream(const LoadedCheckpoint& checkpoint, std::span<const int32_t> tokens, Precision precision,
                           int64_t batch, const data::Tokenizer* tokenizer,
                           const std::function<void(int64_t, int64_t)>& progress);

}  // namespace s3r::infer
