// Checkpoints of a training run; see s3r/train/checkpoint.hpp.
#include "s3r/train/checkpoint.hpp"

#include <sentencepiece_processor.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/core/test_pause.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/io/safetensors.hpp"

namespace s3r::train {

namespace fs = std::filesystem;

namespace {

constexpr int kVersion = 3;
constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors"};
constexpr const char* kTokenizerFile = "tokenizer.model";

// The run configuration <-> the "config" object of meta.json (the one place that knows its
// fields). from_json throws s3r::Error naming `where` and the field.
nlohmann::json to_json(const RunConfig& c) {
  const model::ModelConfig& m = c.model;
  return {{"layers", m.layers},       {"width", m.width},   {"heads", m.heads},
          {"ffn_width", m.ffn_width}, {"vocab", m.vocab},   {"seq_len", m.seq_len},
          {"batch", m.batch},         {"rope_theta", m.rope_theta}, {"norm_eps", m.norm_eps},
          {"lm_head", std::string(nn::to_string(c.recipe.head_choice()))},
          {"mode", std::string(nn::to_string(c.recipe.projections()))},
          {"correction", std::string(nn::to_string(c.recipe.correction()))},
          {"recipe", c.recipe.name()}, {"seed", c.seed}};
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

// The recipe of a "config" object: its "mode", "correction" and "lm_head" (absent in checkpoints
// older than the int8 head: the default head), and its "recipe" name when present (written since
// the recipe is one value), which must agree with them. Checkpoints written through the library
// before it checked recipes may pair bf16 or f32 with a correction or an int8 head; such models
// applied neither, so they read as the recipe they computed.
nn::Recipe recipe_from_json(const nlohmann::json& j, const std::string& where) {
  const nn::LinearMode mode = nn::parse_linear_mode(field<std::string>(j, "mode", where));
  nn::Correction correction = nn::parse_correction(field<std::string>(j, "correction", where));
  nn::HeadChoice head = nn::HeadChoice::kDefault;
  if (j.contains("lm_head")) {
    const std::string name = field<std::string>(j, "lm_head", where);
    if (name != "int8" && name != "default") {
      throw Error(where + ": field \"lm_head\" is \"" + name + "\", not \"default\" or \"int8\"");
    }
    head = nn::parse_head_choice(name);
  }
  if (!nn::is_int8(mode)) {
    correction = nn::Correction::kNone;
    head = nn::HeadChoice::kDefault;
  }
  const nn::Recipe recipe = nn::Recipe::make(mode, correction, head);
  if (j.contains("recipe") && field<std::string>(j, "recipe", where) != recipe.name()) {
    throw Error(where + ": field \"recipe\" is \"" + j["recipe"].get<std::string>() + "\", but \"mode\", " +
                "\"correction\" and \"lm_head\" make " + recipe.name());
  }
  return recipe;
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
  try {
    m.validate();
    c.recipe = recipe_from_json(j, where);
  } catch (const Error& e) {
    const std::string what = e.what();
    throw Error(what.rfind(where, 0) == 0 ? what : where + ": " + what);
  }
  const auto seed = field<int64_t>(j, "seed", where);
  if (seed < 0 || seed > UINT32_MAX) throw Error(where + ": field \"seed\" is " + std::to_string(seed) + ", not a 32-bit seed");
  c.seed = static_cast<uint32_t>(seed);
  return c;
}

// The forward's hyper-parameters beyond the shapes, for readers outside s3r (docs/FORMATS.md).
std::string precision_of(nn::LinearMode mode) {
  if (mode == nn::LinearMode::kF32) return "f32";
  if (mode == nn::LinearMode::kBf16) return "bf16";
  return "int8";  // every int8 mode rounds the forward operands to nearest (SPEC section 1)
}

nlohmann::json architecture(const RunConfig& c) {
  const model::ModelConfig& m = c.model;
  const nn::LinearMode mode = c.recipe.projections();
  return {{"family", "llama"},
          {"layers", m.layers}, {"width", m.width}, {"heads", m.heads}, {"kv_heads", m.heads},
          {"head_dim", m.head_dim()}, {"ffn_width", m.ffn_width}, {"vocab", m.vocab},
          {"context_length", m.seq_len},
          {"norm", {{"type", "rmsnorm"}, {"eps", m.norm_eps}, {"formula", "x / sqrt(mean(x^2) + eps) * gain"}}},
          {"rope", {{"theta", m.rope_theta}, {"layout", "adjacent-pairs"}, {"dimensions", m.head_dim()},
                    {"formula", "in each head, pair i = (x[2i], x[2i+1]) at position p rotates by "
                                "p * theta^(-2i/head_dim)"}}},
          {"attention", {{"type", "causal"}, {"scale", "1/sqrt(head_dim)"}, {"precision", "f32"}}},
          {"ffn", {{"type", "swiglu"}, {"formula", "(silu(x gate) * (x up)) down"}}},
          {"embedding", {{"tied", false}, {"precision", "f32"}}},
          {"bias", false},
          {"projections", {{"precision", precision_of(mode)},
                           {"rounding", nn::is_int8(mode) ? "per-token x per-output-channel absmax/127, "
                                                              "round to nearest even" : "none"}}},
          {"lm_head", {{"precision", precision_of(c.recipe.head())}}},
          {"matrix_orientation", "in_out"},
          {"matrix_orientation_note", "matrices are stored (in, out) row-major: y = x W"}};
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

// A tokenizer.model's record: loads it with SentencePiece. Throws s3r::Error naming the file.
TokenizerRecord tokenizer_record(const fs::path& path) {
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(path.string()); !status.ok()) {
    throw Error("tokenizer '" + path.string() + "' is not a SentencePiece model: " + status.ToString());
  }
  TokenizerRecord r;
  r.vocab = sp.GetPieceSize();
  r.eos_id = sp.eos_id();
  r.bos_id = sp.bos_id();
  r.unk_id = sp.unk_id();
  r.pad_id = sp.pad_id();
  return r;
}

// tokenizer_record, and its vocabulary must be V.
TokenizerRecord checked_tokenizer(const std::string& path, int64_t vocab, const std::string& who) {
  const TokenizerRecord record = tokenizer_record(path);
  if (record.vocab != vocab) {
    throw Error(who + ": tokenizer '" + path + "' has " + std::to_string(record.vocab) +
                " pieces, but the model's V is " + std::to_string(vocab));
  }
  return record;
}

nlohmann::json to_json(const TokenizerRecord& t) {
  return {{"type", t.type}, {"file", kTokenizerFile}, {"vocab", t.vocab}, {"bytes", t.bytes}, {"crc32", t.crc32},
          {"eos_id", t.eos_id}, {"bos_id", t.bos_id}, {"unk_id", t.unk_id}, {"pad_id", t.pad_id}};
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
  if (version < 1 || version > kVersion) {
    throw Error(where + ": checkpoint version " + std::to_string(version) + "; this build reads versions 1 to " +
                std::to_string(kVersion) + (version > kVersion ? " (written by a newer s3r: update s3r)" : ""));
  }
  CheckpointInfo info;
  info.version = static_cast<int>(version);
  if (!meta.contains("config")) throw Error(where + ": field \"config\" is missing");
  static_cast<RunConfig&>(info) = from_json(meta["config"], where);
  info.step = field<int64_t>(meta, "step", where);
  info.loader.epoch = field<int64_t>(meta, "loader_epoch", where);
  info.loader.cursor = field<int64_t>(meta, "loader_cursor", where);
  info.bad_steps = meta.contains("bad_steps") ? static_cast<int>(field<int64_t>(meta, "bad_steps", where)) : 0;
  if (info.step < 0 || info.loader.epoch < 0 || info.loader.cursor < 0 || info.bad_steps < 0) {
    throw Error(where + ": step, loader_epoch, loader_cursor and bad_steps must be >= 0");
  }
  if (version >= 3) {
    // The forward's conventions: this build computes exactly these.
    if (!meta.contains("architecture") || !meta["architecture"].is_object()) {
      throw Error(where + ": field \"architecture\" is missing");
    }
    const nlohmann::json& a = meta["architecture"];
    const std::string a_where = where + " architecture";
    if (!a.contains("rope") || field<std::string>(a["rope"], "layout", a_where + ".rope") != "adjacent-pairs") {
      throw Error(a_where + ": RoPE layout is not \"adjacent-pairs\"; this build computes only that one");
    }
    if (field<std::string>(a, "matrix_orientation", a_where) != "in_out") {
      throw Error(a_where + ": matrix_orientation is not \"in_out\"; this build stores matrices (in, out)");
    }
  }
  std::vector<std::string> files(std::begin(kFiles), std::end(kFiles));
  if (version >= 3 && meta.contains("tokenizer") && !meta["tokenizer"].is_null()) {
    const nlohmann::json& t = meta["tokenizer"];
    const std::string t_where = where + " tokenizer";
    TokenizerRecord r;
    r.type = field<std::string>(t, "type", t_where);
    r.vocab = field<int64_t>(t, "vocab", t_where);
    r.bytes = static_cast<uint64_t>(field<int64_t>(t, "bytes", t_where));
    r.crc32 = static_cast<uint32_t>(field<int64_t>(t, "crc32", t_where));
    for (auto [key, dst] : {std::pair{"eos_id", &r.eos_id}, {"bos_id", &r.bos_id}, {"unk_id", &r.unk_id},
                            {"pad_id", &r.pad_id}}) {
      *dst = field<int64_t>(t, key, t_where);
    }
    if (r.type != "sentencepiece") throw Error(t_where + ": type \"" + r.type + "\", not \"sentencepiece\"");
    if (r.vocab != info.model.vocab) {
      throw Error(t_where + ": " + std::to_string(r.vocab) + " pieces, but the model's V is " +
                  std::to_string(info.model.vocab));
    }
    info.tokenizer = r;
    info.tokenizer_model = (dir / kTokenizerFile).string();
    files.push_back(kTokenizerFile);
  }
  for (const std::string& name : files) {
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

// checkpoint.tmp/ (complete) replaces checkpoint/, which is checkpoint.old/ meanwhile. After each
// rename the run folder is synced, so the order holds on disk too; a crash at any moment leaves a
// complete checkpoint that tidy_checkpoints finds.
void swap_in_checkpoint(const fs::path& run) {
  const fs::path dir = run / "checkpoint", tmp = run / "checkpoint.tmp", old = run / "checkpoint.old";
  fs::remove_all(old);
  if (fs::exists(dir)) {
    fs::rename(dir, old);
    sync_renamed(run);
  }
  test_pause("checkpoint-swap-renames");
  fs::rename(tmp, dir);
  sync_renamed(run);
  test_pause("checkpoint-swapped");
  fs::remove_all(old);
  sync_renamed(run);
}

}  // namespace

std::string checkpoint_folder(const std::string& dir) {
  const fs::path d(dir);
  if (fs::is_regular_file(d / "meta.json")) return d.string();
  return find_checkpoint(dir);
}

std::vector<int64_t> tensor_shape(const model::ModelConfig& c, const std::string& name) {
  const int64_t C = c.width, F = c.ffn_width, V = c.vocab;
  const auto ends = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (name == "tok_emb") return {V, C};
  if (name == "lm_head") return {C, V};
  if (name == "final_norm" || ends("attn_norm") || ends("ffn_norm")) return {C};
  if (ends("attn.q") || ends("attn.k") || ends("attn.v") || ends("attn.o")) return {C, C};
  if (ends("ffn.gate") || ends("ffn.up")) return {C, F};
  if (ends("ffn.down")) return {F, C};
  throw Error("tensor_shape: unknown parameter '" + name + "'");
}

void check_tokenizer(const std::string& path, int64_t vocab) { checked_tokenizer(path, vocab, "the checkpoints' tokenizer"); }

std::string architecture_json(const RunConfig& config) { return architecture(config).dump(); }

std::string describe(const RunConfig& c) {
  return c.model.describe() + ", recipe " + c.recipe.name() + ", seed " + std::to_string(c.seed);
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
  const fs::path run(run_dir), tmp = run / "checkpoint.tmp";
  try {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::vector<io::TensorView> weights, moments;
    for (const model::ParamInfo& p : model.param_table()) {
      const std::vector<int64_t> shape = tensor_shape(model.config(), p.name);
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
    copy_tensor(weights, weights_path, p.name, model.params().data() + p.offset,
                tensor_shape(model.config(), p.name), info.version);
  }
  if (!m.empty() || !v.empty()) {
    if (m.size() != model.params().size() || v.size() != model.params().size()) {
      throw Error("load_checkpoint: the moments do not have the parameters' size");
    }
    const fs::path moments_path = folder / kFiles[1];
    const io::SafetensorsFile moments = io::read_safetensors(moments_path.string());
    for (const model::ParamInfo& p : model.param_table()) {
      const std::vector<int64_t> shape = tensor_shape(model.config(), p.name);
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
  model::ModelConfig want = info.model, have = model.config();
  want.batch = have.batch = 1;
  want.seq_len = have.seq_len = 1;
  if (!(want == have)) {
    throw Error("the checkpoint in '" + folder.string() + "' is of another model: " + info.model.describe() +
                " (this model: " + model.config().describe() + ")");
  }
  const fs::path weights_path = folder / kFiles[0];
  const io::SafetensorsFile weights = io::read_safetensors(weights_path.string());
  for (const model::ParamInfo& p : model.param_table()) {
    copy_tensor(weights, weights_path, p.name, model.params().data() + p.offset,
                tensor_shape(model.config(), p.name), info.version);
  }
  return info;
}

}  // namespace s3r::train
