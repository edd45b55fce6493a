#pragma once
// Checkpoints of a training run: what `s3r train` saves and resumes from, and what `s3r diag`
// reads. Format in docs/FORMATS.md.
//
//   RUN/checkpoint/model.safetensors      weights, one F32 tensor per parameter, with its shape
//                                         (the parameter schema's, s3r/model/params.hpp;
//                                         matrices (in, out): y = x W)
//   RUN/checkpoint/optimizer.safetensors  AdamW moments NAME.m, NAME.v (the same shapes)
//   RUN/checkpoint/tokenizer.model        the SentencePiece tokenizer, when the saver named one
//   RUN/checkpoint/meta.json              format, version 3, step, run configuration, the
//                                         forward's hyper-parameters ("architecture": norm eps,
//                                         RoPE base and layout, precisions, orientation), the
//                                         tokenizer's identity, data-loader position,
//                                         skipped-step count, and per file its size and CRC-32
//
// Durability and atomicity. A save writes RUN/checkpoint.tmp/ (each file fsynced, meta.json with
// the checksums last, then the folder), then swaps it in: checkpoint/ -> checkpoint.old/,
// checkpoint.tmp/ -> checkpoint/, checkpoint.old/ removed, RUN fsynced after each rename. A crash
// at any moment leaves at least one complete checkpoint among checkpoint/, checkpoint.tmp/ and
// checkpoint.old/; find_checkpoint picks the newest complete one (highest step whose files match
// their checksums). Only finite states are saved: a NaN or Inf weight or moment is an error and
// nothing is written.
//
// Versions 1 (no "files" checksums: unchecked) and 2 (flat 1-D tensors, no "architecture") still
// load; a newer version is a clear error.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "s3r/data/dataloader.hpp"
#include "s3r/model/config.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/recipe.hpp"

namespace s3r::ckpt {

// A run's configuration as a checkpoint records it (a resume must match it exactly).
struct RunConfig {
  model::ModelConfig model;
  nn::Recipe recipe;
  uint32_t seed = 0;
  friend bool operator==(const RunConfig&, const RunConfig&) = default;
};

// The tokenizer a checkpoint holds (checkpoint/tokenizer.model), as meta.json identifies it.
struct TokenizerRecord {
  std::string type = "sentencepiece";
  int64_t vocab = 0;       // pieces; equals the model's V
  uint64_t bytes = 0;      // size and CRC-32 of tokenizer.model
  uint32_t crc32 = 0;
  int64_t eos_id = -1, bos_id = -1, unk_id = -1, pad_id = -1;  // -1: none
};

// What a checkpoint's meta.json records: the run's configuration, and where the run stands.
struct CheckpointInfo : RunConfig {
  const RunConfig& config() const { return *this; }
  int64_t step = 0;            // the last step the checkpoint covers (0-based)
  data::LoaderPosition loader; // the training loader's position after that step
  int bad_steps = 0;           // consecutive skipped steps up to that step
  int version = 0;             // the format version read (set by read_checkpoint_info)
  // Saving: a SentencePiece tokenizer.model to copy into the checkpoint (empty: none; the
  // trainer's data folder holds it). Reading: the folder's tokenizer.model when it has one.
  std::string tokenizer_model;
  std::optional<TokenizerRecord> tokenizer;  // read: meta.json's "tokenizer" (null: none)
};

// The "architecture" object of meta.json for a run: every hyper-parameter the forward pass needs
// beyond the shapes (written for readers outside s3r; docs/FORMATS.md).
std::string architecture_json(const RunConfig& config);

// One line describing a configuration, for error messages ("L=2 C=64 ..., recipe s3r+dx, seed 0").
std::string describe(const RunConfig& config);

// Saves the model's weights and the moments m, v (each the size of model.params()) as
// RUN/checkpoint, durably and atomically (see above). Throws s3r::Error naming the tensor and
// element when any value is not finite (nothing is written), or naming the file when writing
// fails (the partial checkpoint.tmp/ is removed; the previous checkpoint stays).
void save_checkpoint(const std::string& run_dir, const CheckpointInfo& info, model::Model& model,
                     std::span<const float> m, std::span<const float> v);

// True when RUN holds a checkpoint or a leftover of one (checkpoint/, .tmp/ or .old/).
bool has_checkpoint(const std::string& run_dir);

// The newest complete checkpoint folder of a run folder (see above). Reads only. Throws
// s3r::Error "no checkpoint at 'RUN/checkpoint/meta.json'" when there is none, or naming each
// candidate and why it was rejected (incomplete, corrupt: checksum, size, JSON, field) when
// none is complete.
std::string find_checkpoint(const std::string& run_dir);

// Makes RUN/checkpoint the newest complete checkpoint: renames checkpoint.tmp/ or .old/ in when
// a crash left the newest there, and removes the other leftovers; a corrupt checkpoint/ that a
// complete leftover replaces is kept as checkpoint.corrupt/. Returns a line saying what it did
// (empty when nothing). Call only with the run folder locked.
std::string tidy_checkpoints(const std::string& run_dir);

// `dir` is a run folder (its newest complete checkpoint is read) or a checkpoint folder itself.
// Throws s3r::Error naming the file and field when it is missing, not an s3r checkpoint, or a
// field is missing or mistyped.
CheckpointInfo read_checkpoint_info(const std::string& dir);

// Throws s3r::Error naming the file unless `path` is a SentencePiece model of `vocab` pieces:
// what save_checkpoint checks before it copies CheckpointInfo::tokenizer_model (callers check
// it before training, not at the first save).
void check_tokenizer(const std::string& path, int64_t vocab);

// Loads weights (and, when m and v are not empty, the moments) of the checkpoint in `dir` (as
// for read_checkpoint_info) into a model of its configuration, whose batch may differ (a rank's or
// a micro-batch's share of the checkpoint's global batch: the batch sizes no tensor). Throws s3r::Error naming the file
// when a tensor is missing or misshaped, a file does not match its checksum, or a value is not
// finite.
CheckpointInfo load_checkpoint(const std::string& dir, model::Model& model, std::span<float> m,
                               std::span<float> v);
void load_checkpoint_weights(const std::string& dir, model::Model& model);

// For inference: loads the weights of the checkpoint in `dir` into `model`, whose configuration
// must equal the checkpoint's except for batch and seq_len (which do not change the weights), in
// any mode (an f32 model evaluates an int8-trained checkpoint in full precision). Returns the
// checkpoint's own information (its configuration, mode and tokenizer).
CheckpointInfo load_checkpoint_for_inference(const std::string& dir, model::Model& model);

// The checkpoint folder that `dir` names: `dir` itself when it holds meta.json, else the newest
// complete checkpoint of the run folder `dir` (find_checkpoint).
std::string checkpoint_folder(const std::string& dir);

}  // namespace s3r::ckpt
