// tokenizer_json — a Hugging Face tokenizer.json read into the byte-level BPE tokenizer (bpe.h);
// what is accepted is documented in tokenizer.h.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_set>

#include "core/error.h"
#include "core/file.h"
#include "io/bpe.h"

namespace mantis::detail {

namespace {

using json = nlohmann::json;

// tiktoken's cl100k pattern as LLaMA-3's tokenizer.json spells it (Split, behavior Isolated).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].dump() : j.dump(); }

// The value of an optional key: absent and null are `dflt`; another type is an error.
bool flag(const json& j, const char* key, bool dflt, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) throw InputError(fmt::format("{}: {} must be true or false, got {}", where, key, j[key].dump()));
  return j[key].get<bool>();
}

// A ByteLevel pre-tokenizer: add_prefix_space must be false (a leading space would change the
// words); use_regex as given (default true: the GPT-2 regex).
bool byte_level_uses_regex(const json& b, const std::string& where) {
  if (flag(b, "add_prefix_space", false, where))
    throw InputError(fmt::format("{}: ByteLevel add_prefix_space = true not supported", where));
  return flag(b, "use_regex", true, where);
}

PreTokenizer pre_tokenizer(const json& pt, const std::string& file) {
  const std::string where = file + ": pre_tokenizer";
  const std::string kind = "(supported: ByteLevel with the GPT-2 regex; Sequence [Split with LLaMA-3's regex, "
                           "ByteLevel with use_regex false])";
  if (pt.is_object() && pt.value("type", "") == "ByteLevel") {
    if (!byte_level_uses_regex(pt, where))
      throw InputError(fmt::format("{}: ByteLevel with use_regex = false and no Split before it not supported {}",
                                   where, kind));
    return PreTokenizer::gpt2;
  }
  if (pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
      pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2) {
    const json& split = pt["pretokenizers"][0];
    const json& bl = pt["pretokenizers"][1];
    if (split.is_object() && split.value("type", "") == "Split" && bl.is_object() && bl.value("type", "") == "ByteLevel") {
      const json& pat = split.contains("pattern") ? split["pattern"] : json();
      const std::string regex = pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string() ? pat["Regex"].get<std::string>() : "";
      if (regex != kLlama3Pattern)
        throw InputError(fmt::format("{}: Split pattern {} not supported (only LLaMA-3's: {})", where, pat.dump(),
                                     json(kLlama3Pattern).dump()));
      if (split.value("behavior", "") != "Isolated" || flag(split, "invert", false, where))
        throw InputError(fmt::format("{}: Split behavior {} / invert {} not supported (Isolated, false)", where,
                                     split.contains("behavior") ? split["behavior"].dump() : "null",
                                     split.contains("invert") ? split["invert"].dump() : "null"));
      if (byte_level_uses_regex(bl, where))
        throw InputError(fmt::format("{}: ByteLevel after a Split must have use_regex = false", where));
      return PreTokenizer::llama3;
    }
  }
  throw InputError(fmt::format("{} {} not supported {}", where, type_of(pt), kind));
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer_json(const std::string& path) {
  const std::string text = read_text_file(path, "tokenizer.json");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw InputError(fmt::format("{}: not a Hugging Face tokenizer.json (no \"model\" object)", path));
  const json& model = j["model"];
  if (model.value("type", "") != "BPE")
    throw InputError(fmt::format("{}: model.type {} not supported (BPE only)", path,
                                 model.contains("type") ? model["type"].dump() : "missing"));
  if (model.contains("dropout") && !model["dropout"].is_null())
    throw InputError(fmt::format("{}: model.dropout {} not supported (null only)", path, model["dropout"].dump()));
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && !model[k].is_null() && model[k] != "")
      throw InputError(fmt::format("{}: model.{} {} not supported (byte-level BPE has none)", path, k, model[k].dump()));
  if (flag(model, "byte_fallback", false, path + ": model"))
    throw InputError(fmt::format("{}: model.byte_fallback = true (SentencePiece-style BPE) not supported", path));
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    throw InputError(fmt::format("{}: normalizer {} not supported (null only)", path, type_of(j["normalizer"])));
  if (!j.contains("pre_tokenizer"))
    throw InputError(fmt::format("{}: key \"pre_tokenizer\" missing", path));
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", "") != "ByteLevel")
    throw InputError(fmt::format("{}: decoder {} not supported (ByteLevel)", path, type_of(j["decoder"])));

  BpeSpec spec;
  spec.source = path;
  spec.pre = pre_tokenizer(j["pre_tokenizer"], path);
  spec.ignore_merges = flag(model, "ignore_merges", false, path + ": model");

  // Ids: the vocabulary and the added tokens together number 0..N−1, each once (an added token
  // may repeat a vocabulary entry with the same bytes, as GPT-2's <|endoftext|> does).
  if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
    throw InputError(fmt::format("{}: model.vocab must be a non-empty object of token -> id", path));
  const json& vocab = model["vocab"];
  const json added = j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : json::array();
  if (!added.is_array()) throw InputError(fmt::format("{}: added_tokens must be an array", path));
  const size_t n = vocab.size() + added.size();  // an upper bound on the ids: checked below
  std::vector<std::string> tokens(n);
  std::vector<uint8_t> seen(n, 0);  // bit 0: in model.vocab, bit 1: an added token
  uint64_t top = 0;
  std::string bytes;
  for (auto& [key, v] : vocab.items()) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() >= n)
      throw InputError(fmt::format("{}: model.vocab: token {:?} has id {}, expected 0..{}", path, key, v.dump(), n - 1));
    const auto id = uint32_t(v.get<uint64_t>());
    if (seen[id]) throw InputError(fmt::format("{}: model.vocab: id {} is used twice", path, id));
    if (!byte_level_bytes(key, bytes))
      throw InputError(fmt::format("{}: model.vocab: token {:?} is not made of byte-level characters (not a "
                                   "byte-level BPE)", path, key));
    if (!spec.index.emplace(bytes, id).second)
      throw InputError(fmt::format("{}: model.vocab: token {:?} is listed twice", path, key));
    seen[id] = 1, tokens[id] = bytes, top = std::max<uint64_t>(top, id + 1);
  }
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() || !a.contains("content") ||
        !a["content"].is_string())
      throw InputError(fmt::format("{}: added_tokens: entry {} needs an id and a content", path, a.dump()));
    const uint64_t id = a["id"].get<uint64_t>();
    const std::string content = a["content"].get<std::string>();
    if (id >= n) throw InputError(fmt::format("{}: added_tokens: {:?} has id {}, expected 0..{}", path, content, id, n - 1));
    if ((seen[id] & 1) && tokens[id] != content)
      throw InputError(fmt::format("{}: added_tokens: {:?} has id {}, which model.vocab gives to {:?}", path, content,
                                   id, tokens[id]));
    if (seen[id] & 2) throw InputError(fmt::format("{}: added_tokens: id {} is used twice", path, id));
    if (content.empty()) throw InputError(fmt::format("{}: added_tokens: id {} has empty content", path, id));
    seen[id] |= 2, tokens[id] = content, top = std::max<uint64_t>(top, id + 1);
  }
  for (uint64_t id = 0; id < top; ++id)
    if (!seen[id]) throw InputError(fmt::format("{}: no token has id {} (ids must be 0..{} without gaps)", path, id, top - 1));
  tokens.resize(size_t(top));
  spec.tokens = std::move(tokens);

  // Merges, by rank: "a b" or ["a", "b"].
  if (!model.contains("merges") || !model["merges"].is_array())
    throw InputError(fmt::format("{}: model.merges must be an array", path));
  const json& merges = model["merges"];
  spec.merges.reserve(merges.size());
  std::unordered_set<uint64_t> listed;
  std::string a_bytes, b_bytes;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        throw InputError(fmt::format("{}: model.merges[{}]: expected \"a b\", got {}", path, r, m.dump()));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      throw InputError(fmt::format("{}: model.merges[{}]: expected \"a b\" or [a, b], got {}", path, r, m.dump()));
    }
    if (!byte_level_bytes(a, a_bytes) || !byte_level_bytes(b, b_bytes))
      throw InputError(fmt::format("{}: model.merges[{}]: {} is not made of byte-level characters", path, r, m.dump()));
    const auto ia = spec.index.find(a_bytes), ib = spec.index.find(b_bytes), im = spec.index.find(a_bytes + b_bytes);
    if (ia == spec.index.end() || ib == spec.index.end() || im == spec.index.end())
      throw InputError(fmt::format("{}: model.merges[{}]: a part or the result of {} is not in model.vocab", path, r,
                                   m.dump()));
    if (!listed.insert(uint64_t{ia->second} << 32 | ib->second).second)
      throw InputError(fmt::format("{}: model.merges[{}]: {} is listed twice", path, r, m.dump()));
    spec.merges.push_back({ia->second, ib->second, im->second});
  }

  // GPT-2's own tokenizer.json is the "gpt2" tokenizer (its shards and corpus rule); any other
  // is named by its content.
  spec.id = "hf-" + sha256_hex(text).substr(0, 13);
  if (spec.pre == PreTokenizer::gpt2 && !spec.ignore_merges && spec.tokens.size() == kGpt2EndOfText + 1) {
    std::error_code ec;
    const std::string dir = gpt2_data_dir();
    if (std::filesystem::exists(dir + "/encoder.json", ec) && std::filesystem::exists(dir + "/vocab.bpe", ec)) {
      const BpeSpec g = read_gpt2_files(dir);
      if (g.tokens == spec.tokens && g.merges == spec.merges) spec.id = "gpt2";
    }
  }
  return make_bpe_tokenizer(std::move(spec));
}

}  // namespace mantis::detail
