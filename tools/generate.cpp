// `s3r generate`: continue a prompt with a trained checkpoint, streaming the text as it comes.
// A KV cache makes each new token cost one position (s3r/infer/decoder.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "commands.hpp"
#include "option_checks.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/infer/decoder.hpp"
#include "s3r/infer/tokenizer.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::tools {

namespace {

struct Options {
  std::string checkpoint, prompt, tokenizer, precision = "trained";
  int64_t max_tokens = 64;
  double temperature = 0.8, top_p = 0.95;
  int64_t top_k = 40;
  int64_t seed = 0;
  bool raw = false, ignore_eos = false, print_ids = false;
  std::string dump_logprobs;
};

// log softmax of one row of logits, in double.
std::vector<double> log_softmax(std::span<const float> z) {
  double mx = -INFINITY, sum = 0;
  for (float v : z) mx = std::max(mx, static_cast<double>(v));
  for (float v : z) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(z.size());
  for (size_t i = 0; i < z.size(); ++i) out[i] = static_cast<double>(z[i]) - lse;
  return out;
}

// The prompt's ids: the document-start token (unless --raw) and the prompt's; checked against the
// model's context of S positions.
std::vector<int32_t> prompt_ids(const Options& o, const data::Tokenizer& tok, const std::vector<int32_t>& prompt,
                                int64_t S) {
  std::vector<int32_t> ids;
  if (!o.raw && tok.document_start_id() >= 0) ids.push_back(tok.document_start_id());
  ids.insert(ids.end(), prompt.begin(), prompt.end());
  if (ids.empty()) throw Error("generate: the prompt is empty and --raw leaves no start token; give a --prompt");
  if (static_cast<int64_t>(ids.size()) > S) {
    throw Error("generate: the prompt is " + std::to_string(ids.size()) + " tokens, more than the model's context of " +
                std::to_string(S) + " (its training sequence length)");
  }
  return ids;
}

// --dump-logprobs: the next-token log-probabilities after each prompt token (for comparisons with
// other implementations: tests/llama, tests/peer); all_logits holds the prompt's (ids, V) logits.
void write_logprobs(const Options& o, const std::vector<int32_t>& ids, bool document_start,
                    const AlignedVector<float>& all_logits, int64_t V, infer::Precision precision) {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t t = 0; t < ids.size(); ++t) {
    rows.push_back(log_softmax({all_logits.data() + t * V, static_cast<size_t>(V)}));
  }
  const nlohmann::json j = {{"prompt", o.prompt}, {"document_start", document_start}, {"prompt_ids", ids},
                            {"precision", infer::to_string(precision)}, {"logprobs", rows}};
  io::write_file_atomic(o.dump_logprobs, [&](std::ostream& f) { f << j.dump() << "\n"; });
}

// Up to --max-tokens new tokens after the prompt (ids, whose last logits are `logits`), streamed
// to stdout as text; when the context fills, its second half is kept and fed again.
std::vector<int32_t> generate_tokens(const Options& o, infer::Decoder& decoder, infer::Sampler& sampler,
                                     const data::Tokenizer& tok, const std::vector<int32_t>& ids,
                                     const std::vector<int32_t>& prompt, std::span<const float> logits) {
  std::vector<int32_t> generated;
  std::string printed = tok.decode(prompt);
  std::cout << o.prompt << std::flush;
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const int32_t next = sampler.sample(logits);
    if (next == tok.eos_id() && !o.ignore_eos) break;
    generated.push_back(next);
    // Stream the new text: decode the prompt and everything generated so far and print what is
    // new (a piece may start with a space, which SentencePiece drops at the start of a text, or
    // complete a multi-byte character).
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), generated.begin(), generated.end());
    const std::string text = tok.decode(all);
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::cout << text.substr(printed.size()) << std::flush;
      printed = text;
    }
    if (i + 1 == o.max_tokens) break;
    if (decoder.position() == decoder.context()) {
      // The context is full: keep its second half and go on from there.
      std::vector<int32_t> context = ids;
      context.insert(context.end(), generated.begin(), generated.end());
      const std::vector<int32_t> keep(context.end() - decoder.context() / 2, context.end());
      decoder.reset();
      logits = decoder.feed(keep);
      continue;
    }
    logits = decoder.feed(std::span<const int32_t>(&next, 1));
  }
  std::cout << "\n" << std::flush;
  return generated;
}

void run(const Options& o) {
  const infer::Precision precision = infer::parse_precision(o.precision);
  infer::SamplingOptions so;
  so.temperature = static_cast<float>(o.temperature);
  so.top_k = o.top_k;
  so.top_p = static_cast<float>(o.top_p);
  so.seed = static_cast<uint64_t>(o.seed);
  infer::Sampler sampler(so);
  const infer::LoadedCheckpoint ckpt = infer::load_for_inference(o.checkpoint);
  const auto tok = infer::tokenizer_for(ckpt.info, o.tokenizer, "", "generate");
  const int64_t S = ckpt.info.model.seq_len;
  const std::vector<int32_t> prompt = tok->encode(o.prompt);
  const std::vector<int32_t> ids = prompt_ids(o, *tok, prompt, S);
  infer::Decoder decoder(ckpt, precision, S);
  const auto t0 = std::chrono::steady_clock::now();
  AlignedVector<float> all_logits;
  const std::span<const float> logits = decoder.feed(ids, o.dump_logprobs.empty() ? nullptr : &all_logits);
  const auto t1 = std::chrono::steady_clock::now();
  if (!o.dump_logprobs.empty()) {
    write_logprobs(o, ids, !o.raw && tok->document_start_id() >= 0, all_logits, decoder.vocab(), precision);
  }
  const std::vector<int32_t> generated = generate_tokens(o, decoder, sampler, *tok, ids, prompt, logits);
  const auto t2 = std::chrono::steady_clock::now();
  const double prompt_s = std::chrono::duration<double>(t1 - t0).count();
  const double gen_s = std::chrono::duration<double>(t2 - t1).count();
  if (o.print_ids) {
    std::cerr << "ids:";
    for (int32_t id : ids) std::cerr << " " << id;
    std::cerr << " |";
    for (int32_t id : generated) std::cerr << " " << id;
    std::cerr << "\n";
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "generate: %zu prompt tokens in %.1f ms, %zu new tokens in %.3f s: %.1f tokens/s (%s, precision %s)\n",
                ids.size(), prompt_s * 1e3, generated.size(), gen_s,
                gen_s > 0 ? static_cast<double>(generated.size()) / gen_s : 0.0,
                ckpt.info.model.describe().c_str(), infer::to_string(precision));
  std::cerr << line;
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("generate", "continue a prompt with a trained checkpoint (streams the text)");
  cmd->add_option("--checkpoint", o->checkpoint, "run folder (or its checkpoint/) of s3r train")->required();
  cmd->add_option("--prompt", o->prompt, "the text to continue")->required();
  add_integer_option(cmd, "--max-tokens", o->max_tokens, "tokens to generate at most", 0, 1 << 24);
  add_float_option(cmd, "--temperature", o->temperature, "sampling temperature (0: greedy, the most likely token)", 0,
                   100);
  add_integer_option(cmd, "--top-k", o->top_k, "sample among the k most likely tokens", 0, INT32_MAX, "0: all");
  add_float_option(cmd, "--top-p", o->top_p, "sample among the most likely tokens whose probabilities add up to p",
                   1e-9, 1);
  add_integer_option(cmd, "--seed", o->seed, "seed of the sampler (the same seed gives the same text)", 0, INT64_MAX);
  cmd->add_option("--precision", o->precision,
                  "trained (the forward as trained: int8 or bf16 products) | f32 (every product in f32)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "SentencePiece tokenizer.model (default: the checkpoint's own; the data folder's for "
                  "checkpoints that hold none)");
  cmd->add_flag("--raw", o->raw, "do not start with the document-start token (end-of-text) before the prompt");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "go on after end-of-text");
  cmd->add_flag("--print-ids", o->print_ids, "print the prompt's and the generated token ids on stderr");
  cmd->add_option("--dump-logprobs", o->dump_logprobs,
                  "write the next-token log-probabilities after each prompt token as JSON (for comparisons)");
  cmd->callback([o] { run(*o); });
}

}  // namespace s3r::tools
