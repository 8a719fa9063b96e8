// mantis tokenize | detokenize | shards — text ↔ token ids, and the corpora as token shards.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common.h"
#include "io/dataset.h"
#include "io/tokenizer.h"

namespace mantis::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer = "gpt2";
};
struct ShardsArgs {
  std::string tokenizer = "gpt2", data_dir, out;
};

int run_tokenize(const TokenizeArgs& a) {
  const auto tok = make_tokenizer(a.tokenizer);
  const auto ids = tok->encode(read_all_stdin());
  std::string out;
  out.reserve(ids.size() * 6 + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int run_detokenize(const TokenizeArgs& a) {
  const auto tok = make_tokenizer(a.tokenizer);
  const auto ids = parse_token_ids(read_all_stdin(), "stdin");
  std::vector<uint32_t> u;
  u.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= int64_t(tok->vocab_size()))
      throw InputError(fmt::format("stdin: token {} (position {}) is outside the {} vocabulary [0, {})", ids[i], i,
                                   tok->id(), tok->vocab_size()));
    u.push_back(uint32_t(ids[i]));
  }
  const std::string bytes = tok->decode(u);
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  return 0;
}

int run_shards(const ShardsArgs& a) {
  namespace fs = std::filesystem;
  const auto tok = make_tokenizer(a.tokenizer);
  const std::string root = a.data_dir.empty() ? data_root() : a.data_dir;
  const std::string out = a.out.empty() ? root + "/shards/" + tok->id() : a.out;
  nlohmann::ordered_json m;
  m["generator"] = "mantis shards";
  m["tokenizer"] = tok->id();
  m["vocab_size"] = tok->vocab_size();
  m["rule"] = tok->id() == "gpt2" ? "each document (text split at blank lines) is <|endoftext|> (50256) followed by "
                                    "its GPT-2 BPE tokens; documents in manifest order"
                                  : "the uncompressed text's bytes, unchanged";
  m["format"] = "tokenizer.h: 48-byte header (magic MNTSTOK, version 1, width, count, tokenizer id, vocab), "
                "little-endian u16/u32 tokens";
  m["source_manifest"] = "corpora/manifest.json";
  if (tok->id() == "gpt2")
    for (const char* f : {"encoder.json", "vocab.bpe"}) m["tokenizer_files"][f] = sha256_file(gpt2_data_dir() + "/" + f);
  m["shards"] = nlohmann::ordered_json::object();
  uint64_t total = 0;
  for (const char* corpus : kCorpora)
    for (const char* split : kSplits) {
      const auto ids = tokenize_split(corpus, split, *tok, root);
      const fs::path file = fs::path(out) / corpus / (std::string(split) + ".tok");
      std::error_code ec;
      fs::create_directories(file.parent_path(), ec);
      if (ec) throw InputError(fmt::format("cannot create {}: {}", file.parent_path().string(), ec.message()));
      write_shard(file.string(), ids, *tok);
      const std::string text = fmt::format("corpora/{}/{}.txt.gz", corpus, split);
      m["shards"][fmt::format("{}/{}", corpus, split)] = {{"file", fmt::format("{}/{}.tok", corpus, split)},
                                                          {"tokens", ids.size()},
                                                          {"file_bytes", fs::file_size(file)},
                                                          {"sha256", sha256_file(file.string())},
                                                          {"source", text}};
      total += ids.size();
      if (!shared().quiet) fmt::print(stderr, "{}/{}: {} tokens\n", corpus, split, ids.size());
    }
  m["total_tokens"] = total;
  write_file_atomic(out + "/manifest.json", m.dump(1) + "\n");
  fmt::print("wrote {} shards, {} tokens, to {}\n", std::size(kCorpora) * std::size(kSplits), total, out);
  return 0;
}

}  // namespace

Runner setup_tokenize(CLI::App& sub) {
  auto a = std::make_shared<TokenizeArgs>();
  sub.description("read UTF-8 text (any bytes) on stdin; print its token ids on one line, separated by single spaces");
  sub.add_option("--tokenizer,-t", a->tokenizer, kTokenizerHelp)->capture_default_str();
  return [a] { return run_tokenize(*a); };
}

Runner setup_detokenize(CLI::App& sub) {
  auto a = std::make_shared<TokenizeArgs>();
  sub.description("read token ids (whitespace-separated) on stdin; write the bytes they stand for to stdout");
  sub.add_option("--tokenizer,-t", a->tokenizer, kTokenizerHelp)->capture_default_str();
  return [a] { return run_detokenize(*a); };
}

Runner setup_shards(CLI::App& sub) {
  auto a = std::make_shared<ShardsArgs>();
  sub.description(
      "tokenize the committed corpora (DATA/corpora/*/{train,validation,test}.txt.gz) into token shards "
      "DATA/shards/<tokenizer>/<corpus>/<split>.tok with a manifest (SHA-256 of every shard)");
  sub.add_option("--tokenizer,-t", a->tokenizer, kTokenizerHelp)->capture_default_str();
  sub.add_option("--data-dir", a->data_dir, "data root (default: $MANTIS_DATA_DIR, else the build tree's or install's data)")
      ->check(kPath);
  add_out(sub, a->out, "output directory (default: DATA/shards/<tokenizer>)");
  add_quiet(sub, "no per-shard lines on stderr");
  return [a] { return run_shards(*a); };
}

}  // namespace mantis::cli
