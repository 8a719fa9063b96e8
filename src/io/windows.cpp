#include "io/windows.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mantis {

std::unique_ptr<Tokenizer> tokenizer_for_model(const std::string& name, int vocab, const std::string& flag,
                                               const std::string& model_path) {
  std::unique_ptr<Tokenizer> tok;
  if (!name.empty()) tok = make_tokenizer(name);
  else if (const std::string json = model_tokenizer_json(model_path); !json.empty()) tok = make_tokenizer(json);
  else if (vocab == 256) tok = make_tokenizer("bytes");
  else if (vocab == int(kGpt2EndOfText) + 1) tok = make_tokenizer("gpt2");
  else
    throw InputError(fmt::format("cannot tell the tokenizer of a model with vocabulary {}: pass {} "
                                 "gpt2|bytes|TOKENIZER.json", vocab, flag));
  if (int64_t(tok->vocab_size()) > vocab)
    throw InputError(fmt::format("tokenizer '{}' has {} tokens but the model's vocabulary is {}", tok->id(),
                                 tok->vocab_size(), vocab));
  return tok;
}

Window window_at(const std::vector<uint32_t>& tokens, size_t start, int ctx) {
  Window w;
  w.inputs.resize(size_t(ctx)), w.targets.resize(size_t(ctx));
  for (size_t t = 0; t < size_t(ctx); ++t) {
    w.inputs[t] = int32_t(tokens[start + t]);
    w.targets[t] = int32_t(tokens[start + t + 1]);
  }
  return w;
}

}  // namespace mantis
