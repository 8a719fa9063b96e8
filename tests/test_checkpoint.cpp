// Checkpoints: every reader (HF GPT-2 and LLaMA, sharded or not, llm.c, llama2.c, our own safetensors) against models the
// tests write themselves, the writer's bit-exact round trip, and every error path by message.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <tuple>
#include <limits>
#include <numeric>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "nn/forward.h"
#include "core/format.h"
#include "nn/model.h"
#include "testutil.h"

using namespace mantis;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// A fresh directory under the system temp dir, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("mantis_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Random full-precision floats in (-2, 2), reproducible from the seed; `keep_bits` < 24 rounds
// them down to that many significant bits (so they are exact in bf16 (8) or fp16 (11)).
Model random_model(const ModelConfig& c, uint64_t seed, int keep_bits = 24) {
  Model m;
  m.cfg = c;
  for (auto& [name, shape] : parameter_shapes(c)) {
    Tensor t;
    t.shape = shape;
    t.data.resize(size_t(t.numel()));
    for (float& x : t.data) {
      const uint64_t r = splitmix(seed);
      x = std::ldexp(float(r >> 40) / float(1 << 24), int(r & 3) - 2) * ((r >> 8) & 1 ? -1.0f : 1.0f);
      if (keep_bits < 24) {
        uint32_t b = std::bit_cast<uint32_t>(x);
        b &= ~((1u << (24 - keep_bits)) - 1);
        x = std::bit_cast<float>(b);
      }
    }
    m.params[name] = std::move(t);
  }
  return m;
}

ModelConfig small_gpt2() {
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.vocab = 11;
  c.ctx = 7;
  c.layers = 2;
  c.heads = c.kv_heads = 2;
  c.dim = 8;
  c.hidden = 32;
  c.gelu_tanh = true;
  c.tied = true;
  return c;
}

ModelConfig small_llama(bool tied) {
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab = 13;
  c.ctx = 6;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.dim = 16;
  c.hidden = 24;
  c.tied = tied;
  return c;
}


void check_same(const Model& got, const Model& want) {
  CHECK(got.cfg.arch == want.cfg.arch);
  CHECK(got.cfg.vocab == want.cfg.vocab);
  CHECK(got.cfg.ctx == want.cfg.ctx);
  CHECK(got.cfg.layers == want.cfg.layers);
  CHECK(got.cfg.heads == want.cfg.heads);
  CHECK(got.cfg.kv_heads == want.cfg.kv_heads);
  CHECK(got.cfg.dim == want.cfg.dim);
  CHECK(got.cfg.hidden == want.cfg.hidden);
  CHECK(got.cfg.gelu_tanh == want.cfg.gelu_tanh);
  CHECK(got.cfg.tied == want.cfg.tied);
  CHECK(got.cfg.norm_eps == want.cfg.norm_eps);
  CHECK(got.cfg.rope_theta == want.cfg.rope_theta);
  REQUIRE(got.params.size() == want.params.size());
  for (auto& [name, t] : want.params) {
    INFO(name);
    auto it = got.params.find(name);
    REQUIRE(it != got.params.end());
    CHECK(it->second.shape == t.shape);
    CHECK(mantis::test::same_bits(it->second.data, t.data));
  }
}

// --- raw byte writers ---------------------------------------------------------------------

struct Bytes {
  std::vector<uint8_t> b;
  void i32(int32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(uint8_t(uint32_t(v) >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
  }
  void f32(float x) { i32(std::bit_cast<int32_t>(x)); }
  void f32s(const std::vector<float>& v) {
    for (float x : v) f32(x);
  }
  void bf16s(const std::vector<float>& v) {  // values must be exact in bf16
    for (float x : v) {
      const uint32_t u = std::bit_cast<uint32_t>(x);
      REQUIRE((u & 0xffffu) == 0);
      b.push_back(uint8_t(u >> 16));
      b.push_back(uint8_t(u >> 24));
    }
  }
  void str(const std::string& s) { b.insert(b.end(), s.begin(), s.end()); }
  void save(const std::string& path) const {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    REQUIRE(o.good());
  }
};

void write_text(const std::string& path, const std::string& s) {
  std::ofstream o(path, std::ios::binary);
  o << s;
}

uint16_t to_f16(float x) {  // exact conversion of values representable in binary16 (normal range)
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) == 0) return sign;
  const int e = int((u >> 23) & 0xff) - 127;
  REQUIRE(e >= -14);
  REQUIRE(e <= 15);
  REQUIRE((u & 0x1fffu) == 0);
  return uint16_t(sign | uint16_t((e + 15) << 10) | uint16_t((u >> 13) & 0x3ffu));
}

struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

StTensor st_f32(const std::string& name, const Tensor& t) {
  Bytes b;
  b.f32s(t.data);
  return {name, "F32", t.shape, b.b};
}

std::vector<uint8_t> st_file(const std::vector<StTensor>& ts) {
  json h = json::object();
  uint64_t off = 0;
  for (auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  h["__metadata__"] = {{"format", "pt"}};
  const std::string s = h.dump();
  Bytes out;
  out.u64(s.size());
  out.str(s);
  for (auto& t : ts) out.b.insert(out.b.end(), t.bytes.begin(), t.bytes.end());
  return out.b;
}

void save_bytes(const std::string& path, const std::vector<uint8_t>& b) { Bytes{b}.save(path); }

// --- format writers ------------------------------------------------------------------------

Tensor transposed(const Tensor& t) {  // [out,in] → [in,out]
  const int64_t out = t.shape[0], in = t.shape[1];
  Tensor u;
  u.shape = {in, out};
  u.data.resize(t.data.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) u.data[size_t(i * out + o)] = t.data[size_t(o * in + i)];
  return u;
}

struct HfOptions {
  bool prefix = true;
  bool buffers = true;
  bool lm_head = false;
  std::string dtype = "F32";
};

std::vector<StTensor> hf_tensors(const Model& m, const HfOptions& o) {
  const std::string p = o.prefix ? "transformer." : "";
  std::vector<StTensor> ts;
  auto add = [&](const std::string& name, const Tensor& t) {
    if (o.dtype == "F32") {
      ts.push_back(st_f32(name, t));
    } else if (o.dtype == "BF16") {
      Bytes b;
      b.bf16s(t.data);
      ts.push_back({name, "BF16", t.shape, b.b});
    } else {
      Bytes b;
      for (float x : t.data) {
        const uint16_t h = to_f16(x);
        b.b.push_back(uint8_t(h));
        b.b.push_back(uint8_t(h >> 8));
      }
      ts.push_back({name, "F16", t.shape, b.b});
    }
  };
  for (auto& [name, t] : m.params) {
    const bool conv = name.find(".attn.c_attn.weight") != std::string::npos ||
                      name.find(".attn.c_proj.weight") != std::string::npos ||
                      name.find(".mlp.c_fc.weight") != std::string::npos ||
                      name.find(".mlp.c_proj.weight") != std::string::npos;
    const std::string hf = name == "wte" ? "wte.weight" : name == "wpe" ? "wpe.weight" : name;
    add(p + hf, conv ? transposed(t) : t);
  }
  if (o.buffers) {
    const int64_t T = m.cfg.ctx;
    for (int l = 0; l < m.cfg.layers; ++l) {
      Tensor mask;
      mask.shape = {1, 1, T, T};
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) mask.data.push_back(j <= i ? 1.0f : 0.0f);
      ts.push_back(st_f32(p + "h." + std::to_string(l) + ".attn.bias", mask));
      Tensor mb;
      mb.shape = {};
      mb.data = {-1e4f};
      ts.push_back(st_f32(p + "h." + std::to_string(l) + ".attn.masked_bias", mb));
    }
  }
  if (o.lm_head) add("lm_head.weight", m.params.at("wte"));
  return ts;
}

void write_hf(const std::string& dir, const Model& m, const HfOptions& o = {}) {
  fs::create_directories(dir);
  json c = {{"model_type", "gpt2"},
            {"n_embd", m.cfg.dim},
            {"n_layer", m.cfg.layers},
            {"n_head", m.cfg.heads},
            {"n_positions", m.cfg.ctx},
            {"n_ctx", m.cfg.ctx},
            {"vocab_size", m.cfg.vocab},
            {"n_inner", nullptr},
            {"activation_function", m.cfg.gelu_tanh ? "gelu_new" : "gelu"},
            {"layer_norm_epsilon", 1e-5},
            {"architectures", {"GPT2LMHeadModel"}}};
  if (m.cfg.hidden != 4 * m.cfg.dim) c["n_inner"] = m.cfg.hidden;
  write_text(dir + "/config.json", c.dump(2));
  save_bytes(dir + "/model.safetensors", st_file(hf_tensors(m, o)));
}

// llm.c's layout: 256-int header, then 16 stacked tensors; wte padded to Vp rows.
Bytes llmc_bytes(const Model& m, int Vp, int version = 3) {
  const ModelConfig& c = m.cfg;
  Bytes b;
  std::vector<int32_t> h(256, 0);
  h[0] = 20240326;
  h[1] = version;
  h[2] = c.ctx;
  h[3] = c.vocab;
  h[4] = c.layers;
  h[5] = c.heads;
  h[6] = c.dim;
  h[7] = Vp;
  for (int32_t v : h) b.i32(v);
  std::vector<float> all;
  auto put = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
  put(m.params.at("wte").data);
  for (int64_t i = 0; i < int64_t(Vp - c.vocab) * c.dim; ++i)
    all.push_back(version == 3 ? std::numeric_limits<float>::quiet_NaN() : 0.0f);  // padding: dropped
  put(m.params.at("wpe").data);
  for (const char* n : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                        "mlp.c_proj.weight", "mlp.c_proj.bias"})
    for (int l = 0; l < c.layers; ++l) put(m.params.at("h." + std::to_string(l) + "." + n).data);
  put(m.params.at("ln_f.weight").data);
  put(m.params.at("ln_f.bias").data);
  if (version == 3) b.f32s(all);
  else b.bf16s(all);
  return b;
}

// llama2.c's legacy layout: 7 int32, then fp32 tensors (freq_cis included, wcls if untied).
Bytes llama2c_bytes(const Model& m) {
  const ModelConfig& c = m.cfg;
  Bytes b;
  for (int32_t v : {c.dim, c.hidden, c.layers, c.heads, c.kv_heads, c.tied ? c.vocab : -c.vocab, c.ctx}) b.i32(v);
  b.f32s(m.params.at("tok_embeddings").data);
  for (const char* n : {"attention_norm", "attention.wq", "attention.wk", "attention.wv", "attention.wo", "ffn_norm",
                        "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"})
    for (int l = 0; l < c.layers; ++l) b.f32s(m.params.at("layers." + std::to_string(l) + "." + n).data);
  b.f32s(m.params.at("norm").data);
  const int hs = c.head_size();
  for (int part = 0; part < 2; ++part)
    for (int t = 0; t < c.ctx; ++t)
      for (int i = 0; i < hs / 2; ++i) {
        const double f = 1.0 / std::pow(10000.0, 2.0 * i / hs);
        b.f32(float(part == 0 ? std::cos(t * f) : std::sin(t * f)));
      }
  if (!c.tied) b.f32s(m.params.at("output").data);
  return b;
}

// Our own format, but with the tensors given (for corrupt-content tests).
void write_own(const std::string& dir, const ModelConfig& c, const std::vector<StTensor>& ts) {
  fs::create_directories(dir);
  json j = {{"mantis_format", 1}, {"arch", c.arch == Arch::gpt2 ? "gpt2" : "llama"},
            {"vocab", c.vocab},   {"ctx", c.ctx},
            {"layers", c.layers}, {"heads", c.heads},
            {"kv_heads", c.kv_heads}, {"dim", c.dim},
            {"hidden", c.hidden}, {"gelu_tanh", c.gelu_tanh},
            {"tied", c.tied},     {"norm_eps", 1e-5},
            {"rope_theta", 10000.0}};
  write_text(dir + "/config.json", j.dump(2));
  save_bytes(dir + "/model.safetensors", st_file(ts));
}

std::vector<StTensor> own_tensors(const Model& m) {
  std::vector<StTensor> ts;
  for (auto& [name, t] : m.params) ts.push_back(st_f32(name, t));
  return ts;
}

std::string error_of(const std::string& path) {
  return mantis::test::error_of([&] { load_model(path); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("parameter_shapes: names, order and counts of the reference models") {
  ModelConfig g;  // defaults: GPT-2 124M
  int64_t n = 0;
  for (auto& [name, shape] : parameter_shapes(g)) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    n += k;
  }
  CHECK(n == 124439808);
  const auto s = parameter_shapes(small_gpt2());
  REQUIRE(s.size() == 2 + 12 * 2 + 2);
  CHECK(s.front().first == "wte");
  CHECK(s[1].first == "wpe");
  CHECK(s[2].first == "h.0.ln_1.weight");
  CHECK(s[4].first == "h.0.attn.c_attn.weight");
  CHECK(s[4].second == std::vector<int64_t>{24, 8});
  CHECK(s[12].second == std::vector<int64_t>{8, 32});  // h.0.mlp.c_proj.weight [C,H]
  CHECK(s.back().first == "ln_f.bias");

  // llama2.c's stories260K: dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512 → 260,032.
  ModelConfig l = small_llama(true);
  l.dim = 64, l.hidden = 172, l.layers = 5, l.heads = 8, l.kv_heads = 4, l.vocab = 512, l.ctx = 512;
  n = 0;
  for (auto& [name, shape] : parameter_shapes(l)) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    n += k;
  }
  CHECK(n == 260032);
  const auto ls = parameter_shapes(l);
  CHECK(ls[3].first == "layers.0.attention.wk");
  CHECK(ls[3].second == std::vector<int64_t>{32, 64});
  CHECK(ls.back().first == "norm");
  l.tied = false;
  CHECK(parameter_shapes(l).back().first == "output");
}

TEST_CASE("validate(ModelConfig) names the field") {
  auto err = [](ModelConfig c) { return mantis::test::error_of([&] { validate(c); }); };
  CHECK(err(small_gpt2()) == "(no error)");
  CHECK(err(small_llama(false)) == "(no error)");
  ModelConfig c = small_gpt2();
  c.vocab = 0;
  CHECK_THAT(err(c), Contains("vocab = 0 must be positive"));
  c = small_gpt2();
  c.layers = -1;
  CHECK_THAT(err(c), Contains("layers = -1"));
  c = small_gpt2();
  c.hidden = 0;
  CHECK_THAT(err(c), Contains("hidden"));
  c = small_gpt2();
  c.dim = 10, c.heads = c.kv_heads = 4;
  CHECK_THAT(err(c), Contains("dim 10 is not divisible by heads 4"));
  c = small_gpt2();
  c.kv_heads = 1;
  CHECK_THAT(err(c), Contains("kv_heads 1 must equal heads 2"));
  c = small_gpt2();
  c.tied = false;
  CHECK_THAT(err(c), Contains("tied"));
  c = small_llama(true);
  c.kv_heads = 3;
  CHECK_THAT(err(c), Contains("heads 4 is not divisible by kv_heads 3"));
  c = small_llama(true);
  c.dim = 12, c.heads = 4, c.kv_heads = 4;  // head size 3
  CHECK_THAT(err(c), Contains("must be even for RoPE"));
  c = small_llama(true);
  c.norm_eps = 0;
  CHECK_THAT(err(c), Contains("norm_eps"));
  c = small_llama(true);
  c.rope_theta = std::numeric_limits<float>::infinity();
  CHECK_THAT(err(c), Contains("rope_theta"));
}

TEST_CASE("validate(Model) names the offending tensor") {
  auto err = [](const Model& m) { return mantis::test::error_of([&] { validate(m); }); };
  const Model good = random_model(small_gpt2(), 1);
  CHECK(err(good) == "(no error)");
  Model m = good;
  m.params.erase("h.1.ln_2.bias");
  CHECK(err(m) == "tensor h.1.ln_2.bias: missing");
  m = good;
  m.params["h.1.attn.c_attn.weight"].shape = {24, 7};
  m.params["h.1.attn.c_attn.weight"].data.resize(24 * 7);
  CHECK(err(m) == "tensor h.1.attn.c_attn.weight: shape [24,7], expected [24,8]");
  m = good;
  m.params["wpe"].data.pop_back();
  CHECK_THAT(err(m), Contains("tensor wpe: holds 55 values"));
  m = good;
  m.params["h.0.mlp.c_fc.bias"].data[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(err(m), Contains("tensor h.0.mlp.c_fc.bias: non-finite value nan at flat index 3"));
  m = good;
  m.params["ln_f.weight"].data[0] = -std::numeric_limits<float>::infinity();
  CHECK_THAT(err(m), Contains("tensor ln_f.weight: non-finite value -inf"));
  m = good;
  m.params["lm_head"] = good.params.at("wte");
  CHECK_THAT(err(m), Contains("tensor lm_head: unexpected"));
  m = good;
  m.cfg.dim = 9;
  CHECK_THAT(err(m), Contains("dim 9 is not divisible by heads 2"));
}

TEST_CASE("own format: save/load round trip is bit-exact") {
  TempDir tmp;
  for (const ModelConfig& c : {small_gpt2(), small_llama(true), small_llama(false)}) {
    Model m = random_model(c, 42);
    m.cfg.norm_eps = 1e-6f;
    m.cfg.rope_theta = 500000.0f;
    m.params.begin()->second.data[0] = -0.0f;  // signed zero survives
    m.params.begin()->second.data[1] = std::numeric_limits<float>::denorm_min();
    const std::string dir = tmp / (c.arch == Arch::gpt2 ? "gpt2/nested" : c.tied ? "llama_tied" : "llama_untied");
    save_model(m, dir);
    CHECK(fs::is_regular_file(dir + "/model.safetensors"));
    CHECK(fs::is_regular_file(dir + "/config.json"));
    CHECK(!fs::exists(dir + "/.model.safetensors.tmp"));
    CHECK(!fs::exists(dir + "/.config.json.tmp"));
    check_same(load_model(dir), m);
    check_same(load_model(dir + "/model.safetensors"), m);  // the file, with its sibling config.json
    // The config is readable JSON naming the format.
    std::ifstream in(dir + "/config.json");
    const json j = json::parse(in);
    CHECK(j["mantis_format"] == 1);
    CHECK(j["arch"] == (c.arch == Arch::gpt2 ? "gpt2" : "llama"));
    CHECK(j["norm_eps"].get<double>() == 1e-6);
    // Saving again over the same directory replaces both files.
    Model m2 = random_model(c, 43);
    save_model(m2, dir);
    check_same(load_model(dir), m2);
  }
}

TEST_CASE("own format: save_model refuses an invalid model and writes nothing") {
  TempDir tmp;
  Model m = random_model(small_gpt2(), 5);
  m.params["wte"].data[7] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(save_model(m, tmp / "out"), Contains("tensor wte: non-finite"));
  CHECK(!fs::exists(tmp / "out/model.safetensors"));
}

TEST_CASE("Hugging Face GPT-2 directory: prefixes, Conv1D transpose, buffers, lm_head") {
  TempDir tmp;
  const Model m = random_model(small_gpt2(), 7);
  SECTION("transformer. prefix, attn.bias buffers") {
    write_hf(tmp / "hf", m, {.prefix = true, .buffers = true});
    check_same(load_model(tmp / "hf"), m);
  }
  SECTION("no prefix, tied lm_head present") {
    write_hf(tmp / "hf", m, {.prefix = false, .buffers = true, .lm_head = true});
    check_same(load_model(tmp / "hf"), m);
    check_same(load_model(tmp / "hf/model.safetensors"), m);
  }
  SECTION("exact GELU, explicit n_inner, n_ctx only") {
    ModelConfig c = small_gpt2();
    c.gelu_tanh = false;
    c.hidden = 20;
    const Model e = random_model(c, 8);
    write_hf(tmp / "hf", e, {.prefix = false, .buffers = false});
    json j;
    {
      std::ifstream in(tmp / "hf/config.json");
      j = json::parse(in);
    }
    j.erase("n_positions");
    write_text(tmp / "hf/config.json", j.dump());
    check_same(load_model(tmp / "hf"), e);
  }
  SECTION("BF16 and F16 weights convert exactly") {
    const Model b = random_model(small_gpt2(), 9, 8);
    write_hf(tmp / "bf", b, {.dtype = "BF16"});
    check_same(load_model(tmp / "bf"), b);
    const Model h = random_model(small_gpt2(), 10, 11);
    write_hf(tmp / "f16", h, {.dtype = "F16"});
    check_same(load_model(tmp / "f16"), h);
  }
  SECTION("lm_head that differs from wte is refused") {
    auto ts = hf_tensors(m, {});
    Tensor head = m.params.at("wte");
    head.data[5] += 1;
    ts.push_back(st_f32("lm_head.weight", head));
    write_hf(tmp / "hf", m);
    save_bytes(tmp / "hf/model.safetensors", st_file(ts));
    CHECK_THAT(error_of(tmp / "hf"), Contains("lm_head.weight differs from wte"));
  }
  SECTION("Conv1D weight of the wrong shape names the file's tensor and layout") {
    auto ts = hf_tensors(m, {});
    for (auto& t : ts)
      if (t.name == "transformer.h.1.attn.c_attn.weight") {
        t.shape = {7, 24};
        t.bytes.resize(7 * 24 * 4);
      }
    write_hf(tmp / "hf", m);
    save_bytes(tmp / "hf/model.safetensors", st_file(ts));
    CHECK_THAT(error_of(tmp / "hf"),
               Contains("tensor transformer.h.1.attn.c_attn.weight: shape [7,24], expected [8,24] (Conv1D [in,out])"));
  }
  SECTION("missing and unexpected tensors") {
    auto ts = hf_tensors(m, {});
    std::erase_if(ts, [](const StTensor& t) { return t.name == "transformer.h.0.mlp.c_fc.bias"; });
    write_hf(tmp / "hf", m);
    save_bytes(tmp / "hf/model.safetensors", st_file(ts));
    CHECK_THAT(error_of(tmp / "hf"), Contains("tensor h.0.mlp.c_fc.bias: missing"));
    ts = hf_tensors(m, {});
    ts.push_back(st_f32("transformer.h.2.ln_1.weight", m.params.at("ln_f.weight")));
    save_bytes(tmp / "hf/model.safetensors", st_file(ts));
    CHECK_THAT(error_of(tmp / "hf"), Contains("tensor transformer.h.2.ln_1.weight: unexpected"));
  }
  SECTION("NaN weight names the tensor") {
    Model bad = m;
    bad.params["h.1.mlp.c_proj.bias"].data[2] = std::numeric_limits<float>::quiet_NaN();
    write_hf(tmp / "hf", bad);
    CHECK_THAT(error_of(tmp / "hf"), Contains("tensor h.1.mlp.c_proj.bias: non-finite value nan"));
  }
  SECTION("unsupported configs") {
    write_hf(tmp / "hf", m);
    json j;
    {
      std::ifstream in(tmp / "hf/config.json");
      j = json::parse(in);
    }
    json k = j;
    k["activation_function"] = "relu";
    write_text(tmp / "hf/config.json", k.dump());
    CHECK_THAT(error_of(tmp / "hf"), Contains("activation_function \"relu\" not supported"));
    k = j;
    k["model_type"] = "bert";
    write_text(tmp / "hf/config.json", k.dump());
    CHECK_THAT(error_of(tmp / "hf"), Contains("model_type \"bert\" not supported (Hugging Face: gpt2, llama, mistral)"));
    k = j;
    k["n_head"] = 3;
    write_text(tmp / "hf/config.json", k.dump());
    CHECK_THAT(error_of(tmp / "hf"), Contains("dim 8 is not divisible by heads 3"));
    k = j;
    k.erase("n_embd");
    write_text(tmp / "hf/config.json", k.dump());
    CHECK_THAT(error_of(tmp / "hf"), Contains("key \"n_embd\" missing"));
  }
}

TEST_CASE("llm.c gpt2 .bin: fp32 (version 3) and bf16 (version 5), padded vocab dropped") {
  TempDir tmp;
  ModelConfig c = small_gpt2();
  c.hidden = 4 * c.dim;
  const Model m = random_model(c, 11);
  llmc_bytes(m, 16).save(tmp / "model.bin");
  check_same(load_model(tmp / "model.bin"), m);
  const Model b = random_model(c, 12, 8);
  llmc_bytes(b, 11, 5).save(tmp / "model_bf16.bin");
  check_same(load_model(tmp / "model_bf16.bin"), b);

  SECTION("truncated") {
    Bytes t = llmc_bytes(m, 16);
    t.b.resize(t.b.size() - 4);
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("truncated"));
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("t.bin"));
    t.b.resize(600);
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("truncated llm.c checkpoint: 600 bytes"));
  }
  SECTION("trailing bytes") {
    Bytes t = llmc_bytes(m, 16);
    t.f32(0);
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("wrong size"));
  }
  SECTION("unsupported version") {
    Bytes t = llmc_bytes(m, 16);
    t.b[4] = 4;
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("llm.c checkpoint version 4 not supported"));
  }
  SECTION("bad magic") {
    Bytes t = llmc_bytes(m, 16);
    for (int i = 0; i < 4; ++i) t.b[size_t(i)] = uint8_t(20240426u >> (8 * i));  // a near miss
    t.save(tmp / "t.bin");
    const std::string e = error_of(tmp / "t.bin");
    CHECK_THAT(e, Contains("no llm.c magic 20240326"));
    CHECK_THAT(e, Contains("not a llama2.c checkpoint"));
  }
  SECTION("another llm.c file kind") {
    Bytes t = llmc_bytes(m, 16);
    t.b[0] += 2;  // 20240328: the tokenizer
    t.save(tmp / "tok.bin");
    CHECK_THAT(error_of(tmp / "tok.bin"), Contains("an llm.c tokenizer"));
  }
  SECTION("inconsistent header") {
    Bytes t = llmc_bytes(m, 16);
    t.b[4 * 5] = 3;  // heads 3, dim 8
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("dim 8 is not divisible by heads 3"));
  }
  SECTION("NaN weight names the tensor") {
    Model bad = m;
    bad.params["h.1.mlp.c_fc.weight"].data[17] = std::numeric_limits<float>::infinity();
    llmc_bytes(bad, 16).save(tmp / "nan.bin");
    CHECK_THAT(error_of(tmp / "nan.bin"), Contains("tensor h.1.mlp.c_fc.weight: non-finite value inf"));
  }
}

TEST_CASE("llama2.c legacy .bin: tied and untied classifier, GQA") {
  TempDir tmp;
  for (bool tied : {true, false}) {
    INFO("tied " << tied);
    const Model m = random_model(small_llama(tied), tied ? 21 : 22);
    llama2c_bytes(m).save(tmp / "stories.bin");
    check_same(load_model(tmp / "stories.bin"), m);
  }
  const Model m = random_model(small_llama(false), 23);
  SECTION("truncated") {
    Bytes t = llama2c_bytes(m);
    t.b.resize(t.b.size() - 1);
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("not a llama2.c checkpoint: size"));
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("expected " + std::to_string(t.b.size() + 1)));
  }
  SECTION("untied flag flipped: sizes no longer match") {
    Bytes t = llama2c_bytes(m);
    t.b[20] = uint8_t(13);  // vocab +13: tied, so wcls is unaccounted for
    t.b[21] = t.b[22] = t.b[23] = 0;
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("not a llama2.c checkpoint: size"));
  }
  SECTION("garbage is not a checkpoint") {
    Bytes t;
    t.str("hello, this is plainly a text file and not any checkpoint\n");
    t.save(tmp / "g.txt");
    CHECK_THAT(error_of(tmp / "g.txt"), Contains("not a llama2.c checkpoint"));
    Bytes s;
    s.str("abc");
    s.save(tmp / "s.bin");
    CHECK_THAT(error_of(tmp / "s.bin"), Contains("too short"));
    Bytes e;
    e.save(tmp / "e.bin");
    CHECK_THAT(error_of(tmp / "e.bin"), Contains("empty file"));
  }
  SECTION("head size odd for RoPE") {
    Bytes t = llama2c_bytes(m);
    t.b[12] = 16;  // heads 16 → head size 1
    t.b[16] = 16;
    t.save(tmp / "t.bin");
    CHECK_THAT(error_of(tmp / "t.bin"), Contains("must be even for RoPE"));
  }
  SECTION("NaN weight names the tensor") {
    Model bad = m;
    bad.params["layers.1.feed_forward.w3"].data[0] = std::numeric_limits<float>::quiet_NaN();
    llama2c_bytes(bad).save(tmp / "nan.bin");
    CHECK_THAT(error_of(tmp / "nan.bin"), Contains("tensor layers.1.feed_forward.w3: non-finite value nan"));
  }
}

TEST_CASE("safetensors reader: every corrupt-file path is named") {
  TempDir tmp;
  const ModelConfig c = small_gpt2();
  const Model m = random_model(c, 31);
  const std::string dir = tmp / "own";
  write_own(dir, c, own_tensors(m));
  check_same(load_model(dir), m);  // the test writer itself is sound
  const std::string st = dir + "/model.safetensors";

  SECTION("header length beyond the file") {
    Bytes b;
    b.u64(1000000);
    b.str("{}");
    b.save(st);
    CHECK_THAT(error_of(dir), Contains("safetensors header length 1000000 exceeds"));
  }
  SECTION("shorter than the length prefix") {
    Bytes b;
    b.str("abc");
    b.save(st);
    CHECK_THAT(error_of(dir), Contains("truncated: 3 bytes"));
  }
  SECTION("JSON garbage") {
    Bytes b;
    b.u64(9);
    b.str("{\"a\": [1,");
    b.save(st);
    CHECK_THAT(error_of(dir), Contains("safetensors header is not valid JSON"));
    Bytes a;
    a.u64(2);
    a.str("[]");
    a.save(st);
    CHECK_THAT(error_of(dir), Contains("not a JSON object"));
  }
  SECTION("truncated data") {
    auto bytes = st_file(own_tensors(m));
    bytes.resize(bytes.size() - 3);
    save_bytes(st, bytes);
    CHECK_THAT(error_of(dir), Contains("outside the"));
    CHECK_THAT(error_of(dir), Contains("truncated file?"));
  }
  SECTION("wrong dtype, by name") {
    auto ts = own_tensors(m);
    for (auto& t : ts)
      if (t.name == "wpe") t.dtype = "I32";
    write_own(dir, c, ts);
    CHECK_THAT(error_of(dir), Contains("tensor wpe: dtype I32 not supported (F32, F16, BF16)"));
    for (auto& t : ts)
      if (t.name == "wpe") t.dtype = "F33";
    write_own(dir, c, ts);
    CHECK_THAT(error_of(dir), Contains("tensor wpe: unknown dtype \"F33\""));
  }
  SECTION("size does not match shape × dtype") {
    auto ts = own_tensors(m);
    for (auto& t : ts)
      if (t.name == "wpe") t.dtype = "F16";
    write_own(dir, c, ts);
    CHECK_THAT(error_of(dir), Contains("tensor wpe: data_offsets"));
    CHECK_THAT(error_of(dir), Contains("F16 shape [7,8] needs 112"));
  }
  SECTION("overlapping tensors") {
    auto bytes = st_file(own_tensors(m));
    const uint64_t n = bytes[0] | uint64_t(bytes[1]) << 8 | uint64_t(bytes[2]) << 16;
    json h = json::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + long(n)));
    auto off = h["ln_f.bias"]["data_offsets"];
    h["ln_f.weight"]["data_offsets"] = off;  // same size, same place
    const std::string s = h.dump();
    Bytes b;
    b.u64(s.size());
    b.str(s);
    b.b.insert(b.b.end(), bytes.begin() + 8 + long(n), bytes.end());
    b.save(st);
    CHECK_THAT(error_of(dir), Contains("overlap"));
  }
  SECTION("entry without data_offsets") {
    Bytes b;
    const std::string s = R"({"wte": {"dtype": "F32", "shape": [2]}})";
    b.u64(s.size());
    b.str(s);
    b.save(st);
    CHECK_THAT(error_of(dir), Contains("tensor wte: header entry needs dtype, shape and data_offsets"));
  }
  SECTION("wrong shape names the tensor") {
    auto ts = own_tensors(m);
    for (auto& t : ts)
      if (t.name == "h.1.attn.c_attn.weight") {
        t.shape = {24, 7};
        t.bytes.resize(24 * 7 * 4);
      }
    write_own(dir, c, ts);
    CHECK_THAT(error_of(dir), Contains("tensor h.1.attn.c_attn.weight: shape [24,7], expected [24,8]"));
  }
  SECTION("missing tensor") {
    auto ts = own_tensors(m);
    std::erase_if(ts, [](const StTensor& t) { return t.name == "ln_f.bias"; });
    write_own(dir, c, ts);
    CHECK_THAT(error_of(dir), Contains("tensor ln_f.bias: missing"));
  }
  SECTION("NaN weight names the tensor") {
    Model bad = m;
    bad.params["h.0.attn.c_proj.weight"].data[9] = std::numeric_limits<float>::quiet_NaN();
    write_own(dir, c, own_tensors(bad));
    CHECK_THAT(error_of(dir), Contains("tensor h.0.attn.c_proj.weight: non-finite value nan at flat index 9"));
  }
}

TEST_CASE("config.json problems are named") {
  TempDir tmp;
  const ModelConfig c = small_gpt2();
  const Model m = random_model(c, 41);
  const std::string dir = tmp / "own";
  save_model(m, dir);
  json j;
  {
    std::ifstream in(dir + "/config.json");
    j = json::parse(in);
  }
  auto with = [&](const std::function<void(json&)>& edit) {
    json k = j;
    edit(k);
    write_text(dir + "/config.json", k.dump());
    return error_of(dir);
  };
  CHECK_THAT(with([](json& k) { k["arch"] = "mamba"; }), Contains("arch \"mamba\" unknown (gpt2, llama)"));
  CHECK_THAT(with([](json& k) { k["heads"] = 3; k["kv_heads"] = 3; }), Contains("dim 8 is not divisible by heads 3"));
  CHECK_THAT(with([](json& k) { k["mantis_format"] = 2; }), Contains("mantis_format 2 not supported"));
  CHECK_THAT(with([](json& k) { k.erase("ctx"); }), Contains("key \"ctx\" missing"));
  CHECK_THAT(with([](json& k) { k["dim"] = "8"; }), Contains("key \"dim\" must be an integer"));
  CHECK_THAT(with([](json& k) { k["dimm"] = 8; }), Contains("unknown key \"dimm\""));
  CHECK_THAT(with([](json& k) { k["ctx"] = 8; }), Contains("tensor wpe: shape [7,8], expected [8,8]"));
  CHECK_THAT(with([](json& k) { k.erase("mantis_format"); k.erase("arch"); }),
             Contains("neither a mantis config"));
  write_text(dir + "/config.json", "{ this is not json");
  CHECK_THAT(error_of(dir), Contains("config.json: not valid JSON"));
  fs::remove(dir + "/config.json");
  CHECK_THAT(error_of(dir), Contains("no config.json"));
  CHECK_THAT(error_of(tmp / "does_not_exist"), Contains("no such file or directory"));
  save_model(m, dir);
  fs::remove(dir + "/model.safetensors");
  CHECK_THAT(error_of(dir), Contains("model.safetensors: no such file"));
  write_text(dir + "/pytorch_model.bin", "PK");
  CHECK_THAT(error_of(dir), Contains("pytorch_model.bin (pickle) is not read"));
  // a FIFO or a directory where a file belongs is named as such (it was "no such file")
  fs::remove(dir + "/pytorch_model.bin");
  REQUIRE(::mkfifo((dir + "/model.safetensors").c_str(), 0600) == 0);
  CHECK_THAT(error_of(dir), Contains("model.safetensors is a FIFO (named pipe), not a regular file"));
  fs::remove(dir + "/model.safetensors");
  fs::create_directory(dir + "/model.safetensors");
  CHECK_THAT(error_of(dir), Contains("model.safetensors is a directory, not a regular file"));
  fs::remove(dir + "/config.json");
  REQUIRE(::mkfifo((dir + "/config.json").c_str(), 0600) == 0);
  CHECK_THAT(error_of(dir), Contains("config.json' is a FIFO (named pipe), not a regular file"));
}

TEST_CASE("sizes in config.json are checked against the file before anything proportional is allocated") {
  for (const ModelConfig& c : {small_gpt2(), small_llama(true), small_llama(false)}) {
    const auto shapes = parameter_shapes(c);
    int64_t values = 0;
    for (auto& [name, shape] : shapes) values += std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
    CHECK(parameter_count(c).tensors == int64_t(shapes.size()));
    CHECK(parameter_count(c).values == values);
  }
  TempDir tmp;
  const Model m = random_model(small_gpt2(), 51);
  // 2^24 layers of a 28-tensor file: listing them alone took ~20 GB before the check
  write_own(tmp / "own", m.cfg, own_tensors(m));
  json j = json::parse(std::ifstream(tmp / "own/config.json"));
  j["layers"] = 16777216;
  write_text(tmp / "own/config.json", j.dump());
  CHECK_THAT(error_of(tmp / "own"), Contains("own/config.json: the configuration (layers 16777216"));
  CHECK_THAT(error_of(tmp / "own"), Contains("model.safetensors holds 28 tensors"));
  write_hf(tmp / "hf", m);
  json h = json::parse(std::ifstream(tmp / "hf/config.json"));
  h["n_layer"] = 16777216;
  write_text(tmp / "hf/config.json", h.dump());
  CHECK_THAT(error_of(tmp / "hf"), Contains("hf/config.json: the configuration (layers 16777216"));
}

TEST_CASE("numbers beyond the double range, and Hugging Face flags given as strings, are named") {
  TempDir tmp;
  const Model m = random_model(small_gpt2(), 52);
  save_model(m, tmp / "own");
  std::string cfg;
  {
    std::ifstream in(tmp / "own/config.json");
    cfg.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = cfg.find("\"norm_eps\": ") + 12;
  write_text(tmp / "own/config.json", cfg.substr(0, at) + "1e999" + cfg.substr(cfg.find_first_of(",\n}", at)));
  CHECK_THAT(error_of(tmp / "own"), Contains("config.json: not valid JSON") && Contains("1e999"));
  write_text(tmp / "own/config.json", cfg);
  const std::string s = R"({"wte": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})";
  Bytes b;
  b.u64(s.size());
  b.str(s);
  b.save(tmp / "own/model.safetensors");
  CHECK_THAT(error_of(tmp / "own"), Contains("safetensors header is not valid JSON") && Contains("1e999"));

  write_hf(tmp / "hf", m);
  const json h = json::parse(std::ifstream(tmp / "hf/config.json"));
  for (const char* key : {"scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention",
                          "tie_word_embeddings"}) {
    INFO(key);
    json k = h;
    k[key] = "false";
    write_text(tmp / "hf/config.json", k.dump());
    CHECK_THAT(error_of(tmp / "hf"), Contains(fmt::format("key \"{}\" must be true or false, got \"false\"", key)));
  }
}

// ---------------------------------------------------------------------------------------------
// Hugging Face LLaMA / Mistral, sharded checkpoints, F16 and BF16, and the export to HF's layout.

namespace {

// Binary16 bits of x, which must be exact in binary16 (subnormals included): written here from
// the format's definition, independently of the reader.
uint16_t exact_f16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const float a = std::fabs(x);
  if (a == 0) return sign;
  if (a < 0x1p-14f) {  // subnormal: a = m · 2^-24, m < 1024
    const float m = a * 0x1p24f;
    REQUIRE(m == std::floor(m));
    return uint16_t(sign | uint16_t(m));
  }
  return to_f16(x);
}

// Convert_llama_weights_to_hf.py's permute(w, n_heads): w.view(n_heads, HS/2, 2, in)
// .transpose(1, 2).reshape(rows, in), written as that index map (HF row h·HS + p·HS/2 + i holds
// Meta row h·HS + 2i + p).
Tensor hf_permute(const Tensor& t, int heads) {
  const int64_t rows = t.shape[0], in = t.shape[1], hs = rows / heads;
  Tensor u;
  u.shape = t.shape;
  u.data.assign(t.data.size(), 0.0f);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < hs / 2; ++i)
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t c = 0; c < in; ++c)
          u.data[size_t(((h * hs) + p * (hs / 2) + i) * in + c)] = t.data[size_t((h * hs + 2 * i + p) * in + c)];
  return u;
}

struct HfLlamaOptions {
  std::string dtype = "F32";
  bool inv_freq = true;        // rotary_emb.inv_freq buffers, as older transformers saved
  bool lm_head_tied = false;   // write lm_head.weight (= the embedding) although tied
  int shards = 1;              // > 1: model-0000k-of-0000n.safetensors + the index
};

StTensor st_as(const std::string& name, const Tensor& t, const std::string& dtype) {
  if (dtype == "F32") return st_f32(name, t);
  Bytes b;
  if (dtype == "BF16") {
    b.bf16s(t.data);
  } else {
    for (float x : t.data) {
      const uint16_t h = exact_f16(x);
      b.b.push_back(uint8_t(h));
      b.b.push_back(uint8_t(h >> 8));
    }
  }
  return {name, dtype, t.shape, b.b};
}

std::vector<StTensor> hf_llama_tensors(const Model& m, const HfLlamaOptions& o) {
  const ModelConfig& c = m.cfg;
  std::vector<StTensor> ts;
  auto add = [&](const std::string& name, const Tensor& t) { ts.push_back(st_as(name, t, o.dtype)); };
  add("model.embed_tokens.weight", m.params.at("tok_embeddings"));
  for (int l = 0; l < c.layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", w = "layers." + std::to_string(l) + ".";
    add(h + "input_layernorm.weight", m.params.at(w + "attention_norm"));
    add(h + "self_attn.q_proj.weight", hf_permute(m.params.at(w + "attention.wq"), c.heads));
    add(h + "self_attn.k_proj.weight", hf_permute(m.params.at(w + "attention.wk"), c.kv_heads));
    add(h + "self_attn.v_proj.weight", m.params.at(w + "attention.wv"));
    add(h + "self_attn.o_proj.weight", m.params.at(w + "attention.wo"));
    add(h + "post_attention_layernorm.weight", m.params.at(w + "ffn_norm"));
    add(h + "mlp.gate_proj.weight", m.params.at(w + "feed_forward.w1"));
    add(h + "mlp.up_proj.weight", m.params.at(w + "feed_forward.w3"));
    add(h + "mlp.down_proj.weight", m.params.at(w + "feed_forward.w2"));
    if (o.inv_freq) {
      Tensor f;
      f.shape = {c.head_size() / 2};
      for (int i = 0; i < c.head_size() / 2; ++i) f.data.push_back(float(std::pow(10000.0, -2.0 * i / c.head_size())));
      ts.push_back(st_f32(h + "self_attn.rotary_emb.inv_freq", f));
    }
  }
  add("model.norm.weight", m.params.at("norm"));
  if (!c.tied) add("lm_head.weight", m.params.at("output"));
  else if (o.lm_head_tied) add("lm_head.weight", m.params.at("tok_embeddings"));
  return ts;
}

json hf_llama_config(const ModelConfig& c) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.kv_heads},
          {"num_hidden_layers", c.layers},
          {"vocab_size", c.vocab},
          {"max_position_embeddings", c.ctx},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"rope_scaling", nullptr},
          {"tie_word_embeddings", c.tied},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"torch_dtype", "bfloat16"}};
}

// Writes the tensors as one model.safetensors, or round-robin over `shards` files with the index.
void write_tensors(const std::string& dir, const std::vector<StTensor>& ts, int shards) {
  if (shards <= 1) {
    save_bytes(dir + "/model.safetensors", st_file(ts));
    return;
  }
  std::vector<std::vector<StTensor>> parts(static_cast<size_t>(shards));
  json map = json::object();
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string file = fmt::format("model-{:05}-of-{:05}.safetensors", i % shards + 1, shards);
    parts[i % size_t(shards)].push_back(ts[i]);
    map[ts[i].name] = file;
  }
  for (int k = 0; k < shards; ++k)
    save_bytes(fmt::format("{}/model-{:05}-of-{:05}.safetensors", dir, k + 1, shards), st_file(parts[size_t(k)]));
  write_text(dir + "/model.safetensors.index.json", json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(2));
}

void write_hf_llama(const std::string& dir, const Model& m, const HfLlamaOptions& o = {}) {
  fs::create_directories(dir);
  write_text(dir + "/config.json", hf_llama_config(m.cfg).dump(2));
  write_tensors(dir, hf_llama_tensors(m, o), o.shards);
}

json read_json_file(const std::string& path) { return json::parse(std::ifstream(path)); }

Matrix<float> logits_of(const Model& m) {
  std::vector<int32_t> tokens;
  for (int t = 0; t < m.cfg.ctx; ++t) tokens.push_back(int32_t((3 * t + 1) % m.cfg.vocab));
  return forward<float>(m, tokens);
}

}  // namespace

TEST_CASE("Hugging Face LLaMA directory: names, RoPE row order, GQA, tied and untied, buffers") {
  TempDir tmp;
  for (bool tied : {false, true}) {
    INFO("tied " << tied);
    const Model m = random_model(small_llama(tied), tied ? 61 : 62);
    write_hf_llama(tmp / "hf", m);
    check_same(load_model(tmp / "hf"), m);
    check_same(load_model(tmp / "hf/config.json"), m);
    fs::remove_all(tmp / "hf");
    write_hf_llama(tmp / "hf", m, {.inv_freq = false, .lm_head_tied = true});
    check_same(load_model(tmp / "hf"), m);
    fs::remove_all(tmp / "hf");
  }
  SECTION("the q/k permutation is undone, not ignored: unpermuted rows give other weights") {
    const Model m = random_model(small_llama(false), 63);
    auto ts = hf_llama_tensors(m, {});
    for (auto& t : ts)
      if (t.name == "model.layers.1.self_attn.k_proj.weight") t = st_f32(t.name, m.params.at("layers.1.attention.wk"));
    write_hf_llama(tmp / "hf", m);
    save_bytes(tmp / "hf/model.safetensors", st_file(ts));
    const Model got = load_model(tmp / "hf");
    CHECK(got.params.at("layers.1.attention.wk").data != m.params.at("layers.1.attention.wk").data);
    CHECK(hf_permute(got.params.at("layers.1.attention.wk"), 2).data == m.params.at("layers.1.attention.wk").data);
  }
  SECTION("Mistral: a sliding window shorter than the context caps it; defaults of optional keys") {
    const Model m = random_model(small_llama(false), 64);
    write_hf_llama(tmp / "hf", m);
    json j = hf_llama_config(m.cfg);
    j["model_type"] = "mistral";
    j["max_position_embeddings"] = 4096;
    j["sliding_window"] = m.cfg.ctx;
    write_text(tmp / "hf/config.json", j.dump());
    check_same(load_model(tmp / "hf"), m);
    j["sliding_window"] = nullptr;
    write_text(tmp / "hf/config.json", j.dump());
    CHECK(load_model_config(tmp / "hf/config.json").ctx == 4096);
    j = hf_llama_config(m.cfg);
    j.erase("rope_theta"), j.erase("tie_word_embeddings"), j.erase("rope_scaling"), j.erase("attention_bias");
    write_text(tmp / "hf/config.json", j.dump());
    check_same(load_model(tmp / "hf"), m);  // rope_theta 10000, untied: transformers' defaults
    j.erase("num_key_value_heads");
    write_text(tmp / "hf/config.json", j.dump());  // then kv heads = heads: k_proj's shape is wrong
    CHECK_THAT(error_of(tmp / "hf"), Contains("tensor model.layers.0.self_attn.k_proj.weight: shape [8,16], expected [16,16]"));
  }
}

TEST_CASE("Hugging Face LLaMA: F16 (subnormals, exact) and BF16 weights; non-finite weights by name") {
  TempDir tmp;
  SECTION("BF16") {
    const Model m = random_model(small_llama(false), 65, 8);
    write_hf_llama(tmp / "hf", m, {.dtype = "BF16"});
    check_same(load_model(tmp / "hf"), m);
  }
  SECTION("F16 with subnormals, the largest finite value and signed zeros") {
    Model m = random_model(small_llama(false), 66, 11);
    for (auto& [name, t] : m.params)  // into binary16's normal range (random_model's can be smaller)
      for (float& x : t.data)
        if (std::fabs(x) < 0x1p-14f) x = 0x1p-10f;
    // The binary16 values at the bottom and the top of the format, as exact binary32 constants.
    const std::vector<float> edge = {0x1p-24f,  -0x1p-24f, 0x1.ff8p-15f, 0x1p-14f, 0x1.ffcp15f,
                                     -0x1.ffcp15f, 0.0f,   -0.0f,        0x1p-23f, 0x1.8p-20f};
    std::copy(edge.begin(), edge.end(), m.params["layers.1.feed_forward.w2"].data.begin());
    write_hf_llama(tmp / "hf", m, {.dtype = "F16"});
    const Model got = load_model(tmp / "hf");
    check_same(got, m);
    const auto& w2 = got.params.at("layers.1.feed_forward.w2").data;
    CHECK(std::signbit(w2[7]));
    CHECK(w2[0] == 5.9604644775390625e-08f);  // 2^-24, the smallest binary16 subnormal
  }
  SECTION("F16 infinity and NaN, BF16 NaN: the Hugging Face tensor is named") {
    const Model m = random_model(small_llama(false), 67, 8);
    for (auto [dtype, bits, what] : {std::tuple{"F16", uint16_t(0x7c00), "inf"}, std::tuple{"F16", uint16_t(0x7e00), "nan"},
                                     std::tuple{"BF16", uint16_t(0x7fc0), "nan"}}) {
      INFO(dtype << " " << what);
      auto ts = hf_llama_tensors(m, {.dtype = dtype});
      for (auto& t : ts)
        if (t.name == "model.layers.1.mlp.up_proj.weight") t.bytes[6] = uint8_t(bits), t.bytes[7] = uint8_t(bits >> 8);
      write_hf_llama(tmp / "hf", m);
      save_bytes(tmp / "hf/model.safetensors", st_file(ts));
      CHECK_THAT(error_of(tmp / "hf"),
                 Contains(fmt::format("tensor model.layers.1.mlp.up_proj.weight: non-finite value {} at flat index 3", what)));
    }
  }
}

TEST_CASE("sharded safetensors: the index's weight_map, every mismatch named") {
  TempDir tmp;
  const Model m = random_model(small_llama(false), 68, 8);
  const std::string dir = tmp / "hf";
  write_hf_llama(dir, m, {.dtype = "BF16", .shards = 3});
  check_same(load_model(dir), m);
  check_same(load_model(dir + "/model.safetensors.index.json"), m);
  const json index = read_json_file(dir + "/model.safetensors.index.json");
  auto with_index = [&](const std::function<void(json&)>& edit) {
    json k = index;
    edit(k);
    write_text(dir + "/model.safetensors.index.json", k.dump());
    return error_of(dir);
  };
  // Shards are read in name order; each tensor is moved to a shard read before its own.
  const std::string norm_shard = index["weight_map"]["model.norm.weight"], q_shard =
      index["weight_map"]["model.layers.0.self_attn.q_proj.weight"];
  REQUIRE(norm_shard == "model-00001-of-00003.safetensors");
  REQUIRE(q_shard == "model-00003-of-00003.safetensors");
  CHECK_THAT(with_index([](json& k) { k["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "model-00001-of-00003.safetensors"; }),
             Contains("index.json: tensor model.layers.0.self_attn.q_proj.weight: mapped to "
                      "model-00001-of-00003.safetensors, which does not hold it"));
  CHECK_THAT(with_index([](json& k) { k["weight_map"]["model.norm.weight"] = "model-00002-of-00003.safetensors"; }),
             Contains("model-00001-of-00003.safetensors: tensor model.norm.weight:") &&
                 Contains("index.json maps it to \"model-00002-of-00003.safetensors\""));
  CHECK_THAT(with_index([](json& k) { k["weight_map"].erase("model.norm.weight"); }),
             Contains("model-00001-of-00003.safetensors: tensor model.norm.weight: not in") &&
                 Contains("index.json's weight_map"));
  CHECK_THAT(with_index([](json& k) { k["weight_map"]["model.norm.weight"] = "../model-00001-of-00003.safetensors"; }),
             Contains("tensor model.norm.weight: shard \"../model-00001-of-00003.safetensors\" is not a file name"));
  CHECK_THAT(with_index([](json& k) { k["weight_map"]["model.norm.weight"] = 3; }),
             Contains("weight_map: tensor model.norm.weight: shard must be a file name, got 3"));
  CHECK_THAT(with_index([](json& k) { k["weight_map"]["extra.weight"] = "model-00009-of-00003.safetensors"; }),
             Contains("model-00009-of-00003.safetensors: cannot open"));
  CHECK_THAT(with_index([](json& k) { k.erase("weight_map"); }), Contains("key \"weight_map\" missing"));
  CHECK_THAT(with_index([](json& k) { k["weight_map"] = json::object(); }), Contains("weight_map is empty"));

  // The model's own checks run over the union of the shards.
  auto ts = hf_llama_tensors(m, {.dtype = "BF16"});
  std::erase_if(ts, [](const StTensor& t) { return t.name == "model.layers.1.mlp.down_proj.weight"; });
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_text(dir + "/config.json", hf_llama_config(m.cfg).dump());
  write_tensors(dir, ts, 2);
  CHECK_THAT(error_of(dir), Contains("index.json: tensor model.layers.1.mlp.down_proj.weight: missing"));
  ts = hf_llama_tensors(m, {.dtype = "BF16"});
  ts.push_back(st_f32("model.layers.2.mlp.up_proj.weight", m.params.at("layers.1.feed_forward.w3")));
  write_tensors(dir, ts, 2);
  CHECK_THAT(error_of(dir), Contains("tensor model.layers.2.mlp.up_proj.weight: unexpected in a LLaMA checkpoint with "
                                     "num_hidden_layers 2"));
  // A single model.safetensors beside an index is the checkpoint (transformers' order).
  save_bytes(dir + "/model.safetensors", st_file(hf_llama_tensors(m, {})));
  check_same(load_model(dir), m);
}

TEST_CASE("Hugging Face LLaMA: tensors and configs mantis cannot compute are refused by name") {
  TempDir tmp;
  const Model m = random_model(small_llama(false), 69);
  const std::string dir = tmp / "hf";
  write_hf_llama(dir, m);
  const json j = hf_llama_config(m.cfg);
  auto with = [&](const std::function<void(json&)>& edit) {
    json k = j;
    edit(k);
    write_text(dir + "/config.json", k.dump());
    return error_of(dir);
  };
  CHECK_THAT(with([](json& k) { k["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }),
             Contains("config.json: rope_scaling {\"factor\":2.0,\"type\":\"linear\"} not supported"));
  CHECK_THAT(with([](json& k) { k["attention_bias"] = true; }), Contains("config.json: attention_bias = true not supported"));
  CHECK_THAT(with([](json& k) { k["mlp_bias"] = true; }), Contains("config.json: mlp_bias = true not supported"));
  CHECK_THAT(with([](json& k) { k["head_dim"] = 8; }), Contains("config.json: head_dim 8 not supported"));
  CHECK(with([](json& k) { k["head_dim"] = 4; }) == "(no error)");
  CHECK_THAT(with([](json& k) { k["hidden_act"] = "gelu"; }), Contains("config.json: hidden_act \"gelu\" not supported"));
  CHECK_THAT(with([](json& k) { k.erase("hidden_act"); }), Contains("key \"hidden_act\" missing"));
  CHECK_THAT(with([](json& k) { k.erase("rms_norm_eps"); }), Contains("config.json: key \"rms_norm_eps\" missing"));
  CHECK_THAT(with([](json& k) { k["sliding_window"] = 0; }), Contains("sliding_window 0 must be positive"));
  CHECK_THAT(with([](json& k) { k["model_type"] = "qwen2"; }), Contains("model_type \"qwen2\" not supported"));
  CHECK_THAT(with([](json& k) { k["num_key_value_heads"] = 3; }), Contains("heads 4 is not divisible by kv_heads 3"));
  CHECK_THAT(with([](json& k) { k["tie_word_embeddings"] = "no"; }), Contains("key \"tie_word_embeddings\" must be true or false"));
  CHECK_THAT(with([](json& k) { k["num_hidden_layers"] = 16777216; }),
             Contains("config.json: the configuration (layers 16777216") && Contains("holds"));
  write_text(dir + "/config.json", j.dump());

  auto with_tensors = [&](const std::function<void(std::vector<StTensor>&)>& edit) {
    auto ts = hf_llama_tensors(m, {});
    edit(ts);
    save_bytes(dir + "/model.safetensors", st_file(ts));
    return error_of(dir);
  };
  CHECK_THAT(with_tensors([&](auto& ts) {
               for (auto& t : ts)
                 if (t.name == "model.layers.0.self_attn.k_proj.weight") t = st_f32(t.name, m.params.at("layers.0.attention.wq"));
             }),
             Contains("model.safetensors: tensor model.layers.0.self_attn.k_proj.weight: shape [16,16], expected [8,16]"));
  CHECK_THAT(with_tensors([](auto& ts) { std::erase_if(ts, [](auto& t) { return t.name == "lm_head.weight"; }); }),
             Contains("tensor lm_head.weight: missing (tie_word_embeddings is false)"));
  CHECK_THAT(with_tensors([](auto& ts) { std::erase_if(ts, [](auto& t) { return t.name == "model.norm.weight"; }); }),
             Contains("tensor model.norm.weight: missing"));
  CHECK_THAT(with_tensors([&](auto& ts) { ts.push_back(st_f32("model.layers.0.self_attn.q_proj.bias", m.params.at("norm"))); }),
             Contains("tensor model.layers.0.self_attn.q_proj.bias: unexpected in a LLaMA checkpoint"));
  CHECK_THAT(with_tensors([&](auto& ts) {
               for (auto& t : ts)
                 if (t.name == "model.norm.weight") t.dtype = "I32";
             }),
             Contains("tensor model.norm.weight: dtype I32 not supported"));
  // tied: an lm_head.weight must be the embedding
  const Model t = random_model(small_llama(true), 70);
  auto ts = hf_llama_tensors(t, {});
  Tensor head = t.params.at("tok_embeddings");
  head.data[4] += 1;
  ts.push_back(st_f32("lm_head.weight", head));
  write_text(dir + "/config.json", hf_llama_config(t.cfg).dump());
  save_bytes(dir + "/model.safetensors", st_file(ts));
  CHECK_THAT(error_of(dir), Contains("tensor lm_head.weight differs from model.embed_tokens.weight"));
}

TEST_CASE("save_model_hf: Hugging Face layout, read back bit for bit with the same logits") {
  TempDir tmp;
  ModelConfig exact = small_gpt2();
  exact.gelu_tanh = false;
  exact.hidden = 20;
  exact.norm_eps = 1e-6f;
  ModelConfig llama = small_llama(false);
  llama.rope_theta = 500000.0f;
  llama.norm_eps = 1e-6f;
  for (const ModelConfig& c : {small_gpt2(), exact, small_llama(true), llama}) {
    INFO("arch " << (c.arch == Arch::gpt2 ? "gpt2" : "llama") << " tied " << c.tied << " hidden " << c.hidden);
    const Model m = random_model(c, 71);
    const std::string dir = tmp / "out";
    fs::remove_all(dir);
    save_model_hf(m, dir);
    const Model got = load_model(dir);
    check_same(got, m);
    CHECK(model_sha256(got) == model_sha256(m));
    CHECK(mantis::test::same_bits(std::span<const float>(logits_of(got).data(), size_t(logits_of(got).size())),
                                  std::span<const float>(logits_of(m).data(), size_t(logits_of(m).size()))));
    // The files are Hugging Face's, not ours under another name.
    const json cfg = read_json_file(dir + "/config.json");
    const auto tensors = read_f32_tensors(dir + "/model.safetensors");
    std::map<std::string, NamedTensor> by_name;
    for (auto& t : tensors) by_name[t.name] = t;
    if (c.arch == Arch::gpt2) {
      CHECK(cfg["model_type"] == "gpt2");
      CHECK(cfg["n_embd"] == c.dim);
      CHECK(cfg["activation_function"] == (c.gelu_tanh ? "gelu_new" : "gelu"));
      CHECK((c.hidden == 4 * c.dim ? cfg["n_inner"].is_null() : cfg["n_inner"] == c.hidden));
      REQUIRE(by_name.count("transformer.h.1.attn.c_attn.weight"));
      CHECK(by_name["transformer.h.1.attn.c_attn.weight"].shape == std::vector<int64_t>{c.dim, 3 * c.dim});
      CHECK(by_name["transformer.h.1.attn.c_attn.weight"].data == transposed(m.params.at("h.1.attn.c_attn.weight")).data);
      CHECK(by_name.count("transformer.wte.weight"));
      CHECK(!by_name.count("lm_head.weight"));
    } else {
      CHECK(cfg["model_type"] == "llama");
      CHECK(cfg["num_key_value_heads"] == c.kv_heads);
      CHECK(cfg["tie_word_embeddings"] == c.tied);
      CHECK(cfg["rope_theta"] == double(c.rope_theta));
      CHECK(by_name["model.layers.1.self_attn.q_proj.weight"].data == hf_permute(m.params.at("layers.1.attention.wq"), c.heads).data);
      CHECK(by_name["model.layers.0.self_attn.k_proj.weight"].data == hf_permute(m.params.at("layers.0.attention.wk"), c.kv_heads).data);
      CHECK(by_name["model.layers.0.mlp.gate_proj.weight"].data == m.params.at("layers.0.feed_forward.w1").data);
      CHECK(by_name.count("lm_head.weight") == (c.tied ? 0u : 1u));
    }
    CHECK(by_name.size() == parameter_shapes(c).size());
  }
  SECTION("an invalid model is refused before anything is written") {
    Model bad = random_model(small_llama(false), 72);
    bad.params.erase("norm");
    CHECK_THAT(mantis::test::error_of([&] { save_model_hf(bad, tmp / "bad"); }), Contains("tensor norm: missing"));
    CHECK(!fs::exists(tmp / "bad/config.json"));
  }
}
