// Tests of s3r::nn::Recipe: the rules (a correction and an int8 head need an int8 mode), the names
// users type (parse and name() are inverses over every valid recipe, and every invalid name is
// one error naming it), the heads, the defaults and the named table.
#include "s3r/nn/recipe.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"

namespace s3r::nn {
namespace {

constexpr LinearMode kModes[] = {LinearMode::kF32, LinearMode::kBf16, LinearMode::kRtne,
                                 LinearMode::kSr,  LinearMode::kS3r,  LinearMode::kS3rBcast};
constexpr Correction kCorrections[] = {Correction::kNone, Correction::kDx, Correction::kTwoWay};
constexpr HeadChoice kHeads[] = {HeadChoice::kDefault, HeadChoice::kInt8};

std::string error_of(std::string_view name) {
  try {
    Recipe::parse(name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Recipe, MakeAcceptsExactlyTheValidCombinations) {
  int valid = 0;
  for (LinearMode mode : kModes) {
    for (Correction correction : kCorrections) {
      for (HeadChoice head : kHeads) {
        const bool ok = is_int8(mode) || (correction == Correction::kNone && head == HeadChoice::kDefault);
        SCOPED_TRACE(std::string(to_string(mode)) + " " + std::string(to_string(correction)) + " " +
                     std::string(to_string(head)));
        if (!ok) {
          EXPECT_THROW(Recipe::make(mode, correction, head), Error);
          continue;
        }
        ++valid;
        const Recipe r = Recipe::make(mode, correction, head);
        EXPECT_EQ(r.projections(), mode);
        EXPECT_EQ(r.correction(), correction);
        EXPECT_EQ(r.head_choice(), head);
      }
    }
  }
  EXPECT_EQ(valid, 4 * 3 * 2 + 2);  // every int8 combination, and bf16 and f32 plain
}

TEST(Recipe, MessagesNameTheOptionAndTheMode) {
  try {
    Recipe::make(LinearMode::kBf16, Correction::kDx);
    FAIL() << "bf16 + dx was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--correction dx needs an int8 mode (rtne, sr, s3r, s3r-bcast); the mode is bf16");
  }
  try {
    Recipe::make(LinearMode::kF32, Correction::kNone, HeadChoice::kInt8);
    FAIL() << "f32 with an int8 head was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--head int8 needs an int8 mode (rtne, sr, s3r, s3r-bcast); the mode is f32");
  }
}

TEST(Recipe, TheHeadIsBf16F32OrTheProjectionsOwnMode) {
  EXPECT_EQ(Recipe::make(LinearMode::kF32, Correction::kNone).head(), LinearMode::kF32);
  EXPECT_EQ(Recipe::make(LinearMode::kBf16, Correction::kNone).head(), LinearMode::kBf16);
  for (LinearMode mode : {LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r, LinearMode::kS3rBcast}) {
    EXPECT_EQ(Recipe::make(mode, Correction::kDx).head(), LinearMode::kBf16);
    EXPECT_EQ(Recipe::make(mode, Correction::kDx, HeadChoice::kInt8).head(), mode);
    EXPECT_EQ(Recipe::make(mode, Correction::kDx).with_head(HeadChoice::kInt8),
              Recipe::make(mode, Correction::kDx, HeadChoice::kInt8));
  }
  EXPECT_THROW(Recipe::make(LinearMode::kBf16, Correction::kNone).with_head(HeadChoice::kInt8), Error);
}

TEST(Recipe, NameAndParseAreInversesOverEveryValidRecipe) {
  std::set<std::string> names;
  for (LinearMode mode : kModes) {
    for (Correction correction : kCorrections) {
      for (HeadChoice head : kHeads) {
        if (!is_int8(mode) && (correction != Correction::kNone || head != HeadChoice::kDefault)) continue;
        const Recipe r = Recipe::make(mode, correction, head);
        EXPECT_EQ(Recipe::parse(r.name()), r) << r.name();
        EXPECT_TRUE(names.insert(r.name()).second) << "two recipes named " << r.name();
      }
    }
  }
  EXPECT_EQ(Recipe::make(LinearMode::kS3r, Correction::kDx).name(), "s3r+dx");
  EXPECT_EQ(Recipe::make(LinearMode::kS3r, Correction::kDx, HeadChoice::kInt8).name(), "s3r+dx/head-int8");
  EXPECT_EQ(Recipe::make(LinearMode::kS3rBcast, Correction::kTwoWay).name(), "s3r-bcast+two-way");
  EXPECT_EQ(Recipe::make(LinearMode::kSr, Correction::kNone).name(), "sr");
  EXPECT_EQ(Recipe::make(LinearMode::kBf16, Correction::kNone).name(), "bf16");
  EXPECT_EQ(Recipe::parse("rtne/head-int8"), Recipe::make(LinearMode::kRtne, Correction::kNone, HeadChoice::kInt8));
  EXPECT_EQ(Recipe::parse("sr+none"), Recipe::parse("sr"));  // an explicit "no correction" reads too
}

TEST(Recipe, ParseRefusesEveryOtherNameNamingIt) {
  const std::pair<const char*, const char*> cases[] = {
      {"fp8", "unknown mode 'fp8'"},
      {"", "unknown mode ''"},
      {"+dx", "unknown mode ''"},
      {"s3r+", "unknown correction ''"},
      {"s3r+dy", "unknown correction 'dy'"},
      {"s3r+dx+two-way", "unknown correction 'dx+two-way'"},
      {"S3R+dx", "unknown mode 'S3R'"},
      {"bf16+dx", "--correction dx needs an int8 mode"},
      {"f32/head-int8", "--head int8 needs an int8 mode"},
      {"s3r+dx/head-bf16", "the only suffix is /head-int8"},
      {"s3r/head-int8/head-int8", "the only suffix is /head-int8"},
  };
  for (const auto& [name, why] : cases) {
    const std::string e = error_of(name);
    EXPECT_NE(e.find("recipe '" + std::string(name) + "': "), std::string::npos) << name << ": " << e;
    EXPECT_NE(e.find(why), std::string::npos) << name << ": " << e;
    EXPECT_NE(e.find("MODE[+CORRECTION][/head-int8]"), std::string::npos) << name << ": " << e;
  }
}

TEST(Recipe, DefaultsAreS3rWithDxAndTheModesOwnCorrection) {
  EXPECT_EQ(Recipe(), Recipe::make(LinearMode::kS3r, Correction::kDx));
  EXPECT_EQ(Recipe().name(), "s3r+dx");
  for (LinearMode mode : kModes) {
    EXPECT_EQ(Recipe::default_correction(mode), is_int8(mode) ? Correction::kDx : Correction::kNone);
    EXPECT_NO_THROW(Recipe::make(mode, Recipe::default_correction(mode))) << to_string(mode);
  }
}

TEST(Recipe, DescribeNamesEveryPart) {
  EXPECT_EQ(Recipe().describe(),
            "s3r+dx: projections int8, gradient rounding s3r, correction dx; LM head bf16; attention f32");
  EXPECT_EQ(Recipe::parse("sr/head-int8").describe(),
            "sr/head-int8: projections int8, gradient rounding sr, correction none; LM head int8 (like the "
            "projections); attention f32");
  EXPECT_EQ(Recipe::parse("f32").describe(), "f32: projections f32; LM head f32; attention f32");
  EXPECT_EQ(Recipe::parse("bf16").describe(), "bf16: projections bf16; LM head bf16; attention f32");
}

// The table: the paper's nine configurations in its order, then f32; unique names that parse
// back; bench ffn's eight columns (bf16 first, f32 last).
TEST(Recipe, TheNamedTableIsThePapersNineThenF32) {
  std::vector<std::string> names, benchmarked;
  for (const NamedRecipe& r : named_recipes()) {
    names.push_back(r.recipe.name());
    if (r.benchmarked) benchmarked.push_back(r.recipe.name());
    EXPECT_EQ(Recipe::parse(r.recipe.name()), r.recipe);
    EXPECT_FALSE(r.about.empty());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bf16", "rtne", "sr", "s3r", "s3r+dx", "s3r+two-way", "s3r-bcast",
                                             "s3r-bcast+dx", "s3r-bcast+two-way", "f32"}));
  EXPECT_EQ(benchmarked, (std::vector<std::string>{"bf16", "rtne", "sr", "s3r", "s3r+dx", "s3r+two-way",
                                                   "s3r-bcast", "f32"}));
  EXPECT_EQ(named_recipe_list(), "bf16, rtne, sr, s3r, s3r+dx, s3r+two-way, s3r-bcast, s3r-bcast+dx, "
                                 "s3r-bcast+two-way, f32");
}

TEST(Recipe, HeadChoiceNames) {
  EXPECT_EQ(parse_head_choice("default"), HeadChoice::kDefault);
  EXPECT_EQ(parse_head_choice("int8"), HeadChoice::kInt8);
  EXPECT_EQ(to_string(HeadChoice::kInt8), "int8");
  EXPECT_THROW(parse_head_choice("bf16"), Error);
}

}  // namespace
}  // namespace s3r::nn
