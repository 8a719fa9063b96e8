#include "optim/adamw.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "core/error.h"
#include "optim/adamw_step.h"

namespace mantis {

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const ParamSet& ps, const AdamWConfig& c) : c_(c) {
    for (auto& p : ps.params) {
      const std::vector<uint64_t> dims(p.shape.begin(), p.shape.end());
      const size_t n = StateTensor{p.name, DType::f32, dims, {}}.numel();
      slots_.push_back({p.name, dims, decays(p), std::vector<float>(n), std::vector<float>(n)});
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
    const AdamWScalars c = adamw_scalars(c_.beta1, c_.beta2, c_.eps, c_.weight_decay, lr, t_);
    for (auto& s : slots_) {
      float* p = m.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      float *mm = s.m.data(), *vv = s.v.data();
      const size_t n = s.m.size();
      const bool wd = s.decay && c_.weight_decay != 0;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (size_t i = 0; i < n; ++i) adamw_element(p[i], mm[i], vv[i], gr[i], c, wd);
    }
  }

  // m and v of every parameter, in name order (the order optimizer.bin had before it recorded dtypes).
  std::vector<StateTensor> state() const override {
    std::map<std::string, StateTensor> by_name;
    for (auto& s : slots_)
      for (auto [suffix, v] : {std::pair<const char*, const std::vector<float>*>{".m", &s.m}, {".v", &s.v}})
        by_name.emplace(s.name + suffix, StateTensor::of<float>(s.name + suffix, s.shape, *v));
    std::vector<StateTensor> out;
    for (auto& [k, t] : by_name) out.push_back(std::move(t));
    return out;
  }
  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    for (auto& s : slots_)  // every tensor checked before any is taken
      for (const char* suffix : {".m", ".v"}) expect_state(st, s.name + suffix, DType::f32, s.shape);
    expect_state_count(st, 2 * slots_.size());
    for (auto& s : slots_) {
      expect_state(st, s.name + ".m", DType::f32, s.shape).copy_to(std::span<float>(s.m));
      expect_state(st, s.name + ".v", DType::f32, s.shape).copy_to(std::span<float>(s.v));
    }
    t_ = steps;
  }

 private:
  struct Slot {
    std::string name;
    std::vector<uint64_t> shape;
    bool decay;
    std::vector<float> m, v;
  };
  AdamWConfig c_;
  std::vector<Slot> slots_;
  uint64_t t_ = 0;
};

// (a function: the registry may be built before this file's statics are)
const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"beta1", "beta2", "eps", "weight_decay"};
  return k;
}

AdamWConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  AdamWConfig c;
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  validate(c);
  return c;
}

}  // namespace

void validate(const AdamWConfig& c) {
  check_adam_settings("adamw", c.beta1, c.beta2, c.eps, c.weight_decay);
}

std::unique_ptr<Optimizer> make_adamw(const ParamSet& p, const AdamWConfig& c) {
  validate(c);
  return std::make_unique<AdamW>(p, c);
}

OptimizerEntry adamw_entry() {
  return {"adamw", "AdamW in binary32 (PyTorch's torch.optim.AdamW); state m and v, 8 bytes per parameter", keys(),
          [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_adamw(p, parse(o)); }};
}

}  // namespace mantis
