// test_adam_lowbit — the bitsandbytes 8-bit and torchao 4-bit Adam baselines: their code tables
// (against an independent restatement and the documented extremes), the nearest-code rules
// (against brute force and hand-traced ties), and every update against a scalar binary32
// restatement in the kernels' order (bit for bit) and a binary64 restatement of the definition.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "core/threads.h"
#include "optim/adam4bit.h"
#include "optim/adam8bit.h"
#include "optim/optimizer.h"
#include "optim/quant_map.h"
#include "testutil.h"

using namespace mantis;
using mantis::test::error_of;
using mantis::test::same_bits;

namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// ---- an independent restatement of the code tables ----------------------------------------

// create_dynamic_map written out again: linspace element by element, as torch's CPU kernel does
// (the first half counted from the start, the second from the end), in binary32.
std::vector<float> restated_dynamic_map(bool is_signed, int e, int bits) {
  std::multiset<float> codes = {0.0f, 1.0f};
  const int s = bits - 1;
  for (int i = 0; i < e; ++i) {
    const int k = (1 << (i + s - e + (is_signed ? 0 : 1))) + 1;
    std::vector<float> bound(static_cast<size_t>(k));
    const float step = 0.9f / float(k - 1);  // (1.0f − 0.1f) is 0.9f exactly in binary32
    for (int j = 0; j < k; ++j) bound[size_t(j)] = j < k / 2 ? 0.1f + step * float(j) : 1.0f - step * float(k - 1 - j);
    const float scale = i == e - 1 ? 1.0f : float(1.0 / std::pow(10.0, double(e - 1 - i)) * 1.0);
    for (int j = 0; j + 1 < k; ++j) {
      const float mean = (bound[size_t(j)] + bound[size_t(j + 1)]) / 2.0f;
      codes.insert(scale * mean);
      if (is_signed) codes.insert(-(scale * mean));
    }
  }
  return {codes.begin(), codes.end()};
}

// ---- the models the updates run on ---------------------------------------------------------

Model make_model(const Shapes& shapes, uint32_t seed) {
  Model m;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& [name, shape] : shapes) {
    Tensor t{shape, {}};
    t.data.resize(size_t(t.numel()));
    for (float& x : t.data) x = u(rng);
    m.params[name] = std::move(t);
  }
  return m;
}

// Gradients of varying scale per step (and per 64-element stretch, so blocks differ); `hole`
// names a parameter whose elements [256, 512) stay zero (an all-zero block); `bad` puts
// non-finite values into a few elements of every parameter at odd steps.
GradMap<float> make_grads(const Model& m, int step, uint32_t seed, bool bad, const std::string& hole = "") {
  GradMap<float> g;
  std::mt19937 rng(seed * 7919u + uint32_t(step));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& [name, t] : m.params) {
    auto& v = g[name];
    v.resize(t.data.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const float scale = std::ldexp(1.0f, -int((i / 64 + size_t(step)) % 12));
      v[i] = nd(rng) * scale;
    }
    if (name == hole)
      for (size_t i = 256; i < std::min<size_t>(512, v.size()); ++i) v[i] = 0.0f;
    if (bad && step % 2 == 1 && v.size() > 40) {
      v[3] = NAN, v[17] = INFINITY, v[40] = -INFINITY;
    }
  }
  return g;
}

GradMap<float> zeros(const Model& m) {
  GradMap<float> g;
  for (auto& [name, t] : m.params) g[name].assign(t.data.size(), 0.0f);
  return g;
}

std::map<std::string, StateTensor> by_name(const std::vector<StateTensor>& st) {
  std::map<std::string, StateTensor> out;
  for (auto& t : st) out.emplace(t.name, t);
  return out;
}
template <class T>
std::vector<T> values(const StateTensor& t) {
  std::vector<T> v(t.numel());
  t.copy_to(std::span<T>(v));
  return v;
}
template <class T>
void put(StateTensor& t, const std::vector<T>& v) {
  std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(T));
}

float pow_f(float b, uint64_t t) { return float(std::pow(double(b), double(t))); }
bool decaying(const Model& m, const std::string& name) { return m.params.at(name).shape.size() >= 2; }

// ---- bnb 8-bit: one step restated in binary32, in the kernels' order --------------------------

void ref8_step(Model& model, const GradMap<float>& g, std::map<std::string, StateTensor>& st, uint64_t t,
               const Adam8bitConfig& c, double lr) {
  const float b1 = float(c.beta1), b2 = float(c.beta2), eps = float(c.eps), lrf = float(lr), wd = float(c.weight_decay);
  const float corr1 = 1.0f - pow_f(b1, t), corr2 = std::sqrt(1.0f - pow_f(b2, t));
  const float step_size = -lrf * corr2 / corr1;
  for (auto& [name, tensor] : model.params) {
    auto& p = tensor.data;
    const auto& gr = g.at(name);
    const size_t n = p.size();
    const bool wd_on = decaying(model, name) && wd > 0.0f;
    if (st.count(name + ".m")) {  // kOptimizer32bit2State
      auto m = values<float>(st.at(name + ".m")), v = values<float>(st.at(name + ".v"));
      for (size_t i = 0; i < n; ++i) {
        m[i] = m[i] * b1 + ((1.0f - b1) * gr[i]);
        v[i] = v[i] * b2 + ((1.0f - b2) * (gr[i] * gr[i]));
        p[i] = p[i] + (1.0f * step_size * (m[i] / (std::sqrt(v[i]) + (eps * corr2))));
        if (wd_on) p[i] = p[i] * (1.0f - (lrf * wd));
      }
      put(st.at(name + ".m"), m), put(st.at(name + ".v"), v);
      continue;
    }
    const auto qm = values<float>(st.at("qmap.m")), qv = values<float>(st.at("qmap.v"));
    auto cm = values<uint8_t>(st.at(name + ".m.codes")), cv = values<uint8_t>(st.at(name + ".v.codes"));
    auto am = values<float>(st.at(name + ".m.absmax")), av = values<float>(st.at(name + ".v.absmax"));
    const size_t bs = c.block;
    for (size_t b = 0; b < am.size(); ++b) {
      std::vector<float> s1(bs), s2(bs);  // the kernel's 256 lanes, padding included
      std::vector<bool> finite(bs);
      float mx1 = -FLT_MAX, mx2 = -FLT_MAX;
      for (size_t j = 0; j < bs; ++j) {
        const size_t i = b * bs + j;
        const bool valid = i < n;
        const float gv = valid ? gr[i] : 0.0f;
        const uint8_t c1 = valid ? cm[i] : 128, c2 = valid ? cv[i] : 0;
        finite[j] = !std::isnan(gv) && !std::isinf(gv);
        if (finite[j]) {
          s2[j] = qv[c2] * av[b];
          s2[j] = (s2[j] * b2) + (((1.0f - b2) * gv * gv));
          s1[j] = qm[c1] * am[b];
          s1[j] = (s1[j] * b1) + (((1.0f - b1) * gv));
        } else {
          s1[j] = s2[j] = 0.0f;
        }
        mx1 = std::fmax(mx1, std::fabs(s1[j]));
        mx2 = std::fmax(mx2, std::fabs(s2[j]));
      }
      am[b] = mx1, av[b] = mx2;
      for (size_t j = 0; j < bs && b * bs + j < n; ++j) {
        const size_t i = b * bs + j;
        if (finite[j]) {
          p[i] = p[i] + (step_size * (s1[j] / (std::sqrt(s2[j]) + (corr2 * eps))));
          if (wd_on) p[i] = p[i] * (1.0f - (lrf * wd));
        }
        uint8_t code = bnb_nearest_code(qm, s1[j] / mx1, true);
        if (std::signbit(qm[code]) != std::signbit(s1[j])) {
          if (s1[j] > 0.0f) code += 1;
          else code -= 1;
        }
        cm[i] = code;
        cv[i] = bnb_nearest_code(qv, s2[j] / mx2, false);
      }
    }
    put(st.at(name + ".m.codes"), cm), put(st.at(name + ".v.codes"), cv);
    put(st.at(name + ".m.absmax"), am), put(st.at(name + ".v.absmax"), av);
  }
}

// ---- torchao 4-bit: one step restated in binary32, eager PyTorch's order ----------------------

float lerp_f(float a, float b, float w) { return std::fabs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

void ref4_step(Model& model, const GradMap<float>& g, std::map<std::string, StateTensor>& st, uint64_t t,
               const Adam4bitConfig& c, double lr) {
  const float b1 = float(c.beta1), b2 = float(c.beta2), eps = float(c.eps), lrf = float(lr), wd = float(c.weight_decay);
  const float w1 = float(1 - c.beta1), w2 = float(1 - c.beta2);
  const float bc1 = 1 - pow_f(b1, t), bc2 = 1 - pow_f(b2, t);
  for (auto& [name, tensor] : model.params) {
    auto& p = tensor.data;
    const auto& gr = g.at(name);
    const size_t n = p.size();
    const bool wd_on = decaying(model, name) && wd > 0.0f;
    std::vector<float> m(n), v(n);
    const bool quant = !st.count(name + ".m");
    std::vector<float> qm, qv, sm, sv;
    std::vector<uint8_t> cm, cv;
    if (quant) {  // dequantise: unpack (high nibble first), qmap[code] · scale
      qm = values<float>(st.at("qmap.m")), qv = values<float>(st.at("qmap.v"));
      cm = values<uint8_t>(st.at(name + ".m.codes")), cv = values<uint8_t>(st.at(name + ".v.codes"));
      sm = values<float>(st.at(name + ".m.absmax")), sv = values<float>(st.at(name + ".v.absmax"));
      for (size_t i = 0; i < n; ++i) {
        const int km = i % 2 ? cm[i / 2] & 15 : cm[i / 2] >> 4, kv = i % 2 ? cv[i / 2] & 15 : cv[i / 2] >> 4;
        m[i] = qm[size_t(km)] * sm[i / c.block], v[i] = qv[size_t(kv)] * sv[i / c.block];
      }
    } else {
      m = values<float>(st.at(name + ".m")), v = values<float>(st.at(name + ".v"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (wd_on) p[i] = p[i] - lrf * wd * p[i];
      m[i] = lerp_f(m[i], gr[i], w1);
      v[i] = lerp_f(v[i], gr[i] * gr[i], w2);
      const float denom = (std::sqrt(v[i]) / std::sqrt(bc2)) + eps;
      p[i] = p[i] - lrf * (m[i] / bc1) / denom;
    }
    if (!quant) {
      put(st.at(name + ".m"), m), put(st.at(name + ".v"), v);
      continue;
    }
    // requantise: scale_tensor, quantize_4bit_with_qmap, pack
    for (auto [x, q, scale, codes] : {std::tuple{&m, &qm, &sm, &cm}, std::tuple{&v, &qv, &sv, &cv}}) {
      std::vector<int> k(n);
      for (size_t b = 0; b < scale->size(); ++b) {
        float amax = 0;
        bool nan = false;
        for (size_t i = b * c.block; i < (b + 1) * c.block; ++i)
          nan |= std::isnan((*x)[i]), amax = std::max(amax, std::fabs((*x)[i]));
        (*scale)[b] = nan ? NAN : std::max(amax, 1e-12f);
        for (size_t i = b * c.block; i < (b + 1) * c.block; ++i) k[i] = torchao_nearest_code_4bit(*q, (*x)[i] / (*scale)[b]);
      }
      for (size_t i = 0; i < n; i += 2) (*codes)[i / 2] = uint8_t((k[i] << 4) | k[i + 1]);
    }
    put(st.at(name + ".m.codes"), cm), put(st.at(name + ".v.codes"), cv);
    put(st.at(name + ".m.absmax"), sm), put(st.at(name + ".v.absmax"), sv);
  }
}

// ---- the binary64 definitions, from the dequantised state ----------------------------------

// The old moments of `name` as the state decodes them, in binary64.
void decode(const std::map<std::string, StateTensor>& st, const std::string& name, size_t n, size_t block, bool packed,
            std::vector<double>& m, std::vector<double>& v) {
  m.assign(n, 0), v.assign(n, 0);
  if (st.count(name + ".m")) {
    auto fm = values<float>(st.at(name + ".m")), fv = values<float>(st.at(name + ".v"));
    for (size_t i = 0; i < n; ++i) m[i] = fm[i], v[i] = fv[i];
    return;
  }
  const auto qm = values<float>(st.at("qmap.m")), qv = values<float>(st.at("qmap.v"));
  const auto cm = values<uint8_t>(st.at(name + ".m.codes")), cv = values<uint8_t>(st.at(name + ".v.codes"));
  const auto am = values<float>(st.at(name + ".m.absmax")), av = values<float>(st.at(name + ".v.absmax"));
  for (size_t i = 0; i < n; ++i) {
    const int km = packed ? (i % 2 ? cm[i / 2] & 15 : cm[i / 2] >> 4) : cm[i];
    const int kv = packed ? (i % 2 ? cv[i / 2] & 15 : cv[i / 2] >> 4) : cv[i];
    m[i] = double(qm[size_t(km)]) * am[i / block], v[i] = double(qv[size_t(kv)]) * av[i / block];
  }
}

// Checks the step from (before, st) to `after` against AdamW's definition in binary64:
// m = β1·m0 + (1−β1)·g, v = β2·v0 + (1−β2)·g², u = lr·(m/(1−β1^t)) / (√v/√(1−β2^t) + ε) (bnb's
// −lr·√(1−β2^t)/(1−β1^t) · m/(√v + ε·√(1−β2^t)) is the same value), decay d = 1 − lr·wd:
// bnb p ← (p − u)·d, torchao p ← p·d − u. bnb: non-finite gradients leave p untouched.
void check_against_f64(const Model& before, const Model& after, const GradMap<float>& g,
                       const std::map<std::string, StateTensor>& st, uint64_t t, double b1, double b2, double eps,
                       double wd, double lr, size_t block, bool packed, bool bnb) {
  // The binary32 scalars the implementations use, so that only the arithmetic differs: bnb's
  // weights are 1 − float(β); torchao's lerp weights are float(1 − β), its β effectively 1 − that.
  const double a1 = bnb ? 1 - double(float(b1)) : double(float(1 - b1));
  const double a2 = bnb ? 1 - double(float(b2)) : double(float(1 - b2));
  b1 = float(b1), b2 = float(b2), eps = float(eps), wd = float(wd), lr = float(lr);
  const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
  double worst = 0;
  for (auto& [name, tensor] : before.params) {
    std::vector<double> m0, v0;
    const size_t n = tensor.data.size();
    decode(st, name, n, block, packed, m0, v0);
    const auto& gr = g.at(name);
    for (size_t i = 0; i < n; ++i) {
      const double gi = gr[i], p0 = tensor.data[i];
      const double got = after.params.at(name).data[i];
      if (!std::isfinite(gi)) {
        if (bnb && !st.count(name + ".m")) CHECK(got == p0);  // bnb's FP32 path has no guard
        continue;
      }
      const double m = (1 - a1) * m0[i] + a1 * gi, v = (1 - a2) * v0[i] + a2 * gi * gi;
      const double d = decaying(before, name) ? 1 - lr * wd : 1;
      const double upd = lr * (m / bc1) / (std::sqrt(v) / std::sqrt(bc2) + eps);
      const double p = bnb ? (p0 - upd) * d : p0 * d - upd;  // bnb decays after the step, torchao before
      // Binary32's error bound: p's roundings (the step, the decay and d itself); the update's relative error from rounding β^t
      // before 1 − β^t (up to 2^-24/(1 − β^t) in each bias correction, halved under √) and from a
      // few roundings (2^-20 covers them); and m's absolute error, a few ulps of |m0| + |g|, which
      // cancellation in β1·m0 + (1 − β1)·g does not shrink.
      const double denom = std::sqrt(v) / std::sqrt(bc2) + eps;
      const double tol = 0x1p-22 * std::abs(p) + std::abs(upd) * (0x1p-24 * (1 / bc1 + 0.5 / bc2) + 0x1p-20) +
                         lr / bc1 * 0x1p-20 * (std::abs(m0[i]) + std::abs(gi)) / denom + 1e-12;
      const double err = std::abs(got - p);
      worst = std::max(worst, err / tol);
      if (err > tol)
        FAIL_CHECK(fmt::format("{}[{}]: {} vs binary64 {} (step {}; u {}, m0 {}, v0 {}, m {}, v {}, g {})", name, i, got,
                               p, t, upd, m0[i], v0[i], m, v, gi));
    }
  }
  INFO("worst error / tolerance " << worst);
  CHECK(worst <= 1.0);
}

bool same_state(const std::vector<StateTensor>& a, const std::vector<StateTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape || a[i].bytes != b[i].bytes)
      return false;
  return true;
}
bool same_params(const Model& a, const Model& b) {
  for (auto& [name, t] : a.params)
    if (!same_bits(t.data, b.params.at(name).data)) return false;
  return true;
}

// 8-bit: a partial last block (4690 = 18·256 + 82), exactly 4096 (quantised, 1-D: no decay),
// 4095 (FP32), a small matrix (FP32 with decay).
const Shapes kShapes8 = {{"w", {67, 70}}, {"c", {4096}}, {"b", {4095}}, {"d", {10, 20}}};
// 4-bit: 4096 and 4224 = 33·128 quantised, 4160 (≥ 4096 but not a multiple of 128) and 3968 FP32.
const Shapes kShapes4 = {{"w", {32, 132}}, {"c", {4096}}, {"e", {4160}}, {"f", {31, 128}}};

}  // namespace

TEST_CASE("quant_map: bnb's dynamic maps, sizes, order, extremes, codes per decade, restated") {
  const auto sm = bnb_dynamic_map(true), um = bnb_dynamic_map(false);
  REQUIRE(sm.size() == 256);
  REQUIRE(um.size() == 256);
  CHECK(std::is_sorted(sm.begin(), sm.end()));
  CHECK(std::is_sorted(um.begin(), um.end()));
  CHECK(sm.back() == 1.0f);
  CHECK(um.back() == 1.0f);
  CHECK(std::count(sm.begin(), sm.end(), -1.0f) == 0);  // +1 but not −1
  CHECK(sm.front() == Approx(-0.99297).epsilon(1e-5));
  CHECK(sm[127] == 0.0f);  // 127 negative codes below the one zero
  CHECK(std::count(sm.begin(), sm.end(), 0.0f) == 1);
  CHECK(sm[128] == Approx(5.5e-7).epsilon(1e-6));   // 1e-6 · (0.1 + 1)/2
  CHECK(sm[126] == -sm[128]);
  CHECK(um[0] == 0.0f);  // unsigned: 0, then 3.25e-7 = 1e-6 · (0.1 + 0.55)/2
  CHECK(um[1] == Approx(3.25e-7).epsilon(1e-6));
  for (int d = 0; d < 7; ++d) {  // codes per decade: signed 1, 2, …, 64; unsigned 2, 4, …, 128
    const double lo = std::pow(10.0, d - 7), hi = std::pow(10.0, d - 6);
    auto count = [&](const std::vector<float>& m) {
      return std::count_if(m.begin(), m.end(), [&](float x) { return x > lo && x < hi; });
    };
    CHECK(count(sm) == (1 << d));
    CHECK(count(um) == (2 << d));
  }
  CHECK(same_bits(sm, restated_dynamic_map(true, 7, 8)));
  CHECK(same_bits(um, restated_dynamic_map(false, 7, 8)));
  // Each code is 10^(i−6) times the midpoint of two adjacent linspace boundaries (binary64 definition).
  std::vector<double> def;
  for (int i = 0; i < 7; ++i) {
    const int k = (1 << i) + 1;
    for (int j = 0; j + 1 < k; ++j) {
      const double mean = 0.1 + 0.9 * (j + 0.5) / (k - 1);
      def.push_back(std::pow(10.0, i - 6) * mean), def.push_back(-std::pow(10.0, i - 6) * mean);
    }
  }
  def.push_back(0), def.push_back(1);
  std::sort(def.begin(), def.end());
  for (size_t i = 0; i < 256; ++i) CHECK(double(sm[i]) == Approx(def[i]).epsilon(3e-7).margin(0));
  // torch.linspace's two halves: the midpoint element counted from the end.
  CHECK(torch_linspace_f32(0.1f, 1.0f, 3, 1) == 1.0f - 0.45f);
  CHECK(torch_linspace_f32(0.1f, 1.0f, 3, 0) == 0.1f);
  CHECK(torch_linspace_f32(0.1f, 1.0f, 3, 2) == 1.0f);
}

TEST_CASE("quant_map: torchao's 4-bit maps") {
  const auto m = torchao_4bit_map_m(), v = torchao_4bit_map_v();
  REQUIRE(m.size() == 16);
  REQUIRE(v.size() == 16);
  const double pos[] = {0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875};
  for (int i = 0; i < 7; ++i) {
    CHECK(m[size_t(8 + i)] == Approx(pos[i]).epsilon(1e-6));
    CHECK(m[size_t(6 - i)] == -m[size_t(8 + i)]);
  }
  CHECK(m[7] == 0.0f);
  CHECK(m[15] == 1.0f);
  for (int i = 0; i < 16; ++i) CHECK(v[size_t(i)] == float(i + 1) / 16.0f);
  CHECK(same_bits(m, restated_dynamic_map(true, 3, 4)));
}

TEST_CASE("quant_map: bnb's nearest code (brute force, hand-traced ties, zero, ends, NaN)") {
  const auto sm = bnb_dynamic_map(true), um = bnb_dynamic_map(false);
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1.1, 1.1);
  std::uniform_int_distribution<int> e(0, 24);
  for (int k = 0; k < 20000; ++k) {
    for (bool sig : {true, false}) {
      const auto& map = sig ? sm : um;
      const float x = float(sig ? std::ldexp(u(rng), -e(rng)) : std::ldexp(std::abs(u(rng)), -e(rng)));
      const uint8_t c = bnb_nearest_code(map, x, sig);
      double best = INFINITY;
      for (float q : map) best = std::min(best, std::abs(double(x) - q));
      const double d = std::abs(double(x) - map[c]);
      // nearest, up to the binary32 rounding of the midpoint the kernel compares against
      if (!(d <= best + 0x1p-24 * std::abs(double(map[c])))) FAIL_CHECK("x = " << x << " code " << int(c));
    }
  }
  CHECK(bnb_nearest_code(sm, 0.0f, true) == 127);
  CHECK(bnb_nearest_code(sm, 1.0f, true) == 255);
  CHECK(bnb_nearest_code(sm, 2.0f, true) == 255);
  CHECK(bnb_nearest_code(sm, -1.0f, true) == 0);
  CHECK(bnb_nearest_code(sm, NAN, true) == 0);
  CHECK(bnb_nearest_code(um, 0.0f, false) == 0);
  CHECK(bnb_nearest_code(um, 1.0f, false) == 255);
  for (int i = 0; i < 256; ++i) CHECK(bnb_nearest_code(sm, sm[size_t(i)], true) == i);
  // Ties go to the last probe: between codes 127 (0) and 128 the search ends at 128 from above
  // (x ≤ code[128], x not below the midpoint → 128); between 128 and 129 it ends at 128 from
  // below (x > code[128], x not above the midpoint → 128).
  CHECK(bnb_nearest_code(sm, (sm[127] + sm[128]) * 0.5f, true) == 128);
  CHECK(bnb_nearest_code(sm, (sm[128] + sm[129]) * 0.5f, true) == 128);
  CHECK(bnb_nearest_code(sm, std::nextafter((sm[127] + sm[128]) * 0.5f, 0.0f), true) == 127);
  CHECK(bnb_nearest_code(sm, std::nextafter((sm[128] + sm[129]) * 0.5f, 1.0f), true) == 129);
}

TEST_CASE("quant_map: torchao's 4-bit nearest code (brute force, ties up, below the map, NaN)") {
  const auto m = torchao_4bit_map_m(), v = torchao_4bit_map_v();
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int k = 0; k < 20000; ++k) {
    const float x = u(rng);
    const int c = torchao_nearest_code_4bit(m, x);
    double best = INFINITY;
    for (float q : m) best = std::min(best, std::abs(double(x) - q));
    CHECK(std::abs(double(x) - m[size_t(c)]) <= best + 1e-7);
  }
  CHECK(torchao_nearest_code_4bit(v, 3.0f / 32) == 1);  // the exact midpoint of 1/16 and 2/16: up
  CHECK(torchao_nearest_code_4bit(v, std::nextafter(3.0f / 32, 0.0f)) == 0);
  CHECK(torchao_nearest_code_4bit(v, 0.0f) == 0);  // below qmap[0] = 1/16: code 0, never "zero"
  CHECK(torchao_nearest_code_4bit(v, 1.0f) == 15);
  CHECK(torchao_nearest_code_4bit(v, NAN) == 0);
  CHECK(torchao_nearest_code_4bit(m, 0.0f) == 7);
  CHECK(torchao_nearest_code_4bit(m, -1.0f) == 0);
  CHECK(torchao_nearest_code_4bit(m, 1.0f) == 15);
  const float mid = (m[8] + m[9]) * 0.5f;  // up exactly when x − q[8] ≥ (q[9] − q[8])·0.5f
  CHECK(torchao_nearest_code_4bit(m, mid) == (mid - m[8] >= (m[9] - m[8]) * 0.5f ? 9 : 8));
  // torch.lerp's two branches
  CHECK(torch_lerp(1.0f, 3.0f, 0.25f) == 1.5f);
  CHECK(torch_lerp(1.0f, 3.0f, 0.75f) == 2.5f);
  CHECK(torch_lerp(0.3f, 0.7f, 1.0f) == 0.7f);  // the large-weight branch ends exactly at b
  CHECK(torch_lerp(0.3f, 0.7f, 0.0f) == 0.3f);
}

TEST_CASE("adam8bit: each step bit for bit against the binary32 restatement and near the binary64 definition") {
  for (double beta1 : {0.9, 0.3}) {
    INFO("beta1 " << beta1);
    Adam8bitConfig c;
    c.beta1 = beta1;
    Model model = make_model(kShapes8, 1), ref = model;
    auto opt = make_adam8bit(param_set(kShapes8), c);
    const double lr = 1e-3;
    for (int t = 1; t <= 6; ++t) {
      const GradMap<float> g = make_grads(model, t, 2, true, "w");
      auto st = by_name(opt->state());
      const auto old = st;
      const Model before = model;
      ref8_step(ref, g, st, uint64_t(t), c, lr);
      opt->step(model, g, lr);
      CHECK(same_params(model, ref));
      std::vector<StateTensor> want;
      for (auto& [k, s] : st) want.push_back(s);
      CHECK(same_state(opt->state(), want));
      check_against_f64(before, model, g, old, uint64_t(t), c.beta1, c.beta2, c.eps, c.weight_decay, lr, c.block, false,
                        true);
    }
  }
}

TEST_CASE("adam8bit: blocks, FP32 fallback at 4095, the sign nudge, zero blocks, non-finite gradients, bytes") {
  Model model = make_model(kShapes8, 3);
  auto opt = make_adam8bit(param_set(kShapes8), {});
  auto st = by_name(opt->state());
  CHECK(st.at("b.m").describe() == "f32 [4095]");  // 4095 < min_8bit_size: FP32
  CHECK(st.at("d.v").describe() == "f32 [10, 20]");
  CHECK(st.at("c.m.codes").describe() == "u8 [4096]");
  CHECK(st.at("w.v.codes").describe() == "u8 [4690]");
  CHECK(st.at("w.m.absmax").describe() == "f32 [19]");  // ⌈4690 / 256⌉
  CHECK(st.at("qmap.m").describe() == "f32 [256]");
  CHECK(same_bits(values<float>(st.at("qmap.v")), bnb_dynamic_map(false)));
  CHECK(st.size() == 2 + 4 + 4 + 2 + 2);
  const uint64_t bytes = 8 + 2 * 1024 + (2 * 4690 + 2 * 19 * 4) + (2 * 4096 + 2 * 16 * 4) + 8 * 4095 + 8 * 200;
  CHECK(opt->state_bytes() == bytes);
  uint64_t sum = 8;
  for (auto& t : opt->state()) sum += t.bytes.size();
  CHECK(sum == bytes);

  // Step 1 by hand: g = 1 at element 0 and −1e-7 at element 1 of c's first block, 0 elsewhere.
  GradMap<float> g = zeros(model);
  g.at("c")[0] = 1.0f, g.at("c")[1] = -1e-7f, g.at("c")[2] = 1e-7f;
  g.at("w")[0] = 0.5f, g.at("w")[5] = NAN, g.at("w")[6] = INFINITY, g.at("w")[300] = 2.0f;
  g.at("b")[7] = NAN;
  g.at("w")[4650] = 1.0f;  // w's last block, elements 4608 … 4689 of a 256-lane block
  const Model before = model;
  opt->step(model, g, 1e-3);
  st = by_name(opt->state());
  const auto cm = values<uint8_t>(st.at("c.m.codes")), cv = values<uint8_t>(st.at("c.v.codes"));
  const auto am = values<float>(st.at("c.m.absmax"));
  CHECK(am[0] == 1.0f - 0.9f);                 // |m| = (1 − β1)·1
  CHECK(cm[0] == 255);                         // m / absmax = 1
  CHECK(cm[1] == 126);                         // −1e-7 rounds to the zero code; the nudge keeps it negative
  CHECK(cm[2] == 127);                         // +1e-7 rounds to zero, whose sign bit is already clear
  CHECK(cm[3] == 127);
  CHECK(cv[3] == 0);
  CHECK(values<float>(st.at("c.m.absmax"))[1] == 0.0f);  // an all-zero block: 0/0 codes, absmax 0
  CHECK(cm[256] == 255);                       // NaN → code 0 → the nudge wraps it to 255 (bnb's unsigned char)
  CHECK(cv[256] == 0);
  // non-finite gradients: the parameter keeps its value (no step, no decay), m and v become 0
  CHECK(model.params.at("w").data[5] == before.params.at("w").data[5]);
  CHECK(model.params.at("w").data[6] == before.params.at("w").data[6]);
  CHECK(model.params.at("w").data[7] != before.params.at("w").data[7]);  // decayed
  const auto wm = values<uint8_t>(st.at("w.m.codes"));
  CHECK(wm[5] == 127);
  CHECK(wm[6] == 127);
  // The padding lanes of a partial block count in its absmax: with every valid gradient
  // non-finite (m = 0 there), the new absmax is that of a padding lane, |(map_m[128]·A)·β1|.
  const float a_last = values<float>(st.at("w.m.absmax"))[18];
  CHECK(a_last == 1.0f - 0.9f);
  GradMap<float> g2 = zeros(model);
  for (size_t i = 4608; i < 4690; ++i) g2.at("w")[i] = NAN;
  opt->step(model, g2, 1e-3);
  CHECK(values<float>(by_name(opt->state()).at("w.m.absmax"))[18] == (bnb_dynamic_map(true)[128] * a_last) * 0.9f);
  CHECK(values<float>(by_name(opt->state()).at("w.v.absmax"))[18] == 0.0f);  // map_v[0] = 0
  // the FP32 path has no guard (bnb's 32-bit kernel): NaN reaches the parameter
  CHECK(std::isnan(model.params.at("b").data[7]));
  CHECK(std::isnan(values<float>(st.at("b.m"))[7]));
}

TEST_CASE("adam4bit: each step bit for bit against the binary32 restatement and near the binary64 definition") {
  for (double beta1 : {0.9, 0.3}) {  // 0.3: lerp's large-weight branch (w1 = 0.7)
    INFO("beta1 " << beta1);
    Adam4bitConfig c;
    c.beta1 = beta1;
    Model model = make_model(kShapes4, 4), ref = model;
    auto opt = make_adam4bit(param_set(kShapes4), c);
    const double lr = 1e-3;
    for (int t = 1; t <= 6; ++t) {
      const GradMap<float> g = make_grads(model, t, 5, false, "w");
      auto st = by_name(opt->state());
      const auto old = st;
      const Model before = model;
      ref4_step(ref, g, st, uint64_t(t), c, lr);
      opt->step(model, g, lr);
      CHECK(same_params(model, ref));
      std::vector<StateTensor> want;
      for (auto& [k, s] : st) want.push_back(s);
      CHECK(same_state(opt->state(), want));
      check_against_f64(before, model, g, old, uint64_t(t), c.beta1, c.beta2, c.eps, c.weight_decay, lr, c.block, true,
                        false);
    }
  }
}

TEST_CASE("adam4bit: which tensors are quantised, packing, zero blocks, NaN, bytes") {
  Model model = make_model(kShapes4, 7);
  auto opt = make_adam4bit(param_set(kShapes4), {});
  auto st = by_name(opt->state());
  CHECK(st.at("w.m.codes").describe() == "u8 [2112]");  // 4224 / 2
  CHECK(st.at("w.v.absmax").describe() == "f32 [33]");
  CHECK(st.at("c.m.codes").describe() == "u8 [2048]");
  CHECK(st.at("e.m").describe() == "f32 [4160]");  // 4160 % 128 ≠ 0: FP32
  CHECK(st.at("f.v").describe() == "f32 [31, 128]");  // 3968 < 4096: FP32
  CHECK(st.at("qmap.m").describe() == "f32 [16]");
  const uint64_t bytes = 8 + 2 * 64 + (4224 + 2 * 33 * 4) + (4096 + 2 * 32 * 4) + 8 * 4160 + 8 * 3968;
  CHECK(opt->state_bytes() == bytes);
  uint64_t sum = 8;
  for (auto& t : opt->state()) sum += t.bytes.size();
  CHECK(sum == bytes);

  GradMap<float> g = zeros(model);
  g.at("c")[0] = 1.0f, g.at("c")[1] = -0.5f;  // block 0 of c; block 1 stays all zero
  g.at("w")[130] = NAN;                       // block 1 of w
  opt->step(model, g, 1e-3);
  st = by_name(opt->state());
  const auto cm = values<uint8_t>(st.at("c.m.codes")), cv = values<uint8_t>(st.at("c.v.codes"));
  const auto sm = values<float>(st.at("c.m.absmax"));
  const auto qm = torchao_4bit_map_m();
  CHECK(sm[0] == float(1 - 0.9));  // lerp(−0, 1, w1) = w1
  CHECK(cm[0] >> 4 == 15);         // m/scale = 1
  CHECK((cm[0] & 15) == torchao_nearest_code_4bit(qm, (-0.5f * float(1 - 0.9)) / sm[0]));  // element 1: low nibble
  CHECK(cm[1] == (7 << 4 | 7));    // zeros: the zero code, both nibbles
  CHECK(sm[1] == 1e-12f);          // an all-zero block: torch's clip(min = 1e-12)
  CHECK(cv[64] == 0);              // v = 0 → code 0 (1/16 of the scale: the map has no zero)
  CHECK(std::isnan(values<float>(st.at("w.m.absmax"))[1]));  // no guard: NaN reaches the scale
  CHECK(std::isnan(model.params.at("w").data[130]));
}

TEST_CASE("adam8bit and adam4bit: state round trip resumes bit-identically; 1 and 2 threads agree") {
  const Shapes big = {{"w", {300, 256}}, {"b", {100}}};  // 300 (8-bit) / 600 (4-bit) blocks: the parallel path
  for (const char* name : {"adam8bit", "adam4bit"}) {
    INFO(name);
    OptimizerOptions o;
    o.name = name;
    const bool bad = std::string(name) == "adam8bit";
    auto run = [&](int threads, Model& m, Optimizer& opt, int from, int steps) {
      set_num_threads(threads);
      for (int t = from; t < from + steps; ++t) opt.step(m, make_grads(m, t, 9, bad, "w"), 1e-3);
      set_num_threads(0);
    };
    Model m1 = make_model(big, 11), m2 = m1, m3 = m1;
    auto o1 = make_optimizer(param_set(big), o), o2 = make_optimizer(param_set(big), o);
    run(1, m1, *o1, 1, 6);
    run(2, m2, *o2, 1, 6);
    CHECK(same_params(m1, m2));
    CHECK(same_state(o1->state(), o2->state()));
    // 3 steps, the state saved and loaded into a fresh optimizer, 3 more: the same as 6 at once
    auto o3 = make_optimizer(param_set(big), o);
    run(2, m3, *o3, 1, 3);
    const auto saved = o3->state();
    auto o4 = make_optimizer(param_set(big), o);
    o4->load_state(saved, o3->steps());
    CHECK(o4->steps() == 3);
    CHECK(same_state(o4->state(), saved));
    run(1, m3, *o4, 4, 3);
    CHECK(same_params(m3, m1));
    CHECK(same_state(o4->state(), o1->state()));
    CHECK(o4->steps() == 6);
    // refused states change nothing
    auto bad_state = saved;
    for (auto& t : bad_state)
      if (t.name == "qmap.m") t.bytes[0] = std::byte(uint8_t(t.bytes[0]) ^ 1);
    CHECK(error_of([&] { o4->load_state(bad_state, 3); }).find("optimizer state: 'qmap.m' is not") == 0);
    bad_state = saved;
    for (auto& t : bad_state)
      if (t.name == "w.m.codes") t.dtype = DType::i8;
    CHECK(error_of([&] { o4->load_state(bad_state, 3); }) ==
          fmt::format("optimizer state: tensor 'w.m.codes' is i8 [{}], expected u8 [{}]", bad ? 76800 : 38400,
                      bad ? 76800 : 38400));
    bad_state = saved;
    bad_state.erase(std::find_if(bad_state.begin(), bad_state.end(), [](auto& t) { return t.name == "b.v"; }));
    CHECK(error_of([&] { o4->load_state(bad_state, 3); }) == "optimizer state: missing tensor 'b.v'");
    CHECK(o4->steps() == 6);
  }
}

TEST_CASE("adam8bit and adam4bit: keys by name, defaults, InputErrors") {
  OptimizerOptions o;
  o.source = "x.toml";
  o.name = "adam8bit";
  CHECK_NOTHROW(check_optimizer(o));
  o.values["block_size"] = {int64_t(64), "x.toml:3"};
  CHECK(error_of([&] { check_optimizer(o); }) ==
        "x.toml:3: unknown key 'block_size' in [optimizer] (known: name, beta1, beta2, eps, weight_decay, "
        "min_8bit_size, block)");
  o.values = {{"beta2", {1.0, "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "adam8bit: betas (0.9, 1) must lie in [0, 1)");
  o.values = {{"eps", {0.0, "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "adam8bit: eps = 0 must be positive");
  o.values = {{"weight_decay", {-0.1, "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "adam8bit: weight_decay = -0.1 must be ≥ 0");
  o.values = {{"block", {int64_t(0), "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "adam8bit: block = 0 must lie in [1, 1048576]");
  o.values = {{"min_8bit_size", {1.5, "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "x.toml:2: 'min_8bit_size' in [optimizer] must be an integer");
  o.values = {{"min_8bit_size", {int64_t(0), "x.toml:2"}}, {"block", {int64_t(2048), "x.toml:3"}}};
  CHECK_NOTHROW(check_optimizer(o));
  // min_8bit_size = 0 quantises everything
  CHECK(make_optimizer(param_set(Shapes{{"x", {3}}}), o)->state().size() == 6);

  o.name = "adam4bit";
  o.values.clear();
  CHECK_NOTHROW(check_optimizer(o));
  o.values = {{"min_8bit_size", {int64_t(1), "x.toml:4"}}};
  CHECK(error_of([&] { check_optimizer(o); }) ==
        "x.toml:4: unknown key 'min_8bit_size' in [optimizer] (known: name, beta1, beta2, eps, weight_decay, block, "
        "min_size)");
  o.values = {{"block", {int64_t(127), "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "adam4bit: block = 127 must be even and lie in [2, 1048576]");
  o.values = {{"beta1", {-0.1, "x.toml:2"}}};
  CHECK(error_of([&] { check_optimizer(o); }) == "adam4bit: betas (-0.1, 0.999) must lie in [0, 1)");
  o.values = {{"min_size", {int64_t(0), "x.toml:2"}}, {"block", {int64_t(2), "x.toml:3"}}};
  CHECK(make_optimizer(param_set(Shapes{{"x", {4}}, {"y", {3}}}), o)->state().size() == 2 + 4 + 2);  // y: odd, FP32
  // the defaults are the references' AdamW defaults
  const Adam8bitConfig c8;
  CHECK((c8.beta1 == 0.9 && c8.beta2 == 0.999 && c8.eps == 1e-8 && c8.weight_decay == 0.01 && c8.block == 256 &&
         c8.min_8bit_size == 4096));
  const Adam4bitConfig c4;
  CHECK((c4.beta1 == 0.9 && c4.beta2 == 0.999 && c4.eps == 1e-8 && c4.weight_decay == 0.01 && c4.block == 128 &&
         c4.min_size == 4096));
}
