// The training loop: bit-exact resume from a checkpoint, and clear errors on bad input.
#include "s3r/train/trainer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <sstream>
#include <string>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/io/folder_lock.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

namespace s3r::train {
namespace {

namespace fs = std::filesystem;

data::TokenShard synthetic(int64_t n, uint32_t salt) {
  data::TokenShard s;
  s.vocab = 256;
  uint32_t t = salt;
  for (int64_t i = 0; i < n; ++i) {
    s.tokens.push_back(t);
    t = (5 * t + static_cast<uint32_t>((i / 7) % 3) + 1) % 64;
  }
  return s;
}

TrainOptions tiny_options(int64_t steps, const std::string& out) {
  TrainOptions o;
  o.model = model::preset("tiny");
  o.recipe = nn::Recipe::make(nn::LinearMode::kS3r, nn::Correction::kTwoWay);
  o.seed = 7;
  o.steps = steps;
  o.lr = optim::LrSchedule{3e-3f, 3e-4f, 2, 12};
  o.eval_every = 3;
  o.eval_batches = 2;
  o.out_dir = out;
  o.quiet = true;
  return o;
}

// A fresh folder `name` inside this process's own scratch folder: the same test run twice at once
// (ctest -j, a capped rerun beside the plain one) must not share run folders.
std::string temp_dir(const std::string& name) {
  const fs::path dir = testing::process_temp_dir("s3r_train_test") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Train 12 steps straight; train 6, stop, resume from the checkpoint for 6 more: every logged
// loss (and validation loss) of the second half is the same double, bit for bit.
TEST(Trainer, ResumeContinuesBitExactly) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  const std::string a = temp_dir("straight"), b = temp_dir("halves");
  const TrainResult straight = train(tiny_options(12, a), train_shard, val_shard, "", log);
  const TrainResult first = train(tiny_options(6, b), train_shard, val_shard, "", log);
  ASSERT_TRUE(fs::exists(fs::path(b) / "checkpoint" / "meta.json"));
  const TrainResult second = train(tiny_options(12, b), train_shard, val_shard, b, log);
  ASSERT_EQ(straight.steps.size(), 12u);
  ASSERT_EQ(first.steps.size(), 6u);
  ASSERT_EQ(second.steps.size(), 6u);
  for (int i = 0; i < 12; ++i) {
    const StepRecord& got = i < 6 ? first.steps[i] : second.steps[i - 6];
    EXPECT_EQ(got.step, i);
    EXPECT_EQ(std::memcmp(&got.loss, &straight.steps[i].loss, sizeof(double)), 0)
        << "step " << i << ": " << got.loss << " vs " << straight.steps[i].loss;
    EXPECT_EQ(got.grad_norm, straight.steps[i].grad_norm) << "step " << i;
  }
  ASSERT_FALSE(second.validation.empty());
  EXPECT_EQ(second.validation.back(), straight.validation.back());
  EXPECT_LT(straight.steps.back().loss, straight.steps.front().loss);
}

TEST(Trainer, BadInputGivesOneClearError) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  auto message = [&](TrainOptions o, const std::string& resume) -> std::string {
    try {
      train(o, train_shard, val_shard, resume, log);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  TrainOptions o = tiny_options(2, "");
  o.model.heads = 5;
  EXPECT_NE(message(o, "").find("not divisible by heads"), std::string::npos);
  o = tiny_options(2, "");
  o.model.vocab = 300;
  EXPECT_NE(message(o, "").find("vocabulary"), std::string::npos);
  EXPECT_NE(message(tiny_options(2, ""), temp_dir("empty")).find("no checkpoint"), std::string::npos);
  // A checkpoint of another configuration, and a corrupt one.
  const std::string dir = temp_dir("other");
  train(tiny_options(2, dir), train_shard, val_shard, "", log);
  o = tiny_options(4, dir);
  o.recipe = nn::Recipe::make(nn::LinearMode::kSr, nn::Correction::kTwoWay);
  EXPECT_NE(message(o, dir).find("differs from this run"), std::string::npos);
  const fs::path weights = fs::path(dir) / "checkpoint" / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) - 8);
  EXPECT_NE(message(tiny_options(4, dir), dir).find("safetensors"), std::string::npos);
}

// Bytes of every file under `dir`, by relative path: to prove a folder was left untouched.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == ".lock") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files[fs::relative(e.path(), dir).string()] = bytes.str();
  }
  return files;
}

using testing::error_of;

// A NaN, infinite or absurd option is refused before anything is done.
TEST(Trainer, NonFiniteOrOutOfRangeOptionsAreRefused) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  const std::string dir = temp_dir("bad_options");
  const std::string out = (fs::path(dir) / "run").string();
  const auto check = [&](const std::function<void(TrainOptions&)>& change, const std::string& expected) {
    TrainOptions o = tiny_options(4, out);
    change(o);
    const std::string what = error_of([&] { train(o, train_shard, val_shard, "", log); });
    EXPECT_NE(what.find(expected), std::string::npos) << what;
    EXPECT_FALSE(fs::exists(out)) << "the run folder was created for a refused run: " << expected;
  };
  check([](TrainOptions& o) { o.lr.max_lr = std::nanf(""); }, "--lr must be");
  check([](TrainOptions& o) { o.lr.max_lr = 1e30f; }, "--lr must be");
  check([](TrainOptions& o) { o.lr.min_lr = std::numeric_limits<float>::infinity(); }, "--min-lr must be");
  check([](TrainOptions& o) { o.adamw.clip_norm = std::nanf(""); }, "--clip must be");
  check([](TrainOptions& o) { o.adamw.weight_decay = -0.1f; }, "--weight-decay must be");
  check([](TrainOptions& o) { o.eval_batches = 0; }, "--eval-batches must be >= 1");
  check([](TrainOptions& o) { o.steps = 0; }, "--steps must be >= 1");
  check([](TrainOptions& o) { o.checkpoint_every = -1; }, "--checkpoint-every must be >= 0");
  // A validation shard shorter than one window: found before step 0, not at the final evaluation.
  TrainOptions o = tiny_options(4, out);
  const std::string what = error_of([&] { train(o, train_shard, synthetic(o.model.seq_len, 2), "", log); });
  EXPECT_NE(what.find("the validation shard holds 32 tokens, fewer than one window"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(out));
  // A model whose activations cannot fit in memory: a clear error, not std::bad_alloc.
  o.model.batch = 1 << 20;
  const std::string oom = error_of([&] { train(o, train_shard, val_shard, "", log); });
  EXPECT_NE(oom.find("per process) needs about"), std::string::npos) << oom;
  EXPECT_NE(oom.find("GB are available; use --micro-batch"), std::string::npos) << oom;
}

// A run folder that holds a run is refused without --resume or --overwrite (and left as it
// was); --overwrite replaces it; a folder in use by another trainer is refused.
TEST(Trainer, RunFoldersAreProtected) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  const std::string dir = temp_dir("protected");
  train(tiny_options(3, dir), train_shard, val_shard, "", log);
  const auto before = snapshot(dir);
  ASSERT_TRUE(before.count("checkpoint/meta.json"));
  const std::string what = error_of([&] { train(tiny_options(3, dir), train_shard, val_shard, "", log); });
  EXPECT_NE(what.find("already holds a run"), std::string::npos) << what;
  EXPECT_EQ(snapshot(dir), before);
  {
    io::FolderLock other(dir);  // another trainer on the same folder
    TrainOptions o = tiny_options(3, dir);
    o.overwrite = true;
    const std::string busy = error_of([&] { train(o, train_shard, val_shard, "", log); });
    EXPECT_NE(busy.find("is in use by another s3r process (pid "), std::string::npos) << busy;
    EXPECT_EQ(snapshot(dir), before);
  }
  TrainOptions o = tiny_options(2, dir);
  o.overwrite = true;
  train(o, train_shard, val_shard, "", log);
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).step, 1);
}

// Resume finds the newest complete checkpoint wherever a crash left it, and names a corrupt one.
TEST(Trainer, ResumeRecoversFromACrashDuringASave) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  const std::string straight_dir = temp_dir("crash_straight"), dir = temp_dir("crash"), copy = temp_dir("crash_copy");
  const TrainResult straight = train(tiny_options(12, straight_dir), train_shard, val_shard, "", log);
  TrainOptions o = tiny_options(6, dir);
  o.lr.total = 12;
  train(o, train_shard, val_shard, "", log);  // checkpoint of step 6
  fs::remove_all(copy);
  fs::copy(fs::path(dir) / "checkpoint", copy, fs::copy_options::recursive);
  o.steps = 9;
  train(o, train_shard, val_shard, dir, log);  // checkpoint of step 9
  // The state after "checkpoint/ -> checkpoint.old/" and before "checkpoint.tmp/ -> checkpoint/":
  // no checkpoint/, the new one complete in checkpoint.tmp/, the previous one in checkpoint.old/.
  fs::rename(fs::path(dir) / "checkpoint", fs::path(dir) / "checkpoint.tmp");
  fs::copy(copy, fs::path(dir) / "checkpoint.old", fs::copy_options::recursive);
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).step, 8);  // read-only: the newest complete one
  std::ostringstream resume_log;
  o.steps = 12;
  const TrainResult rest = train(o, train_shard, val_shard, dir, resume_log);
  EXPECT_NE(resume_log.str().find("recovered the checkpoint of step 9 from checkpoint.tmp/"), std::string::npos)
      << resume_log.str();
  ASSERT_EQ(rest.steps.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(&rest.steps[i].loss, &straight.steps[9 + i].loss, sizeof(double)), 0) << "step " << 9 + i;
  }
  EXPECT_EQ(rest.validation.back(), straight.validation.back());
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoint.tmp"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoint.old"));
  // An incomplete checkpoint.tmp/ (killed while writing) beside a complete checkpoint/ is removed.
  fs::create_directories(fs::path(dir) / "checkpoint.tmp");
  std::ofstream(fs::path(dir) / "checkpoint.tmp" / "model.safetensors") << "partial";
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).step, 11);
  EXPECT_EQ(ckpt::tidy_checkpoints(dir), "removed the leftover checkpoint.tmp/");
  // One flipped byte in a tensor file: named, never trained on.
  const fs::path weights = fs::path(dir) / "checkpoint" / "model.safetensors";
  {
    // Inverted, not overwritten with a constant: a byte that already held the constant would
    // leave the file intact (it did under S3R_ISA=avx2, whose weights differ in the last bits).
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(weights) / 2);
    f.seekg(middle);
    const char byte = static_cast<char>(f.get());
    f.seekp(middle);
    f.put(static_cast<char>(~byte));
  }
  o.steps = 14;
  o.lr.total = 14;
  const std::string what = error_of([&] { train(o, train_shard, val_shard, dir, log); });
  EXPECT_NE(what.find("model.safetensors' does not match its CRC-32 in meta.json (corrupt)"), std::string::npos) << what;
}

// Weights gone absurd (finite, but the forward overflows): every step is skipped, the run stops
// after max_bad_steps, and the checkpoint it resumed from is not replaced.
TEST(Trainer, ARunThatGoesBadKeepsTheGoodCheckpoint) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  const std::string dir = temp_dir("goes_bad");
  TrainOptions o = tiny_options(20, dir);
  o.max_bad_steps = 3;
  model::Model model(o.model, o.recipe);
  model.init_weights(o.seed);
  for (const model::ParamInfo& p : model.param_table()) {
    if (p.name == "blocks.0.attn.q" || p.name == "blocks.0.attn.k") {
      for (int64_t i = 0; i < p.size; ++i) model.params()[p.offset + i] = 1e18f;
    }
  }
  AlignedVector<float> m(model.params().size(), 0.0f), v(model.params().size(), 0.0f);
  ckpt::CheckpointInfo info;
  static_cast<ckpt::RunConfig&>(info) = ckpt::RunConfig{o.model, o.recipe, o.seed};
  info.step = 4;
  info.loader = {0, 20};
  ckpt::save_checkpoint(dir, info, model, m, v);
  const auto before = snapshot(fs::path(dir) / "checkpoint");
  std::ostringstream log;
  const std::string what = error_of([&] { train(o, train_shard, val_shard, dir, log); });
  EXPECT_NE(what.find("3 consecutive steps"), std::string::npos) << what;
  EXPECT_NE(log.str().find("skipped"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("kept the earlier checkpoint"), std::string::npos) << log.str();
  EXPECT_EQ(snapshot(fs::path(dir) / "checkpoint"), before);
  // A non-finite state is never saved.
  model.params()[3] = std::nanf("");
  EXPECT_NE(error_of([&] { ckpt::save_checkpoint(dir, info, model, m, v); }).find("refusing to save a non-finite state"),
            std::string::npos);
  EXPECT_EQ(snapshot(fs::path(dir) / "checkpoint"), before);
}

// Every missing, mistyped or absurd field of meta.json is an s3r::Error naming the file and the
// field (never a JSON library exception, an overflow or an allocation of a corrupt size).
TEST(Trainer, CorruptMetaFieldsAreNamed) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  const std::string dir = temp_dir("meta_fields");
  train(tiny_options(2, dir), train_shard, val_shard, "", log);
  const fs::path meta = fs::path(dir) / "checkpoint" / "meta.json";
  std::string text;
  {
    std::ifstream in(meta);
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
    std::ofstream(meta, std::ios::trunc) << t;
    return error_of([&] { ckpt::read_checkpoint_info(dir); });
  };
  EXPECT_NE(with("\"batch\": 4", "\"batch\": 1099511627776").find("batch must be <= 16777216"), std::string::npos);
  EXPECT_NE(with("\"batch\": 4", "\"batch\": \"4\"").find("field \"batch\" is \"4\", not a whole number"),
            std::string::npos);
  EXPECT_NE(with("\"step\": 1", "\"stop\": 1").find("field \"step\" is missing"), std::string::npos);
  EXPECT_NE(with("\"crc32\"", "\"crc\"").find("field \"crc32\" is missing"), std::string::npos);
  const std::string what = with("\"version\": 3", "\"version\": 7");
  EXPECT_NE(what.find("meta.json': checkpoint version 7"), std::string::npos) << what;
  // The recipe's name must agree with the fields it names.
  EXPECT_NE(with("\"recipe\": \"s3r+two-way\"", "\"recipe\": \"s3r+dx\"")
                .find("field \"recipe\" is \"s3r+dx\", but \"mode\", \"correction\" and \"lm_head\" make s3r+two-way"),
            std::string::npos);
  EXPECT_NE(with("\"recipe\": \"s3r+two-way\"", "\"recipe\": 3").find("field \"recipe\" is 3, not a string"),
            std::string::npos);
  EXPECT_NE(with("\"correction\": \"two-way\"", "\"correction\": \"dy\"").find("unknown correction 'dy'"),
            std::string::npos);
}

// A checkpoint without "recipe" (written before it was one value) reads from its mode,
// correction and lm_head; one that pairs bf16 with a correction and an int8 head, which the
// library could write before it checked recipes and whose model applied neither, reads as bf16.
TEST(Trainer, CheckpointsBeforeTheRecipeNameRead) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  std::ostringstream log;
  const std::string dir = temp_dir("meta_recipe");
  train(tiny_options(2, dir), train_shard, val_shard, "", log);
  const fs::path meta_path = fs::path(dir) / "checkpoint" / "meta.json";
  nlohmann::json meta;
  std::ifstream(meta_path) >> meta;
  EXPECT_EQ(meta["config"]["recipe"], "s3r+two-way");
  meta["config"].erase("recipe");
  std::ofstream(meta_path, std::ios::trunc) << meta.dump(1);
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).recipe, nn::Recipe::parse("s3r+two-way"));
  meta["config"]["lm_head"] = "int8";
  std::ofstream(meta_path, std::ios::trunc) << meta.dump(1);
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).recipe, nn::Recipe::parse("s3r+two-way/head-int8"));
  meta["config"]["mode"] = "bf16";
  std::ofstream(meta_path, std::ios::trunc) << meta.dump(1);
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).recipe, nn::Recipe::parse("bf16"));
  meta["config"].erase("lm_head");
  meta["config"]["mode"] = "s3r";
  std::ofstream(meta_path, std::ios::trunc) << meta.dump(1);
  EXPECT_EQ(ckpt::read_checkpoint_info(dir).recipe, nn::Recipe::parse("s3r+two-way"));
}

TEST(Trainer, UnigramEntropyOfAUniformShardIsLogV) {
  data::TokenShard s;
  s.vocab = 8;
  for (int i = 0; i < 800; ++i) s.tokens.push_back(static_cast<uint32_t>(i % 8));
  EXPECT_NEAR(unigram_entropy(s), std::log(8.0), 1e-12);
}

}  // namespace
}  // namespace s3r::train
