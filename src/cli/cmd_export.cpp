// mantis export — a model (any format load_model reads) written in another layout: --hf, the
// Hugging Face layout transformers loads (io/checkpoint.h save_model_hf).
#include <fmt/format.h>

#include <string>

#include "common.h"
#include "io/checkpoint.h"

namespace mantis::cli {

namespace {

struct ExportArgs {
  std::string model, out;
  bool hf = false;
};

int run_export(const ExportArgs& a) {
  if (!a.hf) throw InputError("mantis export: choose the layout to write: --hf (the only one so far)");
  const Model m = load_model(a.model);
  save_model_hf(m, a.out);
  fmt::print("wrote {}/config.json and {}/model.safetensors (Hugging Face {}, {} tensors, F32)\n", a.out, a.out,
             m.cfg.arch == Arch::gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM", m.params.size());
  return 0;
}

}  // namespace

Runner setup_export(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  sub.description(
      "write MODEL (any checkpoint load_model reads) in Hugging Face's layout: config.json + model.safetensors (F32) "
      "that transformers loads as GPT2LMHeadModel or LlamaForCausalLM (LLaMA q/k rows permuted to HF's rotate_half "
      "RoPE order); reading the directory back gives the same parameters bit for bit");
  sub.add_option("model", a->model, kModelHelp)->required()->check(kPath);
  sub.add_flag("--hf", a->hf, "Hugging Face layout");
  add_out(sub, a->out, "output directory (created; its config.json and model.safetensors are replaced atomically)")
      ->required()
      ->check(kPath);
  return [a] { return run_export(*a); };
}

}  // namespace mantis::cli
