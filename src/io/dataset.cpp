#include "io/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
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

}  // namespace

std::vector<uint32_t> tokenize_split(const std::string& corpus, const std::string& split, const Tokenizer& tok,
                                     const std::string& root) {
  return tokenize_text(split_text(corpus, split, root), tok);
}

std::string shard_path(const std::string& root, const std::string& tokenizer_id, const std::string& corpus,
                       const std::string& split) {
  return fmt::format("{}/shards/{}/{}/{}.tok", root, tokenizer_id, corpus, split);
}

TokenData load_tokens(const std::string& spec, const Tokenizer& tok, const std::string& root) {
  TokenData d{.tokens = {}, .tokenizer_id = tok.id(), .vocab_size = tok.vocab_size(), .sources = {}};
  auto add_shard = [&](const std::string& name, const std::string& path) {
    TokenShard s = read_shard(path);
    if (s.tokenizer_id != tok.id())
      throw InputError(fmt::format("{}: tokens of tokenizer '{}', but this run uses '{}'", path, s.tokenizer_id,
                                   tok.id()));
    d.sources.push_back({name, path, sha256_file(path), s.tokens.size()});
    d.tokens.insert(d.tokens.end(), s.tokens.begin(), s.tokens.end());
  };
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
    const std::string name = corpus + "/" + split, shard = shard_path(root, tok.id(), corpus, split);
    if (fs::is_regular_file(shard, ec)) {
      add_shard(name, shard);
      continue;
    }
    std::string sha;
    const auto t = tokenize_text(split_text(corpus, split, root, &sha), tok);
    d.sources.push_back({name, fmt::format("{}/corpora/{}/{}.txt.gz", root, corpus, split), sha, t.size()});
    d.tokens.insert(d.tokens.end(), t.begin(), t.end());
  }
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
