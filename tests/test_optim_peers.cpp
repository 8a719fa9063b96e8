// test_optim_peers — Adam-mini, Adafactor and SM3-II: each update against a binary32 restatement
// of its header's stated order (bit for bit) and a binary64 reference of its definition (with a
// tolerance); Adam-mini's role partition on gpt2 and llama; refusal without roles; exact state
// bytes; state round trip; 1 vs 2 threads; the InputErrors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/threads.h"
#include "optim/adafactor.h"
#include "optim/adam_mini.h"
#include "optim/gefen.h"
#include "optim/optimizer.h"
#include "optim/sm3.h"
#include "testutil.h"

using namespace mantis;
using mantis::test::error_of;
using mantis::test::same_bits;

namespace {

ModelConfig gpt2_tiny(int vocab = 256) {
  ModelConfig c;
  c.vocab = vocab, c.ctx = 48, c.layers = 2, c.heads = c.kv_heads = 4, c.dim = 32, c.hidden = 128;
  return c;
}
ModelConfig llama_tiny() {
  ModelConfig c = gpt2_tiny();
  c.arch = Arch::llama, c.kv_heads = 2, c.tied = false;  // grouped-query: NKV = 2 of NH = 4
  return c;
}

uint64_t numel(const std::vector<int64_t>& s) {
  uint64_t n = 1;
  for (int64_t d : s) n *= uint64_t(d);
  return n;
}

// A model of arbitrary tensors (the optimizers read only m.params) with parameters ~ N(0, 0.05).
Model model_of(const std::vector<ParamInfo>& ps, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> n(0.0f, 0.05f);
  Model m;
  for (auto& p : ps) {
    Tensor t{p.shape, std::vector<float>(numel(p.shape))};
    for (float& x : t.data) x = n(r);
    m.params[p.name] = std::move(t);
  }
  return m;
}

// Gradients whose scale varies by row and by column (so blocks see different second moments).
GradMap<float> grads_of(const std::vector<ParamInfo>& ps, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  GradMap<float> g;
  for (auto& p : ps) {
    const uint64_t N = numel(p.shape), C = p.shape.size() == 2 ? uint64_t(p.shape[1]) : N, R = N / C;
    std::vector<float> rs(R), cs(C), v(N);
    for (float& x : rs) x = std::exp(u(r));
    for (float& x : cs) x = std::exp(u(r));
    for (uint64_t i = 0; i < R; ++i)
      for (uint64_t j = 0; j < C; ++j) v[i * C + j] = 1e-2f * n(r) * rs[i] * cs[j];
    g[p.name] = std::move(v);
  }
  return g;
}

std::vector<ParamInfo> plain(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  return param_set(shapes).params;
}

// Every parameter's values, in the set's order, and the largest |difference| to a reference.
double max_diff(const Model& m, const std::map<std::string, std::vector<double>>& ref, double* scale = nullptr) {
  double d = 0, s = 0;
  for (auto& [name, v] : ref) {
    const auto& got = m.params.at(name).data;
    for (size_t i = 0; i < v.size(); ++i) d = std::max(d, std::abs(double(got[i]) - v[i])), s = std::max(s, std::abs(v[i]));
  }
  if (scale) *scale = s;
  return d;
}

std::map<std::string, std::vector<double>> as_double(const Model& m) {
  std::map<std::string, std::vector<double>> out;
  for (auto& [n, t] : m.params) out[n] = std::vector<double>(t.data.begin(), t.data.end());
  return out;
}

bool same_params(const Model& a, const Model& b) {
  for (auto& [n, t] : a.params)
    if (!same_bits(t.data, b.params.at(n).data)) return false;
  return true;
}

// Every tensor differs from its initial value (the steps did something everywhere).
bool all_moved(const Model& a, const Model& init) {
  for (auto& [n, t] : a.params)
    if (same_bits(t.data, init.params.at(n).data)) return false;
  return true;
}

OptimizerOptions opts(const std::string& name, std::map<std::string, OptionValue> v = {}) {
  OptimizerOptions o;
  o.name = name, o.values = std::move(v), o.source = "t.toml";
  return o;
}

// ---- Adam-mini: the partition restated element by element, its binary32 order and binary64 ----

// The v block of flat element k of p, from its role (restated independently of adam_mini.cpp).
uint64_t block_of(const ParamInfo& p, uint64_t k) {
  if (p.bias) return k;
  if (p.role == Role::norm1 || p.role == Role::norm2 || p.role == Role::norm_f) return 0;
  const uint64_t C = uint64_t(p.shape[1]), row = k / C;
  if (p.role == Role::wq || p.role == Role::wk) return row / uint64_t(p.head_rows);
  if (p.role == Role::attn_qkv) {
    const uint64_t qk_rows = 2 * uint64_t(p.head_blocks) / 3 * uint64_t(p.head_rows);
    return row < qk_rows ? row / uint64_t(p.head_rows) : 2 * uint64_t(p.head_blocks) / 3 + (row - qk_rows);
  }
  return row;
}

struct MiniRef {  // one tensor's state, binary32 restatement and binary64 reference side by side
  std::vector<float> m, v;
  std::vector<double> m64, v64;
};

void adam_mini_ref_step(const std::vector<ParamInfo>& ps, std::map<std::string, MiniRef>& st, Model& p32,
                        std::map<std::string, std::vector<double>>& p64, const GradMap<float>& g, const AdamMiniConfig& c,
                        double lr, uint64_t t) {
  const double bc1 = 1 - std::pow(c.beta1, double(t)), bc2 = 1 - std::pow(c.beta2, double(t));
  const float w = float(1 - c.beta1);
  for (auto& p : ps) {
    const uint64_t n = numel(p.shape);
    uint64_t nb = 0;
    for (uint64_t k = 0; k < n; ++k) nb = std::max(nb, block_of(p, k) + 1);
    MiniRef& s = st[p.name];
    if (s.m.empty()) s.m.assign(n, 0), s.v.assign(nb, 0), s.m64.assign(n, 0), s.v64.assign(nb, 0);
    const auto& gr = g.at(p.name);
    std::vector<double> sum64(nb, 0.0), len(nb, 0.0);
    std::vector<std::vector<float>> sq(nb);  // each block's g·g, in index order
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t b = block_of(p, k);
      sq[b].push_back(gr[k] * gr[k]), sum64[b] += double(gr[k]) * double(gr[k]), len[b] += 1;
    }
    const bool wd = p.shape.size() >= 2 && c.weight_decay > 0;
    auto& q = p32.params.at(p.name).data;
    auto& q64 = p64.at(p.name);
    for (uint64_t b = 0; b < nb; ++b) {
      s.v64[b] = c.beta2 * s.v64[b] + (1 - c.beta2) * sum64[b] / len[b];
      if (!p.bias) {  // torch's mean: ATen's binary32 sum (gefen_torch_sum, tested in test_gefen), / f32(L)
        const float mean = gefen_torch_sum(sq[b].data(), sq[b].size()) / float(len[b]);
        s.v[b] = std::fma(mean, float(1 - c.beta2), float(c.beta2) * s.v[b]);
      }
    }
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t b = block_of(p, k);
      // binary64: the definition
      if (wd) q64[k] *= 1 - lr * c.weight_decay;
      s.m64[k] = c.beta1 * s.m64[k] + (1 - c.beta1) * double(gr[k]);
      q64[k] -= lr / bc1 * s.m64[k] / (std::sqrt(s.v64[b]) / std::sqrt(bc2) + c.eps);
      // binary32: adam_mini.h's order
      const float gk = gr[k];
      if (p.bias) s.v[b] = std::fma(float(1 - c.beta2) * gk, gk, float(c.beta2) * s.v[b]);
      if (wd) q[k] *= float(1 - lr * c.weight_decay);
      s.m[k] = w < 0.5f ? std::fma(w, gk - s.m[k], s.m[k]) : std::fma(w - 1.0f, gk - s.m[k], gk);
      const float h = std::sqrt(s.v[b]) / float(std::sqrt(bc2)) + float(c.eps);
      if (p.bias) q[k] = q[k] + float(-(lr / bc1)) * s.m[k] / h;
      else q[k] = q[k] + -((s.m[k] * ((1.0f / h) * float(1 / bc1))) * float(lr));
    }
  }
}

}  // namespace

TEST_CASE("adam-mini: v blocks from the roles (gpt2's c_attn split, grouped-query wk), and its state") {
  SECTION("gpt2") {
    const ModelConfig c = gpt2_tiny();  // C 32, NH 4, HS 8, H 128, V 256, T 48
    auto opt = make_optimizer(param_set(c), opts("adam-mini"));
    std::map<std::string, std::vector<uint64_t>> v;
    uint64_t bytes = 8;
    for (auto& t : opt->state()) {
      bytes += t.bytes.size();
      CHECK(t.dtype == DType::f32);
      if (t.name.ends_with(".v")) v[t.name.substr(0, t.name.size() - 2)] = t.shape;
    }
    CHECK(opt->state_bytes() == bytes);
    CHECK(v.at("wte") == std::vector<uint64_t>{256});  // one per token row
    CHECK(v.at("wpe") == std::vector<uint64_t>{48});   // one per position row
    CHECK(v.at("h.0.attn.c_attn.weight") == std::vector<uint64_t>{2 * 4 + 32});  // 2·NH q/k heads + C v rows
    CHECK(v.at("h.0.attn.c_attn.bias") == std::vector<uint64_t>{96});            // plain Adam
    CHECK(v.at("h.1.attn.c_proj.weight") == std::vector<uint64_t>{32});
    CHECK(v.at("h.1.mlp.c_fc.weight") == std::vector<uint64_t>{128});
    CHECK(v.at("h.1.mlp.c_proj.weight") == std::vector<uint64_t>{32});
    CHECK(v.at("h.1.mlp.c_fc.bias") == std::vector<uint64_t>{128});
    CHECK(v.at("h.0.ln_1.weight") == std::vector<uint64_t>{1});  // one per norm tensor
    CHECK(v.at("h.0.ln_1.bias") == std::vector<uint64_t>{32});
    CHECK(v.at("ln_f.weight") == std::vector<uint64_t>{1});
    for (auto& p : param_set(c).params)
      if (p.role == Role::attn_qkv && !p.bias) {
        const auto part = adam_mini_partition(p);
        REQUIRE(part.segments.size() == 2);
        CHECK((part.segments[0].count == 8 && part.segments[0].length == 8 * 32));  // a head: HS rows × C
        CHECK((part.segments[1].count == 32 && part.segments[1].length == 32));
      }
    // m full, v per block: 4 bytes each
    uint64_t want = 8;
    for (auto& p : param_set(c).params) {
      uint64_t nb = 0;
      for (uint64_t k = 0; k < numel(p.shape); ++k) nb = std::max(nb, block_of(p, k) + 1);
      want += 4 * (numel(p.shape) + nb);
    }
    CHECK(opt->state_bytes() == want);
  }
  SECTION("llama, grouped-query, untied") {
    auto opt = make_optimizer(param_set(llama_tiny()), opts("adam-mini"));
    std::map<std::string, std::vector<uint64_t>> v;
    for (auto& t : opt->state())
      if (t.name.ends_with(".v")) v[t.name.substr(0, t.name.size() - 2)] = t.shape;
    CHECK(v.at("tok_embeddings") == std::vector<uint64_t>{256});
    CHECK(v.at("output") == std::vector<uint64_t>{256});
    CHECK(v.at("layers.0.attention.wq") == std::vector<uint64_t>{4});  // NH heads
    CHECK(v.at("layers.0.attention.wk") == std::vector<uint64_t>{2});  // NKV heads
    CHECK(v.at("layers.0.attention.wv") == std::vector<uint64_t>{16});  // NKV·HS rows
    CHECK(v.at("layers.0.attention.wo") == std::vector<uint64_t>{32});
    CHECK(v.at("layers.1.feed_forward.w1") == std::vector<uint64_t>{128});
    CHECK(v.at("layers.1.feed_forward.w3") == std::vector<uint64_t>{128});
    CHECK(v.at("layers.1.feed_forward.w2") == std::vector<uint64_t>{32});
    CHECK(v.at("layers.0.attention_norm") == std::vector<uint64_t>{1});
    CHECK(v.at("norm") == std::vector<uint64_t>{1});
  }
  SECTION("without roles it refuses, naming why") {
    const auto shapes = parameter_shapes(gpt2_tiny());
    CHECK(error_of([&] { make_optimizer(param_set(shapes), opts("adam-mini")); }) ==
          "adam-mini needs parameter roles (a model's parameter layout) to partition v by head and row; "
          "this parameter set has names and shapes only (give the model configuration)");
    ParamInfo bad{"w", {10, 4}, 0, Role::wq, false, 3, 3};
    CHECK(error_of([&] { adam_mini_partition(bad); }) ==
          "adam-mini: parameter 'w' (shape 10×4): its head blocks do not cover its rows");
  }
}

TEST_CASE("adam-mini: 3 steps equal the binary32 restatement bit for bit and binary64 to rounding") {
  for (const ModelConfig& mc : {gpt2_tiny(), llama_tiny()}) {
    for (double wd : {0.0, 0.1}) {
      INFO("arch " << int(mc.arch) << " wd " << wd);
      const auto ps = param_set(mc).params;
      AdamMiniConfig c;
      c.weight_decay = wd, c.beta2 = 0.95;
      Model m = model_of(ps, 1), r32 = m;
      auto r64 = as_double(m);
      auto opt = make_adam_mini(param_set(mc), c);
      std::map<std::string, MiniRef> st;
      const double lr = 1e-3;
      for (uint64_t t = 1; t <= 3; ++t) {
        const auto g = grads_of(ps, 10 + t);
        opt->step(m, g, lr);
        adam_mini_ref_step(ps, st, r32, r64, g, c, lr, t);
      }
      CHECK(same_params(m, r32));
      CHECK(all_moved(m, model_of(ps, 1)));
      double scale = 0;
      const double d = max_diff(m, r64, &scale);
      INFO("max |f32 − f64| " << d);
      CHECK(d <= 1e-4 * lr + 4e-7 * scale);
      // every state tensor also equals the restatement's
      for (auto& t : opt->state()) {
        const std::string pn = t.name.substr(0, t.name.size() - 2);
        std::vector<float> got(t.numel());
        t.copy_to(std::span<float>(got));
        CHECK(same_bits(got, t.name.ends_with(".m") ? st.at(pn).m : st.at(pn).v));
      }
    }
  }
}

namespace {

// ---- Adafactor: binary32 restatement of adafactor.h's order, and binary64 ----

struct FactorRef {
  std::vector<float> vr, vc;
  std::vector<double> vr64, vc64;
};

// Σx² as adafactor.h states it: each row in binary64, the row sums in row order.
double sumsq_rows(const std::vector<float>& x, uint64_t R, uint64_t C) {
  double s = 0;
  for (uint64_t i = 0; i < R; ++i) {
    double r = 0;
    for (uint64_t j = 0; j < C; ++j) r += double(x[i * C + j]) * double(x[i * C + j]);
    s += r;
  }
  return s;
}

void adafactor_ref_step(const std::vector<ParamInfo>& ps, std::map<std::string, FactorRef>& st, Model& p32,
                        std::map<std::string, std::vector<double>>& p64, const GradMap<float>& g,
                        const AdafactorConfig& c, double lr, uint64_t t) {
  const double b2t = 1 - std::pow(double(t), c.decay_rate);
  const float a = float(1 - b2t), b = float(b2t);
  double rho = lr;
  if (c.relative_step) rho = std::min(c.warmup_init ? 1e-6 * double(t) : 1e-2, 1 / std::sqrt(double(t)));
  for (auto& p : ps) {
    const bool fac = p.shape.size() == 2;
    const uint64_t N = numel(p.shape), C = fac ? uint64_t(p.shape[1]) : N, R = N / C;
    FactorRef& s = st[p.name];
    if (s.vc.empty()) {
      s.vc.assign(C, 0), s.vc64.assign(C, 0);
      s.vr.assign(fac ? R : 0, 0), s.vr64.assign(fac ? R : 0, 0);
    }
    const auto& gr = g.at(p.name);
    auto& q = p32.params.at(p.name).data;
    auto& q64 = p64.at(p.name);
    // binary64 definition
    double alpha64 = rho;
    if (c.scale_parameter) {
      double ss = 0;
      for (double x : q64) ss += x * x;
      alpha64 = std::max(c.eps2, std::sqrt(ss / double(N))) * rho;
    }
    std::vector<double> x64(N);
    if (fac) {
      for (uint64_t i = 0; i < R; ++i) {
        double sum = 0;
        for (uint64_t j = 0; j < C; ++j) sum += double(gr[i * C + j]) * gr[i * C + j] + c.eps1;
        s.vr64[i] = b2t * s.vr64[i] + (1 - b2t) * sum / double(C);
      }
      for (uint64_t j = 0; j < C; ++j) {
        double sum = 0;
        for (uint64_t i = 0; i < R; ++i) sum += double(gr[i * C + j]) * gr[i * C + j] + c.eps1;
        s.vc64[j] = b2t * s.vc64[j] + (1 - b2t) * sum / double(R);
      }
      double rs = 0;
      for (double x : s.vr64) rs += x;
      for (uint64_t i = 0; i < R; ++i)
        for (uint64_t j = 0; j < C; ++j)  // v̂ = vr·vc / mean(vr)
          x64[i * C + j] = gr[i * C + j] / std::sqrt(s.vr64[i] * s.vc64[j] / (rs / double(R)));
    } else {
      for (uint64_t j = 0; j < C; ++j) {
        s.vc64[j] = b2t * s.vc64[j] + (1 - b2t) * (double(gr[j]) * gr[j] + c.eps1);
        x64[j] = gr[j] / std::sqrt(s.vc64[j]);
      }
    }
    double xs = 0;
    for (double x : x64) xs += x * x;
    const double d64 = std::max(std::sqrt(xs / double(N)) / c.clip_threshold, 1.0);
    const bool wd = p.shape.size() >= 2 && c.weight_decay != 0;
    for (uint64_t k = 0; k < N; ++k) {
      if (wd) q64[k] -= c.weight_decay * alpha64 * q64[k];
      q64[k] -= x64[k] / d64 * alpha64;
    }
    // binary32, adafactor.h's order
    double alpha = rho;
    float al = float(rho);
    if (c.scale_parameter) {
      const float rms = float(std::sqrt(sumsq_rows(q, R, C))) / float(std::sqrt(double(N)));
      al = double(rms) > c.eps2 ? rms * float(rho) : float(c.eps2 * rho);
      alpha = al;
    }
    const float e1 = float(c.eps1);
    std::vector<float> rf(R, 1.0f), cf(C), x(N);
    if (fac) {
      for (uint64_t i = 0; i < R; ++i) {
        double sum = 0;
        for (uint64_t j = 0; j < C; ++j) sum += double(gr[i * C + j] * gr[i * C + j] + e1);
        s.vr[i] = std::fma(float(sum / double(C)), a, b * s.vr[i]);
      }
      for (uint64_t j = 0; j < C; ++j) {
        double sum = 0;
        for (uint64_t i = 0; i < R; ++i) sum += double(gr[i * C + j] * gr[i * C + j] + e1);
        s.vc[j] = std::fma(float(sum / double(R)), a, b * s.vc[j]);
      }
      double rs = 0;
      for (float v : s.vr) rs += double(v);
      const float rmean = float(rs / double(R));
      for (uint64_t i = 0; i < R; ++i) rf[i] = 1.0f / std::sqrt(s.vr[i] / rmean);
      for (uint64_t j = 0; j < C; ++j) cf[j] = 1.0f / std::sqrt(s.vc[j]);
    } else {
      for (uint64_t j = 0; j < C; ++j) {
        s.vc[j] = std::fma(gr[j] * gr[j] + e1, a, b * s.vc[j]);
        cf[j] = 1.0f / std::sqrt(s.vc[j]);
      }
    }
    for (uint64_t i = 0; i < R; ++i)
      for (uint64_t j = 0; j < C; ++j) x[i * C + j] = (rf[i] * cf[j]) * gr[i * C + j];
    const float d =
        std::max(float(std::sqrt(sumsq_rows(x, R, C))) / float(std::sqrt(double(N))) / float(c.clip_threshold), 1.0f);
    for (uint64_t k = 0; k < N; ++k) {
      const float xk = (x[k] / d) * al;
      if (wd) q[k] = std::fma(q[k], float(-c.weight_decay * alpha), q[k]);
      q[k] = q[k] - xk;
    }
  }
}

const std::vector<std::pair<std::string, std::vector<int64_t>>> kShapes = {
    {"emb", {300, 260}},  // > 65536 elements: the threaded paths
    {"w", {24, 16}},
    {"tall", {40, 3}},
    {"row", {1, 9}},
    {"b", {16}},
    {"s", {}},
};


}  // namespace

TEST_CASE("adafactor: 4 steps equal the binary32 restatement bit for bit and binary64 to rounding") {
  const auto ps = plain(kShapes);
  struct Case {
    const char* what;
    AdafactorConfig c;
    double lr;
  };
  AdafactorConfig base, scaled, relative, warm;
  base.weight_decay = 0.1, base.clip_threshold = 1.0;
  scaled.scale_parameter = true, scaled.clip_threshold = 0.5;
  relative.relative_step = true, relative.scale_parameter = true;
  warm.relative_step = warm.warmup_init = true, warm.weight_decay = 0.01, warm.decay_rate = -0.5;
  for (const Case& k : {Case{"explicit lr, wd", base, 1e-2}, Case{"scale_parameter, clip 0.5", scaled, 1e-2},
                        Case{"relative_step", relative, 123.0}, Case{"warmup_init", warm, 5.0}}) {
    INFO(k.what);
    Model m = model_of(ps, 2), r32 = m;
    auto r64 = as_double(m);
    auto opt = make_adafactor(param_set(kShapes), k.c);
    std::map<std::string, FactorRef> st;
    for (uint64_t t = 1; t <= 4; ++t) {
      const auto g = grads_of(ps, 20 + t);
      opt->step(m, g, k.lr);
      adafactor_ref_step(ps, st, r32, r64, g, k.c, k.lr, t);
    }
    CHECK(same_params(m, r32));
    CHECK(all_moved(m, model_of(ps, 2)));
    double scale = 0;
    const double d = max_diff(m, r64, &scale);
    INFO("max |f32 − f64| " << d);
    CHECK(d <= 1e-5 * scale + 1e-7);
    for (auto& t : opt->state()) {
      std::vector<float> got(t.numel());
      t.copy_to(std::span<float>(got));
      const auto dot = t.name.rfind('.');
      const std::string pn = t.name.substr(0, dot), slot = t.name.substr(dot + 1);
      const auto& want = slot == "vr" ? st.at(pn).vr : st.at(pn).vc;  // a vector's v is the restatement's vc
      CHECK(same_bits(got, want));
    }
  }
}

namespace {

// ---- SM3-II ----

struct SM3Ref {
  std::vector<float> row, col, m;
  std::vector<double> row64, col64, m64;
};

void sm3_ref_step(const std::vector<ParamInfo>& ps, std::map<std::string, SM3Ref>& st, Model& p32,
                  std::map<std::string, std::vector<double>>& p64, const GradMap<float>& g, const SM3Config& c, double lr) {
  for (auto& p : ps) {
    const bool mat = p.shape.size() == 2;
    const uint64_t N = numel(p.shape), C = mat ? uint64_t(p.shape[1]) : N, R = N / C;
    SM3Ref& s = st[p.name];
    if (s.row.empty()) {
      s.row.assign(mat ? R : N, 0), s.row64.assign(mat ? R : N, 0);
      s.col.assign(mat ? C : 0, 0), s.col64.assign(mat ? C : 0, 0);
      s.m.assign(N, 0), s.m64.assign(N, 0);
    }
    const auto& gr = g.at(p.name);
    auto& q = p32.params.at(p.name).data;
    auto& q64 = p64.at(p.name);
    const bool wd = mat && c.weight_decay > 0;
    std::vector<float> nu(N);
    std::vector<double> nu64(N);
    for (uint64_t i = 0; i < R; ++i)
      for (uint64_t j = 0; j < C; ++j) {
        const uint64_t k = i * C + j;
        const double g2 = double(gr[k]) * gr[k];
        if (mat) {
          nu[k] = std::min(s.row[i], s.col[j]) + gr[k] * gr[k];
          nu64[k] = std::min(s.row64[i], s.col64[j]) + g2;
        } else {
          nu[k] = s.row[k] = s.row[k] + gr[k] * gr[k];
          nu64[k] = s.row64[k] = s.row64[k] + g2;
        }
      }
    for (uint64_t k = 0; k < N; ++k) {
      // binary64: x = g/√ν; momentum m = μ·m + (1 − μ)·x
      double x64 = gr[k] / std::sqrt(nu64[k]);
      if (c.momentum > 0) x64 = s.m64[k] = c.momentum * s.m64[k] + (1 - c.momentum) * x64;
      if (wd) q64[k] *= 1 - lr * c.weight_decay;
      q64[k] -= lr * x64;
      // binary32, sm3.h's order
      float x = gr[k] * (1.0f / std::sqrt(nu[k] + float(1e-30)));
      if (c.momentum > 0) {
        const float mu = float(c.momentum);
        x = (1.0f - mu) * x;
        s.m[k] = s.m[k] + (s.m[k] * (mu - 1.0f) + x);
        x = s.m[k];
      }
      if (wd) q[k] *= float(1 - lr * c.weight_decay);
      q[k] = q[k] - float(lr) * x;
    }
    if (mat) {
      for (uint64_t i = 0; i < R; ++i) {
        s.row[i] = 0, s.row64[i] = 0;
        for (uint64_t j = 0; j < C; ++j)
          s.row[i] = std::max(s.row[i], nu[i * C + j]), s.row64[i] = std::max(s.row64[i], nu64[i * C + j]);
      }
      for (uint64_t j = 0; j < C; ++j) {
        s.col[j] = 0, s.col64[j] = 0;
        for (uint64_t i = 0; i < R; ++i)
          s.col[j] = std::max(s.col[j], nu[i * C + j]), s.col64[j] = std::max(s.col64[j], nu64[i * C + j]);
      }
    }
  }
}

}  // namespace

TEST_CASE("sm3: 4 steps equal the binary32 restatement bit for bit and binary64 to rounding") {
  const auto ps = plain(kShapes);
  for (double mu : {0.0, 0.9}) {
    INFO("momentum " << mu);
    SM3Config c;
    c.momentum = mu, c.weight_decay = mu > 0 ? 0.0 : 0.05;
    Model m = model_of(ps, 3), r32 = m;
    auto r64 = as_double(m);
    auto opt = make_sm3(param_set(kShapes), c);
    std::map<std::string, SM3Ref> st;
    const double lr = 1e-2;
    for (uint64_t t = 1; t <= 4; ++t) {
      const auto g = grads_of(ps, 30 + t);
      opt->step(m, g, lr);
      sm3_ref_step(ps, st, r32, r64, g, c, lr);
    }
    CHECK(same_params(m, r32));
    CHECK(all_moved(m, model_of(ps, 3)));
    double scale = 0;
    const double d = max_diff(m, r64, &scale);
    INFO("max |f32 − f64| " << d);
    CHECK(d <= 1e-5 * lr * 4 + 4e-7 * scale);
    size_t tensors = 0;
    for (auto& t : opt->state()) {
      std::vector<float> got(t.numel());
      t.copy_to(std::span<float>(got));
      const auto dot = t.name.rfind('.');
      const std::string pn = t.name.substr(0, dot), slot = t.name.substr(dot + 1);
      const auto& want = slot == "acc_col" ? st.at(pn).col : slot == "m" ? st.at(pn).m : st.at(pn).row;
      CHECK(same_bits(got, want));
      ++tensors;
    }
    CHECK(tensors == 4 * 2 + 2 + (mu > 0 ? kShapes.size() : 0));
  }
}

TEST_CASE("peers: exact state bytes, state round trip resumes bit-identically, 1 and 2 threads agree") {
  const auto ps_mini = param_set(gpt2_tiny(2100)).params;  // wte 2100×32 > 65536: threaded paths
  const auto ps = plain(kShapes);
  struct Case {
    std::string name;
    std::map<std::string, OptionValue> v;
    bool roles;
    uint64_t bytes;  // derived from the header's state list
  };
  // adafactor / sm3: 4(R + C) per matrix, 4n per vector, + 8 for the step count
  uint64_t fac = 8, full = 0;
  for (auto& [n, s] : kShapes) fac += 4 * (s.size() == 2 ? uint64_t(s[0] + s[1]) : numel(s)), full += 4 * numel(s);
  uint64_t mini = 8;
  for (auto& p : ps_mini) {
    uint64_t nb = 0;
    for (uint64_t k = 0; k < numel(p.shape); ++k) nb = std::max(nb, block_of(p, k) + 1);
    mini += 4 * (numel(p.shape) + nb);
  }
  const std::vector<Case> cases = {
      {"adam-mini", {{"weight_decay", {0.1, "t:1"}}}, true, mini},
      {"adafactor", {{"weight_decay", {0.1, "t:1"}}, {"scale_parameter", {true, "t:2"}}}, false, fac},
      {"sm3", {}, false, fac},
      {"sm3", {{"momentum", {0.9, "t:1"}}}, false, fac + full},
  };
  for (auto& k : cases) {
    INFO(k.name << (k.v.count("momentum") ? " with momentum" : ""));
    const auto& infos = k.roles ? ps_mini : ps;
    const ParamSet set = k.roles ? param_set(gpt2_tiny(2100)) : param_set(kShapes);
    auto run = [&](int threads, int steps, Optimizer& o, Model& m, int first) {
      set_num_threads(threads);
      for (int t = 0; t < steps; ++t) o.step(m, grads_of(infos, 100 + first + t), 1e-3);
    };
    Model m1 = model_of(infos, 4), m2 = m1;
    auto o1 = make_optimizer(set, opts(k.name, k.v)), o2 = make_optimizer(set, opts(k.name, k.v));
    uint64_t sum = 8;
    for (auto& t : o1->state()) sum += t.bytes.size();
    CHECK(o1->state_bytes() == sum);
    CHECK(o1->state_bytes() == k.bytes);
    run(1, 3, *o1, m1, 0);
    run(2, 3, *o2, m2, 0);
    CHECK(same_params(m1, m2));
    // resume: a fresh optimizer loads the state and continues exactly as the original
    auto o3 = make_optimizer(set, opts(k.name, k.v));
    o3->load_state(o1->state(), o1->steps());
    Model m3 = m1;
    run(2, 2, *o1, m1, 3);
    run(1, 2, *o3, m3, 3);
    CHECK(o3->steps() == 5);
    CHECK(same_params(m1, m3));
    // load_state's checks
    auto st = o1->state();
    st.pop_back();
    CHECK_THROWS_AS(o3->load_state(st, 1), InputError);
    st = o1->state();
    st.front().shape.push_back(1);
    CHECK(error_of([&] { o3->load_state(st, 1); }).starts_with("optimizer state: tensor '" + st.front().name + "' is f32"));
  }
  set_num_threads(0);
}

TEST_CASE("peers: registry keys and one-line InputErrors") {
  CHECK_NOTHROW(check_optimizer(opts("adam-mini")));
  CHECK_NOTHROW(check_optimizer(opts("adafactor")));
  CHECK_NOTHROW(check_optimizer(opts("sm3")));
  CHECK(error_of([] { check_optimizer(opts("adam-mini", {{"beta3", {0.5, "t.toml:3"}}})); }) ==
        "t.toml:3: unknown key 'beta3' in [optimizer] (known: name, beta1, beta2, eps, weight_decay)");
  CHECK(error_of([] { check_optimizer(opts("adam-mini", {{"beta2", {1.0, "t.toml:3"}}})); }) ==
        "adam-mini: betas (0.9, 1) must lie in [0, 1)");
  CHECK(error_of([] { check_optimizer(opts("adam-mini", {{"eps", {0.0, "t.toml:3"}}})); }) ==
        "adam-mini: eps = 0 must be positive");
  CHECK(error_of([] { check_optimizer(opts("adafactor", {{"beta1", {0.9, "t.toml:2"}}})); }) ==
        "t.toml:2: unknown key 'beta1' in [optimizer] (known: name, eps1, eps2, clip_threshold, decay_rate, "
        "weight_decay, relative_step, scale_parameter, warmup_init)");
  CHECK(error_of([] { check_optimizer(opts("adafactor", {{"warmup_init", {true, "t.toml:2"}}})); }) ==
        "adafactor: warmup_init = true requires relative_step = true");
  CHECK(error_of([] { check_optimizer(opts("adafactor", {{"relative_step", {1.0, "t.toml:2"}}})); }) ==
        "t.toml:2: 'relative_step' in [optimizer] must be true or false");
  CHECK(error_of([] { check_optimizer(opts("adafactor", {{"decay_rate", {0.8, "t.toml:2"}}})); }) ==
        "adafactor: decay_rate = 0.8 must be negative (β2t = 1 − t^decay_rate)");
  CHECK(error_of([] { check_optimizer(opts("adafactor", {{"clip_threshold", {0.0, "t.toml:2"}}})); }) ==
        "adafactor: clip_threshold = 0 must be positive");
  CHECK(error_of([] { check_optimizer(opts("adafactor", {{"eps1", {-1.0, "t.toml:2"}}})); }) ==
        "adafactor: eps1 = -1 must be positive");
  CHECK(error_of([] { check_optimizer(opts("sm3", {{"momentum", {1.0, "t.toml:4"}}})); }) ==
        "sm3: momentum = 1 must lie in [0, 1)");
  CHECK(error_of([] { check_optimizer(opts("sm3", {{"weight_decay", {-0.5, "t.toml:4"}}})); }) ==
        "sm3: weight_decay = -0.5 must be ≥ 0");
  CHECK(error_of([] { check_optimizer(opts("sm3", {{"eps", {1e-8, "t.toml:4"}}})); }) ==
        "t.toml:4: unknown key 'eps' in [optimizer] (known: name, momentum, weight_decay)");
  const ParamSet cube = param_set({{"k", {2, 3, 4}}});
  CHECK(error_of([&] { make_optimizer(cube, opts("adafactor")); }) ==
        "adafactor: parameter 'k' has 3 dimensions; mantis's parameters have at most 2");
  CHECK(error_of([&] { make_optimizer(cube, opts("sm3")); }) ==
        "sm3: parameter 'k' has 3 dimensions; mantis's parameters have at most 2");
  // Adafactor and SM3 serve a replay file's set (no roles); the model's set too
  CHECK(make_optimizer(param_set(parameter_shapes(llama_tiny())), opts("adafactor"))->name() == "adafactor");
  CHECK(make_optimizer(param_set(llama_tiny()), opts("sm3"))->name() == "sm3");
}

TEST_CASE("peers: state bytes per parameter at GPT-2 small (HF layout) beside the analytic figures") {
  const ModelConfig c;  // the default: GPT-2 small, 124,439,808 parameters, tied head
  const ParamSet set = param_set(c);
  uint64_t n = 0, mini = 8, factored = 8;
  for (auto& p : set.params) {
    n += numel(p.shape);
    mini += 4 * (numel(p.shape) + adam_mini_partition(p).blocks());  // m full + v per block
    factored += 4 * (p.shape.size() == 2 ? uint64_t(p.shape[0] + p.shape[1]) : numel(p.shape));
  }
  REQUIRE(n == 124439808);
  // Adafactor and SM3 allocate only their accumulators, so they are built at full size here
  CHECK(make_optimizer(set, opts("adafactor"))->state_bytes() == factored);
  CHECK(make_optimizer(set, opts("sm3"))->state_bytes() == factored);
  const double per = double(factored) / double(n), per_mini = double(mini) / double(n);
  INFO("adafactor / sm3 " << per << " B/param, adam-mini " << per_mini << " B/param");
  CHECK(per == Approx(0.010).margin(0.0005));       // the analytic 0.01
  CHECK(per_mini == Approx(4.007).margin(0.0005));  // training-and-style-anchors §5: 4.007
}
