// tokenizer — text → token ids (byte-level BPE: GPT-2's files or a Hugging Face tokenizer.json;
// raw bytes) and token shards on disk.
//
// GPT-2 ("gpt2", vocabulary 50,257):
//   * OpenAI's original files: encoder.json (token string → id) and vocab.bpe (`#version` line,
//     then one merge "a b" per line; a merge's rank is its index among those lines, 0 first).
//   * Bytes are mapped to printable code points by GPT-2's bytes_to_unicode table; a token's
//     bytes are its encoder.json key mapped back through that table.
//   * Pre-tokenizer: the GPT-2 regex
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     implemented by hand over UTF-8 code points. \p{L}, \p{N} and \s are those of the reference
//     encoder (npm gpt-3-encoder 1.1.4, a JavaScript /u regex: Unicode 17.0 on node 20; \s is
//     ECMAScript's: U+0009..000D, U+0020, U+00A0, U+1680, U+2000..200A, U+2028, U+2029, U+202F,
//     U+205F, U+3000, U+FEFF), from src/unicode_tables.inc (tools/gen_unicode_tables.py).
//     Contractions are case-sensitive ("'S" is not one), as in GPT-2.
//   * BPE per pre-token: repeatedly merge every occurrence (left to right) of the adjacent pair
//     with the lowest rank, until no adjacent pair is a merge. Results are cached per pre-token
//     (pre-tokens ≤ 64 bytes; at most 2^18 of them, the cache is emptied when full).
//   * encode() never produces <|endoftext|> (50256): the text "<|endoftext|>" is encoded as
//     ordinary text ("<|", "endoftext", "|>"), as the reference encoder does. Add separators
//     yourself (kGpt2EndOfText). decode() accepts 50256 and gives the bytes "<|endoftext|>".
//   * Invalid UTF-8 is not an error: every byte that is not part of a well-formed UTF-8
//     sequence (RFC 3629: no overlong forms, no surrogates, ≤ U+10FFFF) is a one-byte code
//     point of class "other" (like U+FFFD, which a JavaScript string would hold there), and
//     byte-level BPE encodes any bytes, so decode(encode(s)) == s for every byte string s.
//   * Files: <dir>/encoder.json and <dir>/vocab.bpe, where <dir> is gpt2_data_dir().
//
// Hugging Face tokenizer.json (byte-level BPE; tokenizer_json.cpp reads it into the same
// tokenizer as GPT-2's files, io/bpe.h): model.type "BPE" with model.vocab (token string → id),
// model.merges ("a b" strings or [a, b] pairs, rank = index), model.ignore_merges (a word that is
// a vocabulary token is that token), added_tokens (ids beyond the vocabulary: decoded to their
// content); pre_tokenizer ByteLevel (use_regex true: the GPT-2 regex above) or a Sequence of a
// Split with LLaMA-3's regex
//       (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   (behavior Isolated, the same Unicode classes; contractions case-insensitive) and ByteLevel
//   with use_regex false. normalizer must be null, decoder null or ByteLevel; the post_processor
//   is not applied. As for GPT-2, encode() treats the text of an added token (<|endoftext|>,
//   <|begin_of_text|>) as ordinary text and adds no special tokens: so GPT-2's tokenizer.json
//   encodes exactly as encoder.json + vocab.bpe. Its id(): "hf-" and the first 13 hex digits of
//   the file's SHA-256 (a token shard records which tokenizer.json made it).
//
// Bytes ("bytes", vocabulary 256): id = byte value.
//
// Tokenizers are immutable after construction; encode/decode may be called from several threads
// (the GPT-2 word cache is locked internally).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mantis {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<uint32_t> encode(std::string_view utf8) const = 0;
  // Concatenated bytes of the tokens; throws InputError naming the first id ≥ vocab_size().
  virtual std::string decode(std::span<const uint32_t> ids) const = 0;
  virtual uint32_t vocab_size() const = 0;
  virtual std::string id() const = 0;   // "gpt2", "bytes" (what make_tokenizer takes), or "hf-…" (a tokenizer.json)
};

inline constexpr uint32_t kGpt2EndOfText = 50256;

// "gpt2" (loads gpt2_data_dir()), "bytes", a tokenizer.json file, or a directory holding a
// tokenizer.json (else encoder.json + vocab.bpe); anything else throws InputError listing them.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);
// MODEL_PATH's tokenizer.json (a checkpoint directory, or the directory of a checkpoint file) when
// there is one, else "".
std::string model_tokenizer_json(const std::string& model_path);
// GPT-2 from a directory holding encoder.json and vocab.bpe; InputError names a missing or
// malformed file.
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& dir);
std::vector<std::string> tokenizer_names();

// Where the GPT-2 files are: <data_root()>/gpt2 (core/paths.h), or the data root itself when it
// directly holds encoder.json (MANTIS_DATA_DIR set to the gpt2 directory).
std::string gpt2_data_dir();

// The offset of the first byte of `s` that is not part of a well-formed UTF-8 sequence (the rule
// above: RFC 3629), or std::string_view::npos when `s` is well-formed UTF-8.
size_t utf8_invalid_offset(std::string_view s);

// The GPT-2 pre-tokenizer alone: the regex matches, in order; they concatenate to `utf8`.
std::vector<std::string_view> gpt2_pretokenize(std::string_view utf8);
// The LLaMA-3 pre-tokenizer alone (tokenizer.json's Split), the same way.
std::vector<std::string_view> llama3_pretokenize(std::string_view utf8);

// ---- token shards -------------------------------------------------------------------------
// A little-endian binary file:
//   offset  size  field
//        0     8  magic "MNTSTOK\0"
//        8     4  u32 version = 1
//       12     4  u32 token width in bytes: 2 when vocab_size ≤ 65536, else 4
//       16     8  u64 token count n
//       24    16  tokenizer id, ASCII (0x21..0x7E), NUL-padded (≤ 16 bytes, at least 1)
//       40     4  u32 vocab size (> 0)
//       44     4  u32 reserved = 0
//       48 n·width tokens (u16 or u32), each < vocab size
// Written to a temp file in the same directory, then renamed over `path` (atomic on POSIX).
// read_shard validates magic, version, width, id, size = 48 + n·width, and every token
// < vocab size; every failure is an InputError naming the file and the problem.
struct TokenShard {
  std::string tokenizer_id;
  uint32_t vocab_size = 0;
  std::vector<uint32_t> tokens;
};

inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 48;

void write_shard(const std::string& path, std::span<const uint32_t> tokens, const Tokenizer& tokenizer);
// Throws InputError (before touching `path`) on a token ≥ vocab_size or a bad id.
void write_shard(const std::string& path, std::span<const uint32_t> tokens,
                 const std::string& tokenizer_id, uint32_t vocab_size);
TokenShard read_shard(const std::string& path);

}  // namespace mantis
