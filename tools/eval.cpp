// `s3r eval`: loss, perplexity and bits per byte of a checkpoint on every window of a prepared
// token shard or of a text / JSONL file (s3r/infer/evaluate.hpp).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "option_checks.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/text_input.hpp"
#include "s3r/data/token_shard.hpp"
#include "s3r/infer/evaluate.hpp"
#include "s3r/infer/tokenizer.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::tools {

namespace {

namespace fs = std::filesystem;

struct Options {
  std::string checkpoint, data, split = "val", text, tokenizer, precision = "trained", json;
  std::optional<int64_t> batch;
};

// A progress bar on stderr: redrawn in place on a terminal, else a line at every quarter.
class Progress {
 public:
  Progress() : tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}
  void operator()(int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int width = 30, filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
    char line[160];
    std::snprintf(line, sizeof line, "[%s%s] %lld/%lld windows, %.1f s", std::string(filled, '#').c_str(),
                  std::string(width - filled, '.').c_str(), static_cast<long long>(done),
                  static_cast<long long>(total), s);
    if (tty_) {
      std::cerr << "\r" << line << (done == total ? "\n" : "") << std::flush;
    } else if (done == total || 4 * done / total > quarter_) {
      quarter_ = 4 * done / total;
      std::cerr << line << "\n";
    }
  }

 private:
  bool tty_;
  int64_t quarter_ = 0;
  std::chrono::steady_clock::time_point start_;
};

void run(const Options& o) {
  const infer::Precision precision = infer::parse_precision(o.precision);
  if (o.data.empty() == o.text.empty()) {
    throw Error("eval: give either --data DIR (a prepared dataset: its val.bin or train.bin) or --text FILE "
                "(text, JSON or JSONL)");
  }
  if (o.split != "val" && o.split != "train") throw Error("eval: --split must be val or train, got '" + o.split + "'");
  if (!o.json.empty()) check_output_file("eval", "--json", o.json);
  const infer::LoadedCheckpoint ckpt = infer::load_for_inference(o.checkpoint);
  std::vector<int32_t> tokens;
  std::unique_ptr<data::Tokenizer> tok;
  std::string source;
  if (!o.data.empty()) {
    source = (fs::path(o.data) / (o.split + ".bin")).string();
    const data::TokenShard shard = data::read_shard(source);
    if (static_cast<int64_t>(shard.vocab) != ckpt.info.model.vocab) {
      throw Error("eval: '" + source + "' has a vocabulary of " + std::to_string(shard.vocab) +
                  ", but the model's V is " + std::to_string(ckpt.info.model.vocab));
    }
    tokens.assign(shard.tokens.begin(), shard.tokens.end());
    // Bits per byte need the tokenizer; without one the other numbers are still given.
    try {
      tok = infer::tokenizer_for(ckpt.info, o.tokenizer, (fs::path(o.data) / "tokenizer.model").string(), "eval");
    } catch (const Error& e) {
      if (!o.tokenizer.empty()) throw;
      std::cerr << "eval: no bits per byte: " << e.what() << "\n";
    }
  } else {
    source = o.text;
    tok = infer::tokenizer_for(ckpt.info, o.tokenizer, "", "eval");
    // As `s3r data prepare` encodes: every document followed by end-of-text.
    for (const std::string& doc : data::read_documents({o.text}, nullptr, nullptr, "eval")) {
      const std::vector<int32_t> ids = tok->encode(doc);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      tokens.push_back(tok->eos_id() >= 0 ? tok->eos_id() : 0);
    }
  }
  const int64_t batch = o.batch.value_or(ckpt.info.model.batch);
  Progress progress;
  const auto t0 = std::chrono::steady_clock::now();
  const infer::EvalResult r = infer::evaluate_stream(ckpt, tokens, precision, batch, tok.get(), std::ref(progress));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char line[512];
  std::snprintf(line, sizeof line,
                "eval: %s: %lld windows of %lld tokens (%lld of %lld tokens scored), precision %s\n"
                "loss %.6f nats/token, perplexity %.4f, bits per byte %.4f (%lld bytes), %.1f s\n",
                source.c_str(), static_cast<long long>(r.windows), static_cast<long long>(ckpt.info.model.seq_len),
                static_cast<long long>(r.tokens), static_cast<long long>(r.stream_tokens), infer::to_string(precision),
                r.loss(), r.perplexity(), r.bits_per_byte(), static_cast<long long>(r.bytes), secs);
  std::cout << line << std::flush;
  if (!o.json.empty()) {
    const auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    const nlohmann::json j = {{"source", source}, {"precision", infer::to_string(precision)},
                              {"windows", r.windows}, {"seq_len", ckpt.info.model.seq_len},
                              {"tokens", r.tokens}, {"stream_tokens", r.stream_tokens}, {"nats", r.nats},
                              {"loss", num(r.loss())}, {"perplexity", num(r.perplexity())},
                              {"bytes", r.bytes}, {"bits_per_byte", num(r.bits_per_byte())}};
    io::write_file_atomic(o.json, [&](std::ostream& f) { f << j.dump(2) << "\n"; });
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("eval", "loss, perplexity and bits per byte of a checkpoint on every window");
  cmd->add_option("--checkpoint", o->checkpoint, "run folder (or its checkpoint/) of s3r train")->required();
  cmd->add_option("--data", o->data, "a prepared dataset folder (s3r data prepare): its val.bin (see --split)");
  cmd->add_option("--split", o->split, "val | train: which shard of --data")->capture_default_str();
  cmd->add_option("--text", o->text, "a text, JSON or JSONL file (optionally .gz), encoded as s3r data prepare does");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "SentencePiece tokenizer.model (default: the checkpoint's own, else --data's)");
  cmd->add_option("--precision", o->precision, "trained (the model's own forward) | f32 (every product in f32)")
      ->capture_default_str();
  add_integer_option(cmd, "--batch", o->batch, "windows per forward (default: the checkpoint's B)", 1, 1 << 20);
  cmd->add_option("--json", o->json, "also write the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace s3r::tools
