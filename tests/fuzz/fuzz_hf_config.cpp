// fuzz_hf_config — a checkpoint's config.json (io/checkpoint.h): the project's own, Hugging Face
// GPT-2's and LLaMA / Mistral's. Each input is read alone (load_model_config) and as the config.json
// beside the weights of three small checkpoints (own GPT-2, Hugging Face GPT-2 and LLaMA), where
// load_model checks it against the tensors.
#include "io/checkpoint.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(hf_config) {
  static const std::string dirs[] = {fuzz::tiny_checkpoint("config-own", Arch::gpt2, false),
                                     fuzz::tiny_checkpoint("config-hf-gpt2", Arch::gpt2, true),
                                     fuzz::tiny_checkpoint("config-hf-llama", Arch::llama, true)};
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const std::string& dir : dirs) {
    const std::string path = fuzz::put(dir + "/config.json", text);
    fuzz::refused([&] { (void)load_model_config(path); });
    fuzz::refused([&] { (void)load_model(dir); });
  }
  return 0;
}
