// `s3r data prepare`: text -> tokenizer -> token shards (s3r/data/prepare.hpp).
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "s3r/data/prepare.hpp"

namespace s3r::tools {

void register_data_prepare(CLI::App& data) {
  auto o = std::make_shared<s3r::data::PrepareOptions>();
  CLI::App* cmd = data.add_subcommand("prepare", "text or JSONL (C4) -> SentencePiece BPE tokenizer -> token shards");
  cmd->add_option("inputs", o->inputs,
                  "text (.txt/.text/.md), JSONL (.json/.jsonl), optionally .gz, files or folders (in folders, "
                  "other files are skipped with a warning)")->required();
  cmd->add_option("--out", o->out_dir,
                  "output folder (tokenizer.model, train.bin, val.bin, info.json); replaced as a whole, and only "
                  "if new, empty or a dataset")->required();
  cmd->add_option("--tokenizer", o->tokenizer_model, "use this SentencePiece model instead of training one");
  cmd->add_option("--vocab", o->vocab_size, "vocabulary size of a trained tokenizer")->capture_default_str();
  cmd->add_option("--val-fraction", o->val_fraction, "share of documents held out for validation")->capture_default_str();
  cmd->callback([o] {
    const auto start = std::chrono::steady_clock::now();
    s3r::data::prepare(*o, [&](const std::string& msg) {
      if (msg.rfind("warning: ", 0) == 0) {  // skipped inputs and the like: on stderr
        std::fflush(stdout);
        std::fprintf(stderr, "s3r: %s\n", msg.c_str());
        return;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("[%6.1f s] %s\n", s, msg.c_str());
      std::fflush(stdout);
    });
  });
}

}  // namespace s3r::tools
