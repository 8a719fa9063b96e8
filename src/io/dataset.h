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
//   a path to a .npy     a NumPy token array: 1-D, int32 / int64 / uint16 / uint32 (core/file.h
//                        read_npy_ints), every id in [0, vocabulary)
//   a path to a .bin     an llm.c token shard (karpathy/llm.c dev/data/data_common.py write_datafile):
//                        256 little-endian int32 (header[0] magic, header[1] version, header[2] token
//                        count n ≥ 0; the rest is not read), then n tokens — magic 20240520 version 1:
//                        uint16 (GPT-2), magic 20240801 version 7: uint32 (LLaMA-3); the file is
//                        exactly 1024 + n·width bytes
//   a path to a .tok file (or any other existing path that is not a name above: /dev/null, a
//   directory, … are then reported as what they are, not as unknown corpora)
// For names, a committed shard is used when it exists (and must match the tokenizer), else the
// text is tokenized in memory. A .npy or .bin records no tokenizer: its ids are taken to be the run's
// tokenizer's, and an id ≥ its vocabulary (so ≥ the model's, windows.h) is an InputError naming the
// file, the position and the id — before any forward pass.
// A text file (load_text_tokens, `mantis eval --text`): any well-formed UTF-8 (else an InputError
// naming the byte offset), tokenized in memory by the corpora's rule above for gpt2 and bytes; a
// tokenizer.json tokenizer, which has no such rule, encodes the whole text and adds no special tokens.
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

// What each source is (its "kind" in manifests and study keys, exp/manifest.h).
enum class SourceKind {
  shard,   // a .tok shard (tokenizer.h)
  corpus,  // a committed corpus's .txt.gz, tokenized in memory
  npy,     // a .npy token array
  llmc,    // an llm.c token shard
  text,    // a UTF-8 text file, tokenized in memory
};
const char* to_string(SourceKind k);  // "shard", "corpus", "npy", "llmc", "text"

struct TokenSource {
  std::string name;    // "austen/validation" or the file path
  std::string origin;  // the file read: a shard, or the .txt.gz tokenized in memory
  std::string sha256;  // of the file read (a corpus: of its uncompressed text)
  uint64_t tokens = 0;
  SourceKind kind = SourceKind::shard;
};
struct TokenData {
  std::vector<uint32_t> tokens;
  std::string tokenizer_id;
  uint32_t vocab_size = 0;
  std::vector<TokenSource> sources;
};
// `root`: the data root for corpus names; empty: data_root(), looked up only when a corpus is named (so
// token files need no data root).
TokenData load_tokens(const std::string& spec, const Tokenizer& tok, std::string root = {});
// The tokens of one UTF-8 text file (the rule above); one source of kind text.
TokenData load_text_tokens(const std::string& path, const Tokenizer& tok);
// The most bytes load_text_tokens reads (so /dev/zero or an endless FIFO cannot exhaust memory).
inline constexpr size_t kTextFileMaxBytes = size_t(1) << 30;

// Start offsets of `count` windows of `length` tokens spread evenly over n tokens: window i
// starts at i·⌊(n − length) / (count − 1)⌋ (0 for count = 1). Windows never overlap; InputError
// when n < count·length (naming how many fit).
std::vector<size_t> window_starts(size_t n, size_t count, size_t length);

}  // namespace mantis
