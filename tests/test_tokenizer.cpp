// Tokenizers: GPT-2 BPE equals the reference encoder (npm gpt-3-encoder 1.1.4, ids stored in
// tests/data/gpt2_reference.json by tests/reference/gen_gpt2_reference.js), decode∘encode is the
// identity on any bytes, the bytes tokenizer, Hugging Face tokenizer.json (GPT-2's, derived from
// data/gpt2, tokenizes as encoder.json + vocab.bpe; the LLaMA-3 pre-tokenizer; ignore_merges,
// added tokens, every rejection), token shards and every shard error path.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/format.h"
#include "mantis_config.h"
#include "io/tokenizer.h"
#include "io/windows.h"
#include "testutil.h"

using namespace mantis;
namespace fs = std::filesystem;

namespace {

const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> t = make_tokenizer("gpt2");
  return *t;
}

struct RefCase {
  std::string name, text;
  std::vector<uint32_t> ids;
};

const std::vector<RefCase>& reference() {
  static const std::vector<RefCase> cases = [] {
    const fs::path p = fs::path(MANTIS_SOURCE_DIR) / "tests" / "data" / "gpt2_reference.json";
    std::ifstream in(p);
    REQUIRE(in.good());
    const nlohmann::json j = nlohmann::json::parse(in);
    std::vector<RefCase> v;
    for (const auto& c : j.at("cases"))
      v.push_back({c.at("name").get<std::string>(), c.at("text").get<std::string>(),
                   c.at("ids").get<std::vector<uint32_t>>()});
    REQUIRE(v.size() == j.at("case_count").get<size_t>());
    return v;
  }();
  return cases;
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("mantis_test_tokenizer_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

using mantis::test::slurp;
using mantis::test::spit;
void put_u32(std::string& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

}  // namespace

TEST_CASE("gpt2: encode equals the reference encoder on corpora and tricky strings") {
  const Tokenizer& t = gpt2();
  const auto& cases = reference();
  REQUIRE(cases.size() > 100);
  size_t corpora = 0;
  for (const auto& c : cases) {
    INFO(c.name);
    CHECK(t.encode(c.text) == c.ids);
    corpora += c.name.starts_with("corpus:");
  }
  CHECK(corpora == 4);
  // A second pass is served from the word cache and must give the same ids.
  for (const auto& c : cases) {
    INFO(c.name);
    CHECK(t.encode(c.text) == c.ids);
  }
}

TEST_CASE("gpt2: decode(encode(x)) == x on the reference cases") {
  const Tokenizer& t = gpt2();
  for (const auto& c : reference()) {
    INFO(c.name);
    CHECK(t.decode(c.ids) == c.text);
    CHECK(t.decode(t.encode(c.text)) == c.text);
  }
}

TEST_CASE("gpt2: concurrent encode calls share the word cache safely") {
  const auto t = make_tokenizer("gpt2");   // a fresh, empty cache
  const auto& cases = reference();
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < cases.size(); ++i) {
          const auto& c = cases[(i * 7 + static_cast<size_t>(k) * 13) % cases.size()];
          bad[k] += t->encode(c.text) != c.ids;
        }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == std::vector<int>(4, 0));
}

TEST_CASE("gpt2: vocabulary, known ids, <|endoftext|>") {
  const Tokenizer& t = gpt2();
  CHECK(t.vocab_size() == 50257);
  CHECK(t.id() == "gpt2");
  CHECK(t.encode("Hello world") == std::vector<uint32_t>{15496, 995});
  CHECK(t.encode("").empty());
  const std::vector<uint32_t> eot{kGpt2EndOfText};
  CHECK(t.decode(eot) == "<|endoftext|>");
  for (const auto& c : reference()) {
    INFO(c.name);
    const auto ids = t.encode(c.text);
    CHECK(std::find(ids.begin(), ids.end(), kGpt2EndOfText) == ids.end());
  }
  CHECK(t.encode("<|endoftext|>") == std::vector<uint32_t>{27, 91, 437, 1659, 5239, 91, 29});
}

TEST_CASE("gpt2: pre-tokenizer splits as the GPT-2 regex") {
  using V = std::vector<std::string_view>;
  CHECK(gpt2_pretokenize("Hello  world  ") == V{"Hello", " ", " world", "  "});
  CHECK(gpt2_pretokenize("I'm don't 'S") == V{"I", "'m", " don", "'t", " '", "S"});
  CHECK(gpt2_pretokenize("a\n\nb") == V{"a", "\n", "\n", "b"});
  CHECK(gpt2_pretokenize("x  \ny") == V{"x", "  ", "\n", "y"});
  CHECK(gpt2_pretokenize(" 123abc!? ") == V{" 123", "abc", "!?", " "});
  CHECK(gpt2_pretokenize("caf\xc3\xa9\xc2\xa0z") == V{"caf\xc3\xa9", "\xc2\xa0", "z"});
  // Invalid UTF-8 bytes are "other" code points of one byte.
  CHECK(gpt2_pretokenize("a\xff\xfe b\xe2\x82") == V{"a", "\xff\xfe", " b", "\xe2\x82"});
  CHECK(gpt2_pretokenize("").empty());
}

TEST_CASE("gpt2: decode(encode(x)) == x for every single byte and random byte strings") {
  const Tokenizer& t = gpt2();
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    const auto ids = t.encode(s);
    REQUIRE(ids.size() == 1);
    CHECK(t.decode(ids) == s);
  }
  std::mt19937_64 rng(20240601);
  // Raw random bytes, and strings biased towards text (ASCII, spaces, UTF-8 lead/continuation
  // bytes, apostrophes), short and long (long pre-tokens take the heap BPE path).
  const std::string biased = "aeiouxyzAB09 '\n\t.,\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\x80\xbf\xc0\xff";
  int failures = 0;
  for (int i = 0; i < 3000; ++i) {
    const size_t n = rng() % (i % 10 == 0 ? 600 : 40);
    std::string s(n, '\0');
    for (auto& ch : s) ch = static_cast<char>(i % 2 ? rng() & 0xFF : biased[rng() % biased.size()]);
    const auto ids = t.encode(s);
    const bool in_vocab = std::all_of(ids.begin(), ids.end(), [&](uint32_t id) { return id < t.vocab_size(); });
    if (!in_vocab || t.decode(ids) != s) {   // one assertion per failure, not per case
      INFO("random case " << i << ", " << n << " bytes");
      CHECK(in_vocab);
      CHECK(t.decode(ids) == s);
      ++failures;
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("gpt2: decode of an out-of-vocabulary id names it") {
  const Tokenizer& t = gpt2();
  const std::vector<uint32_t> bad{15496, 50257};
  CHECK_THROWS_AS(t.decode(bad), InputError);
  CHECK_THROWS_WITH(t.decode(bad), Catch::Contains("50257") && Catch::Contains("out of vocabulary"));
  const std::vector<uint32_t> huge{4294967295u};
  CHECK_THROWS_WITH(t.decode(huge), Catch::Contains("4294967295"));
}

TEST_CASE("tokenizer lookup, data directory, load errors") {
  CHECK_THROWS_WITH(make_tokenizer("gpt3"), Catch::Contains("gpt3") && Catch::Contains("gpt2"));
  CHECK(tokenizer_names() == std::vector<std::string>{"gpt2", "bytes"});
  CHECK(make_gpt2_tokenizer(std::string(MANTIS_SOURCE_DIR) + "/data/gpt2")->encode("Hello world") ==
        std::vector<uint32_t>{15496, 995});
  TempDir d;
  CHECK_THROWS_WITH(make_gpt2_tokenizer(d.path.string()), Catch::Contains("encoder.json"));
  spit(d.file("encoder.json"), "{\"a\": 0,");
  CHECK_THROWS_WITH(make_gpt2_tokenizer(d.path.string()), Catch::Contains("malformed JSON"));

  // MANTIS_DATA_DIR: the data root (holding gpt2/), or a directory holding the files directly.
  const char* old = std::getenv("MANTIS_DATA_DIR");
  const std::string saved = old ? old : "";
  TempDir root;
  ::setenv("MANTIS_DATA_DIR", root.path.c_str(), 1);
  CHECK(gpt2_data_dir() == root.file("gpt2"));
  CHECK_THROWS_WITH(make_tokenizer("gpt2"), Catch::Contains(root.file("gpt2")));
  ::setenv("MANTIS_DATA_DIR", d.path.c_str(), 1);   // holds encoder.json itself (malformed)
  CHECK(gpt2_data_dir() == d.path.string());
  CHECK_THROWS_AS(make_tokenizer("gpt2"), InputError);
  ::setenv("MANTIS_DATA_DIR", (std::string(MANTIS_SOURCE_DIR) + "/data").c_str(), 1);
  CHECK(make_tokenizer("gpt2")->vocab_size() == 50257);
  ::setenv("MANTIS_DATA_DIR", (std::string(MANTIS_SOURCE_DIR) + "/data/gpt2").c_str(), 1);
  CHECK(make_tokenizer("gpt2")->vocab_size() == 50257);
  if (old) ::setenv("MANTIS_DATA_DIR", saved.c_str(), 1);
  else ::unsetenv("MANTIS_DATA_DIR");
  if (!old) CHECK(gpt2_data_dir() == std::string(MANTIS_SOURCE_DIR) + "/data/gpt2");
}

TEST_CASE("bytes tokenizer: id = byte, round trip, out of vocabulary") {
  const auto t = make_tokenizer("bytes");
  CHECK(t->vocab_size() == 256);
  CHECK(t->id() == "bytes");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = t->encode(all);
  REQUIRE(ids.size() == 256);
  for (uint32_t b = 0; b < 256; ++b) CHECK(ids[b] == b);
  CHECK(t->decode(ids) == all);
  for (const auto& c : reference()) CHECK(t->decode(t->encode(c.text)) == c.text);
  const std::vector<uint32_t> bad{65, 256};
  CHECK_THROWS_WITH(t->decode(bad), Catch::Contains("256") && Catch::Contains("out of vocabulary"));
}

TEST_CASE("shards: write/read round trip, 2- and 4-byte tokens, atomic write") {
  TempDir d;
  const Tokenizer& t = gpt2();
  const auto& c = reference().front();
  const std::string p = d.file("austen.tok");
  write_shard(p, c.ids, t);
  const TokenShard s = read_shard(p);
  CHECK(s.tokenizer_id == "gpt2");
  CHECK(s.vocab_size == 50257);
  CHECK(s.tokens == c.ids);
  CHECK(fs::file_size(p) == kShardHeaderBytes + 2 * c.ids.size());
  CHECK(slurp(p).substr(0, 8) == std::string("MNTSTOK\0", 8));

  // Overwrite in place; no temp file stays behind.
  const auto bytes = make_tokenizer("bytes");
  const std::vector<uint32_t> few{0, 255, 7};
  write_shard(p, few, *bytes);
  CHECK(read_shard(p).tokens == few);
  CHECK(read_shard(p).tokenizer_id == "bytes");
  CHECK(std::distance(fs::directory_iterator(d.path), fs::directory_iterator{}) == 1);

  // Empty, vocab 65536 (still 2 bytes), vocab 65537 (4 bytes), a 16-character id.
  write_shard(p, std::vector<uint32_t>{}, "gpt2", 50257);
  CHECK(read_shard(p).tokens.empty());
  const std::vector<uint32_t> wide{0, 65535, 65536, 1};
  write_shard(p, std::vector<uint32_t>{0, 65535}, "x", 65536);
  CHECK(fs::file_size(p) == kShardHeaderBytes + 4);
  write_shard(p, wide, "0123456789abcdef", 65537);
  CHECK(fs::file_size(p) == kShardHeaderBytes + 16);
  const TokenShard w = read_shard(p);
  CHECK(w.tokens == wide);
  CHECK(w.tokenizer_id == "0123456789abcdef");
  CHECK(w.vocab_size == 65537);
}

TEST_CASE("shards: write errors leave the target untouched") {
  TempDir d;
  const std::string p = d.file("s.tok");
  const std::vector<uint32_t> ok{1, 2, 3};
  write_shard(p, ok, "gpt2", 50257);
  const std::string before = slurp(p);
  CHECK_THROWS_WITH(write_shard(p, std::vector<uint32_t>{1, 50257}, "gpt2", 50257),
                    Catch::Contains(p) && Catch::Contains("50257") && Catch::Contains("out of vocabulary"));
  CHECK_THROWS_WITH(write_shard(p, ok, "a-name-longer-than-16", 50257), Catch::Contains("tokenizer id"));
  CHECK_THROWS_WITH(write_shard(p, ok, "", 50257), Catch::Contains("tokenizer id"));
  CHECK_THROWS_WITH(write_shard(p, ok, "has space", 50257), Catch::Contains("tokenizer id"));
  CHECK_THROWS_AS(write_shard(d.file("no/such/dir/s.tok"), ok, "gpt2", 50257), InputError);
  CHECK(slurp(p) == before);
}

TEST_CASE("shards: every read error names the file and the problem") {
  TempDir d;
  const std::string p = d.file("s.tok");
  const std::vector<uint32_t> toks{464, 3139, 286, 50256, 0};
  write_shard(p, toks, "gpt2", 50257);
  const std::string good = slurp(p);
  REQUIRE(read_shard(p).tokens == toks);
  auto with = [&](std::string bytes) {
    spit(p, bytes);
    return p;
  };
  using Catch::Contains;

  CHECK_THROWS_WITH(read_shard(d.file("missing.tok")), Contains("missing.tok") && Contains("cannot open"));
  {
    std::string b = good;
    b[0] = 'X';
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("bad magic"));
  }
  CHECK_THROWS_WITH(read_shard(with("")), Contains(p) && Contains("truncated"));
  CHECK_THROWS_WITH(read_shard(with(good.substr(0, 20))), Contains(p) && Contains("truncated"));
  CHECK_THROWS_WITH(read_shard(with(good.substr(0, good.size() - 1))), Contains(p) && Contains("truncated"));
  CHECK_THROWS_WITH(read_shard(with(good.substr(0, kShardHeaderBytes))), Contains(p) && Contains("truncated"));
  CHECK_THROWS_WITH(read_shard(with(good + std::string(2, '\0'))), Contains(p) && Contains("trailing"));
  {
    std::string b = good;
    put_u32(b, 8, 2);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("version 2"));
  }
  {
    std::string b = good;   // the last token (0) becomes 50257
    b[b.size() - 2] = static_cast<char>(50257 & 0xFF);
    b[b.size() - 1] = static_cast<char>(50257 >> 8);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("token 4 is 50257") && Contains("out of vocabulary"));
  }
  {
    std::string b = good;   // vocab shrinks below a stored token
    put_u32(b, 40, 1000);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("token 1 is 3139"));
  }
  {
    std::string b = good;
    put_u32(b, 12, 4);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("token width 4"));
  }
  {
    std::string b = good;
    put_u32(b, 40, 0);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("vocab size 0"));
  }
  {
    std::string b = good;
    b[24] = '\0';
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("tokenizer id"));
    b = good;
    b[30] = 'x';   // garbage after the NUL padding starts
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("tokenizer id"));
  }
  {
    std::string b = good;
    put_u32(b, 44, 1);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("reserved"));
  }
  {
    std::string b = good;   // a token count so large that count·width overflows
    for (int i = 16; i < 24; ++i) b[i] = static_cast<char>(0xFF);
    CHECK_THROWS_WITH(read_shard(with(b)), Contains(p) && Contains("truncated"));
  }
  CHECK(read_shard(with(good)).tokens == toks);
}

// ---- Hugging Face tokenizer.json ------------------------------------------------------------

namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode, from its definition: printable Latin-1 bytes are themselves, the
// other 68 bytes U+0100.. in byte order; returned as the UTF-8 of that code point.
std::string byte_char(int b) {
  int n = 0;
  for (int c = 0; c < b; ++c) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    n += !printable;
  }
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  const uint32_t cp = printable ? uint32_t(b) : 256u + uint32_t(n);
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  return s;
}

const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json llama3_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

// GPT-2's tokenizer.json as Hugging Face ships it, built from data/gpt2's two files.
json gpt2_tokenizer_json(bool pairs) {
  const std::string dir = std::string(MANTIS_SOURCE_DIR) + "/data/gpt2";
  const json vocab = json::parse(std::ifstream(dir + "/encoder.json"));
  json merges = json::array();
  std::ifstream bpe(dir + "/vocab.bpe");
  std::string line;
  std::getline(bpe, line);  // #version
  while (std::getline(bpe, line)) {
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (pairs) merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
    else merges.push_back(line);
  }
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}}},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
            {"merges", merges}}}};
}

// A small LLaMA-3-style tokenizer.json: the 256 bytes (id = byte), then
//   256 "Ġt" (Ġ t), 257 "he" (h e), 258 "Ġthe" (Ġt he), 259 "34" (3 4, rank 3), 260 "12" (1 2, rank 4),
//   261 "hello" (no merge makes it), and the added token 262 <|begin_of_text|>.
json small_llama3_json(bool ignore_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string G = byte_char(' ');
  vocab[G + "t"] = 256, vocab["he"] = 257, vocab[G + "the"] = 258, vocab["34"] = 259, vocab["12"] = 260,
  vocab["hello"] = 261;
  const json merges = json::array({json::array({G, "t"}), json::array({"h", "e"}), json::array({G + "t", "he"}),
                                   json::array({"3", "4"}), json::array({"1", "2"})});
  return {{"added_tokens", {{{"id", 262}, {"content", "<|begin_of_text|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", llama3_pre_tokenizer()},
          {"post_processor", {{"type", "TemplateProcessing"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"ignore_merges", ignore_merges}, {"byte_fallback", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

std::string write_json(const TempDir& d, const std::string& name, const json& j) {
  spit(d.file(name), j.dump());
  return d.file(name);
}

std::vector<uint32_t> bytes_of(std::string_view s) {
  std::vector<uint32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

}  // namespace

TEST_CASE("tokenizer.json: GPT-2's, derived from data/gpt2, encodes exactly as encoder.json + vocab.bpe") {
  TempDir d;
  for (bool pairs : {false, true}) {
    INFO("merges as " << (pairs ? "[a, b] pairs" : "\"a b\" strings"));
    const std::string path = write_json(d, "tokenizer.json", gpt2_tokenizer_json(pairs));
    const auto t = make_tokenizer(path);
    CHECK(t->vocab_size() == 50257);
    CHECK(t->id() == "gpt2");  // the same tokenizer: its shards and corpus rule
    for (const auto& c : reference()) {
      INFO(c.name);
      CHECK(t->encode(c.text) == c.ids);
      CHECK(t->decode(c.ids) == c.text);
    }
    // <|endoftext|> in the text is ordinary text, as with encoder.json; the id decodes to it.
    CHECK(t->encode("a<|endoftext|>") == gpt2().encode("a<|endoftext|>"));
    const std::vector<uint32_t> eot{kGpt2EndOfText};
    CHECK(t->decode(eot) == "<|endoftext|>");
  }
  // The directory form, and a tokenizer.json that is not GPT-2's (one merge fewer) keeps its own id.
  const auto t = make_tokenizer(d.path.string());
  CHECK(t->id() == "gpt2");
  json j = gpt2_tokenizer_json(false);
  j["model"]["merges"].erase(j["model"]["merges"].size() - 1);
  const auto other = make_tokenizer(write_json(d, "other.json", j));
  CHECK(other->id().starts_with("hf-"));
  CHECK(other->id().size() == 16);
  CHECK(other->encode("Hello world") == gpt2().encode("Hello world"));
}

TEST_CASE("tokenizer.json: the LLaMA-3 pre-tokenizer splits as its regex") {
  using V = std::vector<std::string_view>;
  // contractions, case-insensitively (GPT-2's are case-sensitive); ſ folds to s
  CHECK(llama3_pretokenize("I'M don'T we'Re") == V{"I", "'M", " don", "'T", " we", "'Re"});
  CHECK(llama3_pretokenize("it'\xc5\xbf") == V{"it", "'\xc5\xbf"});
  // digits in groups of at most three, never with a leading space
  CHECK(llama3_pretokenize("12345 678") == V{"123", "45", " ", "678"});
  CHECK(llama3_pretokenize("3.14") == V{"3", ".", "14"});
  // one non-letter, non-digit, non-line-break code point may lead a word
  CHECK(llama3_pretokenize("(hi) \tyo") == V{"(hi", ")", " ", "\tyo"});
  CHECK(llama3_pretokenize("a\t\tb") == V{"a", "\t", "\tb"});
  // punctuation runs take the line breaks after them
  CHECK(llama3_pretokenize("x!!\n\ny") == V{"x", "!!\n\n", "y"});
  CHECK(llama3_pretokenize(" !? z") == V{" !?", " z"});
  // whitespace up to its last line break; then \s+(?!\S) and \s+
  CHECK(llama3_pretokenize("a  \n b") == V{"a", "  \n", " b"});
  CHECK(llama3_pretokenize("a\n \n  b") == V{"a", "\n \n", " ", " b"});
  CHECK(llama3_pretokenize("end  ") == V{"end", "  "});
  CHECK(llama3_pretokenize("  x") == V{" ", " x"});
  CHECK(llama3_pretokenize("caf\xc3\xa9\xc2\xa0z") == V{"caf\xc3\xa9", "\xc2\xa0z"});
  CHECK(llama3_pretokenize("").empty());
  // GPT-2's regex splits the same strings differently
  CHECK(gpt2_pretokenize("12345") == V{"12345"});
  CHECK(gpt2_pretokenize("(hi)") == V{"(", "hi", ")"});
}

TEST_CASE("tokenizer.json: LLaMA-3 style BPE, ignore_merges, added tokens") {
  TempDir d;
  const auto t = make_tokenizer(write_json(d, "tokenizer.json", small_llama3_json(false)));
  CHECK(t->vocab_size() == 263);
  CHECK(t->id().starts_with("hf-"));
  CHECK(t->encode(" the the") == std::vector<uint32_t>{258, 258});
  // "123" and "45" are separate words: 34 cannot form across them although it ranks before 12
  CHECK(t->encode("12345") == std::vector<uint32_t>{260, '3', '4', '5'});
  CHECK(t->encode("hello") == std::vector<uint32_t>{257, 'l', 'l', 'o'});
  // ignore_merges: a word that is a vocabulary token is that token
  const auto im = make_tokenizer(write_json(d, "im.json", small_llama3_json(true)));
  CHECK(im->encode("hello hello") == std::vector<uint32_t>{261, ' ', 257, 'l', 'l', 'o'});
  CHECK(im->id() != t->id());
  // Added tokens decode to their content; encode treats their text as ordinary text.
  const std::vector<uint32_t> bot{262, 258};
  CHECK(t->decode(bot) == "<|begin_of_text|> the");
  CHECK(t->encode("<|begin_of_text|>") == bytes_of("<|begin_of_text|>"));
  const std::vector<uint32_t> bad{263};
  CHECK_THROWS_WITH(t->decode(bad), Catch::Contains("263") && Catch::Contains("out of vocabulary"));
  // decode(encode(x)) == x for arbitrary bytes
  std::mt19937 rng(5);
  for (int k = 0; k < 200; ++k) {
    std::string s(size_t(rng() % 40), '\0');
    for (char& c : s) c = char(rng() % 7 == 0 ? rng() % 256 : " \n\tab12'sT.("[rng() % 12]);
    CHECK(t->decode(t->encode(s)) == s);
  }
}

TEST_CASE("tokenizer.json: what mantis cannot tokenize is refused, naming the key") {
  TempDir d;
  const json good = small_llama3_json(false);
  auto error_with = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return mantis::test::error_of([&] { make_tokenizer(write_json(d, "tokenizer.json", j)); });
  };
  using Catch::Contains;
  CHECK_THAT(error_with([](json& j) { j["model"]["type"] = "WordPiece"; }), Contains("tokenizer.json: model.type \"WordPiece\" not supported (BPE only)"));
  CHECK_THAT(error_with([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }), Contains("normalizer \"NFC\" not supported"));
  CHECK_THAT(error_with([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }),
             Contains("pre_tokenizer \"Metaspace\" not supported"));
  CHECK_THAT(error_with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; }),
             Contains("Split pattern {\"Regex\":\"\\\\s+\"} not supported"));
  CHECK_THAT(error_with([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; }),
             Contains("ByteLevel after a Split must have use_regex = false"));
  CHECK_THAT(error_with([](json& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}}; }),
             Contains("add_prefix_space = true not supported"));
  CHECK_THAT(error_with([](json& j) { j.erase("pre_tokenizer"); }), Contains("key \"pre_tokenizer\" missing"));
  CHECK_THAT(error_with([](json& j) { j["model"]["byte_fallback"] = true; }), Contains("model.byte_fallback = true"));
  CHECK_THAT(error_with([](json& j) { j["model"]["dropout"] = 0.1; }), Contains("model.dropout 0.1 not supported"));
  CHECK_THAT(error_with([](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }), Contains("decoder \"Metaspace\" not supported"));
  CHECK_THAT(error_with([](json& j) { j["added_tokens"][0]["id"] = 300; }),
             Contains("added_tokens: \"<|begin_of_text|>\" has id 300, expected 0..262"));
  CHECK_THAT(error_with([](json& j) {  // 263 with an added token repeating id 5: 262 is nobody's
               j["added_tokens"][0]["id"] = 263;
               j["added_tokens"].push_back({{"id", 5}, {"content", "\x05"}});
             }),
             Contains("no token has id 262 (ids must be 0..263 without gaps)"));
  CHECK_THAT(error_with([](json& j) { j["added_tokens"][0]["id"] = 5; }),
             Contains("added_tokens: \"<|begin_of_text|>\" has id 5, which model.vocab gives to"));
  CHECK_THAT(error_with([](json& j) { j["added_tokens"].push_back({{"id", 262}, {"content", "x"}}); }),
             Contains("added_tokens: id 262 is used twice"));
  CHECK_THAT(error_with([](json& j) { j["model"]["merges"].push_back(json::array({"l", "l"})); }),
             Contains("model.merges[5]: a part or the result of [\"l\",\"l\"] is not in model.vocab"));
  CHECK_THAT(error_with([](json& j) { j["model"]["merges"].push_back("h e"); }), Contains("model.merges[5]: \"h e\" is listed twice"));
  CHECK_THAT(error_with([](json& j) { j["model"]["merges"].push_back("he"); }), Contains("model.merges[5]: expected \"a b\""));
  CHECK_THAT(error_with([](json& j) { j["model"]["merges"].push_back(7); }), Contains("model.merges[5]: expected \"a b\" or [a, b], got 7"));
  CHECK_THAT(error_with([](json& j) { j["model"]["vocab"]["\xe2\x96\x81the"] = 263; j["added_tokens"][0]["id"] = 264; }),
             Contains("model.vocab: token \"\xe2\x96\x81the\" is not made of byte-level characters"));
  CHECK_THAT(error_with([](json& j) {
               j["model"]["vocab"].erase(byte_char(0x41));
               j["model"]["vocab"]["Q2"] = 65;
             }),
             Contains("the single byte 0x41 has no token"));
  spit(d.file("tokenizer.json"), "{\"model\": ");
  CHECK_THAT(mantis::test::error_of([&] { make_tokenizer(d.file("tokenizer.json")); }), Contains("tokenizer.json: not valid JSON"));
  spit(d.file("tokenizer.json"), "{}");
  CHECK_THAT(mantis::test::error_of([&] { make_tokenizer(d.file("tokenizer.json")); }), Contains("no \"model\" object"));
}

TEST_CASE("tokenizer.json: --tokenizer paths, and the one beside a model") {
  TempDir d;
  using Catch::Contains;
  CHECK_THAT(mantis::test::error_of([&] { make_tokenizer(d.path.string()); }), Contains("no tokenizer.json (nor encoder.json + vocab.bpe)"));
  spit(d.file("notes.txt"), "x");
  CHECK_THAT(mantis::test::error_of([&] { make_tokenizer(d.file("notes.txt")); }), Contains("notes.txt: not a tokenizer"));
  CHECK_THAT(mantis::test::error_of([&] { make_tokenizer(d.file("missing.json")); }), Contains("unknown tokenizer"));
  write_json(d, "tokenizer.json", small_llama3_json(false));
  const auto t = make_tokenizer(d.path.string());
  CHECK(t->vocab_size() == 263);
  // A model directory (or a file in it) holding tokenizer.json: used unless --tokenizer names another.
  CHECK(model_tokenizer_json(d.path.string()) == d.file("tokenizer.json"));
  CHECK(model_tokenizer_json(d.file("model.safetensors")) == d.file("tokenizer.json"));
  CHECK(tokenizer_for_model("", 300, "--tokenizer", d.path.string())->id() == t->id());
  CHECK(tokenizer_for_model("bytes", 300, "--tokenizer", d.path.string())->id() == "bytes");
  TempDir plain;  // no tokenizer.json: the vocabulary decides
  CHECK(tokenizer_for_model("", 256, "--tokenizer", plain.path.string())->id() == "bytes");
  CHECK_THAT(mantis::test::error_of([&] { tokenizer_for_model("", 200, "--tokenizer", d.path.string()); }),
             Contains("has 263 tokens but the model's vocabulary is 200"));
  CHECK_THAT(mantis::test::error_of([&] { tokenizer_for_model("", 300); }), Contains("gpt2|bytes|TOKENIZER.json"));
}
