// `s3r export`: a checkpoint as GGUF (llama.cpp, ollama, LM Studio) or as a Hugging Face
// LlamaForCausalLM folder (s3r/infer/export.hpp, docs/FORMATS.md).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "s3r/core/error.hpp"
#include "s3r/infer/export.hpp"
#include "s3r/infer/tokenizer.hpp"

namespace s3r::tools {

namespace {

struct Options {
  std::string checkpoint, format, out, type, tokenizer, name, inject;
};

void run(const Options& o) {
  if (o.format != "gguf" && o.format != "hf") {
    throw Error("export: unknown --format '" + o.format + "'; expected gguf or hf");
  }
  infer::ExportOptions eo;
  if (!o.type.empty()) eo.type = infer::parse_gguf_type(o.type);
  eo.inject = o.inject;
  eo.name = o.name.empty() ? std::filesystem::path(o.out).stem().string() : o.name;
  const infer::LoadedCheckpoint ckpt = infer::load_for_inference(o.checkpoint);
  const auto tok = infer::tokenizer_for(ckpt.info, o.tokenizer, "", "export");
  if (o.format == "gguf") {
    infer::export_gguf(ckpt, *tok, o.out, eo);
  } else {
    infer::export_hf(ckpt, *tok, o.out, eo);
  }
  std::cout << "export: " << o.out << " (" << o.format << (o.format == "gguf" ? ", " + (o.type.empty() ? "f32" : o.type) : "")
            << "; " << ckpt.info.model.describe() << ", step " << ckpt.info.step + 1 << ")\n";
}

}  // namespace

void register_export(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("export", "a checkpoint as GGUF (llama.cpp) or a Hugging Face folder");
  cmd->add_option("--checkpoint", o->checkpoint, "run folder (or its checkpoint/) of s3r train")->required();
  cmd->add_option("--format", o->format, "gguf (one file) | hf (a folder: config.json, model.safetensors, ...)")
      ->required();
  cmd->add_option("--out", o->out, "the GGUF file or the Hugging Face folder to write")->required();
  cmd->add_option("--type", o->type, "GGUF weight type: f32 (default) | f16 | bf16 | q8_0 (norm gains stay f32)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "SentencePiece tokenizer.model (default: the checkpoint's own; the data folder's for "
                  "checkpoints that hold none)");
  cmd->add_option("--name", o->name, "the model's name (general.name; default: --out's name)");
  cmd->add_option("--inject", o->inject, "for tests only: write a deliberately broken model (permute-qk | transpose-o | f16-overflow | "
                  "nan-weight | no-gain-offset | reverse-experts), to show that a comparison catches it")->group("");
  cmd->callback([o] { run(*o); });
}

}  // namespace s3r::tools
