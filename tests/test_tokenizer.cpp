// Tokenizers: GPT-2 BPE equals the reference encoder (npm gpt-3-encoder 1.1.4, ids stored in
// tests/data/gpt2_reference.json by tests/reference/gen_gpt2_reference.js), decode∘encode is the
// identity on any bytes, the bytes tokenizer, token shards and every shard error path.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/format.h"
#include "mantis_config.h"
#include "io/tokenizer.h"
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
