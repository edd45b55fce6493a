#pragma once
// The tokenizer of a checkpoint, for generation, evaluation and export: the checkpoint's own
// tokenizer.model, or one given beside it (s3r/data/tokenizer.hpp loads and encodes).
#include <memory>
#include <string>

#include "s3r/ckpt/checkpoint.hpp"
#include "s3r/data/tokenizer.hpp"

namespace s3r::infer {

// The tokenizer for a checkpoint: `given` (a --tokenizer option) when not empty, else the
// checkpoint's own tokenizer.model, else `fallback` (e.g. a dataset's tokenizer.model) when it
// exists. Throws s3r::Error when there is none ("no tokenizer: ...; pass --tokenizer") or when
// its vocabulary differs from the model's V. `what` prefixes messages ("generate").
std::unique_ptr<data::Tokenizer> tokenizer_for(const ckpt::CheckpointInfo& info, const std::string& given,
                                               const std::string& fallback, const std::string& what);

}  // namespace s3r::infer
