// dataset — the committed corpora as token sequences, and the windows evaluation reads.
//
// Text: <root>/corpora/<corpus>/<split>.txt.gz (data/README.md; root = data_root(), core/file.h), whose
// uncompressed SHA-256 is checked against <root>/corpora/manifest.json on every read.
// Tokens of one split (the same rule for a shard on disk and for tokenizing on the fly):
//   gpt2  : for each document in order, <|endoftext|> (50256) then encode(document) — every
//           document starts with the separator, as in llm.c's data preparation;
//   bytes : the text's bytes unchanged (documents stay separated by their blank line).
// Shards: <root>/shards/<tokenizer>/<corpus>/<split>.tok (tokenizer.h's format), written by
// `mantis shards` with <root>/shards/<tokenizer>/manifest.json; the GPT-2 ones are committed.
// A data spec names what to read:
//   "<split>"            every corpus's split, concatenated in kCorpora order (not the held-out ones)
//   "<corpus>/<split>"   one corpus (kCorpora or kHeldOutCorpora)
//   a path to a .tok file (or any other existing path that is not a name above: /dev/null, a
//   directory, … are then reported as what they are, not as unknown corpora)
// For names, a committed shard is used when it exists (and must match the tokenizer), else the
// text is tokenized in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace mantis {

inline constexpr const char* kCorpora[] = {"austen", "kjv", "web", "brown"};
// Corpora no "<split>" aggregate includes (the shipped models never saw them): named only as
// "<corpus>/<split>". jargon: the fine-tuning corpus of the GNMR study 3 (data/README.md).
inline constexpr const char* kHeldOutCorpora[] = {"jargon"};
inline constexpr const char* kSplits[] = {"train", "validation", "test"};

// The tokens of one corpus split, from its text (InputError: unknown corpus or split, missing
// or corrupt file, checksum mismatch).
std::vector<uint32_t> tokenize_split(const std::string& corpus, const std::string& split, const Tokenizer& tok,
                                     const std::string& root);
std::string shard_path(const std::string& root, const std::string& tokenizer_id, const std::string& corpus,
                       const std::string& split);

struct TokenSource {
  std::string name;    // "austen/validation" or the file path
  std::string origin;  // the file read: a shard, or the .txt.gz tokenized in memory
  std::string sha256;  // of the shard file / of the uncompressed text
  uint64_t tokens = 0;
};
struct TokenData {
  std::vector<uint32_t> tokens;
  std::string tokenizer_id;
  uint32_t vocab_size = 0;
  std::vector<TokenSource> sources;
};
TokenData load_tokens(const std::string& spec, const Tokenizer& tok, const std::string& root);

// Start offsets of `count` windows of `length` tokens spread evenly over n tokens: window i
// starts at i·⌊(n − length) / (count − 1)⌋ (0 for count = 1). Windows never overlap; InputError
// when n < count·length (naming how many fit).
std::vector<size_t> window_starts(size_t n, size_t count, size_t length);

}  // namespace mantis
