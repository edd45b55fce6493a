// The training loop: bit-exact resume from a checkpoint, and clear errors on bad input.
#include "s3r/train/trainer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>

#include "s3r/core/error.hpp"

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
  o.mode = nn::LinearMode::kS3r;
  o.correction = nn::Correction::kTwoWay;
  o.seed = 7;
  o.steps = steps;
  o.lr = optim::LrSchedule{3e-3f, 3e-4f, 2, 12};
  o.eval_every = 3;
  o.eval_batches = 2;
  o.out_dir = out;
  o.quiet = true;
  return o;
}

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "s3r_train_test" / name;
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
  o.mode = nn::LinearMode::kSr;
  EXPECT_NE(message(o, dir).find("differs from this run"), std::string::npos);
  const fs::path weights = fs::path(dir) / "checkpoint" / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) - 8);
  EXPECT_NE(message(tiny_options(4, dir), dir).find("safetensors"), std::string::npos);
}

// A NaN learning rate poisons the weights at the first update; every later step meets NaN (in
// the forward quantizers, or in the loss in f32 mode), is skipped and logged, and the run stops
// after max_bad_steps in a row with a checkpoint of the last state.
TEST(Trainer, NonFiniteStepsAreSkippedThenTheRunStops) {
  const data::TokenShard train_shard = synthetic(6000, 1), val_shard = synthetic(2000, 2);
  for (nn::LinearMode mode : {nn::LinearMode::kS3r, nn::LinearMode::kF32}) {
    const std::string dir = temp_dir(std::string("nan_") + std::string(nn::to_string(mode)));
    TrainOptions o = tiny_options(20, dir);
    o.mode = mode;
    o.correction = nn::Correction::kNone;
    o.lr = optim::LrSchedule{std::nanf(""), std::nanf(""), 0, 20};
    o.max_bad_steps = 3;
    std::ostringstream log;
    try {
      train(o, train_shard, val_shard, "", log);
      FAIL() << "expected the run to stop";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("3 consecutive steps"), std::string::npos) << e.what();
    }
    EXPECT_NE(log.str().find("skipped"), std::string::npos) << log.str();
    EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoint" / "meta.json"));
  }
}

TEST(Trainer, UnigramEntropyOfAUniformShardIsLogV) {
  data::TokenShard s;
  s.vocab = 8;
  for (int i = 0; i < 800; ++i) s.tokens.push_back(static_cast<uint32_t>(i % 8));
  EXPECT_NEAR(unigram_entropy(s), std::log(8.0), 1e-12);
}

}  // namespace
}  // namespace s3r::train
