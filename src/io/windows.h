// windows — what evaluating a model on text needs beside the data itself: the tokenizer its
// vocabulary implies, and one window of tokens as model inputs and next-token targets.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace mantis {

// `name` when given (make_tokenizer); else the tokenizer.json beside the model (`model_path`, a
// checkpoint directory or file) when there is one; else the tokenizer a vocabulary of `vocab`
// tokens implies (256: bytes, 50257: gpt2). InputError when there is none, or when the tokenizer
// has more tokens than the model (`flag` names the option that chooses it, for the message).
std::unique_ptr<Tokenizer> tokenizer_for_model(const std::string& name, int vocab,
                                               const std::string& flag = "--tokenizer",
                                               const std::string& model_path = "");

// The window of ctx inputs tokens[start, start+ctx) and their targets, shifted by one
// (tokens[start+ctx] must exist).
struct Window {
  std::vector<int32_t> inputs, targets;
};
Window window_at(const std::vector<uint32_t>& tokens, size_t start, int ctx);

}  // namespace mantis
