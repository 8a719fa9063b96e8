#include "optim/adam4bit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"
#include "optim/quant_map.h"

namespace mantis {

namespace {

float pow_f32(float b, uint64_t t) { return float(std::pow(double(b), double(t))); }

// The 4-bit code of element i of a packed array (element 2k in byte k's high nibble).
inline int nibble(const uint8_t* codes, int64_t i) { return i % 2 == 0 ? codes[i / 2] >> 4 : codes[i / 2] & 15; }

class Adam4bit final : public Optimizer {
 public:
  Adam4bit(const ParamSet& ps, const Adam4bitConfig& c)
      : c_(c), map_m_(torchao_4bit_map_m()), map_v_(torchao_4bit_map_v()) {
    for (auto& p : ps.params) {
      Slot s;
      s.name = p.name;
      s.shape.assign(p.shape.begin(), p.shape.end());
      s.n = StateTensor{p.name, DType::f32, s.shape, {}}.numel();
      s.decay = decays(p);
      s.quant = s.n >= c_.min_size && s.n % c_.block == 0;
      if (s.quant) {
        s.cm.assign(s.n / 2, 0), s.cv.assign(s.n / 2, 0);
        s.sm.assign(s.n / c_.block, 0.0f), s.sv.assign(s.n / c_.block, 0.0f);
        any_quant_ = true;
      } else {
        s.m.assign(s.n, 0.0f), s.v.assign(s.n, 0.0f);
      }
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "adam4bit"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_) + (any_quant_ ? 2 * 16 * sizeof(float) : 0);
    for (auto& s : slots_) b += s.quant ? s.n + 2 * s.sm.size() * sizeof(float) : 2 * s.n * sizeof(float);
    return b;
  }

  void step(Model& model, const GradMap<float>& g, double lr) override {
    ++t_;
    const float b1 = float(c_.beta1), b2 = float(c_.beta2), eps = float(c_.eps), lrf = float(lr);
    const float wd = float(c_.weight_decay), lr_wd = lrf * wd;
    const float w1 = float(1.0 - c_.beta1), w2 = float(1.0 - c_.beta2);  // Python's 1 − β, then float
    const float bc1 = 1.0f - pow_f32(b1, t_), bc2_sqrt = std::sqrt(1.0f - pow_f32(b2, t_));
    const float* qm = map_m_.data();
    const float* qv = map_v_.data();
    // The AdamW update of one parameter from its new fp32 moments.
    auto update = [=](float& p, float m, float v, bool wd_on) {
      if (wd_on) p = p - lr_wd * p;
      p = p - (lrf * (m / bc1)) / ((std::sqrt(v) / bc2_sqrt) + eps);
    };
    for (auto& s : slots_) {
      float* p = model.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      const int64_t n = int64_t(s.n);
      const bool wd_on = s.decay && wd > 0.0f;
      if (!s.quant) {
        float *m = s.m.data(), *v = s.v.data();
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) {
          m[i] = torch_lerp(m[i], gr[i], w1);
          v[i] = torch_lerp(v[i], gr[i] * gr[i], w2);
          update(p[i], m[i], v[i], wd_on);
        }
        continue;
      }
      const int64_t bs = int64_t(c_.block), nb = int64_t(s.sm.size());
      uint8_t *cm = s.cm.data(), *cv = s.cv.data();
      float *sm = s.sm.data(), *sv = s.sv.data();
      // Each block reads and writes only its own codes and scale: blocks are independent.
#pragma omp parallel for schedule(static) if (nb > 64)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * bs, hi = lo + bs;
        const float old_sm = sm[b], old_sv = sv[b];
        auto moments = [&](int64_t i, float& mi, float& vi) {
          mi = torch_lerp(qm[nibble(cm, i)] * old_sm, gr[i], w1);
          vi = torch_lerp(qv[nibble(cv, i)] * old_sv, gr[i] * gr[i], w2);
        };
        // Pass 1: the new scales, amax then clip(min = 1e-12); NaN propagates as torch's amax does.
        float am = 0.0f, av = 0.0f, mi, vi;
        bool nan_m = false, nan_v = false;
        for (int64_t i = lo; i < hi; ++i) {
          moments(i, mi, vi);
          nan_m |= std::isnan(mi), nan_v |= std::isnan(vi);
          am = std::max(am, std::fabs(mi)), av = std::max(av, std::fabs(vi));
        }
        const float new_sm = nan_m ? NAN : std::max(am, 1e-12f), new_sv = nan_v ? NAN : std::max(av, 1e-12f);
        // Pass 2 (element pairs: one byte each): the step with the fp32 moments, then requantisation.
        for (int64_t i = lo; i < hi; i += 2) {
          int code_m[2], code_v[2];
          for (int k = 0; k < 2; ++k) {
            moments(i + k, mi, vi);
            update(p[i + k], mi, vi, wd_on);
            code_m[k] = torchao_nearest_code_4bit(map_m_, mi / new_sm);
            code_v[k] = torchao_nearest_code_4bit(map_v_, vi / new_sv);
          }
          cm[i / 2] = uint8_t(code_m[0] << 4 | code_m[1]);
          cv[i / 2] = uint8_t(code_v[0] << 4 | code_v[1]);
        }
        sm[b] = new_sm, sv[b] = new_sv;
      }
    }
  }

  std::vector<StateTensor> state() const override {
    std::map<std::string, StateTensor> by_name;
    auto add = [&](StateTensor t) { by_name.emplace(t.name, std::move(t)); };
    if (any_quant_) {
      add(StateTensor::of<float>("qmap.m", {16}, map_m_));
      add(StateTensor::of<float>("qmap.v", {16}, map_v_));
    }
    for (auto& s : slots_) {
      if (s.quant) {
        add(StateTensor::of<uint8_t>(s.name + ".m.codes", {s.cm.size()}, s.cm));
        add(StateTensor::of<uint8_t>(s.name + ".v.codes", {s.cv.size()}, s.cv));
        add(StateTensor::of<float>(s.name + ".m.absmax", {s.sm.size()}, s.sm));
        add(StateTensor::of<float>(s.name + ".v.absmax", {s.sv.size()}, s.sv));
      } else {
        add(StateTensor::of<float>(s.name + ".m", s.shape, s.m));
        add(StateTensor::of<float>(s.name + ".v", s.shape, s.v));
      }
    }
    std::vector<StateTensor> out;
    for (auto& [k, t] : by_name) out.push_back(std::move(t));
    return out;
  }

  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    size_t count = 0;
    if (any_quant_) {  // the maps must be torchao's (other codes would decode differently)
      for (auto [key, map] : {std::pair<const char*, const std::vector<float>*>{"qmap.m", &map_m_}, {"qmap.v", &map_v_}}) {
        std::vector<float> got(16);
        expect_state(st, key, DType::f32, {16}).copy_to(std::span<float>(got));
        if (got != *map) throw InputError(fmt::format("optimizer state: '{}' is not torchao's 4-bit map", key));
      }
      count += 2;
    }
    for (auto& s : slots_) {  // every tensor checked before any is taken
      if (s.quant) {
        for (const char* k : {".m.codes", ".v.codes"}) expect_state(st, s.name + k, DType::u8, {s.cm.size()});
        for (const char* k : {".m.absmax", ".v.absmax"}) expect_state(st, s.name + k, DType::f32, {s.sm.size()});
        count += 4;
      } else {
        for (const char* k : {".m", ".v"}) expect_state(st, s.name + k, DType::f32, s.shape);
        count += 2;
      }
    }
    expect_state_count(st, count);
    for (auto& s : slots_) {
      if (s.quant) {
        expect_state(st, s.name + ".m.codes", DType::u8, {s.cm.size()}).copy_to(std::span<uint8_t>(s.cm));
        expect_state(st, s.name + ".v.codes", DType::u8, {s.cv.size()}).copy_to(std::span<uint8_t>(s.cv));
        expect_state(st, s.name + ".m.absmax", DType::f32, {s.sm.size()}).copy_to(std::span<float>(s.sm));
        expect_state(st, s.name + ".v.absmax", DType::f32, {s.sv.size()}).copy_to(std::span<float>(s.sv));
      } else {
        expect_state(st, s.name + ".m", DType::f32, s.shape).copy_to(std::span<float>(s.m));
        expect_state(st, s.name + ".v", DType::f32, s.shape).copy_to(std::span<float>(s.v));
      }
    }
    t_ = steps;
  }

 private:
  struct Slot {
    std::string name;
    std::vector<uint64_t> shape;
    uint64_t n = 0;
    bool decay = false, quant = false;
    std::vector<float> m, v;      // FP32 tensors
    std::vector<uint8_t> cm, cv;  // quantised: packed codes, n/2 bytes
    std::vector<float> sm, sv;    // quantised: scale (absmax) per block
  };
  Adam4bitConfig c_;
  std::vector<float> map_m_, map_v_;
  std::vector<Slot> slots_;
  bool any_quant_ = false;
  uint64_t t_ = 0;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"beta1", "beta2", "eps", "weight_decay", "block", "min_size"};
  return k;
}

Adam4bitConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  Adam4bitConfig c;
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  r.get("block", c.block);
  r.get("min_size", c.min_size);
  validate(c);
  return c;
}

}  // namespace

void validate(const Adam4bitConfig& c) {
  check_adam_settings("adam4bit", c.beta1, c.beta2, c.eps, c.weight_decay);
  if (c.block < 2 || c.block > (uint64_t(1) << 20) || c.block % 2 != 0)  // two codes per byte within a block
    throw InputError(fmt::format("adam4bit: block = {} must be even and lie in [2, 1048576]", c.block));
}

std::unique_ptr<Optimizer> make_adam4bit(const ParamSet& p, const Adam4bitConfig& c) {
  validate(c);
  return std::make_unique<Adam4bit>(p, c);
}

OptimizerEntry adam4bit_entry() {
  return {"adam4bit",
          "torchao AdamW4bit: blockwise 4-bit m and v (dynamic(signed, 3, 4) and linear maps, block 128, FP32 "
          "scale), two codes per byte; other tensors keep FP32 m and v",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_adam4bit(p, parse(o)); }};
}

}  // namespace mantis
