// sm3 — SM3-II with row / column accumulators; the semantics are in sm3.h.
#include "optim/sm3.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"

namespace mantis {

namespace {

class SM3 final : public Optimizer {
 public:
  SM3(const ParamSet& ps, const SM3Config& c) : c_(c) {
    for (auto& p : ps.params) {
      if (p.shape.size() > 2)
        throw InputError(
            fmt::format("sm3: parameter '{}' has {} dimensions; mantis's parameters have at most 2", p.name, p.shape.size()));
      Slot s{p.name, {p.shape.begin(), p.shape.end()}, decays(p), p.shape.size() == 2, 1, 1, {}, {}, {}};
      const uint64_t n = StateTensor{p.name, DType::f32, s.shape, {}}.numel();
      if (s.matrix) s.R = s.shape[0], s.C = s.shape[1], s.row.assign(s.R, 0.0f), s.col.assign(s.C, 0.0f);
      else s.C = n, s.row.assign(n, 0.0f);  // a vector's full accumulator lives in row
      if (c_.momentum > 0) s.m.assign(n, 0.0f);
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "sm3"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_);
    for (auto& s : slots_) b += (s.row.size() + s.col.size() + s.m.size()) * sizeof(float);
    return b;
  }

  void step(Model& m, const GradMap<float>& g, double lr) override {
    ++t_;
    const bool mom = c_.momentum > 0;
    const float mu = float(c_.momentum), one_minus = 1.0f - mu, mu_minus = mu - 1.0f;
    const float tiny = float(1e-30), lr_f = float(lr), decay = float(1 - lr * c_.weight_decay);
    for (auto& s : slots_) {
      float* p = m.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      float* mm = s.m.data();
      const uint64_t R = s.R, C = s.C;
      const bool wd = s.decay && c_.weight_decay > 0;
      auto apply = [&](uint64_t k, float nu) {
        float x = gr[k] * (1.0f / std::sqrt(nu + tiny));
        if (mom) {
          x = one_minus * x;
          mm[k] = mm[k] + (mm[k] * mu_minus + x);
          x = mm[k];
        }
        if (wd) p[k] *= decay;
        p[k] = p[k] - lr_f * x;
      };
      float* acc = s.row.data();
      if (!s.matrix) {
#pragma omp parallel for schedule(static) if (C > 65536)
        for (int64_t k = 0; k < int64_t(C); ++k) {
          acc[k] = acc[k] + gr[k] * gr[k];
          apply(uint64_t(k), acc[k]);
        }
        continue;
      }
      const float* col = s.col.data();
      new_row_.resize(R), new_col_.resize(C);
#pragma omp parallel for schedule(static) if (R * C > 65536)
      for (int64_t i = 0; i < int64_t(R); ++i) {
        float hi = 0;  // ν ≥ 0
        for (uint64_t j = 0; j < C; ++j) {
          const uint64_t k = uint64_t(i) * C + j;
          const float nu = std::min(acc[i], col[j]) + gr[k] * gr[k];
          hi = std::max(hi, nu);
          apply(k, nu);
        }
        new_row_[size_t(i)] = hi;
      }
      // column maxima from the same ν (the old accumulators), by chunks of columns
      const int64_t chunks = int64_t((C + kCols - 1) / kCols);
#pragma omp parallel for schedule(static) if (R * C > 65536)
      for (int64_t q = 0; q < chunks; ++q) {
        const uint64_t j0 = uint64_t(q) * kCols, j1 = std::min(C, j0 + kCols);
        for (uint64_t j = j0; j < j1; ++j) new_col_[j] = 0;
        for (uint64_t i = 0; i < R; ++i)
          for (uint64_t j = j0; j < j1; ++j) {
            const uint64_t k = i * C + j;
            new_col_[j] = std::max(new_col_[j], std::min(acc[i], col[j]) + gr[k] * gr[k]);
          }
      }
      std::copy(new_row_.begin(), new_row_.end(), s.row.begin());
      std::copy(new_col_.begin(), new_col_.end(), s.col.begin());
    }
  }

  std::vector<StateTensor> state() const override {
    std::map<std::string, StateTensor> by_name;
    for (auto& s : slots_)
      for (auto& [n, shape, v] : tensors(s)) by_name.emplace(n, StateTensor::of<float>(n, shape, *v));
    std::vector<StateTensor> out;
    for (auto& [k, t] : by_name) out.push_back(std::move(t));
    return out;
  }
  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    size_t count = 0;
    for (auto& s : slots_)
      for (auto& [n, shape, v] : tensors(s)) expect_state(st, n, DType::f32, shape), ++count;
    expect_state_count(st, count);
    for (auto& s : slots_)
      for (auto& [n, shape, v] : tensors(s)) expect_state(st, n, DType::f32, shape).copy_to(std::span<float>(*v));
    t_ = steps;
  }

 private:
  static constexpr uint64_t kCols = 64;
  struct Slot {
    std::string name;
    std::vector<uint64_t> shape;
    bool decay, matrix;
    uint64_t R, C;  // a vector: R = 1, C = n
    std::vector<float> row, col, m;
  };
  struct Named {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<float>* v;
  };
  static std::vector<Named> tensors(const Slot& s) {
    auto& w = const_cast<Slot&>(s);
    std::vector<Named> out;
    if (s.matrix) out = {{s.name + ".acc_row", {s.R}, &w.row}, {s.name + ".acc_col", {s.C}, &w.col}};
    else out = {{s.name + ".acc", {s.C}, &w.row}};
    if (!s.m.empty()) out.push_back({s.name + ".m", s.shape, &w.m});
    return out;
  }
  SM3Config c_;
  std::vector<Slot> slots_;
  std::vector<float> new_row_, new_col_;  // per-step scratch
  uint64_t t_ = 0;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"momentum", "weight_decay"};
  return k;
}

SM3Config parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  SM3Config c;
  r.get("momentum", c.momentum);
  r.get("weight_decay", c.weight_decay);
  validate(c);
  return c;
}

}  // namespace

void validate(const SM3Config& c) {
  if (!(c.momentum >= 0 && c.momentum < 1))
    throw InputError(fmt::format("sm3: momentum = {} must lie in [0, 1)", c.momentum));
  if (!(c.weight_decay >= 0)) throw InputError(fmt::format("sm3: weight_decay = {} must be ≥ 0", c.weight_decay));
}

std::unique_ptr<Optimizer> make_sm3(const ParamSet& p, const SM3Config& c) {
  validate(c);
  return std::make_unique<SM3>(p, c);
}

OptimizerEntry sm3_entry() {
  return {"sm3",
          "SM3-II as google-research's sm3.py: row and column accumulators (sums of squares), optional momentum; "
          "≈ 4(R + C)/(R·C) bytes per parameter without momentum",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_sm3(p, parse(o)); }};
}

}  // namespace mantis
