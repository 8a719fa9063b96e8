// test_cli_model — `mantis tokenize | detokenize | shards | logits | eval` end to end.
//
// Models are created here (init_model + save_model) in a scratch directory; expected values come
// from the library (forward, metrics) run in this process on the same checkpoint, or from the
// reference GPT-2 encoder's committed outputs (tests/data/gpt2_reference.json).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <catch2/catch_reporter_tap.hpp>  // `-r tap` (Meson's protocol: 'tap')
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "cliutil.h"
#include "io/dataset.h"
#include "nn/forward.h"
#include "core/file.h"
#include "mantis_config.h"
#include "nn/metrics.h"
#include "nn/model.h"
#include "io/tokenizer.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "core/scheme.h"
#include "testutil.h"

namespace {

using namespace mantis_test_cli;

// Children here may run long (Meson timeout 600 s).
static const int kChildDeadline = child_deadline_seconds = 550;
using namespace mantis;

const std::string kSource = MANTIS_SOURCE_DIR;

ModelConfig bytes_gpt2() {
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.vocab = 256, c.ctx = 72, c.layers = 2, c.heads = 2, c.kv_heads = 2, c.dim = 32, c.hidden = 64;
  return c;
}
ModelConfig bytes_llama() {
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab = 256, c.ctx = 72, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.dim = 32, c.hidden = 48, c.tied = false;
  return c;
}
ModelConfig gpt2_vocab() {
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.vocab = 50257, c.ctx = 40, c.layers = 1, c.heads = 2, c.kv_heads = 2, c.dim = 8, c.hidden = 16;
  return c;
}

// A saved random model (once per name); returns its directory.
std::string model_dir(const std::string& name, const ModelConfig& c) {
  const fs::path d = scratch_dir() / name;
  if (!fs::exists(d / "config.json")) save_model(init_model(c, 7), d.string());
  return d.string();
}

// A random model with large weights (std ≈ 0.3): attention scores of order 1, so low-precision
// scores change the output (GPT-2's 0.02 init gives near-uniform attention).
std::string sharp_model_dir(const std::string& name, const ModelConfig& c) {
  const fs::path d = scratch_dir() / name;
  if (!fs::exists(d / "config.json")) {
    Model m = init_model(c, 9);
    for (auto& [k, t] : m.params)
      if (t.shape.size() == 2)
        for (float& x : t.data) x *= 15.0f;
    save_model(m, d.string());
  }
  return d.string();
}

std::string ids_text(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(v[i]);
  }
  return s;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("tokenize equals the reference GPT-2 encoder; detokenize inverts it", "[cli][tokenize]") {
  const auto ref = nlohmann::json::parse(slurp(kSource + "/tests/data/gpt2_reference.json"));
  int checked = 0;
  for (const auto& c : ref["cases"]) {
    const std::string name = c["name"];
    if (!name.starts_with("corpus:") && !name.starts_with("tricky:")) continue;
    const std::string text = c["text"];
    std::vector<int32_t> want;
    for (auto& id : c["ids"]) want.push_back(id.get<int32_t>());
    const Result r = run({"tokenize"}, text);
    INFO(name << " stderr: " << flat(r.err));
    REQUIRE(r.status == 0);
    const bool ids_equal = r.out == ids_text(want) + "\n";  // one line, single spaces
    CHECK(ids_equal);
    const Result back = run({"detokenize"}, r.out);
    REQUIRE(back.status == 0);
    const bool text_equal = back.out == text;
    CHECK(text_equal);
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("tokenize / detokenize: every byte value round-trips through both tokenizers", "[cli][tokenize]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  all += "\xc3\xa9 caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x80\x94\n\n";
  for (const char* t : {"gpt2", "bytes"}) {
    const Result r = run({"tokenize", "--tokenizer", t}, all);
    REQUIRE(r.status == 0);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
    const Result back = run({"detokenize", "-t", t}, r.out);
    REQUIRE(back.status == 0);
    const bool round_trip = back.out == all;
    CHECK(round_trip);
  }
  const Result bytes = run({"tokenize", "-t", "bytes"}, "AZ\n");
  const bool bytes_ok = bytes.out == "65 90 10\n";
  CHECK(bytes_ok);
  const bool empty_ok = run({"tokenize"}, "").out == "\n";
  CHECK(empty_ok);
}

TEST_CASE("tokenize / detokenize errors", "[cli][tokenize][errors]") {
  check_error(run({"tokenize", "-t", "sentencepiece"}), {"unknown tokenizer 'sentencepiece'", "gpt2, bytes"});
  check_error(run({"detokenize"}, "15496 99999\n"), {"99999", "position 1", "50257"});
  check_error(run({"detokenize", "-t", "bytes"}, "65 256"), {"256", "position 1"});
  check_error(run({"detokenize"}, "1 2 -3"), {"token 2", "'-3'"});
  check_error(run({"detokenize"}, "1 x2"), {"'x2'"});
}

TEST_CASE("shards: the committed GPT-2 shards are exactly what `mantis shards` writes", "[cli][shards]") {
  const fs::path out = scratch_dir() / "shards-gpt2";
  const Result r = run({"shards", "--tokenizer", "gpt2", "--out", out.string(), "-q"});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  const fs::path committed = fs::path(kSource) / "data" / "shards" / "gpt2";
  const bool manifest_equal = slurp(out / "manifest.json") == slurp(committed / "manifest.json");
  CHECK(manifest_equal);
  const auto manifest = nlohmann::json::parse(slurp(committed / "manifest.json"));
  size_t n = 0;
  for (auto& [key, s] : manifest["shards"].items()) {
    const std::string file = s["file"];
    INFO(key);
    const bool shard_equal = slurp(out / file) == slurp(committed / file);  // (bool: TAP prints operands)
    CHECK(shard_equal);
    CHECK(sha256_file((committed / file).string()) == s["sha256"].get<std::string>());
    const TokenShard t = read_shard((committed / file).string());
    CHECK(t.tokenizer_id == "gpt2");
    CHECK(t.tokens.size() == s["tokens"].get<size_t>());
    CHECK(t.tokens.front() == kGpt2EndOfText);  // every document starts with the separator
    ++n;
  }
  CHECK(n == 12);
  // the bytes tokenizer's split is the text itself (the WEB has non-ASCII punctuation: bytes ≥ 128)
  const auto tok = make_tokenizer("bytes");
  const auto ids = tokenize_split("web", "test", *tok, kSource + "/data");
  const std::string text = read_gzip(kSource + "/data/corpora/web/test.txt.gz");
  CHECK(*std::max_element(ids.begin(), ids.end()) >= 128u);
  const bool bytes_equal = std::equal(ids.begin(), ids.end(), text.begin(), text.end(),
                                      [](uint32_t a, char b) { return a == uint32_t(uint8_t(b)); });
  CHECK(bytes_equal);
}

TEST_CASE("logits: the .npy holds forward<float> of the checkpoint, bit for bit", "[cli][logits]") {
  for (auto [name, cfg] : {std::pair{"bytes-gpt2", bytes_gpt2()}, std::pair{"bytes-llama", bytes_llama()}}) {
    const std::string dir = model_dir(name, cfg);
    const Model m = load_model(dir);
    const std::vector<int32_t> tokens = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 0, 255};
    for (const char* pol : {"native", "lamp:4"}) {
      INFO(name << " " << pol);
      const fs::path out = scratch_dir() / (std::string(name) + "-" + (pol[0] == 'n' ? "native" : "lamp") + ".npy");
      const Result r = run({"logits", "--model", dir, "--policy", pol, "--tokens", ids_text(tokens), "--out", out.string()});
      INFO(flat(r.err));
      REQUIRE(r.status == 0);
      const NpyArray a = read_npy(out.string());
      REQUIRE(a.shape == std::vector<int64_t>{int64_t(tokens.size()), cfg.vocab});
      const Matrix<float> want = forward<float>(m, tokens, policy_from_spec(pol));
      CHECK(same_bits(a.data.data(), want.data(), a.data.size()));
    }
    // --tokens-file: whitespace of any kind
    spit(scratch_dir() / "ids.txt", "72 101\n108\t108 111\n");
    const fs::path out = scratch_dir() / "file.npy";
    REQUIRE(run({"logits", "-m", dir, "--tokens-file", (scratch_dir() / "ids.txt").string(), "-o", out.string()}).status == 0);
    const Matrix<float> want = forward<float>(m, std::vector<int32_t>{72, 101, 108, 108, 111});
    CHECK(same_bits(read_npy(out.string()).data.data(), want.data(), size_t(want.size())));
  }
}

TEST_CASE("logits: bad input is one line and status 2", "[cli][logits][errors]") {
  const std::string dir = model_dir("bytes-gpt2", bytes_gpt2());
  const std::string out = (scratch_dir() / "bad.npy").string();
  check_error(run({"logits", "-m", dir, "-o", out}), {"exactly one of --tokens and --tokens-file"});
  check_error(run({"logits", "-m", dir, "--tokens", "1 2", "--tokens-file", "x", "-o", out}), {"exactly one"});
  check_error(run({"logits", "-m", dir, "--tokens", "1 256", "-o", out}), {"token 256", "position 1", "vocabulary"});
  check_error(run({"logits", "-m", dir, "--tokens", "1 two", "-o", out}), {"'two'"});
  std::string long_seq;
  for (int i = 0; i < 73; ++i) long_seq += "1 ";
  check_error(run({"logits", "-m", dir, "--tokens", long_seq, "-o", out}), {"73 tokens", "context (72)"});
  const fs::path unknown = write_config("unknown-site.toml", "[site.\"attn.kq\"]\noutput = \"bf16\"\n");
  check_error(run({"logits", "-m", dir, "-p", unknown.string(), "--tokens", "1", "-o", out}),
              {"attn.kq", "attn.qkv", "lm_head"});
  const fs::path badfmt = write_config("bad-format.toml", "[site.\"attn.qk\"]\noutput = \"ps99x\"\n");
  check_error(run({"logits", "-m", dir, "-p", badfmt.string(), "--tokens", "1", "-o", out}), {"ps99x"});
  check_error(run({"logits", "-m", dir, "-p", "lamp:x", "--tokens", "1", "-o", out}), {"lamp:x"});
  check_error(run({"logits", "-m", (scratch_dir() / "no-such-model").string(), "--tokens", "1", "-o", out}),
              {"no-such-model"});
  // a truncated checkpoint names the file; a NaN weight names the tensor
  const fs::path trunc = scratch_dir() / "truncated";
  fs::create_directories(trunc);
  fs::copy_file(fs::path(dir) / "config.json", trunc / "config.json", fs::copy_options::overwrite_existing);
  const std::string w = slurp(fs::path(dir) / "model.safetensors");
  spit(trunc / "model.safetensors", w.substr(0, w.size() - 100));
  check_error(run({"logits", "-m", trunc.string(), "--tokens", "1", "-o", out}), {"model.safetensors"});
  const fs::path nandir = scratch_dir() / "nan-model";
  fs::create_directories(nandir);
  fs::copy_file(fs::path(dir) / "config.json", nandir / "config.json", fs::copy_options::overwrite_existing);
  {  // save_model refuses NaN, so patch the float in the file: find the tensor's bytes
    std::string bytes = w;
    const Model good_model = load_model(dir);
    const float* good = good_model.params.at("h.1.mlp.c_fc.weight").data.data();
    const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(good), 64));
    REQUIRE(at != std::string::npos);
    const float q = std::nanf("");
    std::memcpy(bytes.data() + at + 5 * 4, &q, 4);
    spit(nandir / "model.safetensors", bytes);
  }
  check_error(run({"logits", "-m", nandir.string(), "--tokens", "1", "-o", out}), {"h.1.mlp.c_fc.weight"});
  CHECK_FALSE(fs::exists(out));  // nothing written on any error
}

TEST_CASE("eval: metrics over every position of every window, results and manifest", "[cli][eval]") {
  const std::string dir = model_dir("bytes-llama", bytes_llama());
  const fs::path out = scratch_dir() / "eval-lamp";
  const Result r = run({"eval", "-m", dir, "-p", "lamp:4", "-d", "austen/validation", "--seqs", "3", "--ctx", "48",
                        "-o", out.string(), "-q"});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  CHECK(r.out.find("KL(ref || policy)") != std::string::npos);

  // the same numbers, recomputed here from the definition
  const Model m = load_model(dir);
  const auto tok = make_tokenizer("bytes");
  const TokenData data = load_tokens("austen/validation", *tok, kSource + "/data");
  const auto starts = window_starts(data.tokens.size(), 3, 49);
  MetricsAccumulator acc;
  for (size_t s : starts) {
    std::vector<int32_t> in, target;
    for (size_t t = 0; t < 48; ++t) {
      in.push_back(int32_t(data.tokens[s + t]));
      target.push_back(int32_t(data.tokens[s + t + 1]));
    }
    acc.add(forward<float>(m, in), forward<float>(m, in, lamp_policy(4)), target);
  }
  const auto res = nlohmann::json::parse(slurp(out / "results.json"));
  CHECK(res["summary"]["positions"] == 3 * 48);
  CHECK(res["summary"]["kl_mean"].get<double>() == acc.mean_kl());
  CHECK(res["summary"]["flip_rate"].get<double>() == acc.flip_rate());
  CHECK(res["summary"]["ppl_ref"].get<double>() == acc.ppl_ref());
  CHECK(res["summary"]["ppl_test"].get<double>() == acc.ppl_test());
  CHECK(res["summary"]["max_abs_logit_error"].get<double>() == acc.max_abs_error());
  CHECK(acc.mean_kl() > 0);
  CHECK(res["sequences"].size() == 3);
  CHECK(res["sequences"][2]["start"].get<size_t>() == starts[2]);
  const auto csv = lines(slurp(out / "results.csv"));
  REQUIRE(csv.size() == 2);
  // column names carry their unit as the last suffix (study.h)
  CHECK(csv[0] == "model,policy,data,seqs,ctx_tokens,positions,kl_mean_nats,flip_rate,flips,ppl_ref,ppl_test,"
                  "max_abs_logit_error,nonfinite_positions,overflow,nan,inf,ref_seconds,policy_seconds");

  const auto man = nlohmann::json::parse(slurp(out / "manifest.json"));
  CHECK(man["config"]["policy"] == "lamp:4");
  CHECK(man["config"]["ctx"] == 48);
  CHECK(man["config"]["tokenizer"] == "bytes");
  CHECK(!man["git_commit"].get<std::string>().empty());
  CHECK(man["data"]["sources"][0]["sha256"] ==
        sha256_hex(read_gzip(kSource + "/data/corpora/austen/validation.txt.gz")));
  CHECK(man["model_files"].size() == 2);
  CHECK(man["timings_s"]["total"].get<double>() > 0);
  for (const char* f : {"results.csv", "results.json", "manifest.json"}) CHECK(fs::exists(out / f));
}

TEST_CASE("eval: the native policy against itself gives zero KL and no flips; committed shards are read",
          "[cli][eval]") {
  const std::string dir = model_dir("gpt2-vocab", gpt2_vocab());
  const fs::path out = scratch_dir() / "eval-native";
  const Result r = run({"eval", "-m", dir, "-d", "kjv/test", "-n", "2", "-o", out.string(), "-q"});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  const auto res = nlohmann::json::parse(slurp(out / "results.json"));
  CHECK(res["summary"]["kl_mean"].get<double>() == 0.0);
  CHECK(res["summary"]["flips"] == 0);
  CHECK(res["summary"]["positions"] == 2 * 40);
  const auto man = nlohmann::json::parse(slurp(out / "manifest.json"));
  CHECK(man["config"]["tokenizer"] == "gpt2");
  const std::string shard = kSource + "/data/shards/gpt2/kjv/test.tok";
  CHECK(man["data"]["sources"][0]["file"] == shard);
  CHECK(man["data"]["sources"][0]["sha256"] == sha256_file(shard));
}

// A .npy (version 1.0) of `ids` as little-endian integers of `width` bytes under `descr`.
fs::path write_token_npy(const std::string& name, const std::vector<uint32_t>& ids, const std::string& descr,
                         size_t width) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(ids.size()) + ",), }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::string b = std::string("\x93NUMPY\x01\x00", 8) + char(h.size() & 0xff) + char(h.size() >> 8) + h;
  for (uint32_t t : ids)
    for (size_t k = 0; k < width; ++k) b += char((t >> (8 * k)) & 0xff);
  const fs::path p = scratch_dir() / name;
  spit(p, b);
  return p;
}

// Two runs of eval on the same tokens: results.json identical, the manifests alike but for the data.
void check_same_eval(const fs::path& a, const fs::path& b) {
  CHECK(slurp(a / "results.json") == slurp(b / "results.json"));
  const auto ma = nlohmann::json::parse(slurp(a / "manifest.json")), mb = nlohmann::json::parse(slurp(b / "manifest.json"));
  CHECK(ma["config"]["window_starts"] == mb["config"]["window_starts"]);
  CHECK(ma["config"]["tokenizer"] == mb["config"]["tokenizer"]);
  CHECK(ma["data"]["tokens"] == mb["data"]["tokens"]);
  // the CSV row alike but for the data column and the two timings
  auto row = [](const fs::path& d) {
    std::vector<std::string> f;
    std::stringstream ss(lines(slurp(d / "results.csv")).at(1));
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    f.erase(f.end() - 2, f.end());
    f.erase(f.begin() + 2);
    return f;
  };
  CHECK(row(a) == row(b));
}

TEST_CASE("eval --text: a UTF-8 file tokenized on the fly equals --data on the same tokens (.npy, llm.c)",
          "[cli][eval][data]") {
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
            "in want of a wife \xe2\x80\x94 caf\xc3\xa9 " + std::to_string(i) + ".\nA second line.\n\n";
  const fs::path txt = scratch_dir() / "story.txt";
  spit(txt, text);
  {  // bytes: the tokens are the bytes
    const std::string dir = sharp_model_dir("sharp-llama", bytes_llama());
    std::vector<uint32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    const fs::path npy = write_token_npy("story-bytes.npy", ids, "<i4", 4);
    const fs::path ot = scratch_dir() / "eval-text-bytes", on = scratch_dir() / "eval-npy-bytes";
    const Result rt = run({"eval", "-m", dir, "-p", "lamp:4", "--text", txt.string(), "-n", "3", "--ctx", "40", "-o",
                           ot.string(), "-q"});
    INFO(flat(rt.err));
    REQUIRE(rt.status == 0);
    CHECK(rt.out.find("data         text " + txt.string() + " (" + std::to_string(ids.size()) + " tokens, tokenizer bytes)") !=
          std::string::npos);
    const Result rn = run({"eval", "-m", dir, "-p", "lamp:4", "-d", npy.string(), "-n", "3", "--ctx", "40", "-o",
                           on.string(), "-q"});
    INFO(flat(rn.err));
    REQUIRE(rn.status == 0);
    check_same_eval(ot, on);
    const auto res = nlohmann::json::parse(slurp(ot / "results.json"));
    CHECK(res["summary"]["kl_mean"].get<double>() > 0);  // a policy that changes something
    const auto mt = nlohmann::json::parse(slurp(ot / "manifest.json")), mn = nlohmann::json::parse(slurp(on / "manifest.json"));
    CHECK(mt["config"]["text"] == txt.string());
    CHECK_FALSE(mt["config"].contains("data"));
    CHECK(mn["config"]["data"] == npy.string());
    CHECK(mt["data"]["sources"][0]["kind"] == "text");
    CHECK(mt["data"]["sources"][0]["sha256"] == sha256_file(txt.string()));
    CHECK(mn["data"]["sources"][0]["kind"] == "npy");
    CHECK(mn["data"]["sources"][0]["sha256"] == sha256_file(npy.string()));
  }
  {  // gpt2 (the vocabulary implies it): <|endoftext|> before each document; as uint16 .npy and an llm.c shard
    const std::string dir = model_dir("gpt2-vocab", gpt2_vocab());
    const auto tok = make_tokenizer("gpt2");
    std::vector<uint32_t> ids;
    std::string_view body(text);
    body.remove_suffix(1);  // text[:-1].split("\n\n")
    for (size_t pos = 0; pos <= body.size();) {
      const size_t end = std::min(body.find("\n\n", pos), body.size());
      ids.push_back(kGpt2EndOfText);
      for (uint32_t t : tok->encode(body.substr(pos, end - pos))) ids.push_back(t);
      pos = end + 2;
    }
    const fs::path npy = write_token_npy("story-gpt2.npy", ids, "<u2", 2);
    std::string bin;
    for (int32_t h : std::vector<int32_t>{20240520, 1, int32_t(ids.size())}) bin.append(reinterpret_cast<const char*>(&h), 4);
    bin.append(253 * 4, '\0');
    for (uint32_t t : ids) bin += char(t & 0xff), bin += char(t >> 8);
    const fs::path llmc = scratch_dir() / "story-gpt2.bin";
    spit(llmc, bin);
    const fs::path ot = scratch_dir() / "eval-text-gpt2", on = scratch_dir() / "eval-npy-gpt2",
                   ob = scratch_dir() / "eval-llmc-gpt2";
    for (auto [flag, path, out] : {std::tuple{"--text", txt, ot}, {"-d", npy, on}, {"-d", llmc, ob}}) {
      const Result r = run({"eval", "-m", dir, "-p", "lamp:4", flag, path.string(), "-n", "2", "-o", out.string(), "-q"});
      INFO(flat(r.err));
      REQUIRE(r.status == 0);
    }
    check_same_eval(ot, on);
    check_same_eval(ot, ob);
    CHECK(nlohmann::json::parse(slurp(ob / "manifest.json"))["data"]["sources"][0]["kind"] == "llmc");
  }
}

TEST_CASE("eval --text / .npy / llm.c: bad data is one line and status 2, before any forward pass",
          "[cli][eval][data][errors]") {
  const std::string dir = model_dir("bytes-gpt2", bytes_gpt2());
  const fs::path bad = write_config("bad-utf8.txt", "ok \xc3\x28 then");
  check_error(run({"eval", "-m", dir, "--text", bad.string()}), {"bad-utf8.txt", "not UTF-8: byte offset 3"});
  check_error(run({"eval", "-m", dir, "--text", bad.string(), "-d", "kjv/test"}), {"--text", "--data"});
  check_error(run({"eval", "-m", dir, "--text", (scratch_dir() / "none.txt").string()}), {"none.txt"});
  std::vector<uint32_t> ids(200, 65);
  ids[150] = 300;  // outside the model's 256 (and outside any window of -n 1 --ctx 8: checked all the same)
  const fs::path npy = write_token_npy("oov.npy", ids, "<u2", 2);
  check_error(run({"eval", "-m", dir, "-d", npy.string(), "-n", "1", "--ctx", "8"}),
              {"oov.npy", "token 150 is 300", "[0, 256)"});
  const fs::path f4 = write_token_npy("float.npy", {0, 0}, "<f4", 4);
  check_error(run({"eval", "-m", dir, "-d", f4.string()}), {"float.npy", "npy dtype '<f4'"});
  const fs::path bin = write_config("bad.bin", std::string(1024, '\0'));
  check_error(run({"eval", "-m", dir, "-d", bin.string()}), {"bad.bin", "not an llm.c token shard (magic 0"});
}

TEST_CASE("eval: bad input is one line and status 2", "[cli][eval][errors]") {
  const std::string dir = model_dir("bytes-gpt2", bytes_gpt2());
  check_error(run({"eval", "-m", dir, "--ctx", "73"}), {"--ctx 73", "1..72"});
  check_error(run({"eval", "-m", dir, "-d", "austen/validation", "--seqs", "100000", "--ctx", "64"}),
              {"windows of 65 tokens fit", "100000 requested"});
  check_error(run({"eval", "-m", dir, "-d", "shakespeare/validation"}), {"unknown corpus 'shakespeare'"});
  check_error(run({"eval", "-m", dir, "-d", "dev"}), {"unknown split 'dev'"});
  check_error(run({"eval", "-m", dir, "-t", "gpt2"}), {"50257", "vocabulary is 256"});
  check_error(run({"eval", "-m", dir, "-d", (scratch_dir() / "none.tok").string()}), {"none.tok"});
  check_error(run({"eval", "-m", model_dir("gpt2-small-vocab", [] {
                     ModelConfig c = bytes_gpt2();
                     c.vocab = 300;
                     return c;
                   }())}),
              {"vocabulary 300", "--tokenizer"});
  const fs::path layer9 = write_config("layer9.toml", "[site.\"layer.9.attn.qk\"]\noutput = \"bf16\"\n");
  check_error(run({"eval", "-m", dir, "-p", layer9.string()}), {"layer.9.attn.qk", "2 layers"});
}

// A training configuration: 4 steps of a one-layer LLaMA on bytes (seconds to run).
const char* const kTinyTrain = R"(
[model]
arch = "llama"
layers = 1
heads = 2
dim = 16
ctx = 24
[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"
[train]
steps = 4
batch = 2
val_every = 2
val_seqs = 2
checkpoint_every = 2
)";

TEST_CASE("train: runs a tiny configuration, refuses to overwrite, resumes, reports bad input", "[cli][train]") {
  const fs::path cfg = write_config("train.toml", kTinyTrain);
  const fs::path out = scratch_dir() / "train-run";
  const Result r = run({"train", cfg.string(), "--out", out.string(), "-q"});
  INFO(flat(r.err) << " | " << flat(r.out));
  REQUIRE(r.status == 0);
  CHECK(r.out.find("validation loss") != std::string::npos);
  for (const char* f : {"log.csv", "units.csv", "config.toml", "latest"}) CHECK(fs::exists(out / f));
  CHECK(lines(slurp(out / "log.csv")).size() == 5);
  CHECK(slurp(out / "latest") == "checkpoint-00000004");
  const Model m = load_model((out / "checkpoint-00000004").string());
  CHECK(m.cfg.arch == Arch::llama);
  check_error(run({"train", cfg.string(), "--out", out.string()}), {"already holds a run", "--resume"});
  const Result again = run({"train", cfg.string(), "--resume", out.string(), "-q"});
  CHECK(again.status == 0);  // already complete: nothing to do, nothing changed
  CHECK(lines(slurp(out / "log.csv")).size() == 5);
  const fs::path other = write_config("train-other.toml", slurp(cfg).replace(slurp(cfg).find("steps = 4"), 9, "steps = 5"));
  check_error(run({"train", other.string(), "--resume", out.string()}), {"different configuration"});
  check_error(run({"train", write_config("bad-train.toml", "[train]\nsteps = 3\nbatchsize = 2\n").string(), "-o",
                   (scratch_dir() / "x").string()}),
              {"bad-train.toml:3", "unknown key 'batchsize' in [train]"});
  check_error(run({"train", cfg.string()}), {"no output directory"});
  check_error(run({"train", (scratch_dir() / "none.toml").string(), "-o", "x"}), {"none.toml"});
}

TEST_CASE("lamp sweep: cells, one cell at a time, resume, merge, and what the cells must show", "[cli][lamp]") {
  const std::string dir = sharp_model_dir("sharp-llama", bytes_llama());
  const fs::path out = scratch_dir() / "lamp-sweep";
  const fs::path cfg = write_config("lamp.toml", "model = \"" + dir + "\"\nout = \"" + out.string() +
                                                     "\"\ndata = \"austen/validation\"\nseqs = 2\nctx = 40\n"
                                                     "mu = [4]\nstrict_tau = [0, 0.05]\nrelaxed_tau = [0.3]\n");
  const Result list = run({"lamp", "sweep", cfg.string(), "--cells"});
  REQUIRE(list.status == 0);
  const auto names = lines(list.out);
  REQUIRE(names.size() == 8);  // fp32, uniform ps4, strict 0 (rule, random), strict 0.05 (2), relaxed 0.3 (2)
  CHECK(names[1] == "1\tuniform ps4");
  CHECK(names[2] == "2\tps4 strict tau=0");
  CHECK(names[7] == "7\tps4 relaxed tau=0.3 random");

  REQUIRE(run({"lamp", "sweep", cfg.string(), "--cell", "4", "-q"}).status == 0);
  CHECK(fs::exists(out / "cells" / "4.json"));
  CHECK_FALSE(fs::exists(out / "results.csv"));  // one shard: no merge yet
  const std::string cell4 = slurp(out / "cells" / "4.json");
  const Result all = run({"lamp", "sweep", cfg.string(), "-q"});
  INFO(flat(all.err));
  REQUIRE(all.status == 0);
  const bool cell_kept = slurp(out / "cells" / "4.json") == cell4;  // resumed: the finished cell was not redone
  CHECK(cell_kept);
  const auto res = nlohmann::json::parse(slurp(out / "results.json"))["cells"];
  REQUIRE(res.size() == 8);
  CHECK(res[0]["kl"].get<double>() == 0.0);                  // FP32 against itself
  CHECK(res[1]["kl"].get<double>() > 0);                     // uniform ps4
  CHECK(res[2]["kl"].get<double>() == 0.0);                  // τ = 0: everything recomputed = FP32
  CHECK(res[2]["recompute_rate"].get<double>() == 1.0);
  CHECK(res[4]["recompute_rate"].get<double>() > 0);
  CHECK(res[4]["recompute_rate"].get<double>() < 1);
  CHECK(res[4]["kl"].get<double>() < res[1]["kl"].get<double>());
  CHECK(res[5]["random_control"].get<bool>());
  CHECK(lines(slurp(out / "results.csv")).size() == 9);
  const auto man = nlohmann::json::parse(slurp(out / "manifest.json"));
  CHECK(man["cells"] == 8);
  CHECK(man["cells_missing"].empty());
  CHECK(man["partial"] == false);
  CHECK(man["data"]["windows"] == 2);
  // --merge alone re-merges; a directory holding another sweep's cells is refused
  CHECK(run({"lamp", "sweep", cfg.string(), "--merge", "-q"}).status == 0);
  const fs::path other = write_config("lamp-other.toml", "model = \"" + dir + "\"\nout = \"" + out.string() +
                                                             "\"\ndata = \"austen/validation\"\nseqs = 2\nctx = 40\n"
                                                             "mu = [7]\nstrict_tau = [0]\nrelaxed_tau = []\n");
  check_error(run({"lamp", "sweep", other.string(), "--merge"}), {"another configuration"});
  check_error(run({"lamp", "sweep", cfg.string(), "--cell", "8"}), {"--cell 8", "0..7"});
  check_error(run({"lamp", "sweep", write_config("lamp-bad.toml", "model = \"x\"\nmu = [30]\n").string()}), {"30"});
  check_error(run({"lamp", "sweep", write_config("lamp-bad2.toml", "modle = \"x\"\n").string()}), {"unknown key 'modle'"});
  check_error(run({"lamp", "run", cfg.string()}), {"run"});
}

// A small sweep of the sharp LLaMA model: 2 windows of 40 tokens, μ = 4, one strict and one
// relaxed τ (6 cells: fp32, uniform ps4, strict and relaxed with their random controls); `extra` is appended to the configuration.
fs::path small_sweep(const std::string& name, const fs::path& out, const std::string& extra = "") {
  const std::string dir = sharp_model_dir("sharp-llama", bytes_llama());
  return write_config(name, "model = \"" + dir + "\"\nout = \"" + out.string() +
                                "\"\ndata = \"austen/validation\"\nseqs = 2\nctx = 40\nmu = [4]\n"
                                "strict_tau = [0.05]\nrelaxed_tau = [0.3]\n" + extra);
}

TEST_CASE("lamp sweep: a stored cell is reused only under the same key; --overwrite recomputes", "[cli][lamp]") {
  const fs::path out = scratch_dir() / "lamp-keys";
  REQUIRE(run({"lamp", "sweep", small_sweep("keys.toml", out).string(), "-q"}).status == 0);
  const std::string cell2 = slurp(out / "cells" / "2.json");
  // every input that determines a cell: changing it into the same directory is refused, naming
  // the first differing field of the key (before: "merged 8 of 8 cells", the old numbers)
  const std::string dir = sharp_model_dir("sharp-llama", bytes_llama());
  struct Change {
    std::string toml, field;
  };
  const std::string base = "model = \"" + dir + "\"\nout = \"" + out.string() + "\"\n";
  const std::vector<Change> changes{
      {"data = \"austen/validation\"\nseqs = 3\nctx = 40\n", "data.window_starts"},
      {"data = \"austen/validation\"\nseqs = 2\nctx = 32\n", "data.ctx"},
      {"data = \"kjv/validation\"\nseqs = 2\nctx = 40\n", "data.sources"},
      {"data = \"austen/validation\"\nseqs = 2\nctx = 40\nseed = 1\n", "cell.seed"},
      {"data = \"austen/validation\"\nseqs = 2\nctx = 40\nlength_scaling = true\n", "cell.length_scaling"},
      {"data = \"austen/validation\"\nseqs = 2\nctx = 40\nrecompute = \"bf16\"\n", "cell.recompute"}};
  for (const Change& c : changes) {
    const fs::path cfg = write_config("keys-changed.toml", base + c.toml + "mu = [4]\nstrict_tau = [0.05]\nrelaxed_tau = [0.3]\n");
    INFO(c.field);
    check_error(run({"lamp", "sweep", cfg.string(), "-q"}), {"cells/", "another configuration", c.field, "--overwrite"});
    check_error(run({"lamp", "sweep", cfg.string(), "--merge"}), {"another configuration", c.field});
  }
  const bool untouched = slurp(out / "cells" / "2.json") == cell2;
  CHECK(untouched);
  // another model file (same shapes, other weights): the model's SHA-256 differs
  const std::string other_model = sharp_model_dir("sharp-llama-2", [] {
    ModelConfig c = bytes_llama();
    c.hidden = 48;
    return c;
  }());
  {
    Model m = load_model(other_model);
    m.params.begin()->second.data[0] += 1.0f;
    save_model(m, other_model);
  }
  const fs::path moved = write_config("keys-model.toml", "model = \"" + other_model + "\"\nout = \"" + out.string() +
                                                            "\"\ndata = \"austen/validation\"\nseqs = 2\nctx = 40\n"
                                                            "mu = [4]\nstrict_tau = [0.05]\nrelaxed_tau = [0.3]\n");
  check_error(run({"lamp", "sweep", moved.string(), "-q"}), {"another configuration", "model[1].sha256"});
  // a recompute format read from a file is keyed by what it defines, not by its path
  {
    const fs::path fmt_file = scratch_dir() / "recompute-fmt.toml";
    spit(fmt_file, "name = \"mine\"\nmantissa_bits = 10\nexponent_bits = 8\n");
    const fs::path fout = scratch_dir() / "lamp-keys-fmt";
    const fs::path fcfg = small_sweep("keys-fmt.toml", fout, "recompute = \"" + fmt_file.string() + "\"\n");
    REQUIRE(run({"lamp", "sweep", fcfg.string(), "-q", "--cell", "2"}).status == 0);
    spit(fmt_file, "name = \"mine\"\nmantissa_bits = 12\nexponent_bits = 8\n");
    check_error(run({"lamp", "sweep", fcfg.string(), "-q", "--cell", "2"}), {"cell.recompute_format.mu", "10", "12"});
  }
  // --overwrite recomputes the cells of the new configuration
  const fs::path cfg3 = write_config("keys-3.toml", base + changes[0].toml + "mu = [4]\nstrict_tau = [0.05]\nrelaxed_tau = [0.3]\n");
  REQUIRE(run({"lamp", "sweep", cfg3.string(), "-q", "--overwrite"}).status == 0);
  const auto cell = nlohmann::json::parse(slurp(out / "cells" / "2.json"));
  CHECK(cell["windows"]["kl"].size() == 3);
  CHECK(run({"lamp", "sweep", cfg3.string(), "--merge", "-q"}).status == 0);
  // duplicate grid values would make two cells of one key
  check_error(run({"lamp", "sweep", write_config("dup2.toml", "model = \"x\"\nstrict_tau = [0.1, 0.5, 0.1]\n").string()}),
              {"strict_tau", "0.1 twice"});
  check_error(run({"lamp", "sweep", write_config("dup3.toml", "model = \"x\"\nmu = [4, 7, 4]\n").string()}), {"'mu'", "twice"});
}

TEST_CASE("lamp sweep: merge refuses missing and malformed cells; --allow-partial marks the result", "[cli][lamp]") {
  const fs::path out = scratch_dir() / "lamp-merge";
  const fs::path cfg = small_sweep("merge.toml", out);
  REQUIRE(run({"lamp", "sweep", cfg.string(), "-q"}).status == 0);
  const std::string good = slurp(out / "cells" / "3.json");
  check_error(run({"lamp", "sweep", cfg.string(), "--merge", "--cell", "2"}), {"--merge", "--cell"});
  fs::remove(out / "cells" / "3.json");
  const Result partial = run({"lamp", "sweep", cfg.string(), "--merge"});
  check_error(partial, {"1 of 6 cells are missing (3)", "--allow-partial"});
  const Result allowed = run({"lamp", "sweep", cfg.string(), "--merge", "--allow-partial"});
  REQUIRE(allowed.status == 0);
  CHECK_THAT(allowed.out, Catch::Contains("PARTIAL"));
  const auto man = nlohmann::json::parse(slurp(out / "manifest.json"));
  CHECK(man["partial"] == true);
  CHECK(man["cells_missing"] == nlohmann::json::array({3}));
  CHECK(lines(slurp(out / "results.csv")).size() == 6);  // the header and 5 cells
  // an edited cell: refused by its hash (exp/study.h)
  spit(out / "cells" / "3.json", good + " ");
  check_error(run({"lamp", "sweep", cfg.string(), "--merge"}), {"cells/3.json", "SHA-256"});
  // malformed cell files, their hashes matching (as a faulty writer would leave them): one line
  // naming the file, never a value copied into the CSV
  auto put = [&](const std::string& text) {
    spit(out / "cells" / "3.json", text);
    spit(out / "cells" / "3.json.sha256", mantis::sha256_hex(text) + "  3.json\n");
  };
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(good);
    edit(j);
    put(j.dump());
    return run({"lamp", "sweep", cfg.string(), "--merge"});
  };
  put("[1, 2]");
  check_error(run({"lamp", "sweep", cfg.string(), "--merge"}), {"cells/3.json", "no key"});
  put("{\"key\": ");
  check_error(run({"lamp", "sweep", cfg.string(), "--merge"}), {"cells/3.json", "malformed"});
  check_error(with([](auto& j) { j.erase("kl"); }), {"cells/3.json", "no 'kl'"});
  check_error(with([](auto& j) { j["kl"] = "abc"; }), {"cells/3.json", "'kl' is not a number"});
  check_error(with([](auto& j) { j["kl"] = -0.5; }), {"cells/3.json", "negative"});
  check_error(with([](auto& j) { j["windows"]["kl"][1] = -1; }), {"cells/3.json", "windows.kl[1]"});
  check_error(with([](auto& j) { j["windows"]["kl"].erase(0); }), {"cells/3.json", "windows.kl"});
  check_error(with([](auto& j) { j["per_layer"]["recomputed"][0] = "x"; }), {"cells/3.json", "per_layer.recomputed[0]"});
  check_error(with([](auto& j) { j["health"] = 3; }), {"cells/3.json", "health"});
  // a well-formed cell under another key is a stale cell, named as such
  check_error(with([](auto& j) { j["key"]["cell"]["tau"] = 0.5; }), {"cells/3.json", "cell.tau"});
  put(good);
  CHECK(run({"lamp", "sweep", cfg.string(), "--merge", "-q"}).status == 0);
  CHECK(nlohmann::json::parse(slurp(out / "manifest.json"))["partial"] == false);
}

TEST_CASE("lamp sweep: per-window data, intervals, per-layer rates and site health in every result", "[cli][lamp]") {
  const fs::path out = scratch_dir() / "lamp-stats";
  REQUIRE(run({"lamp", "sweep", small_sweep("stats.toml", out, "").string(), "-q"}).status == 0);
  const auto res = nlohmann::json::parse(slurp(out / "results.json"))["cells"];
  REQUIRE(res.size() == 6);
  for (const auto& r : res) {
    INFO(r["name"]);
    REQUIRE(r["windows"]["kl"].size() == 2);
    // the cell's mean KL is the positions-weighted mean of its windows
    double s = 0, n = 0;
    for (size_t w = 0; w < 2; ++w)
      s += r["windows"]["kl"][w].get<double>() * r["windows"]["positions"][w].get<double>(),
          n += r["windows"]["positions"][w].get<double>();
    CHECK(s / n == Approx(r["kl"].get<double>()).epsilon(1e-12));
    const double lo = r["kl_interval"][0].get<double>(), hi = r["kl_interval"][1].get<double>();
    CHECK(lo <= r["kl"].get<double>() * (1 + 1e-12));
    CHECK(r["kl"].get<double>() <= hi * (1 + 1e-12));
    // per-layer counts sum to the totals
    uint64_t rec = 0, ent = 0;
    for (auto& x : r["per_layer"]["recomputed"]) rec += x.get<uint64_t>();
    for (auto& x : r["per_layer"]["causal_scores"]) ent += x.get<uint64_t>();
    CHECK(rec == r["recomputed"].get<uint64_t>());
    if (r["kind"] == "lamp") CHECK(ent == r["causal_scores"].get<uint64_t>());
    uint64_t wrec = 0;
    for (auto& x : r["windows"]["recomputed"]) wrec += x.get<uint64_t>();
    CHECK(wrec == rec);
    CHECK(r["health"].is_array());
    CHECK(r["nonfinite_positions"] == 0);
  }
  CHECK(res[1]["kl_ratio"].get<double>() == 1.0);  // uniform against itself
  const double ratio = res[2]["kl"].get<double>() > 0 ? res[1]["kl"].get<double>() / res[2]["kl"].get<double>() : 0;
  CHECK(res[2]["kl_ratio"].get<double>() == Approx(ratio).epsilon(1e-12));
  const auto csv = lines(slurp(out / "results.csv"));
  CHECK_THAT(csv[0], Catch::Contains(",kl_nats,kl_lo_nats,kl_hi_nats,kl_ratio,kl_ratio_lo,kl_ratio_hi,"));
  CHECK_THAT(csv[0], Catch::Contains("recompute_rate_l0,recompute_rate_l1"));
  // the result set: the manifest lists every file's SHA-256
  const auto man = nlohmann::json::parse(slurp(out / "manifest.json"));
  CHECK(man["files"]["results.csv"] == sha256_hex(slurp(out / "results.csv")));
  CHECK(man["files"]["results.json"] == sha256_hex(slurp(out / "results.json")));
}

TEST_CASE("lamp sweep and eval: settings that fail inside the parallel passes are clean errors first", "[cli][lamp][errors]") {
  // recompute = "fp64" used to abort (SIGABRT: an InputError thrown inside the attention loop)
  const fs::path out = scratch_dir() / "lamp-fp64";
  const Result r = run({"lamp", "sweep", small_sweep("fp64.toml", out, "recompute = \"fp64\"\n").string(), "-q"});
  check_error(r, {"recompute = \"fp64\"", "binary32"});
  // the same through a policy file, for eval and for training's parallel per-sequence passes
  const std::string dir = sharp_model_dir("sharp-llama", bytes_llama());
  const fs::path pol = write_config("lamp-fp64.toml", "[lamp]\ntau = 0.1\nrecompute = \"fp64\"\n");
  check_error(run({"eval", "-m", dir, "-p", pol.string(), "-d", "austen/validation", "--seqs", "2", "--ctx", "16"}),
              {"fp64", "binary32"});
  const fs::path act = write_config("lampact-fp64.toml", "[lamp_activation]\ntau = 0.1\nrecompute = \"fp64\"\n");
  check_error(run({"eval", "-m", dir, "-p", act.string(), "-d", "austen/validation", "--seqs", "2", "--ctx", "16"}),
              {"fp64", "binary32"});
  const fs::path train = write_config("train-fp64-lamp.toml", "[model]\narch = \"llama\"\nlayers = 1\nheads = 2\n"
                                                              "dim = 16\nctx = 24\n[data]\ntokenizer = \"bytes\"\n"
                                                              "train = \"kjv/test\"\nvalidation = \"kjv/validation\"\n"
                                                              "[train]\nsteps = 1\nbatch = 2\n[precision]\npolicy = \"" +
                                                              pol.string() + "\"\n");
  check_error(run({"train", train.string(), "-o", (scratch_dir() / "train-fp64-lamp").string(), "-q"}),
              {"fp64", "binary32"});
}

TEST_CASE("eval: non-finite logits are said in one line, reported as inf, and counted per site", "[cli][eval]") {
  const std::string dir = sharp_model_dir("sharp-gpt2", bytes_gpt2());
  const fs::path pol = write_config("qk-e2m1.toml", "[site.\"attn.qk\"]\noutput = \"e2m1\"\n");
  const fs::path out = scratch_dir() / "eval-e2m1";
  const Result r = run({"eval", "-m", dir, "-p", pol.string(), "-d", "austen/validation", "--seqs", "2", "--ctx", "32",
                        "-o", out.string()});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("attn.qk    layer 0 overflow"));
  const auto res = nlohmann::json::parse(slurp(out / "results.json"));
  CHECK(res["summary"]["kl_mean"] == "inf");
  CHECK(res["summary"]["ppl_test"] == "inf");
  // most positions (a window's first ones may see only finite scores: attention is causal, and a
  // later key's NaN value does not reach them), counted once in the text and in results.json
  const int bad = res["summary"]["nonfinite_positions"].get<int>();
  CHECK(bad > 32);
  CHECK(bad <= 64);
  CHECK_THAT(r.out, Catch::Contains("NON-FINITE LOGITS at " + std::to_string(bad) + " of 64 positions"));
  REQUIRE(res["health"].size() > 0);
  CHECK(res["health"][0]["site"] == "attn.qk");  // forward order: where the trouble began
  CHECK(res["health"][0]["layer"] == 0);
  CHECK(res["health"][0]["overflow"].get<uint64_t>() > 0);
  const auto csv = lines(slurp(out / "results.csv"));
  CHECK_THAT(csv[1], Catch::Contains(",inf,"));
  // finite-but-huge weights: the FP32 logits themselves overflow; the same treatment
  const fs::path huge = scratch_dir() / "huge-gpt2";
  {
    Model m = load_model(dir);
    for (float& x : m.params.at("ln_f.weight").data) x = 3e38f;  // finite, but the logits exceed binary32
    save_model(m, huge.string());
  }
  const Result h = run({"eval", "-m", huge.string(), "-p", "native", "-d", "austen/validation", "--seqs", "2", "--ctx", "16"});
  REQUIRE(h.status == 0);
  CHECK_THAT(h.out, Catch::Contains("NON-FINITE LOGITS"));
  CHECK_THAT(h.out, Catch::Contains("site health, FP32 reference"));
}

TEST_CASE("eval / lamp --cells: an unwritable standard output is status 2", "[cli][eval][errors]") {
  const std::string dir = model_dir("bytes-gpt2", bytes_gpt2());
  check_error(run({"eval", "-m", dir, "-d", "austen/validation", "--seqs", "1", "--ctx", "16", "-q"}, "", "/dev/full"),
              {"cannot write standard output"});
  const fs::path cfg = write_config("lamp-full.toml", "model = \"" + dir + "\"\nout = \"" +
                                                          (scratch_dir() / "lamp-full").string() +
                                                          "\"\ndata = \"austen/validation\"\nseqs = 1\nctx = 16\n"
                                                          "mu = [4]\nstrict_tau = [0]\nrelaxed_tau = []\n");
  REQUIRE(run({"lamp", "sweep", cfg.string(), "--cells"}).status == 0);
  check_error(run({"lamp", "sweep", cfg.string(), "--cells"}, "", "/dev/full"), {"cannot write standard output"});
}

TEST_CASE("bad data / policy / output paths: the error names the real problem", "[cli][eval][errors]") {
  const std::string dir = model_dir("bytes-gpt2", bytes_gpt2());
  const std::string scratch = scratch_dir().string();
  check_error(run({"eval", "-m", dir, "-d", "/dev/null"}), {"/dev/null is a character device, not a regular file"});
  check_error(run({"eval", "-m", dir, "-d", "/dev/zero"}), {"/dev/zero is a character device, not a regular file"});
  check_error(run({"eval", "-m", dir, "-d", scratch}), {scratch, "is a directory"});
  // A policy that is a directory is an error, not a silent FP32 run.
  check_error(run({"eval", "-m", dir, "-p", scratch}), {"policy file", scratch, "is a directory"});
  check_error(run({"logits", "-m", dir, "-p", scratch, "--tokens", "1 2", "-o", scratch + "/x.npy"}),
              {"policy file", "is a directory"});
  check_error(run({"eval", "-m", dir, "-p", "/dev/zero"}), {"policy file '/dev/zero' is a character device"});
  const fs::path train = write_config("train-dir-policy.toml", "[model]\narch = \"llama\"\nlayers = 1\nheads = 2\n"
                                                               "dim = 16\nctx = 24\n[data]\ntokenizer = \"bytes\"\n"
                                                               "train = \"kjv/test\"\nvalidation = \"kjv/validation\"\n"
                                                               "[train]\nsteps = 1\nbatch = 1\n[precision]\npolicy = \"" +
                                                               scratch + "\"\n");
  check_error(run({"train", train.string(), "-o", scratch + "/train-dir-policy", "-q"}), {"policy file", "is a directory"});
  // Empty paths say so, instead of ": cannot write".
  check_error(run({"logits", "-m", dir, "--tokens", "1 2", "-o", ""}), {"--out", "the path is empty"});
  check_error(run({"eval", "-m", dir, "-o", ""}), {"--out", "the path is empty"});
  check_error(run({"eval", "-m", "", "-o", "x"}), {"--model", "the path is empty"});
  check_error(run({"eval", "-m", dir, "-p", ""}), {"policy file", "the path is empty"});
  // Seeds in a TOML policy: negative or beyond 64 bits is an error, not a wrapped value.
  check_error(run({"eval", "-m", dir, "-p", write_config("seed-neg.toml", "[site.\"attn.qk\"]\nseed = -1\n").string()}),
              {"seed-neg.toml:2", "'seed' = -1"});
  check_error(run({"eval", "-m", dir, "-p",
                   write_config("seed-big.toml", "[site.\"attn.qk\"]\nseed = 18446744073709551616\n").string()}),
              {"seed-big.toml:2", "18446744073709551616"});
  check_error(run({"eval", "-m", dir, "-p", write_config("lamp-seed.toml", "[lamp]\nseed = -5\n").string()}),
              {"lamp-seed.toml", "'seed' must be a non-negative integer"});
}

TEST_CASE("manifests: eval, lamp sweep and train record command, build, CPU, hashes, seeds, timings", "[cli][manifest]") {
  const std::string dir = model_dir("bytes-llama", bytes_llama());
  const fs::path out = scratch_dir() / "eval-manifest";
  const Result r = run({"eval", "-m", dir, "-p", "lamp:4", "-d", "austen/validation", "--seqs", "2", "--ctx", "16",
                        "-o", out.string()});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  CHECK(r.err.find("eval: 2/2 windows (100.0 %)") != std::string::npos);  // the plain progress line
  const auto m = nlohmann::json::parse(slurp(out / "manifest.json"));
  check_manifest_header(m, "mantis eval");
  CHECK(m["command"].get<std::string>().find("eval -m " + dir) != std::string::npos);
  CHECK(m["model_files"][0]["sha256"].is_string());
  CHECK(m["files"]["results.json"] == sha256_hex(slurp(out / "results.json")));

  const fs::path lout = scratch_dir() / "lamp-manifest";
  const fs::path lcfg = write_config("lamp-manifest.toml", "model = \"" + dir + "\"\nout = \"" + lout.string() +
                                                               "\"\ndata = \"austen/validation\"\nseqs = 1\nctx = 16\n"
                                                               "mu = [4]\nstrict_tau = [0]\nrelaxed_tau = []\n");
  const Result l = run({"lamp", "sweep", lcfg.string()});
  INFO(flat(l.err));
  REQUIRE(l.status == 0);
  CHECK(l.err.find("lamp sweep: 4/4 windows (100.0 %)") != std::string::npos);
  const auto lm = nlohmann::json::parse(slurp(lout / "manifest.json"));
  check_manifest_header(lm, "mantis lamp sweep");
  CHECK(lm["seeds"]["bootstrap"] == 0);
  CHECK(lm["config_sha256"] == sha256_hex(slurp(lcfg)));
  CHECK(run({"lamp", "sweep", lcfg.string(), "-q", "--overwrite"}).err.empty());

  const fs::path cfg = write_config("train-manifest.toml", kTinyTrain);
  const fs::path tout = scratch_dir() / "train-manifest";
  const Result t = run({"train", cfg.string(), "--out", tout.string()});
  INFO(flat(t.err));
  REQUIRE(t.status == 0);
  CHECK(t.err.find("train: 4/4 steps (100.0 %)") != std::string::npos);
  const auto tm = nlohmann::json::parse(slurp(tout / "manifest.json"));
  check_manifest_header(tm, "mantis train");
  CHECK(tm["seeds"]["init"] == 1);
  CHECK(tm["files"]["log.csv"] == sha256_file((tout / "log.csv").string()));
  CHECK(tm["data"]["train"]["sources"][0]["sha256"].is_string());
  CHECK(tm["config_sha256"] == sha256_hex(slurp(cfg)));
  // the optimizer and its exact state bytes, as the last checkpoint records them
  const auto tj = nlohmann::json::parse(slurp(tout / "checkpoint-00000004" / "trainer.json"));
  CHECK(tm["optimizer"]["name"] == "adamw");
  CHECK(tm["optimizer"]["state_bytes"] == tj["optimizer"]["state_bytes"]);
  CHECK(!tm.contains("init"));
  const Result q = run({"train", cfg.string(), "--out", (scratch_dir() / "train-manifest-q").string(), "-q"});
  CHECK(q.status == 0);
  CHECK(q.err.empty());
}

TEST_CASE("quantize: a .npy through every preset equals the library, float32 and float64; errors", "[cli][quantize]") {
  const fs::path d = scratch_dir() / "quantize";
  fs::create_directories(d);
  const int64_t shape[] = {5, 3, 24};  // a 3-D array: 15 rows of 24 columns
  std::vector<float> xf(5 * 3 * 24);
  for (size_t i = 0; i < xf.size(); ++i)
    xf[i] = std::ldexp(float(int32_t(random_word(4, 0, i)) % 1000) / 300.0f, int(random_word(4, 1, i) % 12) - 6);
  const std::vector<double> xd(xf.begin(), xf.end());
  write_npy((d / "x32.npy").string(), std::span<const float>(xf), shape);
  write_npy((d / "x64.npy").string(), std::span<const double>(xd), shape);
  for (const std::string& name : scheme_presets()) {
    INFO(name);
    const Scheme s = scheme_lookup(name);
    for (const char* mode : {"rne", "sr"}) {
      const auto r32 = run({"quantize", "--scheme", name, "--in", (d / "x32.npy").string(), "--out",
                            (d / "y32.npy").string(), "--rounding", mode, "--seed", "5", "--json"});
      INFO(flat(r32.err));
      REQUIRE(r32.status == 0);
      std::vector<float> want(xf.size());
      std::vector<double> scales;
      const SchemeStats st = quantize_scheme<float>(s, xf.data(), want.data(), 15, 24, rounding_from_string(mode), 32, 5,
                                                    0, 0, &scales);
      const NpyArray got = read_npy((d / "y32.npy").string());
      CHECK(got.shape == std::vector<int64_t>{5, 3, 24});
      CHECK(mantis::test::same_bits(got.data, want));
      const auto j = nlohmann::json::parse(r32.out);
      CHECK(j["scheme"] == name);
      CHECK(j["blocks"] == st.blocks);
      CHECK(j["clipped"] == st.clipped);
      CHECK(j["scales"].size() == scales.size());
      CHECK(j["dtype"] == "float32");
      const auto r64 = run({"quantize", "--scheme", name, "--in", (d / "x64.npy").string(), "--out",
                            (d / "y64.npy").string(), "--rounding", mode, "--seed", "5"});
      REQUIRE(r64.status == 0);
      std::vector<double> want64(xd.size());
      quantize_scheme<double>(s, xd.data(), want64.data(), 15, 24, rounding_from_string(mode), 32, 5, 0, 0);
      const NpyFloats got64 = read_npy_floats((d / "y64.npy").string());
      CHECK(got64.f8);
      CHECK(mantis::test::same_bits(got64.f8_data, want64));
    }
  }
  // round --in / --out: round_array over the flattened array
  const auto rr = run({"round", "--format", "fp4_e2m1", "--rounding", "sr", "--seed", "3", "--in",
                       (d / "x32.npy").string(), "--out", (d / "r.npy").string()});
  REQUIRE(rr.status == 0);
  std::vector<float> rw(xf.size());
  round_array(xf.data(), rw.data(), rw.size(), format_lookup("fp4_e2m1"),
              RoundOptions{.mode = Rounding::sr, .seed = 3});
  CHECK(mantis::test::same_bits(read_npy((d / "r.npy").string()).data, rw));
  // errors: one line, status 2
  const std::string in = (d / "x32.npy").string(), out = (d / "e.npy").string();
  check_error(run({"quantize", "--scheme", "mxfp5", "--in", in, "--out", out}), {"unknown scheme", "mxfp4"});
  check_error(run({"quantize", "--scheme", "mxfp4", "--in", (d / "none.npy").string(), "--out", out}), {"none.npy"});
  check_error(run({"quantize", "--scheme", "mxfp4", "--in", in, "--out", out, "--rounding", "up"}), {"up"});
  check_error(run({"round", "--format", "fp4_e2m1", "--in", in}), {"--in and --out"});
  check_error(run({"round", "--format", "fp64", "--in", in, "--out", out}), {"binary32"});
  std::string fortran = slurp(d / "x32.npy");
  fortran.replace(fortran.find("False"), 5, "True");
  fortran.insert(fortran.find('\n'), " ");
  spit(d / "f.npy", fortran);
  check_error(run({"quantize", "--scheme", "mxfp4", "--in", (d / "f.npy").string(), "--out", out}), {"Fortran order"});
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("the held-out corpus: named as jargon/<split>, never part of a <split> aggregate", "[data]") {
  const auto tok = make_tokenizer("bytes");
  const TokenData j = load_tokens("jargon/validation", *tok, kSource + "/data");
  REQUIRE(j.sources.size() == 1);
  CHECK(j.tokens.size() > 50000);
  const std::string text(j.tokens.begin(), j.tokens.begin() + 200);
  CHECK(text.starts_with(":"));  // a lexicon entry opens the split
  const TokenData all = load_tokens("validation", *tok, kSource + "/data");
  CHECK(all.sources.size() == std::size(kCorpora));
  for (const auto& s : all.sources) CHECK(s.name.find("jargon") == std::string::npos);
}
