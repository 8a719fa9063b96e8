// bpe — what every byte-level BPE source builds (io/ internal): OpenAI's encoder.json + vocab.bpe
// (tokenizer.cpp) and Hugging Face's tokenizer.json (tokenizer_json.cpp) fill one BpeSpec, and
// make_bpe_tokenizer turns it into the one tokenizer (BPE, word cache, pre-tokenizers:
// tokenizer.cpp), so the two sources cannot drift.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/tokenizer.h"

namespace mantis::detail {

// The regexes that split text into the words BPE sees (tokenizer.h).
enum class PreTokenizer : uint8_t {
  gpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  llama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
};

struct BpeStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using BpeIndex = std::unordered_map<std::string, uint32_t, BpeStringHash, std::equal_to<>>;

struct BpeSpec {
  std::string id;                               // Tokenizer::id()
  std::string source;                           // the file named in messages
  std::vector<std::string> tokens;              // id → bytes (every id 0..N−1)
  BpeIndex index;                               // bytes → id of the BPE vocabulary (not added tokens)
  std::vector<std::array<uint32_t, 3>> merges;  // by rank (0 first): {left, right, merged}
  PreTokenizer pre = PreTokenizer::gpt2;
  bool ignore_merges = false;  // a word that is a vocabulary token is that token, without BPE
};

// InputError (naming spec.source) when a single byte has no token.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec);

// GPT-2's byte alphabet (bytes_to_unicode): a token string (UTF-8 of byte-alphabet code points)
// → its bytes; false when a character is not in the alphabet (or the string is empty).
bool byte_level_bytes(std::string_view token, std::string& out);

// OpenAI's encoder.json + vocab.bpe in DIR (tokenizer.cpp).
BpeSpec read_gpt2_files(const std::string& dir);
// A Hugging Face tokenizer.json (tokenizer_json.cpp).
std::unique_ptr<Tokenizer> make_tokenizer_json(const std::string& path);

}  // namespace mantis::detail
