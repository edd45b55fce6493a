// GGUF and Hugging Face export; see s3r/infer/export.hpp.
#include "s3r/infer/export.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <span>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/bf16.hpp"
#include "s3r/core/error.hpp"
#include "s3r/io/atomic_file.hpp"
#include "s3r/io/safetensors.hpp"

namespace s3r::infer {

namespace fs = std::filesystem;

GgufType parse_gguf_type(const std::string& name) {
  if (name == "f32") return GgufType::kF32;
  if (name == "f16") return GgufType::kF16;
  if (name == "bf16") return GgufType::kBf16;
  if (name == "q8_0") return GgufType::kQ8_0;
  throw Error("unknown weight type '" + name + "'; expected f32, f16, bf16 or q8_0");
}

uint16_t to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // overflow (rounds to inf)
  if (abs < 0x38800000u) {  // below the smallest normal half 2^-14: a subnormal half (or zero)
    // value = abs * 2^-24 units: round(f / 2^-24) to nearest even.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // exact (power of two)
    const float r = std::nearbyint(scaled);                         // current mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
  if (e == 0) return std::bit_cast<float>(sign) + (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

namespace {

// (rows, cols) row-major -> (cols, rows).
AlignedVector<float> transposed(const float* data, int64_t rows, int64_t cols) {
  AlignedVector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = data[r * cols + c];
  }
  return out;
}

// Rows of an (out, in) Q or K matrix reordered per head for half-split RoPE: new row h HD + i =
// old row h HD + 2i, new row h HD + HD/2 + i = old row h HD + 2i + 1.
AlignedVector<float> permute_for_half_split(const AlignedVector<float>& w, int64_t heads, int64_t head_dim,
                                            int64_t in) {
  AlignedVector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t from = h * head_dim + 2 * i + j, to = h * head_dim + j * half + i;
        std::copy_n(w.begin() + from * in, in, out.begin() + to * in);
      }
    }
  }
  return out;
}

// One tensor in the output orientation: row-major (rows, cols), i.e. GGUF ne = [cols, rows].
struct OutTensor {
  std::string name;
  AlignedVector<float> data;
  int64_t rows = 0, cols = 0;  // cols = 1 dimension for vectors (rows = 1)
  bool vector = false;
  int64_t experts = 0;  // > 0: a mixture's experts stacked, `experts` matrices of (rows, cols); GGUF ne [cols, rows, E]
};

// Each parameter's name in GGUF (llama.cpp's LLM_ARCH_LLAMA, LLM_ARCH_QWEN3, LLM_ARCH_GEMMA3) and
// in Hugging Face's LlamaForCausalLM, Qwen3ForCausalLM and Gemma3ForCausalLM, by its name in the
// schema (ParamInfo::local); "#" is the block index. Gemma's Hugging Face names differ for the
// norm before the FFN (kGemmaHfNames).
struct FormatNames {
  std::string_view local, gguf, hf;
};
constexpr FormatNames kFormatNames[] = {
    {"tok_emb", "token_embd.weight", "model.embed_tokens.weight"},
    {"attn_norm", "blk.#.attn_norm.weight", "model.layers.#.input_layernorm.weight"},
    {"attn.q", "blk.#.attn_q.weight", "model.layers.#.self_attn.q_proj.weight"},
    {"attn.k", "blk.#.attn_k.weight", "model.layers.#.self_attn.k_proj.weight"},
    {"attn.v", "blk.#.attn_v.weight", "model.layers.#.self_attn.v_proj.weight"},
    {"attn.o", "blk.#.attn_output.weight", "model.layers.#.self_attn.o_proj.weight"},
    {"attn.q_norm", "blk.#.attn_q_norm.weight", "model.layers.#.self_attn.q_norm.weight"},
    {"attn.k_norm", "blk.#.attn_k_norm.weight", "model.layers.#.self_attn.k_norm.weight"},
    {"ffn_norm", "blk.#.ffn_norm.weight", "model.layers.#.post_attention_layernorm.weight"},
    {"ffn.gate", "blk.#.ffn_gate.weight", "model.layers.#.mlp.gate_proj.weight"},
    {"ffn.up", "blk.#.ffn_up.weight", "model.layers.#.mlp.up_proj.weight"},
    {"ffn.down", "blk.#.ffn_down.weight", "model.layers.#.mlp.down_proj.weight"},
    {"final_norm", "output_norm.weight", "model.norm.weight"},
    {"lm_head", "output.weight", "lm_head.weight"},
    {"attn_post_norm", "blk.#.post_attention_norm.weight", "model.layers.#.post_attention_layernorm.weight"},
    {"ffn_post_norm", "blk.#.post_ffw_norm.weight", "model.layers.#.post_feedforward_layernorm.weight"},
    // Qwen3-MoE (LLM_ARCH_QWEN3MOE, Qwen3MoeForCausalLM): the router and the stacked experts; "%"
    // is the expert (Hugging Face has one tensor per expert).
    {"ffn.router", "blk.#.ffn_gate_inp.weight", "model.layers.#.mlp.gate.weight"},
    {"ffn.experts.gate", "blk.#.ffn_gate_exps.weight", "model.layers.#.mlp.experts.%.gate_proj.weight"},
    {"ffn.experts.up", "blk.#.ffn_up_exps.weight", "model.layers.#.mlp.experts.%.up_proj.weight"},
    {"ffn.experts.down", "blk.#.ffn_down_exps.weight", "model.layers.#.mlp.experts.%.down_proj.weight"},
};
// Gemma3DecoderLayer's post_attention_layernorm is the attention's post-norm; the FFN's pre-norm
// is its pre_feedforward_layernorm.
constexpr FormatNames kGemmaHfNames[] = {
    {"ffn_norm", "blk.#.ffn_norm.weight", "model.layers.#.pre_feedforward_layernorm.weight"},
};

// What the consumers call a family and how their RoPE pairs a head's elements: llama.cpp rotates
// adjacent pairs for llama (as s3r does) but halves for qwen3 and gemma3 (NEOX); Hugging Face
// halves for all.
struct FormatFamily {
  model::Family family;
  std::string_view hf_architecture, hf_model_type;
  bool gguf_half_split;
};
constexpr FormatFamily kFormatFamilies[] = {
    {model::Family::kLlama, "LlamaForCausalLM", "llama", false},
    {model::Family::kQwen3, "Qwen3ForCausalLM", "qwen3", true},
    {model::Family::kGemma3, "Gemma3ForCausalLM", "gemma3_text", true},
    {model::Family::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", true},
};

const FormatFamily& format_family(model::Family f) {
  for (const FormatFamily& x : kFormatFamilies) {
    if (x.family == f) return x;
  }
  throw Error("export: no GGUF or Hugging Face layout for the architecture '" + std::string(model::traits(f).name) + "'");
}

std::string format_name(const model::ParamInfo& p, bool hf_names, model::Family family) {
  const bool gemma_hf = hf_names && family == model::Family::kGemma3;
  for (std::span<const FormatNames> table :
       {std::span<const FormatNames>(kGemmaHfNames), std::span<const FormatNames>(kFormatNames)}) {
    if (table.data() == kGemmaHfNames && !gemma_hf) continue;
    for (const FormatNames& f : table) {
      if (f.local != p.local) continue;
      std::string name(hf_names ? f.hf : f.gguf);
      if (const size_t at = name.find('#'); at != std::string::npos) name.replace(at, 1, std::to_string(p.block));
      return name;
    }
  }
  throw Error("export: no GGUF or Hugging Face name for the parameter '" + p.name + "'");
}

// The model's tensors in schema order, in Hugging Face orientation (out, in): the embedding
// (V, C) as it is, gains as vectors, every other matrix transposed, a tied head left out (both
// formats tie it to the embedding); `hf_names` picks the names, and `half_split` whether Q and K
// are permuted for half-split RoPE (per query head and per key/value head). GGUF's gains are the
// gains applied (llama.cpp multiplies by the stored vector): Gemma's 1 + w; Hugging Face stores w.
std::vector<OutTensor> output_tensors(const LoadedCheckpoint& c, bool hf_names, bool half_split,
                                      const std::string& inject) {
  const model::ModelConfig& m = c.info.model;
  const bool permute_qk = half_split != (inject == "permute-qk");
  std::vector<OutTensor> out;
  const float gain_offset = hf_names || inject == "no-gain-offset" ? 0.0f : m.traits().norm_offset;
  for (const model::ParamInfo& p : c.model->param_table()) {
    if (p.tied) continue;
    const float* data = c.model->params().data() + p.offset;
    OutTensor t{format_name(p, hf_names, m.family), {}, 1, p.shape[0], true};
    if (p.shape.size() == 1) {
      t.data.assign(data, data + p.size);
      if (gain_offset != 0.0f) {
        for (float& x : t.data) x += gain_offset;
      }
      // A QK-norm gain acts on one head's elements: it follows the rows of Q and K.
      if (permute_qk && (p.local == "attn.q_norm" || p.local == "attn.k_norm")) {
        t.data = permute_for_half_split(t.data, 1, m.head_dim(), 1);
      }
      out.push_back(std::move(t));
      continue;
    }
    if (p.shape.size() == 3) {  // experts (E, in, out): each transposed to (out, in)
      const int64_t E = p.shape[0], in = p.shape[1], outs = p.shape[2];
      t.rows = outs;
      t.cols = in;
      t.vector = false;
      t.experts = E;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t from = inject == "reverse-experts" ? E - 1 - e : e;  // a bug the checks must catch
        const AlignedVector<float> one = transposed(data + from * in * outs, in, outs);
        t.data.insert(t.data.end(), one.begin(), one.end());
      }
      out.push_back(std::move(t));
      continue;
    }
    const int64_t in = p.shape[0], outs = p.shape[1];
    const bool is = p.role == model::ParamRole::kProjection;
    const bool transpose = p.role != model::ParamRole::kEmbedding &&
                           !(is && p.projection == model::Projection::kO && inject == "transpose-o");
    t.data = transpose ? transposed(data, in, outs) : AlignedVector<float>(data, data + p.size);
    t.rows = transpose ? outs : in;
    t.cols = transpose ? in : outs;
    t.vector = false;
    if (permute_qk && is && (p.projection == model::Projection::kQ || p.projection == model::Projection::kK)) {
      const int64_t heads = p.projection == model::Projection::kQ ? m.heads : m.kv_heads;
      t.data = permute_for_half_split(t.data, heads, m.head_dim(), t.cols);
    }
    out.push_back(std::move(t));
  }
  // Bugs that a reader's comparison must catch although they make its numbers non-finite rather
  // than merely different. Each changes the first element of every token's embedding row, so that
  // any prompt meets it, and RMSNorm spreads a non-finite element over the whole activation:
  // "f16-overflow": the element becomes +-1e7, finite in f32 but beyond f16's largest finite
  //   value (65504: inf in an f16 export) and beyond what q8_0's f16 block scale absmax / 127 can
  //   hold (65504 * 127 = 8.3e6: an inf scale, so NaN and inf values, in a q8_0 export);
  // "nan-weight": the element becomes NaN (meant for f32, f16 and hf exports: q8_0's block absmax
  //   skips a NaN, and its code is whatever lround makes of NaN).
  if (inject == "f16-overflow" || inject == "nan-weight") {
    OutTensor& emb = out.front();  // (V, C), a row per token
    for (int64_t t = 0; t < emb.rows; ++t) {
      float& w = emb.data[t * emb.cols];
      w = inject == "nan-weight" ? std::numeric_limits<float>::quiet_NaN() : std::copysign(1e7f, w);
    }
  }
  return out;
}

void check_inject(const std::string& inject) {
  if (!inject.empty() && inject != "permute-qk" && inject != "transpose-o" && inject != "f16-overflow" &&
      inject != "nan-weight" && inject != "no-gain-offset" && inject != "reverse-experts") {
    throw Error("export: unknown --inject '" + inject +
                "'; expected permute-qk, transpose-o, f16-overflow, nan-weight, no-gain-offset or reverse-experts");
  }
}

// ---- GGUF (llama.cpp's docs/gguf.md, version 3, little-endian) ----------------------------
enum GgufValue : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32v, kBool, kString, kArray, kU64, kI64, kF64 };
enum GgmlType : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8, kGgmlBf16 = 30 };
constexpr uint64_t kAlignment = 32;

class GgufBuffer {
 public:
  std::string bytes;
  template <typename T>
  void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes.append(b, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes += s;
  }
  void key(const std::string& k, uint32_t type) {
    str(k);
    put<uint32_t>(type);
    ++count;
  }
  void kv_u32(const std::string& k, uint32_t v) { key(k, kU32); put(v); }
  void kv_i32(const std::string& k, int32_t v) { key(k, kI32); put(v); }
  void kv_f32(const std::string& k, float v) { key(k, kF32v); put(v); }
  void kv_bool(const std::string& k, bool v) { key(k, kBool); put<uint8_t>(v ? 1 : 0); }
  void kv_str(const std::string& k, const std::string& v) { key(k, kString); str(v); }
  uint64_t count = 0;
};

// ggml's Q8_0: blocks of 32 values, an f16 scale d = absmax / 127 and 32 int8 codes round(x / d).
void put_q8_0(std::string& out, const AlignedVector<float>& x) {
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = to_f16(d);
    out.append(reinterpret_cast<const char*>(&dh), 2);
    for (size_t i = 0; i < 32; ++i) {
      const auto q = static_cast<int8_t>(std::lround(x[b + i] * id));  // roundf: half away from zero
      out.push_back(static_cast<char>(q));
    }
  }
}

}  // namespace

namespace {

// general.* and the model's hyper-parameters, under the family's prefix (general.architecture).
void put_model_keys(GgufBuffer& kv, const LoadedCheckpoint& c, const ExportOptions& o) {
  const model::ModelConfig& m = c.info.model;
  const uint32_t file_type = o.type == GgufType::kF32 ? 0 : o.type == GgufType::kF16 ? 1 : o.type == GgufType::kQ8_0 ? 7 : 32;
  const std::string a(m.traits().name);
  kv.kv_str("general.architecture", a);
  kv.kv_str("general.name", o.name.empty() ? "s3r" : o.name);
  kv.kv_u32("general.file_type", file_type);
  kv.kv_u32("general.quantization_version", 2);
  kv.kv_u32("general.alignment", static_cast<uint32_t>(kAlignment));
  kv.kv_u32(a + ".context_length", static_cast<uint32_t>(m.seq_len));
  kv.kv_u32(a + ".embedding_length", static_cast<uint32_t>(m.width));
  kv.kv_u32(a + ".block_count", static_cast<uint32_t>(m.layers));
  kv.kv_u32(a + ".feed_forward_length", static_cast<uint32_t>(m.ffn_width));
  kv.kv_u32(a + ".attention.head_count", static_cast<uint32_t>(m.heads));
  kv.kv_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(m.kv_heads));
  if (m.head_size != 0) {  // llama.cpp's default is embedding_length / head_count
    kv.kv_u32(a + ".attention.key_length", static_cast<uint32_t>(m.head_dim()));
    kv.kv_u32(a + ".attention.value_length", static_cast<uint32_t>(m.head_dim()));
  }
  kv.kv_u32(a + ".rope.dimension_count", static_cast<uint32_t>(m.head_dim()));
  kv.kv_f32(a + ".rope.freq_base", m.rope_theta);  // gemma3: the global layers' (llama.cpp: 1e4 for local ones)
  if (m.window > 0) kv.kv_u32(a + ".attention.sliding_window", static_cast<uint32_t>(m.window));
  if (m.experts > 0) {  // llama.cpp's qwen3moe: softmax gating, the top k renormalized, as s3r
    kv.kv_u32(a + ".expert_count", static_cast<uint32_t>(m.experts));
    kv.kv_u32(a + ".expert_used_count", static_cast<uint32_t>(m.experts_used));
    kv.kv_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(m.ffn_width));
  }
  kv.kv_f32(a + ".attention.layer_norm_rms_epsilon", m.norm_eps);
  kv.kv_u32(a + ".vocab_size", static_cast<uint32_t>(m.vocab));
}

// The SentencePiece tokenizer: every piece, its score and type (GGUF's numbering), and the
// special tokens.
void put_tokenizer_keys(GgufBuffer& kv, const data::Tokenizer& tok) {
  const int64_t V = tok.vocab();
  kv.kv_str("tokenizer.ggml.model", "llama");
  kv.key("tokenizer.ggml.tokens", kArray);
  kv.put<uint32_t>(kString);
  kv.put<uint64_t>(static_cast<uint64_t>(V));
  for (int32_t i = 0; i < V; ++i) kv.str(tok.piece(i));
  kv.key("tokenizer.ggml.scores", kArray);
  kv.put<uint32_t>(kF32v);
  kv.put<uint64_t>(static_cast<uint64_t>(V));
  for (int32_t i = 0; i < V; ++i) kv.put<float>(tok.score(i));
  kv.key("tokenizer.ggml.token_type", kArray);
  kv.put<uint32_t>(kI32);
  kv.put<uint64_t>(static_cast<uint64_t>(V));
  for (int32_t i = 0; i < V; ++i) kv.put<int32_t>(static_cast<int32_t>(tok.type(i)));
  // s3r's data separates documents with end-of-text and has no BOS: a document starts after
  // end-of-text, so end-of-text serves as BOS too (added before a prompt, as `s3r generate` does).
  const int32_t start = tok.document_start_id();
  if (start >= 0) kv.kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(start));
  if (tok.eos_id() >= 0) kv.kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok.eos_id()));
  if (tok.unk_id() >= 0) kv.kv_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(tok.unk_id()));
  if (tok.pad_id() >= 0) kv.kv_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(tok.pad_id()));
  kv.kv_bool("tokenizer.ggml.add_bos_token", start >= 0);
  kv.kv_bool("tokenizer.ggml.add_eos_token", false);
  kv.kv_bool("tokenizer.ggml.add_space_prefix", tok.adds_space_prefix());  // SentencePiece's add_dummy_prefix
}

// One tensor's values in `type`, appended to data.
void put_tensor_data(std::string& data, const AlignedVector<float>& values, GgufType type) {
  switch (type) {
    case GgufType::kF32:
      data.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
      break;
    case GgufType::kF16:
      for (float v : values) {
        const uint16_t h = to_f16(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
      break;
    case GgufType::kBf16:
      for (float v : values) {
        const uint16_t h = to_bf16(v).bits;
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
      break;
    case GgufType::kQ8_0:
      put_q8_0(data, values);
      break;
  }
}

}  // namespace

void export_gguf(const LoadedCheckpoint& c, const data::Tokenizer& tok, const std::string& path,
                 const ExportOptions& o) {
  check_inject(o.inject);
  const std::vector<OutTensor> tensors =
      output_tensors(c, false, format_family(c.info.model.family).gguf_half_split, o.inject);
  if (o.type == GgufType::kQ8_0) {
    for (const OutTensor& t : tensors) {
      if (!t.vector && t.cols % 32 != 0) {
        throw Error("export: q8_0 needs rows that are a multiple of 32 values, but tensor '" + t.name + "' has " +
                    std::to_string(t.cols) + "; use f16, bf16 or f32");
      }
    }
  }
  GgufBuffer kv;
  put_model_keys(kv, c, o);
  put_tokenizer_keys(kv, tok);
  // Where the file came from.
  kv.kv_str("s3r.mode", std::string(nn::to_string(c.info.recipe.projections())));
  kv.kv_u32("s3r.step", static_cast<uint32_t>(c.info.step + 1));
  // Tensor infos and data.
  GgufBuffer info;
  std::string data;
  for (const OutTensor& t : tensors) {
    while (data.size() % kAlignment) data.push_back('\0');
    info.str(t.name);
    info.put<uint32_t>(t.vector ? 1 : t.experts > 0 ? 3 : 2);
    info.put<uint64_t>(static_cast<uint64_t>(t.cols));
    if (!t.vector) info.put<uint64_t>(static_cast<uint64_t>(t.rows));
    if (t.experts > 0) info.put<uint64_t>(static_cast<uint64_t>(t.experts));
    const GgufType type = t.vector ? GgufType::kF32 : o.type;  // norm gains stay f32
    info.put<uint32_t>(type == GgufType::kF32 ? kGgmlF32 : type == GgufType::kF16 ? kGgmlF16
                       : type == GgufType::kBf16 ? kGgmlBf16 : kGgmlQ8_0);
    info.put<uint64_t>(data.size());
    put_tensor_data(data, t.data, type);
  }
  io::write_file_atomic(path, [&](std::ostream& f) {
    GgufBuffer head;
    head.put<uint32_t>(0x46554747u);  // "GGUF"
    head.put<uint32_t>(3);
    head.put<uint64_t>(tensors.size());
    head.put<uint64_t>(kv.count);
    std::string all = head.bytes + kv.bytes + info.bytes;
    while (all.size() % kAlignment) all.push_back('\0');
    f.write(all.data(), static_cast<std::streamsize>(all.size()));
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  });
}

namespace {

// Gemma3TextConfig's fields beyond Llama's: GeGLU, the tied head, the local layers' window,
// pattern and RoPE base, the query scale (query_pre_attn_scalar^-1/2 = 1/sqrt(HD)), no
// soft-capping; its norms apply 1 + w to the stored w (Gemma3RMSNorm).
void add_gemma3_config(nlohmann::json& config, const model::ModelConfig& m) {
  config.erase("hidden_act");
  config.erase("mlp_bias");
  config.erase("pretraining_tp");
  config["hidden_activation"] = "gelu_pytorch_tanh";
  config["tie_word_embeddings"] = true;
  config["query_pre_attn_scalar"] = m.head_dim();
  config["rope_local_base_freq"] = m.traits().rope_theta_local;
  config["sliding_window_pattern"] = m.traits().local_period;
  config["sliding_window"] = m.window > 0 ? m.window : m.seq_len;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < m.layers; ++l) types.push_back(m.is_local(l) ? "sliding_attention" : "full_attention");
  config["layer_types"] = types;
  config["final_logit_softcapping"] = nullptr;
  config["attn_logit_softcapping"] = nullptr;
}

}  // namespace

void export_hf(const LoadedCheckpoint& c, const data::Tokenizer& tok, const std::string& dir, const ExportOptions& o) {
  check_inject(o.inject);
  if (o.type != GgufType::kF32) throw Error("export: --format hf writes f32 weights only; leave --type out");
  const model::ModelConfig& m = c.info.model;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error("export: cannot create the folder '" + dir + "': " + ec.message());
  const std::vector<OutTensor> tensors = output_tensors(c, true, true, o.inject);
  std::vector<io::TensorView> views;
  for (const OutTensor& t : tensors) {
    if (t.experts > 0) {  // one (out, in) tensor per expert
      const size_t at = t.name.find('%'), size = static_cast<size_t>(t.rows * t.cols);
      for (int64_t e = 0; e < t.experts; ++e) {
        views.push_back({std::string(t.name).replace(at, 1, std::to_string(e)), {t.rows, t.cols},
                         std::span<const float>(t.data).subspan(e * size, size)});
      }
      continue;
    }
    views.push_back({t.name, t.vector ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.rows, t.cols}, t.data});
  }
  io::write_safetensors((fs::path(dir) / "model.safetensors").string(), views, {{"format", "pt"}});
  const int32_t start = tok.document_start_id();
  nlohmann::json config = {
      {"architectures", {std::string(format_family(m.family).hf_architecture)}},
      {"model_type", std::string(format_family(m.family).hf_model_type)},
      {"hidden_size", m.width}, {"intermediate_size", m.ffn_width}, {"num_hidden_layers", m.layers},
      {"num_attention_heads", m.heads}, {"num_key_value_heads", m.kv_heads}, {"head_dim", m.head_dim()},
      {"max_position_embeddings", m.seq_len}, {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
      {"rope_scaling", nullptr}, {"vocab_size", m.vocab}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
      {"attention_bias", false}, {"mlp_bias", false}, {"attention_dropout", 0.0}, {"initializer_range", 0.02},
      {"pretraining_tp", 1}, {"use_cache", true}, {"torch_dtype", "float32"},
      {"bos_token_id", start}, {"eos_token_id", tok.eos_id()},
      {"s3r", {{"mode", std::string(nn::to_string(c.info.recipe.projections()))}, {"step", c.info.step + 1},
               {"rope_note", "q_proj and k_proj rows are permuted per head from s3r's adjacent-pair RoPE layout "
                             "to the half-split layout Hugging Face computes"}}}};
  if (m.family == model::Family::kGemma3) add_gemma3_config(config, m);
  if (m.experts > 0) {  // Qwen3MoeConfig: every layer sparse, top k renormalized (norm_topk_prob)
    config["num_experts"] = m.experts;
    config["num_experts_per_tok"] = m.experts_used;
    config["moe_intermediate_size"] = m.ffn_width;
    config["norm_topk_prob"] = true;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = nlohmann::json::array();
    config["output_router_logits"] = false;
    config["router_aux_loss_coef"] = 0.001;
  }
  const auto write_json = [&](const char* name, const nlohmann::json& j) {
    io::write_file_atomic((fs::path(dir) / name).string(), [&](std::ostream& f) { f << j.dump(2) << "\n"; });
  };
  write_json("config.json", config);
  write_json("generation_config.json", {{"bos_token_id", start}, {"eos_token_id", tok.eos_id()}});
  const std::string model = tok.serialized();
  io::write_file_atomic((fs::path(dir) / "tokenizer.model").string(),
                        [&](std::ostream& f) { f.write(model.data(), static_cast<std::streamsize>(model.size())); });
  const std::string start_piece = start >= 0 ? tok.piece(start) : "";
  const std::string eos_piece = tok.eos_id() >= 0 ? tok.piece(tok.eos_id()) : "";
  const std::string unk_piece = tok.unk_id() >= 0 ? tok.piece(tok.unk_id()) : "";
  // legacy: LlamaTokenizer encodes with the SentencePiece model as it is, as s3r does (the
  // non-legacy path rewrites its normalizer, which needs protobuf).
  write_json("tokenizer_config.json", {{"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", start >= 0},
                                       {"add_eos_token", false}, {"bos_token", start_piece}, {"eos_token", eos_piece},
                                       {"unk_token", unk_piece}, {"legacy", true},
                                       {"model_max_length", m.seq_len}, {"clean_up_tokenization_spaces", false}});
  write_json("special_tokens_map.json", {{"bos_token", start_piece}, {"eos_token", eos_piece}, {"unk_token", unk_piece}});
}

}  // namespace s3r::infer
