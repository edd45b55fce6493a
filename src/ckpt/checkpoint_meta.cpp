// Checkpoints' meta.json: the run configuration, the forward's hyper-parameters, the tokenizer's
// record, the format's versions and the files' checksums; see s3r/ckpt/checkpoint.hpp.
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>
#include <vector>

#include "ckpt/checkpoint_internal.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/tokenizer.hpp"

namespace s3r::ckpt {

namespace detail {

// The run configuration <-> the "config" object of meta.json (the one place that knows its
// fields). from_json throws s3r::Error naming `where` and the field.
// "kv_heads" is written only with grouped-query attention (kv_heads < heads): a checkpoint without
// it has kv_heads = heads, as every checkpoint before grouped-query attention has. Likewise
// "head_size" only when it is explicit (not C / heads), "arch" only for a family other than
// llama, "window" only when the family's local layers have one, and "experts", "experts_used"
// only with a mixture of experts.
nlohmann::json to_json(const RunConfig& c) {
  const model::ModelConfig& m = c.model;
  nlohmann::json j = {{"layers", m.layers},       {"width", m.width},   {"heads", m.heads},
                      {"ffn_width", m.ffn_width}, {"vocab", m.vocab},   {"seq_len", m.seq_len},
                      {"batch", m.batch},         {"rope_theta", m.rope_theta}, {"norm_eps", m.norm_eps},
                      {"lm_head", std::string(nn::to_string(c.recipe.head_choice()))},
                      {"mode", std::string(nn::to_string(c.recipe.projections()))},
                      {"correction", std::string(nn::to_string(c.recipe.correction()))},
                      {"recipe", c.recipe.name()}, {"seed", c.seed}};
  if (m.kv_heads != m.heads) j["kv_heads"] = m.kv_heads;
  if (m.head_size != 0) j["head_size"] = m.head_size;
  if (m.family != model::Family::kLlama) j["arch"] = std::string(m.traits().name);
  if (m.window != 0) j["window"] = m.window;
  if (m.experts != 0) {
    j["experts"] = m.experts;
    j["experts_used"] = m.experts_used;
  }
  return j;
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
  m.kv_heads = j.contains("kv_heads") ? field<int64_t>(j, "kv_heads", where) : m.heads;
  m.head_size = j.contains("head_size") ? field<int64_t>(j, "head_size", where) : 0;
  if (j.contains("arch")) {
    try {
      m.family = model::parse_family(field<std::string>(j, "arch", where));
    } catch (const Error& e) {
      throw Error(where + ": field \"arch\": " + e.what());
    }
  }
  m.window = j.contains("window") ? field<int64_t>(j, "window", where) : 0;
  m.experts = j.contains("experts") ? field<int64_t>(j, "experts", where) : 0;
  m.experts_used = j.contains("experts_used") ? field<int64_t>(j, "experts_used", where) : 0;
  m.ffn_width = field<int64_t>(j, "ffn_width", where);
  m.vocab = field<int64_t>(j, "vocab", where);
  m.seq_len = field<int64_t>(j, "seq_len", where);
  m.batch = field<int64_t>(j, "batch", where);
  if (j.contains("rope_theta")) m.rope_theta = field<float>(j, "rope_theta", where);  // version 2
  if (j.contains("norm_eps")) m.norm_eps = field<float>(j, "norm_eps", where);
  try {
    m.validate();
    static_cast<model::Architecture&>(m) = m.architecture().normalized();
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
  nlohmann::json a = {{"family", std::string(m.traits().name)},
          {"layers", m.layers}, {"width", m.width}, {"heads", m.heads}, {"kv_heads", m.kv_heads},
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
  if (m.traits().qk_norm) {
    a["qk_norm"] = {{"type", "rmsnorm"}, {"eps", m.norm_eps}, {"over", "each head of q and k (head_dim), before RoPE"},
                    {"gains", "attn.q_norm, attn.k_norm (head_dim each)"}};
  }
  const model::FamilyTraits& t = m.traits();
  if (t.norm_offset != 0.0f) a["norm"]["formula"] = "x / sqrt(mean(x^2) + eps) * (1 + gain)";
  if (t.post_norms) {
    a["post_norms"] = {{"gains", "attn_post_norm, ffn_post_norm (width each)"},
                       {"formula", "x + norm(sublayer(norm(x))) for the attention and the FFN"}};
  }
  if (t.moe) {
    a["ffn"] = {{"type", "moe"}, {"experts", m.experts}, {"experts_used", m.experts_used},
                {"expert_ffn_width", m.ffn_width}, {"router", "ffn.router (width, experts), f32"},
                {"formula", "sum over the k most probable experts e of softmax(x router)_e / (their sum) * "
                            "(silu(x gate_e) * (x up_e)) down_e"},
                {"experts_layout", "ffn.experts.gate, ffn.experts.up: (experts, width, ffn_width); "
                                   "ffn.experts.down: (experts, ffn_width, width)"}};
  }
  if (t.gelu) {
    a["ffn"] = {{"type", "geglu"},
                {"formula", "(gelu_tanh(x gate) * (x up)) down, gelu_tanh(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))"}};
  }
  if (t.embed_scale) a["embedding"]["scale"] = "sqrt(width)";
  if (t.tied_head) a["embedding"]["tied"] = true;
  if (t.local_period > 0 && m.window > 0) {
    a["attention"]["sliding_window"] = m.window;
    a["attention"]["local_layers"] = "l with (l + 1) % " + std::to_string(t.local_period) + " != 0: keys i - window < j <= i";
    a["rope"]["theta_local"] = t.rope_theta_local;
  }
  return a;
}

// CRC-32 (zlib) and size of a file.

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

// A tokenizer.model's record: its vocabulary and special ids. Throws s3r::Error naming the file
// (data::Tokenizer's: missing, or not a SentencePiece model).
TokenizerRecord tokenizer_record(const fs::path& path) {
  const data::Tokenizer tok(path.string());
  TokenizerRecord r;
  r.vocab = tok.vocab();
  r.eos_id = tok.eos_id();
  r.bos_id = tok.bos_id();
  r.unk_id = tok.unk_id();
  r.pad_id = tok.pad_id();
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

namespace {

// meta.json parsed, with its "format" checked.
nlohmann::json read_meta(const fs::path& meta_path, const std::string& where) {
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
  return meta;
}

// Version 3 on: the forward's conventions, which this build computes exactly.
void check_architecture(const nlohmann::json& meta, const std::string& where) {
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

// The "tokenizer" record t, checked against the model's vocabulary.
TokenizerRecord read_tokenizer_record(const nlohmann::json& t, const std::string& where, int64_t vocab) {
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
  if (r.vocab != vocab) {
    throw Error(t_where + ": " + std::to_string(r.vocab) + " pieces, but the model's V is " + std::to_string(vocab));
  }
  return r;
}

// Each of the files is in dir, with the size and CRC-32 meta.json records (version 2 on).
void check_files(const fs::path& dir, const std::vector<std::string>& files, const nlohmann::json& meta,
                 int64_t version, const std::string& where) {
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
}

}  // namespace

// A checkpoint folder checked whole: meta.json parses and has every field, and the tensor
// files are there with their recorded size and checksum. Throws s3r::Error naming the file.
CheckpointInfo inspect(const fs::path& dir) {
  const fs::path meta_path = dir / "meta.json";
  // (appended: GCC 12 warns of an overlap, falsely, on "'" + path + "'" inlined here)
  const std::string where = std::string("'").append(meta_path.string()).append("'");
  const nlohmann::json meta = read_meta(meta_path, where);
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
  if (version >= 3) check_architecture(meta, where);
  std::vector<std::string> files(std::begin(kFiles), std::end(kFiles));
  if (version >= 3 && meta.contains("tokenizer") && !meta["tokenizer"].is_null()) {
    info.tokenizer = read_tokenizer_record(meta["tokenizer"], where, info.model.vocab);
    info.tokenizer_model = (dir / kTokenizerFile).string();
    files.push_back(kTokenizerFile);
  }
  check_files(dir, files, meta, version, where);
  return info;
}

}  // namespace detail

using namespace detail;

void check_tokenizer(const std::string& path, int64_t vocab) { checked_tokenizer(path, vocab, "the checkpoints' tokenizer"); }

std::string architecture_json(const RunConfig& config) { return architecture(config).dump(); }

std::string describe(const RunConfig& c) {
  return c.model.describe() + ", recipe " + c.recipe.name() + ", seed " + std::to_string(c.seed);
}

}  // namespace s3r::ckpt
