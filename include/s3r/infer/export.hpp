#pragma once
// `s3r export`: a checkpoint as a GGUF file for llama.cpp (and ollama, LM Studio) or
// as a Hugging Face LlamaForCausalLM folder. docs/FORMATS.md lists every key and tensor.
//
// Orientation. s3r stores matrices (in, out) (y = x W); GGUF (ne = [in, out], i.e. row-major
// (out, in)) and Hugging Face (nn.Linear weight (out, in)) both want them transposed; the token
// embedding (V, C) is already a row per token in all three.
//
// RoPE. s3r rotates adjacent pairs (x[2i], x[2i+1]) of each head (docs/SPEC.md, appendix A.7).
//  - GGUF, architecture `llama`: llama.cpp's rope type NORM rotates the same adjacent pairs, so
//    the Q and K weights go in as they are (llama.cpp's own converter permutes Hugging Face's
//    half-split weights back to this layout);
//  - Hugging Face: LlamaForCausalLM rotates (x[i], x[i + HD/2]) ("rotate_half"), so the output
//    rows of Q and K are permuted within each head, new row i = old row 2i and new row HD/2 + i =
//    old row 2i + 1: the rotated pairs, and every dot product q . k, are then the same.
// Both are checked against independent implementations (tests/llama, tests/peer).
#include <cstdint>
#include <string>

#include "s3r/infer/decoder.hpp"
#include "s3r/data/tokenizer.hpp"

namespace s3r::infer {

enum class GgufType { kF32, kF16, kBf16, kQ8_0 };
GgufType parse_gguf_type(const std::string& name);  // f32 | f16 | bf16 | q8_0

struct ExportOptions {
  GgufType type = GgufType::kF32;  // GGUF matrices; norm gains stay f32 (as llama.cpp's converter)
  std::string name;                // general.name / the model's name (default: the folder's)
  // For tests: a deliberate bug, so that a comparison can show it catches it:
  // "permute-qk" (GGUF: apply the Hugging Face permutation; HF: leave it out), "transpose-o"
  // (the attention output matrix not transposed), "f16-overflow" (the first element of every
  // token's embedding set to +-1e7: inf in f16, an inf block scale in q8_0), "nan-weight" (those
  // elements NaN).
  std::string inject;
};

// Writes the GGUF file `path` (atomically: PATH.tmp, then renamed). Throws s3r::Error naming the
// file on failure.
void export_gguf(const LoadedCheckpoint& checkpoint, const data::Tokenizer& tokenizer, const std::string& path,
                 const ExportOptions& options);

// Writes the folder `dir` (created; files written atomically): config.json,
// generation_config.json, model.safetensors (F32, Hugging Face names and orientation),
// tokenizer.model, tokenizer_config.json, special_tokens_map.json.
void export_hf(const LoadedCheckpoint& checkpoint, const data::Tokenizer& tokenizer, const std::string& dir,
               const ExportOptions& options);

// IEEE half precision, round to nearest even (what ggml's FP32_TO_FP16 computes).
uint16_t to_f16(float f);
float from_f16(uint16_t h);

}  // namespace s3r::infer
