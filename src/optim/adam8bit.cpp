#include "optim/adam8bit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"
#include "optim/quant_map.h"

namespace mantis {

namespace {

// β^t rounded once to binary32 (see the header).
float pow_f32(float b, uint64_t t) { return float(std::pow(double(b), double(t))); }

class Adam8bit final : public Optimizer {
 public:
  Adam8bit(const ParamSet& ps, const Adam8bitConfig& c)
      : c_(c), map_m_(bnb_dynamic_map(true)), map_v_(bnb_dynamic_map(false)) {
    for (auto& p : ps.params) {
      Slot s;
      s.name = p.name;
      s.shape.assign(p.shape.begin(), p.shape.end());
      s.n = StateTensor{p.name, DType::f32, s.shape, {}}.numel();
      s.decay = decays(p);
      s.quant = s.n >= c_.min_8bit_size;
      if (s.quant) {
        const size_t blocks = (s.n + c_.block - 1) / c_.block;
        s.cm.assign(s.n, 0), s.cv.assign(s.n, 0), s.am.assign(blocks, 0.0f), s.av.assign(blocks, 0.0f);
        any_quant_ = true;
      } else {
        s.m.assign(s.n, 0.0f), s.v.assign(s.n, 0.0f);
      }
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "adam8bit"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_) + (any_quant_ ? 2 * 256 * sizeof(float) : 0);
    for (auto& s : slots_)
      b += s.quant ? 2 * s.n + 2 * s.am.size() * sizeof(float) : 2 * s.n * sizeof(float);
    return b;
  }

  void step(Model& model, const GradMap<float>& g, double lr) override {
    ++t_;
    const float b1 = float(c_.beta1), b2 = float(c_.beta2), eps = float(c_.eps), lrf = float(lr);
    const float wd = float(c_.weight_decay), a1 = 1.0f - b1, a2 = 1.0f - b2, decay = 1.0f - lrf * wd;
    const float c1 = 1.0f - pow_f32(b1, t_), c2 = std::sqrt(1.0f - pow_f32(b2, t_));
    const float step_size = (-lrf * c2) / c1, c2_eps = c2 * eps, eps_c2 = eps * c2;
    const std::span<const float> qm(map_m_), qv(map_v_);
    for (auto& s : slots_) {
      float* p = model.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      const int64_t n = int64_t(s.n);
      const bool wd_on = s.decay && wd > 0.0f;
      if (!s.quant) {  // kOptimizer32bit2State, ADAM
        float *m = s.m.data(), *v = s.v.data();
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) {
          m[i] = m[i] * b1 + a1 * gr[i];
          v[i] = v[i] * b2 + a2 * (gr[i] * gr[i]);
          p[i] = p[i] + step_size * (m[i] / (std::sqrt(v[i]) + eps_c2));
          if (wd_on) p[i] = p[i] * decay;
        }
        continue;
      }
      const int64_t bs = int64_t(c_.block), nb = int64_t(s.am.size());
      uint8_t *cm = s.cm.data(), *cv = s.cv.data();
      float *am = s.am.data(), *av = s.av.data();
      // Each block reads only its own codes and absmax: blocks are independent.
#pragma omp parallel for schedule(static) if (nb > 64)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * bs, hi = std::min(n, lo + bs);
        const float old_am = am[b], old_av = av[b];
        // The new moments of element i from its old codes (false: a non-finite gradient).
        auto moments = [&](int64_t i, float& mi, float& vi) {
          const float gi = gr[i];
          if (!std::isfinite(gi)) {
            mi = vi = 0.0f;
            return false;
          }
          vi = (qv[cv[i]] * old_av) * b2 + (a2 * gi) * gi;
          mi = (qm[cm[i]] * old_am) * b1 + a1 * gi;
          return true;
        };
        // Pass 1: the new block absmax (recomputing the moments in pass 2 keeps this allocation-free).
        float new_am = -FLT_MAX, new_av = -FLT_MAX, mi, vi;
        for (int64_t i = lo; i < hi; ++i) {
          moments(i, mi, vi);
          new_am = std::fmax(new_am, std::fabs(mi)), new_av = std::fmax(new_av, std::fabs(vi));
        }
        if (hi - lo < bs) {  // the kernel's padding lanes: g = 0, m code 128, v code 0
          new_am = std::fmax(new_am, std::fabs((qm[128] * old_am) * b1 + a1 * 0.0f));
          new_av = std::fmax(new_av, std::fabs((qv[0] * old_av) * b2 + (a2 * 0.0f) * 0.0f));
        }
        // Pass 2: the step with the unquantised moments, then requantisation.
        for (int64_t i = lo; i < hi; ++i) {
          if (moments(i, mi, vi)) {
            p[i] = p[i] + step_size * (mi / (std::sqrt(vi) + c2_eps));
            if (wd_on) p[i] = p[i] * decay;
          }
          uint8_t code = bnb_nearest_code(qm, mi / new_am, true);
          if (std::signbit(qm[code]) != std::signbit(mi)) code = uint8_t(mi > 0.0f ? code + 1 : code - 1);
          cm[i] = code;
          cv[i] = bnb_nearest_code(qv, vi / new_av, false);
        }
        am[b] = new_am, av[b] = new_av;
      }
    }
  }

  std::vector<StateTensor> state() const override {
    std::map<std::string, StateTensor> by_name;
    auto add = [&](StateTensor t) { by_name.emplace(t.name, std::move(t)); };
    if (any_quant_) {
      add(StateTensor::of<float>("qmap.m", {256}, map_m_));
      add(StateTensor::of<float>("qmap.v", {256}, map_v_));
    }
    for (auto& s : slots_) {
      if (s.quant) {
        add(StateTensor::of<uint8_t>(s.name + ".m.codes", {s.n}, s.cm));
        add(StateTensor::of<uint8_t>(s.name + ".v.codes", {s.n}, s.cv));
        add(StateTensor::of<float>(s.name + ".m.absmax", {s.am.size()}, s.am));
        add(StateTensor::of<float>(s.name + ".v.absmax", {s.av.size()}, s.av));
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
    if (any_quant_) {  // the maps must be bnb's (a state made by another map would decode differently)
      for (auto [key, map] : {std::pair<const char*, const std::vector<float>*>{"qmap.m", &map_m_}, {"qmap.v", &map_v_}}) {
        std::vector<float> got(256);
        expect_state(st, key, DType::f32, {256}).copy_to(std::span<float>(got));
        if (got != *map) throw InputError(fmt::format("optimizer state: '{}' is not bitsandbytes' dynamic map", key));
      }
      count += 2;
    }
    for (auto& s : slots_) {  // every tensor checked before any is taken
      if (s.quant) {
        for (const char* k : {".m.codes", ".v.codes"}) expect_state(st, s.name + k, DType::u8, {s.n});
        for (const char* k : {".m.absmax", ".v.absmax"}) expect_state(st, s.name + k, DType::f32, {s.am.size()});
        count += 4;
      } else {
        for (const char* k : {".m", ".v"}) expect_state(st, s.name + k, DType::f32, s.shape);
        count += 2;
      }
    }
    expect_state_count(st, count);
    for (auto& s : slots_) {
      if (s.quant) {
        expect_state(st, s.name + ".m.codes", DType::u8, {s.n}).copy_to(std::span<uint8_t>(s.cm));
        expect_state(st, s.name + ".v.codes", DType::u8, {s.n}).copy_to(std::span<uint8_t>(s.cv));
        expect_state(st, s.name + ".m.absmax", DType::f32, {s.am.size()}).copy_to(std::span<float>(s.am));
        expect_state(st, s.name + ".v.absmax", DType::f32, {s.av.size()}).copy_to(std::span<float>(s.av));
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
    std::vector<float> m, v;       // FP32 tensors
    std::vector<uint8_t> cm, cv;   // quantised: codes
    std::vector<float> am, av;     // quantised: absmax per block
  };
  Adam8bitConfig c_;
  std::vector<float> map_m_, map_v_;
  std::vector<Slot> slots_;
  bool any_quant_ = false;
  uint64_t t_ = 0;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"beta1", "beta2", "eps", "weight_decay", "min_8bit_size", "block"};
  return k;
}

Adam8bitConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  Adam8bitConfig c;
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  r.get("min_8bit_size", c.min_8bit_size);
  r.get("block", c.block);
  validate(c);
  return c;
}

}  // namespace

void validate(const Adam8bitConfig& c) {
  check_adam_settings("adam8bit", c.beta1, c.beta2, c.eps, c.weight_decay);
  if (c.block < 1 || c.block > (uint64_t(1) << 20))
    throw InputError(fmt::format("adam8bit: block = {} must lie in [1, 1048576]", c.block));
}

std::unique_ptr<Optimizer> make_adam8bit(const ParamSet& p, const Adam8bitConfig& c) {
  validate(c);
  return std::make_unique<Adam8bit>(p, c);
}

OptimizerEntry adam8bit_entry() {
  return {"adam8bit",
          "bitsandbytes AdamW8bit: blockwise 8-bit m and v (dynamic maps, block 256, FP32 absmax); tensors "
          "under 4096 elements keep FP32 m and v",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_adam8bit(p, parse(o)); }};
}

}  // namespace mantis
