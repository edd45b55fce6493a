#include "s3r/model/config.hpp"

#include <algorithm>
#include <sstream>

#include "s3r/core/error.hpp"

namespace s3r::model {

namespace {

// Bounds far beyond any machine, so that every size computed from a configuration (a corrupt
// meta.json can hold anything) fits in int64 and no allocation is attempted for it.
constexpr int64_t kMaxDim = int64_t{1} << 24;

void check_range(const char* name, int64_t v, int64_t max = kMaxDim) {
  if (v < 1) throw Error(std::string("model config: ") + name + " must be >= 1, got " + std::to_string(v));
  if (v > max) {
    throw Error(std::string("model config: ") + name + " must be <= " + std::to_string(max) + ", got " +
                std::to_string(v));
  }
}

constexpr FamilyTraits kFamilies[] = {
    {Family::kLlama, "llama", false, 10000.0f, 1e-5f},
    {Family::kQwen3, "qwen3", true, 1000000.0f, 1e-6f},
    {.family = Family::kGemma3, .name = "gemma3", .qk_norm = true, .rope_theta = 1000000.0f, .norm_eps = 1e-6f,
     .norm_offset = 1.0f, .post_norms = true, .gelu = true, .embed_scale = true, .tied_head = true,
     .local_period = 6, .rope_theta_local = 10000.0f},
    {.family = Family::kQwen3Moe, .name = "qwen3moe", .qk_norm = true, .rope_theta = 1000000.0f, .norm_eps = 1e-6f,
     .moe = true},
};

}  // namespace

const FamilyTraits& traits(Family f) { return kFamilies[static_cast<size_t>(f)]; }

Family parse_family(std::string_view name) {
  for (const FamilyTraits& t : kFamilies) {
    if (t.name == name) return t.family;
  }
  throw Error("unknown architecture '" + std::string(name) + "'; expected one of: " + family_names());
}

std::string family_names() {
  std::string out;
  for (const FamilyTraits& t : kFamilies) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

void Architecture::validate() const {
  check_range("layers", layers);
  check_range("width", width);
  check_range("heads", heads);
  check_range("kv_heads", kv_heads);
  check_range("ffn_width", ffn_width);
  check_range("vocab", vocab, (int64_t{1} << 31) - 1);
  if (head_size < 0 || head_size > kMaxDim) {
    throw Error("model config: head_size must be in [1, " + std::to_string(kMaxDim) + "] (0: C / heads), got " +
                std::to_string(head_size));
  }
  if (head_size == 0 && width % heads != 0) {
    throw Error("model config: width C = " + std::to_string(width) + " is not divisible by heads = " +
                std::to_string(heads) + " (or give an explicit head size)");
  }
  if (head_dim() % 2 != 0) {
    throw Error("model config: head size " + std::string(head_size == 0 ? "C / heads" : "HD") + " = " +
                std::to_string(head_dim()) + " must be even for RoPE");
  }
  check_range("heads x head size", q_width());
  if (window < 0 || window > kMaxDim) {
    throw Error("model config: window must be in [0, " + std::to_string(kMaxDim) + "] (0: none), got " +
                std::to_string(window));
  }
  if (window > 0 && traits().local_period == 0) {
    throw Error("model config: a sliding window (" + std::to_string(window) + ") needs a family with local layers (gemma3); " +
                std::string(traits().name) + " has none");
  }
  if (traits().moe) {
    check_range("experts", experts, 1 << 16);
    if (experts_used < 1 || experts_used > experts) {
      throw Error("model config: experts per token k = " + std::to_string(experts_used) + " must be in [1, E = " +
                  std::to_string(experts) + "]");
    }
  } else if (experts != 0 || experts_used != 0) {
    throw Error("model config: experts (" + std::to_string(experts) + ") need a family with a mixture of experts (qwen3moe); " +
                std::string(traits().name) + " has none");
  }
  if (heads % kv_heads != 0) {
    throw Error("model config: kv_heads = " + std::to_string(kv_heads) + " does not divide heads = " +
                std::to_string(heads) + " (each key/value head serves heads / kv_heads query heads)");
  }
}

std::string Architecture::describe() const {
  std::ostringstream s;
  if (family != Family::kLlama) s << traits().name << " ";
  s << "L=" << layers << " C=" << width << " heads=" << heads;
  if (kv_heads != heads) s << "/kv=" << kv_heads;
  if (head_size != 0) s << " hd=" << head_size;
  if (window != 0) s << " window=" << window;
  s << " F=" << ffn_width;
  if (experts != 0) s << " E=" << experts << "/k=" << experts_used;
  s << " V=" << vocab;
  return s.str();
}

Architecture Architecture::normalized() const {
  Architecture a = *this;
  if (a.head_size != 0 && a.heads > 0 && a.head_size * a.heads == a.width) a.head_size = 0;
  return a;
}

void ModelConfig::validate() const {
  Architecture::validate();
  check_range("seq_len", seq_len);
  check_range("batch", batch);
  const double T = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double widest = std::max({static_cast<double>(width), static_cast<double>(ffn_width), static_cast<double>(vocab)});
  const double per_layer =
      static_cast<double>(width) * (2.0 * q_width() + 2.0 * kv_width() + 3.0 * ffn_width * std::max<int64_t>(experts, 1));
  const double params = 2.0 * static_cast<double>(vocab) * width + static_cast<double>(layers) * per_layer;
  const double attention = T * static_cast<double>(seq_len) * static_cast<double>(heads) * static_cast<double>(layers);
  if (std::max({T * widest, params, attention}) > 1e15) {
    throw Error("model config: " + describe() + " needs more than 1e15 values (tensors of T x max(C, F, V), " +
                "parameters, or attention), beyond any machine");
  }
}

std::string ModelConfig::describe() const {
  return Architecture::describe() + " S=" + std::to_string(seq_len) + " B=" + std::to_string(batch);
}

namespace {

// The Llama presets; the other families derive theirs from these (preset()).
struct PresetRow {
  std::string_view name;
  Architecture architecture;
  RunShape shape;
};
constexpr PresetRow kPresets[] = {
    {"tiny", {.layers = 2, .width = 64, .heads = 4, .kv_heads = 4, .ffn_width = 192, .vocab = 256},
     {.seq_len = 32, .batch = 4}},
    {"small", {.layers = 6, .width = 256, .heads = 4, .kv_heads = 4, .ffn_width = 768, .vocab = 4096},
     {.seq_len = 256, .batch = 16}},
    {"wide", {.layers = 4, .width = 1024, .heads = 8, .kv_heads = 8, .ffn_width = 4096, .vocab = 4096},
     {.seq_len = 256, .batch = 8}},
    {"paper", {.layers = 12, .width = 768, .heads = 12, .kv_heads = 12, .ffn_width = 2048, .vocab = 32000},
     {.seq_len = 2048, .batch = 8}},
};

ModelConfig llama_preset(std::string_view name) {
  std::string names;
  for (const PresetRow& p : kPresets) {
    if (p.name == name) return ModelConfig{p.architecture, p.shape};
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  throw Error("unknown preset '" + std::string(name) + "'; expected one of: " + names);
}

}  // namespace

ModelConfig preset(std::string_view name, Family family) {
  ModelConfig m = llama_preset(name);
  m.family = family;
  m.rope_theta = traits(family).rope_theta;
  m.norm_eps = traits(family).norm_eps;
  if (family == Family::kQwen3 || family == Family::kQwen3Moe) {  // Qwen3-0.6B's ratios: NKV = NH / 2,
    m.kv_heads = m.heads / 2;                                       // HD = 2 C / NH (128 of C 1024, 16 heads)
    m.head_size = 2 * m.width / m.heads;
  }
  if (family == Family::kQwen3Moe) {  // Qwen3-30B-A3B's expert width 768 of C 2048; E, k at this scale
    m.ffn_width = m.width * 3 / 8;
    m.experts = name == "small" || name == "paper" ? 32 : 8;
    m.experts_used = 2;
  }
  if (family == Family::kGemma3) {  // Gemma 3 4B's NKV = NH / 2; its window of 1024 is 1/32 of its context
    m.kv_heads = m.heads / 2;       // of 32k: at these lengths S / 2, so that local layers differ from global
    m.window = m.seq_len / 2;
  }
  return m;
}

}  // namespace s3r::model
