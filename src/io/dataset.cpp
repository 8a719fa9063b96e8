#include "io/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
#include <nlohmann/json.hpp>

#include "core/format.h"  // InputError
#include "core/file.h"

namespace mantis {

namespace fs = std::filesystem;

namespace {

bool known(const char* const* list, size_t n, const std::string& s) {
  return std::any_of(list, list + n, [&](const char* x) { return s == x; });
}

// A corpus a "<corpus>/<split>" spec may name: the aggregated ones and the held-out ones.
bool known_corpus(const std::string& c) {
  return known(kCorpora, std::size(kCorpora), c) || known(kHeldOutCorpora, std::size(kHeldOutCorpora), c);
}

void check_names(const std::string& corpus, const std::string& split) {
  if (!known_corpus(corpus))
    throw InputError(fmt::format("unknown corpus '{}' (known: austen, kjv, web, brown; held out: jargon)", corpus));
  if (!known(kSplits, std::size(kSplits), split))
    throw InputError(fmt::format("unknown split '{}' (known: train, validation, test)", split));
}

// text_sha256 of every split, from <root>/corpora/manifest.json (read once per root).
std::string expected_text_sha(const std::string& root, const std::string& corpus, const std::string& split) {
  static std::mutex mu;
  static std::map<std::string, nlohmann::json> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(root);
  const std::string path = root + "/corpora/manifest.json";
  if (it == cache.end()) {
    try {
      it = cache.emplace(root, nlohmann::json::parse(read_file(path))).first;
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("{}: malformed JSON: {}", path, e.what()));
    }
  }
  try {
    return it->second.at("corpora").at(corpus).at("splits").at(split).at("text_sha256").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(fmt::format("{}: no text_sha256 for {}/{}", path, corpus, split));
  }
}

std::string split_text(const std::string& corpus, const std::string& split, const std::string& root,
                       std::string* sha = nullptr) {
  check_names(corpus, split);
  const std::string path = fmt::format("{}/corpora/{}/{}.txt.gz", root, corpus, split);
  std::string text = read_gzip(path);
  const std::string got = sha256_hex(text), want = expected_text_sha(root, corpus, split);
  if (got != want)
    throw InputError(fmt::format("{}: text SHA-256 {} does not match the manifest's {} (regenerate: "
                                 "tools/data/prepare_corpora.py)", path, got, want));
  if (sha) *sha = got;
  return text;
}

std::vector<uint32_t> tokenize_text(const std::string& text, const Tokenizer& tok) {
  if (tok.id() == "bytes") {
    std::vector<uint32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = uint8_t(text[i]);  // char may be signed
    return ids;
  }
  if (tok.id() != "gpt2") throw InputError(fmt::format("no corpus rule for tokenizer '{}'", tok.id()));
  // Documents: text[:-1].split("\n\n") (data/README.md).
  std::string_view body(text);
  if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  std::vector<uint32_t> out;
  out.reserve(text.size() / 4);
  for (size_t pos = 0; pos <= body.size();) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string_view::npos) end = body.size();
    out.push_back(kGpt2EndOfText);
    const auto ids = tok.encode(body.substr(pos, end - pos));
    out.insert(out.end(), ids.begin(), ids.end());
    pos = end + 2;
  }
  return out;
}

// The ids of a file that records no tokenizer (.npy, llm.c), checked against the run's tokenizer.
std::vector<uint32_t> checked_ids(const std::string& path, std::span<const int64_t> ids, const Tokenizer& tok) {
  std::vector<uint32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) throw InputError(fmt::format("{}: token {} is {}, negative", path, i, ids[i]));
    if (ids[i] >= int64_t(tok.vocab_size()))
      throw InputError(fmt::format("{}: token {} is {}, outside the vocabulary of tokenizer '{}' [0, {})", path, i,
                                   ids[i], tok.id(), tok.vocab_size()));
    out[i] = uint32_t(ids[i]);
  }
  return out;
}

std::vector<uint32_t> read_npy_tokens(const std::string& path, const Tokenizer& tok) {
  const NpyInts a = read_npy_ints(path);
  if (a.shape.size() != 1)
    throw InputError(fmt::format("{}: a token array must be 1-D; this one has {} dimensions", path, a.shape.size()));
  return checked_ids(path, a.data, tok);
}

// llm.c's token shards (dataset.h): (magic, version) → token width in bytes.
constexpr int32_t kLlmcHeaderInts = 256;
constexpr struct {
  int32_t magic, version;
  size_t width;
} kLlmcFormats[] = {{20240520, 1, 2}, {20240801, 7, 4}};

std::vector<uint32_t> read_llmc_tokens(const std::string& path, const Tokenizer& tok) {
  auto fail = [&](const std::string& why) { return InputError(fmt::format("{}: {}", path, why)); };
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw fail("is a directory, not an llm.c token shard");
  if (!fs::is_regular_file(path, ec)) throw fail("is not a regular file, not an llm.c token shard");
  const std::string b = read_file(path);
  constexpr size_t header = kLlmcHeaderInts * 4;
  if (b.size() < header)
    throw fail(fmt::format("truncated llm.c token shard: {} bytes, shorter than the {}-byte header", b.size(), header));
  auto word = [&](size_t i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= uint32_t(uint8_t(b[4 * i + size_t(k)])) << (8 * k);
    return int32_t(v);
  };
  const int32_t magic = word(0), version = word(1), count = word(2);
  const auto* f = std::find_if(std::begin(kLlmcFormats), std::end(kLlmcFormats),
                               [&](auto& x) { return x.magic == magic; });
  if (f == std::end(kLlmcFormats))
    throw fail(fmt::format("not an llm.c token shard (magic {}; 20240520: GPT-2, 20240801: LLaMA-3)", magic));
  if (version != f->version)
    throw fail(fmt::format("llm.c token shard of magic {} has version {} (expected {})", magic, version, f->version));
  if (count < 0) throw fail(fmt::format("llm.c token shard header gives a negative token count {}", count));
  const size_t want = header + size_t(count) * f->width;
  if (b.size() != want)
    throw fail(fmt::format("llm.c token shard of {} tokens of {} bytes should be {} bytes; the file has {}", count,
                           f->width, want, b.size()));
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    for (size_t k = 0; k < f->width; ++k) v |= uint32_t(uint8_t(b[header + i * f->width + k])) << (8 * k);
    ids[i] = v;
  }
  return checked_ids(path, ids, tok);
}

}  // namespace

const char* to_string(SourceKind k) {
  switch (k) {
    case SourceKind::shard: return "shard";
    case SourceKind::corpus: return "corpus";
    case SourceKind::npy: return "npy";
    case SourceKind::llmc: return "llmc";
    case SourceKind::text: return "text";
  }
  return "?";
}

std::vector<uint32_t> tokenize_split(const std::string& corpus, const std::string& split, const Tokenizer& tok,
                                     const std::string& root) {
  return tokenize_text(split_text(corpus, split, root), tok);
}

std::string shard_path(const std::string& root, const std::string& tokenizer_id, const std::string& corpus,
                       const std::string& split) {
  return fmt::format("{}/shards/{}/{}/{}.tok", root, tokenizer_id, corpus, split);
}

TokenData load_tokens(const std::string& spec, const Tokenizer& tok, std::string root) {
  TokenData d{.tokens = {}, .tokenizer_id = tok.id(), .vocab_size = tok.vocab_size(), .sources = {}};
  auto add_shard = [&](const std::string& name, const std::string& path) {
    TokenShard s = read_shard(path);
    if (s.tokenizer_id != tok.id())
      throw InputError(fmt::format("{}: tokens of tokenizer '{}', but this run uses '{}'", path, s.tokenizer_id,
                                   tok.id()));
    d.sources.push_back({name, path, sha256_file(path), s.tokens.size(), SourceKind::shard});
    d.tokens.insert(d.tokens.end(), s.tokens.begin(), s.tokens.end());
  };
  // Token files that record no tokenizer, by their extension (dataset.h).
  if (spec.ends_with(".npy") || spec.ends_with(".bin")) {
    const bool npy = spec.ends_with(".npy");
    d.tokens = npy ? read_npy_tokens(spec, tok) : read_llmc_tokens(spec, tok);
    d.sources.push_back({spec, spec, sha256_file(spec), d.tokens.size(), npy ? SourceKind::npy : SourceKind::llmc});
    return d;
  }
  std::vector<std::pair<std::string, std::string>> parts;  // (corpus, split)
  if (const size_t slash = spec.find('/'); slash != std::string::npos) {
    parts.emplace_back(spec.substr(0, slash), spec.substr(slash + 1));
  } else {
    for (const char* c : kCorpora) parts.emplace_back(c, spec);
  }
  const bool named = std::all_of(parts.begin(), parts.end(), [](auto& p) {
    return known_corpus(p.first) && known(kSplits, std::size(kSplits), p.second);
  });
  // Any other existing path (a directory, /dev/null, a FIFO) is read as a shard, so the error
  // names the file rather than an unknown corpus.
  std::error_code ec;
  if (spec.ends_with(".tok") || fs::is_regular_file(spec, ec) || (!named && fs::exists(spec, ec))) {
    add_shard(spec, spec);
    return d;
  }
  for (auto& [corpus, split] : parts) {
    check_names(corpus, split);
    if (root.empty()) root = data_root();
    const std::string name = corpus + "/" + split, shard = shard_path(root, tok.id(), corpus, split);
    if (fs::is_regular_file(shard, ec)) {
      add_shard(name, shard);
      continue;
    }
    std::string sha;
    const auto t = tokenize_text(split_text(corpus, split, root, &sha), tok);
    d.sources.push_back(
        {name, fmt::format("{}/corpora/{}/{}.txt.gz", root, corpus, split), sha, t.size(), SourceKind::corpus});
    d.tokens.insert(d.tokens.end(), t.begin(), t.end());
  }
  return d;
}

TokenData load_text_tokens(const std::string& path, const Tokenizer& tok) {
  const std::string text = read_text_file(path, "text file", kTextFileMaxBytes);
  if (const size_t bad = utf8_invalid_offset(text); bad != std::string::npos)
    throw InputError(fmt::format("{}: not UTF-8: byte offset {} (0x{:02X}) starts no well-formed sequence", path, bad,
                                 uint8_t(text[bad])));
  const bool corpus_rule = tok.id() == "gpt2" || tok.id() == "bytes";
  TokenData d{.tokens = corpus_rule ? tokenize_text(text, tok) : tok.encode(text),
              .tokenizer_id = tok.id(),
              .vocab_size = tok.vocab_size(),
              .sources = {}};
  d.sources.push_back({path, path, sha256_hex(text), d.tokens.size(), SourceKind::text});
  return d;
}

std::vector<size_t> window_starts(size_t n, size_t count, size_t length) {
  if (count == 0 || length == 0) throw InputError("need at least one window of at least one token");
  if (n / length < count)
    throw InputError(fmt::format("the data holds {} tokens: {} windows of {} tokens fit, {} requested", n,
                                 n / length, length, count));
  const size_t stride = count == 1 ? 0 : (n - length) / (count - 1);
  std::vector<size_t> s(count);
  for (size_t i = 0; i < count; ++i) s[i] = i * stride;
  return s;
}

}  // namespace mantis
