// Saving and loading a checkpoint's tensors (weights, AdamW moments); see s3r/ckpt/checkpoint.hpp.
#include "s3r/ckpt/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "ckpt/checkpoint_internal.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/test_pause.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/io/safetensors.hpp"

namespace s3r::ckpt {

using namespace detail;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// Copies tensor `name` of a safetensors file into dst; values must be finite. Its shape must be
// `shape` (version 3), or it may be flat with the same number of elements (versions 1 and 2).
void copy_tensor(const io::SafetensorsFile& file, const fs::path& path, const std::string& name, float* dst,
                 const std::vector<int64_t>& shape, int version) {
  int64_t size = 1;
  for (int64_t d : shape) size *= d;
  const auto it = file.tensors.find(name);
  if (it == file.tensors.end()) throw Error("tensor '" + name + "' is missing from '" + path.string() + "'");
  const std::vector<int64_t>& got = it->second.shape;
  const bool flat_ok = version < 3 && got.size() == 1 && got[0] == size;
  if (got != shape && !flat_ok) {
    throw Error("tensor '" + name + "' of '" + path.string() + "' has shape " + shape_text(got) + ", expected " +
                shape_text(shape) + (version < 3 ? " or flat (" + std::to_string(size) + ")" : ""));
  }
  const AlignedVector<float>& src = it->second.data;
  for (size_t i = 0; i < src.size(); ++i) {
    if (!std::isfinite(src[i])) {
      throw Error("tensor '" + name + "' of '" + path.string() + "' holds a non-finite value at element " +
                  std::to_string(i));
    }
  }
  std::copy(src.begin(), src.end(), dst);
}

// Throws s3r::Error naming the tensor and element when `values` holds a NaN or Inf.
void check_finite(std::span<const float> values, const model::Model& model, const char* what) {
  for (const model::ParamInfo& p : model.param_table()) {
    for (int64_t i = 0; i < p.size; ++i) {
      if (!std::isfinite(values[p.offset + i])) {
        throw Error("checkpoint: refusing to save a non-finite state: " + std::string(what) + " of '" + p.name +
                    "' is " + std::to_string(values[p.offset + i]) + " at element " + std::to_string(i));
      }
    }
  }
}

}  // namespace

void save_checkpoint(const std::string& run_dir, const CheckpointInfo& info, model::Model& model,
                     std::span<const float> m, std::span<const float> v) {
  const std::span<const float> params = model.params();
  if (m.size() != params.size() || v.size() != params.size()) {
    throw Error("save_checkpoint: the moments do not have the parameters' size " + std::to_string(params.size()));
  }
  check_finite(params, model, "weight");
  check_finite(m, model, "first moment");
  check_finite(v, model, "second moment");
  const fs::path run(run_dir), tmp = run / "checkpoint.tmp";
  try {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::vector<io::TensorView> weights, moments;
    for (const model::ParamInfo& p : model.param_table()) {
      if (p.tied) continue;  // the embedding's values; its moments stay zero (params.hpp)
      const std::vector<int64_t> shape = p.shape;
      weights.push_back({p.name, shape, params.subspan(p.offset, p.size)});
      moments.push_back({p.name + ".m", shape, m.subspan(p.offset, p.size)});
      moments.push_back({p.name + ".v", shape, v.subspan(p.offset, p.size)});
    }
    const std::map<std::string, std::string> st_meta = {{"format", "s3r-checkpoint"},
                                                        {"matrix_orientation", "in_out"}};
    io::write_safetensors((tmp / kFiles[0]).string(), weights, st_meta);
    test_pause("checkpoint-write");
    io::write_safetensors((tmp / kFiles[1]).string(), moments, st_meta);
    std::vector<std::string> names(std::begin(kFiles), std::end(kFiles));
    nlohmann::json tokenizer = nullptr;
    std::optional<TokenizerRecord> record;
    if (!info.tokenizer_model.empty()) {
      record = checked_tokenizer(info.tokenizer_model, model.config().vocab, "save_checkpoint");
      const std::string bytes = [&] {
        std::ifstream in(info.tokenizer_model, std::ios::binary);
        std::ostringstream s;
        s << in.rdbuf();
        return s.str();
      }();
      io::write_file_atomic((tmp / kTokenizerFile).string(), [&](std::ostream& f) { f << bytes; });
      names.push_back(kTokenizerFile);
    }
    nlohmann::json files = nlohmann::json::object();
    for (const std::string& name : names) {
      const FileSum s = file_sum(tmp / name);  // what is on disk now, read back
      files[name] = {{"bytes", s.bytes}, {"crc32", s.crc}};
      if (name == kTokenizerFile) {
        record->bytes = s.bytes;
        record->crc32 = s.crc;
        tokenizer = to_json(*record);
      }
    }
    const nlohmann::json meta = {{"format", "s3r-checkpoint"}, {"version", kVersion}, {"step", info.step},
                                 {"config", to_json(info.config())}, {"architecture", architecture(info.config())},
                                 {"tokenizer", tokenizer}, {"loader_epoch", info.loader.epoch},
                                 {"loader_cursor", info.loader.cursor}, {"bad_steps", info.bad_steps},
                                 {"files", files}};
    io::write_file_atomic((tmp / "meta.json").string(), [&](std::ostream& f) { f << meta.dump(2) << "\n"; });
    io::sync_path(tmp.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed write leaves no partial checkpoint behind
    throw;
  }
  test_pause("checkpoint-before-swap");
  swap_in_checkpoint(run);
}

CheckpointInfo load_checkpoint(const std::string& dir, model::Model& model, std::span<float> m,
                               std::span<float> v) {
  const fs::path folder = checkpoint_folder(dir);
  const CheckpointInfo info = inspect(folder);
  // The model may hold a share of the checkpoint's batch (a rank's under data parallelism, a
  // micro-batch's): the batch sizes no tensor, and the trainer checks the global batch itself.
  const RunConfig have{model.config(), model.recipe(), info.seed};
  RunConfig have_any_batch = have, want_any_batch = info.config();
  have_any_batch.model.batch = want_any_batch.model.batch = 1;
  if (!(have_any_batch == want_any_batch)) {
    throw Error("the checkpoint in '" + folder.string() + "' is of another model: " + describe(info.config()) +
                " (this model: " + describe(have) + ")");
  }
  const fs::path weights_path = folder / kFiles[0];
  const io::SafetensorsFile weights = io::read_safetensors(weights_path.string());
  for (const model::ParamInfo& p : model.param_table()) {
    if (p.tied) continue;
    copy_tensor(weights, weights_path, p.name, model.params().data() + p.offset,
                p.shape, info.version);
  }
  if (!m.empty() || !v.empty()) {
    if (m.size() != model.params().size() || v.size() != model.params().size()) {
      throw Error("load_checkpoint: the moments do not have the parameters' size");
    }
    const fs::path moments_path = folder / kFiles[1];
    const io::SafetensorsFile moments = io::read_safetensors(moments_path.string());
    for (const model::ParamInfo& p : model.param_table()) {
      if (p.tied) continue;
      const std::vector<int64_t> shape = p.shape;
      copy_tensor(moments, moments_path, p.name + ".m", m.data() + p.offset, shape, info.version);
      copy_tensor(moments, moments_path, p.name + ".v", v.data() + p.offset, shape, info.version);
    }
  }
  return info;
}

void load_checkpoint_weights(const std::string& dir, model::Model& model) { load_checkpoint(dir, model, {}, {}); }

CheckpointInfo load_checkpoint_for_inference(const std::string& dir, model::Model& model) {
  const fs::path folder = checkpoint_folder(dir);
  const CheckpointInfo info = inspect(folder);
  if (!(info.model.architecture() == model.config().architecture())) {
    throw Error("the checkpoint in '" + folder.string() + "' is of another model: " +
                info.model.architecture().describe() + " (this model: " + model.config().architecture().describe() + ")");
  }
  const fs::path weights_path = folder / kFiles[0];
  const io::SafetensorsFile weights = io::read_safetensors(weights_path.string());
  for (const model::ParamInfo& p : model.param_table()) {
    if (p.tied) continue;
    copy_tensor(weights, weights_path, p.name, model.params().data() + p.offset,
                p.shape, info.version);
  }
  return info;
}

}  // namespace s3r::ckpt
