// Checkpoints of a training run; see s3r/train/checkpoint.hpp.
#include "s3r/train/checkpoint.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/io/safetensors.hpp"

namespace s3r::train {

namespace fs = std::filesystem;

namespace {

constexpr int kVersion = 2;
constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors"};

// The run configuration <-> the "config" object of meta.json (the one place that knows its
// fields). from_json throws s3r::Error naming `where` and the field.
nlohmann::json to_json(const RunConfig& c) {
  const model::ModelConfig& m = c.model;
  return {{"layers", m.layers},       {"width", m.width},   {"heads", m.heads},
          {"ffn_width", m.ffn_width}, {"vocab", m.vocab},   {"seq_len", m.seq_len},
          {"batch", m.batch},         {"rope_theta", m.rope_theta}, {"norm_eps", m.norm_eps},
          {"lm_head", m.int8_head ? "int8" : "default"},
          {"mode", std::string(nn::to_string(c.mode))},
          {"correction", std::string(nn::to_string(c.correction))}, {"seed", c.seed}};
}

// Field `key` of object `j` as T; an s3r::Error naming the file and field when it is missing or
// of another type.
template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw Error(where + ": field \"" + key + "\" is missing");
  const nlohmann::json& v = j[key];
  try {
    if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) throw Error("");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) throw Error("");
    } else {
      if (!v.is_string()) throw Error("");
    }
    return v.get<T>();
  } catch (const std::exception&) {
    throw Error(where + ": field \"" + key + "\" is " + v.dump() + ", not a " +
                (std::is_integral_v<T> ? "whole number" : std::is_floating_point_v<T> ? "number" : "string"));
  }
}

RunConfig from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": field \"config\" is not an object");
  RunConfig c;
  model::ModelConfig& m = c.model;
  m.layers = field<int64_t>(j, "layers", where);
  m.width = field<int64_t>(j, "width", where);
  m.heads = field<int64_t>(j, "heads", where);
  m.ffn_width = field<int64_t>(j, "ffn_width", where);
  m.vocab = field<int64_t>(j, "vocab", where);
  m.seq_len = field<int64_t>(j, "seq_len", where);
  m.batch = field<int64_t>(j, "batch", where);
  if (j.contains("rope_theta")) m.rope_theta = field<float>(j, "rope_theta", where);  // version 2
  if (j.contains("norm_eps")) m.norm_eps = field<float>(j, "norm_eps", where);
  if (j.contains("lm_head")) {  // absent before issue 11: the default head
    const std::string head = field<std::string>(j, "lm_head", where);
    if (head != "int8" && head != "default") {
      throw Error(where + ": field \"lm_head\" is \"" + head + "\", not \"default\" or \"int8\"");
    }
    m.int8_head = head == "int8";
  }
  try {
    m.validate();
    c.mode = nn::parse_linear_mode(field<std::string>(j, "mode", where));
    c.correction = nn::parse_correction(field<std::string>(j, "correction", where));
  } catch (const Error& e) {
    const std::string what = e.what();
    throw Error(what.rfind(where, 0) == 0 ? what : where + ": " + what);
  }
  const auto seed = field<int64_t>(j, "seed", where);
  if (seed < 0 || seed > UINT32_MAX) throw Error(where + ": field \"seed\" is " + std::to_string(seed) + ", not a 32-bit seed");
  c.seed = static_cast<uint32_t>(seed);
  return c;
}

// CRC-32 (zlib) and size of a file.
struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

FileSum file_sum(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path.string() + "'");
  std::vector<char> buf(1 << 20);
  FileSum s;
  uLong crc = crc32_z(0L, Z_NULL, 0);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(in.gcount());
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(buf.data()), n);
    s.bytes += n;
  }
  if (in.bad()) throw Error("reading '" + path.string() + "' failed");
  s.crc = static_cast<uint32_t>(crc);
  return s;
}

// A checkpoint folder checked whole: meta.json parses and has every field, and the tensor
// files are there with their recorded size and checksum. Throws s3r::Error naming the file.
CheckpointInfo inspect(const fs::path& dir) {
  const fs::path meta_path = dir / "meta.json";
  const std::string where = "'" + meta_path.string() + "'";
  std::ifstream f(meta_path);
  if (!f) throw Error("no checkpoint at " + where);
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(where + " is not valid JSON: " + e.what());
  }
  if (!meta.is_object() || !meta.contains("format") || meta["format"] != "s3r-checkpoint") {
    throw Error(where + " is not an s3r checkpoint (no \"format\": \"s3r-checkpoint\")");
  }
  const auto version = field<int64_t>(meta, "version", where);
  if (version != 1 && version != kVersion) {
    throw Error(where + ": checkpoint version " + std::to_string(version) + "; this build reads versions 1 and 2");
  }
  CheckpointInfo info;
  if (!meta.contains("config")) throw Error(where + ": field \"config\" is missing");
  static_cast<RunConfig&>(info) = from_json(meta["config"], where);
  info.step = field<int64_t>(meta, "step", where);
  info.loader.epoch = field<int64_t>(meta, "loader_epoch", where);
  info.loader.cursor = field<int64_t>(meta, "loader_cursor", where);
  info.bad_steps = meta.contains("bad_steps") ? static_cast<int>(field<int64_t>(meta, "bad_steps", where)) : 0;
  if (info.step < 0 || info.loader.epoch < 0 || info.loader.cursor < 0 || info.bad_steps < 0) {
    throw Error(where + ": step, loader_epoch, loader_cursor and bad_steps must be >= 0");
  }
  for (const char* name : kFiles) {
    const fs::path path = dir / name;
    if (!fs::is_regular_file(path)) throw Error("checkpoint file '" + path.string() + "' is missing");
    if (version == 1) continue;  // no checksums recorded
    if (!meta.contains("files") || !meta["files"].is_object() || !meta["files"].contains(name)) {
      throw Error(where + ": no checksum for " + name + " under \"files\"");
    }
    const nlohmann::json& entry = meta["files"][name];
    const std::string entry_where = where + " files." + name;
    const auto bytes = field<int64_t>(entry, "bytes", entry_where);
    const auto crc = field<int64_t>(entry, "crc32", entry_where);
    const FileSum got = file_sum(path);
    if (static_cast<int64_t>(got.bytes) != bytes) {
      throw Error("checkpoint file '" + path.string() + "' is " + std::to_string(got.bytes) + " bytes, but " +
                  "meta.json records " + std::to_string(bytes) + " (truncated or corrupt)");
    }
    if (static_cast<int64_t>(got.crc) != crc) {
      throw Error("checkpoint file '" + path.string() + "' does not match its CRC-32 in meta.json (corrupt)");
    }
  }
  return info;
}

struct Candidate {
  fs::path dir;
  std::optional<CheckpointInfo> info;
  std::string problem;  // why it is not complete
};

// checkpoint/, checkpoint.tmp/, checkpoint.old/ of a run folder: those that exist, inspected.
std::vector<Candidate> candidates(const fs::path& run) {
  std::vector<Candidate> out;
  for (const char* name : {"checkpoint", "checkpoint.tmp", "checkpoint.old"}) {
    const fs::path dir = run / name;
    if (!fs::exists(dir)) continue;
    Candidate c{dir, std::nullopt, ""};
    try {
      c.info = inspect(dir);
    } catch (const Error& e) {
      c.problem = e.what();
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The newest complete candidate (ties: the earlier in the list above), or an s3r::Error.
const Candidate& newest(const std::vector<Candidate>& all, const fs::path& run) {
  const Candidate* best = nullptr;
  for (const Candidate& c : all) {
    if (c.info && (!best || c.info->step > best->info->step)) best = &c;
  }
  if (best) return *best;
  if (all.empty()) throw Error("no checkpoint at '" + (run / "checkpoint" / "meta.json").string() + "'");
  std::string why;
  for (const Candidate& c : all) why += (why.empty() ? "" : "; ") + c.problem;
  throw Error("no complete checkpoint in '" + run.string() + "': " + why);
}

// A run folder (holding checkpoint/ or a leftover) or a checkpoint folder itself.
fs::path checkpoint_folder(const std::string& dir) {
  const fs::path d(dir);
  if (fs::is_regular_file(d / "meta.json")) return d;
  return find_checkpoint(dir);
}

// Copies tensor `name` (of `size` elements) of a safetensors file into dst; values must be finite.
void copy_tensor(const io::SafetensorsFile& file, const fs::path& path, const std::string& name, float* dst,
                 int64_t size) {
  const auto it = file.tensors.find(name);
  if (it == file.tensors.end() || static_cast<int64_t>(it->second.data.size()) != size) {
    throw Error("tensor '" + name + "' is missing from '" + path.string() + "' or does not have " +
                std::to_string(size) + " elements");
  }
  const std::vector<float>& src = it->second.data;
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

void sync_renamed(const fs::path& run) { io::sync_path(run.string()); }

}  // namespace

std::string describe(const RunConfig& c) {
  return c.model.describe() + ", mode " + std::string(nn::to_string(c.mode)) + ", correction " +
         std::string(nn::to_string(c.correction)) + ", seed " + std::to_string(c.seed);
}

void save_checkpoint(const std::string& run_dir, const CheckpointInfo& info, model::Model& model,
                     std::span<const float> m, std::span<const float> v) {
  const std::span<const float> params = model.params();
  if (m.size() != params.size() || v.size() != params.size()) {
    throw Error("save_checkpoint: the moments do not have the parameters' size " + std::to_string(params.size()));
  }
  check_finite(params, model, "weight");
  check_finite(m, model, "first moment");
  check_finite(v, model, "second moment");
  const fs::path run(run_dir), dir = run / "checkpoint", tmp = run / "checkpoint.tmp", old = run / "checkpoint.old";
  try {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::vector<io::TensorView> weights, moments;
    for (const model::ParamInfo& p : model.param_table()) {
      weights.push_back({p.name, {p.size}, params.subspan(p.offset, p.size)});
      moments.push_back({p.name + ".m", {p.size}, m.subspan(p.offset, p.size)});
      moments.push_back({p.name + ".v", {p.size}, v.subspan(p.offset, p.size)});
    }
    io::write_safetensors((tmp / kFiles[0]).string(), weights);
    io::write_safetensors((tmp / kFiles[1]).string(), moments);
    nlohmann::json files = nlohmann::json::object();
    for (const char* name : kFiles) {
      const FileSum s = file_sum(tmp / name);  // what is on disk now, read back
      files[name] = {{"bytes", s.bytes}, {"crc32", s.crc}};
    }
    const nlohmann::json meta = {{"format", "s3r-checkpoint"}, {"version", kVersion}, {"step", info.step},
                                 {"config", to_json(info.config())}, {"loader_epoch", info.loader.epoch},
                                 {"loader_cursor", info.loader.cursor}, {"bad_steps", info.bad_steps},
                                 {"files", files}};
    io::write_file_atomic((tmp / "meta.json").string(), [&](std::ostream& f) { f << meta.dump(2) << "\n"; });
    io::sync_path(tmp.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed write leaves no partial checkpoint behind
    throw;
  }
  // The swap. After each rename the run folder is synced, so the order holds on disk too.
  fs::remove_all(old);
  if (fs::exists(dir)) {
    fs::rename(dir, old);
    sync_renamed(run);
  }
  fs::rename(tmp, dir);
  sync_renamed(run);
  fs::remove_all(old);
  sync_renamed(run);
}

bool has_checkpoint(const std::string& run_dir) {
  const fs::path run(run_dir);
  return fs::exists(run / "checkpoint") || fs::exists(run / "checkpoint.tmp") || fs::exists(run / "checkpoint.old");
}

std::string find_checkpoint(const std::string& run_dir) {
  return newest(candidates(run_dir), run_dir).dir.string();
}

std::string tidy_checkpoints(const std::string& run_dir) {
  const fs::path run(run_dir), dir = run / "checkpoint";
  const std::vector<Candidate> all = candidates(run);
  if (all.empty()) return "";
  const Candidate& best = newest(all, run);
  std::string did;
  if (best.dir != dir) {
    if (fs::exists(dir)) {
      const bool corrupt = std::any_of(all.begin(), all.end(), [&](const Candidate& c) { return c.dir == dir && !c.info; });
      if (corrupt) {
        fs::remove_all(run / "checkpoint.corrupt");
        fs::rename(dir, run / "checkpoint.corrupt");
        did = "kept the corrupt checkpoint/ as checkpoint.corrupt/ (" +
              std::find_if(all.begin(), all.end(), [&](const Candidate& c) { return c.dir == dir; })->problem + "); ";
      } else {
        fs::remove_all(dir);  // complete but older than the leftover
      }
      sync_renamed(run);
    }
    fs::rename(best.dir, dir);
    sync_renamed(run);
    did += "recovered the checkpoint of step " + std::to_string(best.info->step + 1) + " from " +
           best.dir.filename().string() + "/ (a crash interrupted a save)";
  }
  for (const char* name : {"checkpoint.tmp", "checkpoint.old"}) {
    if (fs::exists(run / name)) {
      fs::remove_all(run / name);
      did += std::string(did.empty() ? "" : "; ") + "removed the leftover " + name + "/";
    }
  }
  if (!did.empty()) sync_renamed(run);
  return did;
}

CheckpointInfo read_checkpoint_info(const std::string& dir) { return inspect(checkpoint_folder(dir)); }

CheckpointInfo load_checkpoint(const std::string& dir, model::Model& model, std::span<float> m,
                               std::span<float> v) {
  const fs::path folder = checkpoint_folder(dir);
  const CheckpointInfo info = inspect(folder);
  const RunConfig have{model.config(), model.mode(), model.correction(), info.seed};
  if (!(have == info.config())) {
    throw Error("the checkpoint in '" + folder.string() + "' is of another model: " + describe(info.config()) +
                " (this model: " + describe(have) + ")");
  }
  const fs::path weights_path = folder / kFiles[0];
  const io::SafetensorsFile weights = io::read_safetensors(weights_path.string());
  for (const model::ParamInfo& p : model.param_table()) {
    copy_tensor(weights, weights_path, p.name, model.params().data() + p.offset, p.size);
  }
  if (!m.empty() || !v.empty()) {
    if (m.size() != model.params().size() || v.size() != model.params().size()) {
      throw Error("load_checkpoint: the moments do not have the parameters' size");
    }
    const fs::path moments_path = folder / kFiles[1];
    const io::SafetensorsFile moments = io::read_safetensors(moments_path.string());
    for (const model::ParamInfo& p : model.param_table()) {
      copy_tensor(moments, moments_path, p.name + ".m", m.data() + p.offset, p.size);
      copy_tensor(moments, moments_path, p.name + ".v", v.data() + p.offset, p.size);
    }
  }
  return info;
}

void load_checkpoint_weights(const std::string& dir, model::Model& model) { load_checkpoint(dir, model, {}, {}); }

}  // namespace s3r::train
