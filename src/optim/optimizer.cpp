#include "optim/optimizer.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "core/format.h"  // InputError

namespace mantis {

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const Model& m, const AdamWConfig& c) : c_(c) {
    for (auto& [name, shape] : parameter_shapes(m.cfg)) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      slots_.push_back({name, shape.size() >= 2, std::vector<float>(size_t(n)), std::vector<float>(size_t(n))});
    }
  }
  std::string name() const override { return "adamw"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_);
    for (auto& s : slots_) b += (s.m.size() + s.v.size()) * sizeof(float);
    return b;
  }

  void step(Model& m, const GradMap<float>& g, double lr) override {
    ++t_;
    const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
    const float b1 = float(c_.beta1), b2 = float(c_.beta2), a1 = float(1 - c_.beta1), a2 = float(1 - c_.beta2);
    const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2)), eps = float(c_.eps);
    const float decay = float(1 - lr * c_.weight_decay);
    for (auto& s : slots_) {
      float* p = m.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      float *mm = s.m.data(), *vv = s.v.data();
      const size_t n = s.m.size();
      const bool wd = s.decay && c_.weight_decay != 0;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (size_t i = 0; i < n; ++i) {
        if (wd) p[i] *= decay;
        mm[i] = b1 * mm[i] + a1 * gr[i];
        vv[i] = b2 * vv[i] + a2 * gr[i] * gr[i];
        const float denom = std::sqrt(vv[i]) / bc2_sqrt + eps;
        p[i] -= step_size * (mm[i] / denom);
      }
    }
  }

  std::map<std::string, std::vector<float>> state() const override {
    std::map<std::string, std::vector<float>> out;
    for (auto& s : slots_) out[s.name + ".m"] = s.m, out[s.name + ".v"] = s.v;
    return out;
  }
  void load_state(const std::map<std::string, std::vector<float>>& st, uint64_t steps) override {
    for (auto& s : slots_)
      for (auto [suffix, dst] : {std::pair<const char*, std::vector<float>*>{".m", &s.m}, {".v", &s.v}}) {
        auto it = st.find(s.name + suffix);
        if (it == st.end()) throw InputError(fmt::format("optimizer state: missing tensor '{}{}'", s.name, suffix));
        if (it->second.size() != dst->size())
          throw InputError(fmt::format("optimizer state: tensor '{}{}' has {} values, expected {}", s.name, suffix,
                                       it->second.size(), dst->size()));
        *dst = it->second;
      }
    if (st.size() != 2 * slots_.size())
      throw InputError(fmt::format("optimizer state: {} tensors, expected {}", st.size(), 2 * slots_.size()));
    t_ = steps;
  }

 private:
  struct Slot {
    std::string name;
    bool decay;
    std::vector<float> m, v;
  };
  AdamWConfig c_;
  std::vector<Slot> slots_;
  uint64_t t_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(const Model& m, const AdamWConfig& c) {
  if (!(c.beta1 >= 0 && c.beta1 < 1) || !(c.beta2 >= 0 && c.beta2 < 1))
    throw InputError(fmt::format("adamw: betas ({}, {}) must lie in [0, 1)", c.beta1, c.beta2));
  if (!(c.eps > 0)) throw InputError(fmt::format("adamw: eps = {} must be positive", c.eps));
  if (!(c.weight_decay >= 0)) throw InputError(fmt::format("adamw: weight_decay = {} must be ≥ 0", c.weight_decay));
  return std::make_unique<AdamW>(m, c);
}

double Schedule::at(uint64_t s) const {
  if (s < warmup) return lr * double(s + 1) / double(warmup);
  if (steps <= warmup) return lr;
  const double frac = std::min(1.0, double(s - warmup) / double(steps - warmup));
  return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(std::numbers::pi * frac));
}

double grad_norm(const Model& m, const GradMap<float>& g) {
  double ss = 0;
  for (auto& [name, shape] : parameter_shapes(m.cfg))
    for (float x : g.at(name)) ss += double(x) * double(x);
  return std::sqrt(ss);
}

double clip_grads(const Model& m, GradMap<float>& g, double clip) {
  const double norm = grad_norm(m, g);
  if (clip > 0 && norm > clip) {
    const float k = float(clip / norm);
    for (auto& [name, v] : g)
      for (float& x : v) x *= k;
  }
  return norm;
}

}  // namespace mantis
