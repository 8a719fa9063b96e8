// fuzz_safetensors — a safetensors file (io/safetensors.h): the one parser (parse_safetensors: the
// header length, the JSON header, every entry's dtype, shape and offsets), the F32 reader
// (read_f32_tensors), and the file as the model.safetensors of three small checkpoints (own GPT-2,
// Hugging Face GPT-2 and LLaMA: io/checkpoint.h load_model, with F32 / BF16 / F16 conversion, the
// tensors checked against the configuration).
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(safetensors) {
  static const std::string dirs[] = {fuzz::tiny_checkpoint("st-own", Arch::gpt2, false),
                                     fuzz::tiny_checkpoint("st-hf-gpt2", Arch::gpt2, true),
                                     fuzz::tiny_checkpoint("st-hf-llama", Arch::llama, true)};
  fuzz::refused([&] { (void)parse_safetensors(data, size, "fuzz.safetensors"); });
  const std::string path = fuzz::put("tensors.safetensors", data, size);
  fuzz::refused([&] { (void)read_f32_tensors(path); });
  for (const std::string& dir : dirs) {
    const std::string weights = fuzz::put(dir + "/model.safetensors", data, size);
    fuzz::refused([&] { (void)load_model(weights); });
  }
  return 0;
}
