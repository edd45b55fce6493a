#pragma once
// A model's numerics recipe, one value: the mode of the seven projections of every block, their
// S3R-EC correction, and the LM head's mode (SPEC sections 2 and 4; s3r/model/model.hpp). Every
// tool, the trainer, checkpoints, the decoder and the benchmarks take it from here.
//
// Names (what users type, and what name() prints): MODE[+CORRECTION][/head-int8], e.g. "s3r+dx",
// "sr", "bf16", "s3r+two-way/head-int8"; MODE is a LinearMode name, CORRECTION "dx" or "two-way"
// (no "+..." is no correction). The rules, checked by every way of building one:
//   - a correction needs an int8 mode (bf16 and f32 have no quantized gradient to correct);
//   - the LM head is bf16 (f32 in an f32 recipe), as in the paper, or, with /head-int8 (an int8
//     mode only), an eighth int8 projection in the recipe's mode and correction.
#include <span>
#include <string>
#include <string_view>

#include "s3r/nn/linear_mode.hpp"

namespace s3r::nn {

// The LM head's choice as `--head` spells it: "default" (bf16; f32 in f32 mode) or "int8".
enum class HeadChoice { kDefault, kInt8 };
std::string_view to_string(HeadChoice head);
HeadChoice parse_head_choice(std::string_view name);  // throws s3r::Error naming both

class Recipe {
 public:
  // s3r+dx: the default of `s3r train` and of train::TrainOptions.
  Recipe() = default;

  // The one factory: throws s3r::Error, in the options' words ("--correction dx needs an int8
  // mode ..."; "--head int8 needs an int8 mode ..."), when the rules above are broken.
  static Recipe make(LinearMode mode, Correction correction, HeadChoice head = HeadChoice::kDefault);
  // The correction a mode takes when none is named (`s3r train --mode M`): dx in int8 modes (the
  // default with s3r), none in bf16 and f32.
  static Correction default_correction(LinearMode mode);
  // Reads a name (see above); throws s3r::Error naming it and what is wrong with it.
  static Recipe parse(std::string_view name);

  LinearMode projections() const { return projections_; }
  Correction correction() const { return correction_; }
  LinearMode head() const { return head_; }  // f32, bf16, or projections() with /head-int8
  HeadChoice head_choice() const { return is_int8(head_) ? HeadChoice::kInt8 : HeadChoice::kDefault; }
  // The same recipe with another head choice (make's rules apply).
  Recipe with_head(HeadChoice head) const { return make(projections_, correction_, head); }

  std::string name() const;  // parse(name()) == *this
  // One line for banners: "s3r+dx: projections int8, gradient rounding s3r, correction dx;
  // LM head bf16; attention f32".
  std::string describe() const;

  friend bool operator==(const Recipe&, const Recipe&) = default;

 private:
  Recipe(LinearMode projections, Correction correction, LinearMode head)
      : projections_(projections), correction_(correction), head_(head) {}
  LinearMode projections_ = LinearMode::kS3r;
  Correction correction_ = Correction::kDx;
  LinearMode head_ = LinearMode::kBf16;
};

// The named recipes, in the paper's order (its Tables I and II), then f32: what `bench ffn` and
// `bench step` compare, what `diag grad-error` measures (the int8 ones) and what `--help` lists.
struct NamedRecipe {
  Recipe recipe;
  std::string_view about;  // a few words for --help
  bool benchmarked;        // one of `s3r bench ffn`'s columns
};
std::span<const NamedRecipe> named_recipes();
// "bf16, rtne, sr, ..., f32": the names of named_recipes(), for help texts and errors.
std::string named_recipe_list();

}  // namespace s3r::nn
