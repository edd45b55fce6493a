// The numerics recipe; see s3r/nn/recipe.hpp.
#include "s3r/nn/recipe.hpp"

#include <vector>

#include "s3r/core/error.hpp"

namespace s3r::nn {

namespace {

constexpr std::string_view kHeadSuffix = "/head-int8";
constexpr std::string_view kGrammar = "MODE[+CORRECTION][/head-int8], e.g. s3r+dx, sr, bf16, s3r+dx/head-int8";
constexpr std::string_view kInt8Modes = "(rtne, sr, s3r, s3r-bcast)";

// The head a recipe's choice gives: its own int8 mode, or bf16 (f32 in an f32 recipe).
LinearMode head_mode(LinearMode projections, HeadChoice head) {
  if (head == HeadChoice::kInt8) return projections;
  return projections == LinearMode::kF32 ? LinearMode::kF32 : LinearMode::kBf16;
}

std::string precision_name(LinearMode mode) { return is_int8(mode) ? "int8" : std::string(to_string(mode)); }

}  // namespace

std::string_view to_string(HeadChoice head) { return head == HeadChoice::kInt8 ? "int8" : "default"; }

HeadChoice parse_head_choice(std::string_view name) {
  if (name == "default") return HeadChoice::kDefault;
  if (name == "int8") return HeadChoice::kInt8;
  throw Error("unknown LM head '" + std::string(name) + "'; expected default or int8");
}

Recipe Recipe::make(LinearMode mode, Correction correction, HeadChoice head) {
  if (!is_int8(mode) && correction != Correction::kNone) {
    throw Error("--correction " + std::string(to_string(correction)) + " needs an int8 mode " +
                std::string(kInt8Modes) + "; the mode is " + std::string(to_string(mode)));
  }
  if (!is_int8(mode) && head == HeadChoice::kInt8) {
    throw Error("--head int8 needs an int8 mode " + std::string(kInt8Modes) + "; the mode is " +
                std::string(to_string(mode)));
  }
  return Recipe(mode, correction, head_mode(mode, head));
}

Correction Recipe::default_correction(LinearMode mode) { return is_int8(mode) ? Correction::kDx : Correction::kNone; }

Recipe Recipe::parse(std::string_view name) {
  std::string_view rest = name;
  HeadChoice head = HeadChoice::kDefault;
  if (rest.ends_with(kHeadSuffix)) {
    head = HeadChoice::kInt8;
    rest.remove_suffix(kHeadSuffix.size());
  }
  const size_t plus = rest.find('+');
  try {
    if (rest.find('/') != std::string_view::npos) throw Error("the only suffix is /head-int8");
    const LinearMode mode = parse_linear_mode(rest.substr(0, plus));
    const Correction correction =
        plus == std::string_view::npos ? Correction::kNone : parse_correction(rest.substr(plus + 1));
    return make(mode, correction, head);
  } catch (const Error& e) {
    throw Error("recipe '" + std::string(name) + "': " + e.what() + "; a recipe is " + std::string(kGrammar));
  }
}

std::string Recipe::name() const {
  std::string s(to_string(projections_));
  if (correction_ != Correction::kNone) s.append("+").append(to_string(correction_));
  if (head_choice() == HeadChoice::kInt8) s.append(kHeadSuffix);
  return s;
}

std::string Recipe::describe() const {
  std::string s = name() + ": projections " + precision_name(projections_);
  if (is_int8(projections_)) {
    s += ", gradient rounding " + std::string(to_string(projections_)) + ", correction " +
         std::string(to_string(correction_));
  }
  s += "; LM head " + precision_name(head_);
  if (is_int8(head_)) s += " (like the projections)";
  return s + "; attention f32";
}

std::span<const NamedRecipe> named_recipes() {
  // Built with make(), so the table itself obeys the rules.
  static const std::vector<NamedRecipe> kNamedRecipes = {
      {Recipe::make(LinearMode::kBf16, Correction::kNone), "bf16 products, the paper's baseline", true},
      {Recipe::make(LinearMode::kRtne, Correction::kNone), "int8, gradient rounded to nearest", true},
      {Recipe::make(LinearMode::kSr, Correction::kNone), "int8, independent stochastic rounding", true},
      {Recipe::make(LinearMode::kS3r, Correction::kNone), "int8, one shared threshold per token", true},
      {Recipe::make(LinearMode::kS3r, Correction::kDx), "s3r with the dX correction (the default)", true},
      {Recipe::make(LinearMode::kS3r, Correction::kTwoWay), "s3r corrected in dX and dW", true},
      {Recipe::make(LinearMode::kS3rBcast, Correction::kNone), "int8, one shared threshold per example", true},
      {Recipe::make(LinearMode::kS3rBcast, Correction::kDx), "s3r-bcast with the dX correction", false},
      {Recipe::make(LinearMode::kS3rBcast, Correction::kTwoWay), "s3r-bcast corrected in dX and dW", false},
      {Recipe::make(LinearMode::kF32, Correction::kNone), "f32 products, the exact reference", true},
  };
  return kNamedRecipes;
}

std::string named_recipe_list() {
  std::string s;
  for (const NamedRecipe& r : named_recipes()) s += (s.empty() ? "" : ", ") + r.recipe.name();
  return s;
}

}  // namespace s3r::nn
