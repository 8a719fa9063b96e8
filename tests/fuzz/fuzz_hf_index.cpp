// fuzz_hf_index — a sharded checkpoint's model.safetensors.index.json (io/checkpoint.h): its
// weight_map, against a small Hugging Face GPT-2 and LLaMA checkpoint whose tensors lie in two
// shards, model-00001-of-00002.safetensors (the first half of the names in byte order) and
// model-00002-of-00002.safetensors (the rest).
#include <algorithm>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "fuzz.h"

using namespace mantis;

namespace {

// The tiny checkpoint NAME with its model.safetensors split into the two shards.
std::string sharded(const std::string& name, Arch arch) {
  const std::string dir = fuzz::tiny_checkpoint(name, arch, true);
  const std::string single = dir + "/model.safetensors";
  const std::vector<NamedTensor> all = read_f32_tensors(single);
  std::vector<TensorView> views;
  for (const NamedTensor& t : all) views.push_back({t.name, t.shape, t.data});
  std::sort(views.begin(), views.end(), [](auto& a, auto& b) { return a.name < b.name; });
  const size_t half = views.size() / 2;
  write_f32_tensors(dir + "/model-00001-of-00002.safetensors", {views.begin(), views.begin() + long(half)});
  write_f32_tensors(dir + "/model-00002-of-00002.safetensors", {views.begin() + long(half), views.end()});
  std::filesystem::remove(single);
  return dir;
}

}  // namespace

MANTIS_FUZZ_TARGET(hf_index) {
  static const std::string dirs[] = {sharded("index-hf-gpt2", Arch::gpt2), sharded("index-hf-llama", Arch::llama)};
  for (const std::string& dir : dirs) {
    fuzz::put(dir + "/model.safetensors.index.json", data, size);
    fuzz::refused([&] { (void)load_model(dir); });
  }
  return 0;
}
