// self-describing checkpoints, the KV-cache decoder against the model's own forward,
// `s3r eval`'s windows, the samplers, and the exporters' conversions.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "s3r/ckpt/checkpoint.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/prepare.hpp"
#include "s3r/infer/decoder.hpp"
#include "s3r/infer/evaluate.hpp"
#include "s3r/infer/export.hpp"
#include "s3r/infer/tokenizer.hpp"
#include "s3r/io/safetensors.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

namespace s3r::infer {
namespace {

namespace fs = std::filesystem;

// A folder per process (tests/temp_dir.hpp), so that no test deletes the tokenizer another one
// is reading.
std::string temp_dir(const std::string& name) {
  const fs::path dir = testing::process_temp_dir("s3r_infer_test") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

using testing::error_of;

// A tiny model with weights large enough that its next-token distributions are far from uniform.
model::ModelConfig tiny(int64_t vocab = 300) {
  model::ModelConfig c = model::preset("tiny");
  c.vocab = vocab;
  return c;
}

void init_peaky(model::Model& m, uint32_t seed) {
  m.init_weights(seed);
  for (const model::ParamInfo& p : m.param_table()) {
    if (p.name.find("norm") != std::string::npos) continue;
    for (int64_t i = 0; i < p.size; ++i) m.params()[p.offset + i] *= 4.0f;
  }
}

// A SentencePiece tokenizer of `vocab` pieces trained by `s3r data prepare` (once per process).
const std::string& tokenizer_path() {
  static const std::string path = [] {
    const std::string dir = temp_dir("tokenizer");
    std::ofstream text(fs::path(dir) / "corpus.txt");
    testing::write_word_corpus(text);
    text.close();
    data::PrepareOptions o;
    o.inputs = {(fs::path(dir) / "corpus.txt").string()};
    o.out_dir = (fs::path(dir) / "data").string();
    o.vocab_size = 300;
    data::prepare(o, nullptr);
    return (fs::path(dir) / "data" / "tokenizer.model").string();
  }();
  return path;
}

// Saves a checkpoint of `model` (mode as given) with the test tokenizer into RUN/checkpoint.
std::string save(const std::string& name, model::Model& model, bool with_tokenizer = true) {
  const std::string run = temp_dir(name);
  ckpt::CheckpointInfo info;
  static_cast<ckpt::RunConfig&>(info) = {model.config(), model.recipe(), 3};
  info.step = 9;
  if (with_tokenizer) info.tokenizer_model = tokenizer_path();
  AlignedVector<float> zeros(model.params().size(), 0.0f);
  ckpt::save_checkpoint(run, info, model, zeros, zeros);
  return run;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

TEST(Checkpoint, TensorsHaveTheirShapesAndMetaDescribesTheForward) {
  model::Model m(tiny(), nn::Recipe::make(nn::LinearMode::kS3r, nn::Correction::kDx));
  init_peaky(m, 1);
  const std::string run = save("v3", m);
  const io::SafetensorsFile w = io::read_safetensors(run + "/checkpoint/model.safetensors");
  const int64_t C = 64, F = 192, V = 300;
  EXPECT_EQ(w.tensors.at("tok_emb").shape, (std::vector<int64_t>{V, C}));
  EXPECT_EQ(w.tensors.at("lm_head").shape, (std::vector<int64_t>{C, V}));
  EXPECT_EQ(w.tensors.at("blocks.1.ffn.down").shape, (std::vector<int64_t>{F, C}));
  EXPECT_EQ(w.tensors.at("blocks.0.ffn.gate").shape, (std::vector<int64_t>{C, F}));
  EXPECT_EQ(w.tensors.at("final_norm").shape, (std::vector<int64_t>{C}));
  EXPECT_EQ(w.metadata.at("matrix_orientation"), "in_out");
  const io::SafetensorsFile mom = io::read_safetensors(run + "/checkpoint/optimizer.safetensors");
  EXPECT_EQ(mom.tensors.at("blocks.0.attn.q.m").shape, (std::vector<int64_t>{C, C}));
  const nlohmann::json meta = read_json(run + "/checkpoint/meta.json");
  EXPECT_EQ(meta["version"], 3);
  const nlohmann::json& a = meta["architecture"];
  EXPECT_EQ(a["rope"]["layout"], "adjacent-pairs");
  EXPECT_FLOAT_EQ(a["rope"]["theta"].get<float>(), 10000.0f);
  EXPECT_FLOAT_EQ(a["norm"]["eps"].get<float>(), 1e-5f);
  EXPECT_EQ(a["lm_head"]["precision"], "bf16");
  EXPECT_EQ(a["projections"]["precision"], "int8");
  EXPECT_EQ(a["attention"]["precision"], "f32");
  EXPECT_EQ(a["matrix_orientation"], "in_out");
  EXPECT_EQ(meta["tokenizer"]["vocab"], 300);
  EXPECT_EQ(meta["tokenizer"]["eos_id"], 1);
  EXPECT_TRUE(meta["files"].contains("tokenizer.model"));
  // Read back: the tokenizer is the checkpoint's own, and the weights are the same.
  const ckpt::CheckpointInfo info = ckpt::read_checkpoint_info(run);
  EXPECT_EQ(info.version, 3);
  ASSERT_TRUE(info.tokenizer.has_value());
  EXPECT_EQ(data::Tokenizer(info.tokenizer_model).serialized(), data::Tokenizer(tokenizer_path()).serialized());
  const LoadedCheckpoint c = load_for_inference(run);
  EXPECT_TRUE(std::equal(m.params().begin(), m.params().end(), c.model->params().begin()));
  // A corrupt tokenizer.model is named by its checksum.
  std::ofstream(run + "/checkpoint/tokenizer.model", std::ios::app) << "x";
  EXPECT_NE(error_of([&] { ckpt::read_checkpoint_info(run); }).find("tokenizer.model' is"), std::string::npos);
}

TEST(Checkpoint, OlderVersionsLoadAndNewerOnesAreRefused) {
  model::Model m(tiny(), nn::Recipe::make(nn::LinearMode::kF32, nn::Correction::kNone));
  init_peaky(m, 2);
  const std::string run = save("v1", m, false);
  const fs::path dir = fs::path(run) / "checkpoint";
  // Rewrite as version 1: flat tensors, no checksums, no architecture.
  std::vector<io::TensorView> flat;
  for (const model::ParamInfo& p : m.param_table()) flat.push_back({p.name, {p.size}, m.params().subspan(p.offset, p.size)});
  io::write_safetensors((dir / "model.safetensors").string(), flat);
  nlohmann::json meta = read_json(dir / "meta.json");
  meta["version"] = 1;
  meta.erase("files");
  meta.erase("architecture");
  meta.erase("tokenizer");
  std::ofstream(dir / "meta.json", std::ios::trunc) << meta.dump(2);
  const LoadedCheckpoint c = load_for_inference(run);
  EXPECT_EQ(c.info.version, 1);
  EXPECT_TRUE(std::equal(m.params().begin(), m.params().end(), c.model->params().begin()));
  // Flat tensors in a version 3 checkpoint (with matching checksums) are named with their shape.
  meta["version"] = 3;
  meta["architecture"] = nlohmann::json::parse(ckpt::architecture_json({m.config(), m.recipe(), 3}));
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    std::ifstream in(dir / name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
    meta["files"][name] = {{"bytes", bytes.size()}, {"crc32", crc}};
  }
  std::ofstream(dir / "meta.json", std::ios::trunc) << meta.dump(2);
  EXPECT_NE(error_of([&] { load_for_inference(run); }).find("tensor 'tok_emb' of '"), std::string::npos);
  EXPECT_NE(error_of([&] { load_for_inference(run); }).find("has shape (19200), expected (300, 64)"), std::string::npos);
  // Another RoPE layout, and a version from the future.
  meta["architecture"]["rope"]["layout"] = "half-split";
  std::ofstream(dir / "meta.json", std::ios::trunc) << meta.dump(2);
  EXPECT_NE(error_of([&] { load_for_inference(run); }).find("RoPE layout is not \"adjacent-pairs\""), std::string::npos);
  meta["version"] = 9;
  std::ofstream(dir / "meta.json", std::ios::trunc) << meta.dump(2);
  EXPECT_NE(error_of([&] { load_for_inference(run); }).find("checkpoint version 9; this build reads versions 1 to 3 "
                                                            "(written by a newer s3r"),
            std::string::npos);
  // No tokenizer anywhere: a clear error that says what to pass.
  meta["version"] = 1;
  meta.erase("architecture");
  std::ofstream(dir / "meta.json", std::ios::trunc) << meta.dump(2);
  const ckpt::CheckpointInfo info = ckpt::read_checkpoint_info(run);
  EXPECT_NE(error_of([&] { tokenizer_for(info, "", "", "generate"); }).find("generate: no tokenizer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer_for(info, "/nonexistent/tokenizer.model", "", "generate"); })
                .find("tokenizer '/nonexistent/tokenizer.model' does not exist"),
            std::string::npos);
}

// The per-token log-probabilities of the decoder, fed one token at a time through its KV cache,
// against the model's own training forward on the same window: mean cross-entropies agree.
double decoder_mean_loss(const LoadedCheckpoint& c, Precision p, const std::vector<int32_t>& in,
                         const std::vector<int32_t>& tg, bool one_by_one) {
  Decoder d(c, p, static_cast<int64_t>(in.size()));
  double sum = 0;
  AlignedVector<float> all;
  if (!one_by_one) d.feed(in, &all);
  const int64_t V = d.vocab();
  for (size_t t = 0; t < in.size(); ++t) {
    std::span<const float> z = one_by_one ? d.feed(std::span<const int32_t>(&in[t], 1))
                                          : std::span<const float>(all.data() + t * V, size_t(V));
    double mx = -INFINITY, s = 0;
    for (float v : z) mx = std::max(mx, double(v));
    for (float v : z) s += std::exp(double(v) - mx);
    sum += mx + std::log(s) - z[tg[t]];
  }
  return sum / static_cast<double>(in.size());
}

// Gemma 3 with six layers: five local ones (window 16 of S = 32) and a global one; its gains
// (1 + w) drawn around the identity so that the offset matters.
void expect_decoder_matches_model(nn::LinearMode mode, double rtol, model::Family family = model::Family::kLlama) {
  model::ModelConfig cfg = model::preset("tiny", family);
  cfg.vocab = 300;
  cfg.batch = 1;
  if (family == model::Family::kGemma3) cfg.layers = 6;
  model::Model m(cfg, nn::Recipe::make(mode, nn::Recipe::default_correction(mode)));
  init_peaky(m, 5);
  std::mt19937 g(7);
  std::normal_distribution<float> n(0.0f, 0.2f);
  for (const model::ParamInfo& p : m.param_table()) {
    if (p.role != model::ParamRole::kNorm || cfg.traits().norm_offset == 0.0f) continue;
    for (int64_t i = 0; i < p.size; ++i) m.params()[p.offset + i] = n(g);
  }
  const std::string run = save(std::string("dec_") + std::string(cfg.traits().name) + "_" + std::string(nn::to_string(mode)), m);
  const LoadedCheckpoint c = load_for_inference(run);
  std::mt19937 gen(11);
  std::vector<int32_t> tokens(static_cast<size_t>(cfg.seq_len + 1));
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % cfg.vocab);
  const std::vector<int32_t> in(tokens.begin(), tokens.end() - 1), tg(tokens.begin() + 1, tokens.end());
  const double model_loss = m.forward(in, tg);
  const double one = decoder_mean_loss(c, Precision::kTrained, in, tg, true);
  const double all = decoder_mean_loss(c, Precision::kTrained, in, tg, false);
  SCOPED_TRACE(std::string(nn::to_string(mode)));
  EXPECT_GT(model_loss, 0.1);
  EXPECT_NEAR(one, model_loss, rtol * model_loss);
  // One position at a time = all at once, up to the summation order of the products for 1 and
  // for S rows (oneDNN picks other kernels), whose last bits flip bf16 roundings downstream.
  EXPECT_NEAR(all, one, rtol * model_loss);
  // reset() empties the cache: the first position again gives the same logits.
  Decoder d(c, Precision::kTrained, 2);
  const std::span<const float> first(d.feed(std::span<const int32_t>(&in[0], 1)));
  const AlignedVector<float> a(first.begin(), first.end());
  d.reset();
  const std::span<const float> again = d.feed(std::span<const int32_t>(&in[0], 1));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), again.begin()));  // reset starts over
}

TEST(Decoder, MatchesTheModelForwardInF32) { expect_decoder_matches_model(nn::LinearMode::kF32, 2e-6); }
TEST(Decoder, MatchesTheModelForwardInBf16) { expect_decoder_matches_model(nn::LinearMode::kBf16, 2e-5); }
TEST(Decoder, MatchesTheModelForwardInS3r) { expect_decoder_matches_model(nn::LinearMode::kS3r, 2e-5); }
TEST(Decoder, MatchesTheModelForwardQwen3) { expect_decoder_matches_model(nn::LinearMode::kF32, 2e-6, model::Family::kQwen3); }
TEST(Decoder, MatchesTheModelForwardGemma3InF32) {
  expect_decoder_matches_model(nn::LinearMode::kF32, 2e-6, model::Family::kGemma3);
}
// The int8 forward's gap is codes flipped by the last bits of the f32 (model) against the double
// (decoder) attention: six layers give about three times the two-layer model's (2.0e-5 measured).
TEST(Decoder, MatchesTheModelForwardGemma3InS3r) {
  expect_decoder_matches_model(nn::LinearMode::kS3r, 6e-5, model::Family::kGemma3);
}

// Qwen3-MoE (8 experts, 2 per token): the decoder routes each position as the model routes it.
TEST(Decoder, MatchesTheModelForwardQwen3MoeInF32) {
  expect_decoder_matches_model(nn::LinearMode::kF32, 2e-6, model::Family::kQwen3Moe);
}
TEST(Decoder, MatchesTheModelForwardQwen3MoeInS3r) {
  expect_decoder_matches_model(nn::LinearMode::kS3r, 2e-5, model::Family::kQwen3Moe);
}

TEST(Decoder, PrecisionF32DiffersFromTheInt8ForwardOnlyByRounding) {
  model::ModelConfig cfg = tiny();
  model::Model m(cfg, nn::Recipe::make(nn::LinearMode::kS3r, nn::Correction::kDx));
  init_peaky(m, 6);
  const LoadedCheckpoint c = load_for_inference(save("prec", m));
  std::vector<int32_t> in(cfg.seq_len), tg(cfg.seq_len);
  for (int64_t i = 0; i < cfg.seq_len; ++i) {
    in[i] = static_cast<int32_t>((i * 37) % cfg.vocab);
    tg[i] = static_cast<int32_t>((i * 37 + 11) % cfg.vocab);
  }
  const double q = decoder_mean_loss(c, Precision::kTrained, in, tg, false);
  const double f = decoder_mean_loss(c, Precision::kF32, in, tg, false);
  EXPECT_NE(q, f);                          // int8 rounding is visible
  EXPECT_NEAR(q, f, 0.05 * f);              // but only rounding
}

// `s3r eval`'s windows: the same sums for any batch size (a partial last batch included), equal
// to the decoder's per-token log-probabilities on the same windows.
TEST(Eval, EveryWindowOnceForAnyBatch) {
  model::ModelConfig cfg = tiny();
  model::Model m(cfg, nn::Recipe::make(nn::LinearMode::kF32, nn::Correction::kNone));
  init_peaky(m, 7);
  const LoadedCheckpoint c = load_for_inference(save("eval", m));
  std::mt19937 gen(3);
  std::vector<int32_t> tokens(7 * cfg.seq_len + 5);  // 7 windows and a tail of 4 unscored tokens
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % cfg.vocab);
  int64_t calls = 0;
  const EvalResult r3 = evaluate_stream(c, tokens, Precision::kTrained, 3, nullptr, [&](int64_t, int64_t) { ++calls; });
  const EvalResult r1 = evaluate_stream(c, tokens, Precision::kTrained, 1, nullptr, nullptr);
  EXPECT_EQ(r3.windows, 7);
  EXPECT_EQ(r3.tokens, 7 * cfg.seq_len);
  EXPECT_EQ(calls, 3);  // 3 + 3 + 1
  // The same windows, so the same nats up to f32 rounding: batch 3 and batch 1 run products of
  // different M, for which oneDNN may pick kernels that sum K in another order (under
  // S3R_MAX_ISA=avx2: 1.1e-9 relative here). A window scored twice or missed moves it by ~1/7.
  EXPECT_NEAR(r3.nats, r1.nats, 1e-6 * r1.nats);
  double sum = 0;
  for (int64_t w = 0; w < 7; ++w) {
    const std::vector<int32_t> in(tokens.begin() + w * cfg.seq_len, tokens.begin() + (w + 1) * cfg.seq_len);
    const std::vector<int32_t> tg(tokens.begin() + w * cfg.seq_len + 1, tokens.begin() + (w + 1) * cfg.seq_len + 1);
    sum += decoder_mean_loss(c, Precision::kTrained, in, tg, false) * cfg.seq_len;
  }
  EXPECT_NEAR(r3.nats, sum, 2e-6 * sum);
  EXPECT_NEAR(r3.perplexity(), std::exp(r3.nats / r3.tokens), 1e-9);
  EXPECT_TRUE(std::isnan(r3.bits_per_byte()));  // no tokenizer, no bytes
  EXPECT_NE(error_of([&] { evaluate_stream(c, std::vector<int32_t>(cfg.seq_len), Precision::kTrained, 1, nullptr, nullptr); })
                .find("fewer than one window of S + 1 = 33"),
            std::string::npos);
}

TEST(Sampler, GreedyTopKTopPAndSeeds) {
  AlignedVector<float> z = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f};
  EXPECT_EQ(argmax(z), 1);
  EXPECT_EQ(Sampler({0.0f, 40, 0.95f, 1}).sample(z), 1);
  Sampler k1({1.0f, 1, 1.0f, 2}), p0({1.0f, 0, 1e-6f, 3});
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(k1.sample(z), 1);
    EXPECT_EQ(p0.sample(z), 1);
  }
  Sampler a({0.8f, 3, 1.0f, 42}), b({0.8f, 3, 1.0f, 42});
  for (int i = 0; i < 50; ++i) {
    const int32_t x = a.sample(z);
    EXPECT_EQ(x, b.sample(z));
    EXPECT_TRUE(x == 1 || x == 2 || x == 4);  // the top 3
  }
  // Temperature 1, no limits: frequencies follow softmax(z) within 5 standard errors.
  Sampler s({1.0f, 0, 1.0f, 7});
  const int n = 20000;
  std::vector<int> count(z.size());
  for (int i = 0; i < n; ++i) ++count[s.sample(z)];
  double sum = 0;
  for (float v : z) sum += std::exp(double(v));
  for (size_t i = 0; i < z.size(); ++i) {
    const double p = std::exp(double(z[i])) / sum, se = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(count[i] / double(n), p, 5 * se) << "token " << i;
  }
  EXPECT_NE(error_of([] { Sampler({-1.0f, 0, 1.0f, 0}); }).find("--temperature"), std::string::npos);
  EXPECT_NE(error_of([] { Sampler({1.0f, 0, 0.0f, 0}); }).find("--top-p must be in (0, 1]"), std::string::npos);
}

TEST(Export, HalfPrecisionRoundsToNearestEven) {
  EXPECT_EQ(to_f16(1.0f), 0x3c00);
  EXPECT_EQ(to_f16(-2.0f), 0xc000);
  EXPECT_EQ(to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(to_f16(65520.0f), 0x7c00);               // rounds up to infinity
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -25)), 0x0000);  // a tie: to even (zero)
  EXPECT_EQ(to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: to even
  EXPECT_EQ(to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = normal(gen);
    const float y = from_f16(to_f16(x));
    EXPECT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -11) + std::ldexp(1.0f, -25)) << x;
  }
}

// Reads the GGUF written by export_gguf back (from llama.cpp's docs/gguf.md) and checks its
// header, some keys, and that every matrix is s3r's transposed.
TEST(Export, GgufHoldsTransposedMatricesAndTheTokenizer) {
  model::Model m(tiny(), nn::Recipe::make(nn::LinearMode::kS3r, nn::Correction::kDx));
  init_peaky(m, 8);
  const LoadedCheckpoint c = load_for_inference(save("gguf", m));
  data::Tokenizer tok(tokenizer_path());
  const std::string path = temp_dir("gguf_out") + "/m.gguf";
  export_gguf(c, tok, path, {});
  std::ifstream f(path, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(f)), {});
  size_t at = 0;
  const auto get = [&](auto& v) { std::memcpy(&v, b.data() + at, sizeof v); at += sizeof v; };
  const auto str = [&] { uint64_t n; get(n); std::string s = b.substr(at, n); at += n; return s; };
  uint32_t magic, version;
  uint64_t n_tensors, n_kv;
  get(magic); get(version); get(n_tensors); get(n_kv);
  EXPECT_EQ(magic, 0x46554747u);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(n_tensors, 2u + 2u * 9u + 1u);
  std::map<std::string, std::string> strings;
  std::map<std::string, uint64_t> ints;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = str();
    uint32_t type;
    get(type);
    if (type == 8) { strings[key] = str(); continue; }
    if (type == 4) { uint32_t v; get(v); ints[key] = v; continue; }
    if (type == 6) { float v; get(v); ints[key] = static_cast<uint64_t>(v); continue; }
    if (type == 7) { uint8_t v; get(v); ints[key] = v; continue; }
    ASSERT_EQ(type, 9u) << key;  // an array
    uint32_t et;
    uint64_t n;
    get(et); get(n);
    ints[key] = n;
    for (uint64_t j = 0; j < n; ++j) {
      if (et == 8) str(); else at += 4;
    }
  }
  EXPECT_EQ(strings["general.architecture"], "llama");
  EXPECT_EQ(strings["tokenizer.ggml.model"], "llama");
  EXPECT_EQ(ints["tokenizer.ggml.tokens"], 300u);
  EXPECT_EQ(ints["llama.rope.dimension_count"], 16u);
  EXPECT_EQ(ints["llama.rope.freq_base"], 10000u);
  EXPECT_EQ(ints["llama.feed_forward_length"], 192u);
  EXPECT_EQ(ints["tokenizer.ggml.bos_token_id"], 1u);
  struct Info { std::vector<uint64_t> ne; uint32_t type; uint64_t offset; };
  std::map<std::string, Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string name = str();
    uint32_t nd;
    get(nd);
    Info t;
    t.ne.resize(nd);
    for (auto& d : t.ne) get(d);
    get(t.type);
    get(t.offset);
    infos[name] = t;
  }
  const size_t data = (at + 31) / 32 * 32;
  EXPECT_EQ(infos["blk.1.ffn_down.weight"].ne, (std::vector<uint64_t>{192, 64}));
  EXPECT_EQ(infos["output.weight"].ne, (std::vector<uint64_t>{64, 300}));
  EXPECT_EQ(infos["token_embd.weight"].ne, (std::vector<uint64_t>{64, 300}));
  // (out, in) row-major: element [o][i] of attn_q is s3r's W[i][o]; output.weight[v][c] = lm_head[c][v].
  const auto value = [&](const std::string& name, uint64_t row, uint64_t col) {
    float v;
    std::memcpy(&v, b.data() + data + infos[name].offset + 4 * (row * infos[name].ne[0] + col), 4);
    return v;
  };
  const auto s3r_value = [&](const std::string& name, int64_t r, int64_t col) {
    for (const model::ParamInfo& p : m.param_table()) {
      if (p.name == name) return m.params()[p.offset + r * m.param_info(name).shape[1] + col];
    }
    return NAN;
  };
  EXPECT_EQ(value("blk.0.attn_q.weight", 5, 17), s3r_value("blocks.0.attn.q", 17, 5));
  EXPECT_EQ(value("blk.1.ffn_down.weight", 3, 100), s3r_value("blocks.1.ffn.down", 100, 3));
  EXPECT_EQ(value("output.weight", 250, 7), s3r_value("lm_head", 7, 250));
  EXPECT_EQ(value("token_embd.weight", 250, 7), s3r_value("tok_emb", 250, 7));
}

// Hugging Face's half-split RoPE on the permuted Q rows gives the same rotated values, in the
// permuted order, as s3r's adjacent-pair RoPE on the original rows (so every q . k agrees).
TEST(Export, HfPermutationTurnsAdjacentPairsIntoHalfSplit) {
  model::ModelConfig cfg = tiny();
  model::Model m(cfg, nn::Recipe::make(nn::LinearMode::kF32, nn::Correction::kNone));
  init_peaky(m, 9);
  const LoadedCheckpoint c = load_for_inference(save("hf", m));
  data::Tokenizer tok(tokenizer_path());
  const std::string dir = temp_dir("hf_out");
  export_hf(c, tok, dir, {});
  const io::SafetensorsFile hf = io::read_safetensors(dir + "/model.safetensors");
  const auto& q = hf.tensors.at("model.layers.0.self_attn.q_proj.weight");
  ASSERT_EQ(q.shape, (std::vector<int64_t>{64, 64}));
  const nlohmann::json config = read_json(fs::path(dir) / "config.json");
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["head_dim"], 16);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "tokenizer.model"));
  const int64_t C = 64, HD = 16, NH = 4;
  const float* w = nullptr;
  for (const model::ParamInfo& p : m.param_table()) {
    if (p.name == "blocks.0.attn.q") w = m.params().data() + p.offset;
  }
  std::mt19937 gen(4);
  std::normal_distribution<float> normal;
  std::vector<double> x(C);
  for (auto& v : x) v = normal(gen);
  const double pos = 5, theta = 10000;
  for (int64_t h = 0; h < NH; ++h) {
    for (int64_t i = 0; i < HD / 2; ++i) {
      // s3r: y = x W (in, out), pair (2i, 2i+1) of head h.
      double a = 0, bb = 0, ha = 0, hb = 0;
      for (int64_t k = 0; k < C; ++k) {
        a += x[k] * w[k * C + h * HD + 2 * i];
        bb += x[k] * w[k * C + h * HD + 2 * i + 1];
        ha += x[k] * q.data[(h * HD + i) * C + k];           // HF: y = W x, (out, in)
        hb += x[k] * q.data[(h * HD + HD / 2 + i) * C + k];
      }
      const double ang = pos * std::pow(theta, -2.0 * i / HD), cs = std::cos(ang), sn = std::sin(ang);
      EXPECT_NEAR(ha * cs - hb * sn, a * cs - bb * sn, 1e-4);  // rotate_half: (x1 c - x2 s, x2 c + x1 s)
      EXPECT_NEAR(hb * cs + ha * sn, bb * cs + a * sn, 1e-4);
    }
  }
}

}  // namespace
}  // namespace s3r::infer
