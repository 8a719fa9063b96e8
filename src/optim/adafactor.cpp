// adafactor — Hugging Face's Adafactor (beta1 = None); the semantics are in adafactor.h.
#include "optim/adafactor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"

namespace mantis {

namespace {

// Σ f(i, j)² over an R×C grid: each row in binary64 in column order, the row sums in row order
// (so the result does not depend on the thread count).
template <class F>
double sum_sq(uint64_t R, uint64_t C, F f) {
  std::vector<double> rows(R);
#pragma omp parallel for schedule(static) if (R * C > 65536 && R > 1)
  for (int64_t i = 0; i < int64_t(R); ++i) {
    double s = 0;
    for (uint64_t j = 0; j < C; ++j) {
      const double x = f(uint64_t(i), j);
      s += x * x;
    }
    rows[size_t(i)] = s;
  }
  double s = 0;
  for (double r : rows) s += r;
  return s;
}

inline float rms_of(double sum_squares, uint64_t n) { return float(std::sqrt(sum_squares)) / float(std::sqrt(double(n))); }

class Adafactor final : public Optimizer {
 public:
  Adafactor(const ParamSet& ps, const AdafactorConfig& c) : c_(c) {
    for (auto& p : ps.params) {
      if (p.shape.size() > 2)
        throw InputError(fmt::format("adafactor: parameter '{}' has {} dimensions; mantis's parameters have at most 2",
                                     p.name, p.shape.size()));
      Slot s{p.name, {p.shape.begin(), p.shape.end()}, decays(p), p.shape.size() == 2, 1, 1, {}, {}};
      if (s.factored) s.R = s.shape[0], s.C = s.shape[1];
      else s.C = StateTensor{p.name, DType::f32, s.shape, {}}.numel();
      if (s.factored) s.vr.assign(s.R, 0.0f), s.vc.assign(s.C, 0.0f);
      else s.vr.assign(s.C, 0.0f);  // the full v of a vector lives in vr
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "adafactor"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_);
    for (auto& s : slots_) b += (s.vr.size() + s.vc.size()) * sizeof(float);
    return b;
  }

  void step(Model& m, const GradMap<float>& g, double lr) override {
    ++t_;
    const double t = double(t_);
    const double beta2t = 1 - std::pow(t, c_.decay_rate);
    const float b = float(beta2t), a = float(1 - beta2t), eps1 = float(c_.eps1), clip = float(c_.clip_threshold);
    double rho = lr;
    if (c_.relative_step) rho = std::min(c_.warmup_init ? 1e-6 * t : 1e-2, 1 / std::sqrt(t));
    for (auto& s : slots_) {
      float* p = m.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      const uint64_t R = s.R, C = s.C;
      // α: HF's max(eps2, RMS)·ρ is a binary32 tensor product when the RMS wins, a binary64 one otherwise
      double alpha = rho;
      float al = float(rho);
      if (c_.scale_parameter) {
        const float rms = rms_of(sum_sq(R, C, [&](uint64_t i, uint64_t j) { return p[i * C + j]; }), R * C);
        al = double(rms) > c_.eps2 ? rms * float(rho) : float(c_.eps2 * rho);
        alpha = al;
      }
      auto u = [&](uint64_t k) { return gr[k] * gr[k] + eps1; };
      float* vr = s.vr.data();
      if (s.factored) {
        float* vc = s.vc.data();
#pragma omp parallel for schedule(static) if (R * C > 65536)
        for (int64_t i = 0; i < int64_t(R); ++i) {
          double sum = 0;
          for (uint64_t j = 0; j < C; ++j) sum += double(u(uint64_t(i) * C + j));
          vr[i] = std::fma(float(sum / double(C)), a, b * vr[i]);
        }
        // column means: chunks of columns, each column summed over the rows in row order
        const int64_t chunks = int64_t((C + kCols - 1) / kCols);
#pragma omp parallel for schedule(static) if (R * C > 65536)
        for (int64_t q = 0; q < chunks; ++q) {
          const uint64_t j0 = uint64_t(q) * kCols, j1 = std::min(C, j0 + kCols);
          double sum[kCols] = {};
          for (uint64_t i = 0; i < R; ++i)
            for (uint64_t j = j0; j < j1; ++j) sum[j - j0] += double(u(i * C + j));
          for (uint64_t j = j0; j < j1; ++j) vc[j] = std::fma(float(sum[j - j0] / double(R)), a, b * vc[j]);
        }
        double rsum = 0;
        for (uint64_t i = 0; i < R; ++i) rsum += double(vr[i]);
        const float rmean = float(rsum / double(R));
        rf_.resize(R), cf_.resize(C);
        for (uint64_t i = 0; i < R; ++i) rf_[i] = 1.0f / std::sqrt(vr[i] / rmean);
        for (uint64_t j = 0; j < C; ++j) cf_[j] = 1.0f / std::sqrt(vc[j]);
      } else {
        rf_.assign(1, 1.0f), cf_.resize(C);
        for (uint64_t j = 0; j < C; ++j) {
          vr[j] = std::fma(u(j), a, b * vr[j]);
          cf_[j] = 1.0f / std::sqrt(vr[j]);
        }
      }
      // x is recomputed in the second pass (bit-identical) rather than stored: no n-sized scratch
      const float *rf = rf_.data(), *cf = cf_.data();
      auto x = [&](uint64_t i, uint64_t j) { return (rf[i] * cf[j]) * gr[i * C + j]; };
      const float d = std::max(rms_of(sum_sq(R, C, x), R * C) / clip, 1.0f);
      const float decay = float(-c_.weight_decay * alpha);
      const bool wd = s.decay && c_.weight_decay != 0;
#pragma omp parallel for schedule(static) if (R * C > 65536)
      for (int64_t i = 0; i < int64_t(R); ++i)
        for (uint64_t j = 0; j < C; ++j) {
          const uint64_t k = uint64_t(i) * C + j;
          const float xk = (x(uint64_t(i), j) / d) * al;
          if (wd) p[k] = std::fma(p[k], decay, p[k]);
          p[k] = p[k] - xk;
        }
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
    bool decay, factored;
    uint64_t R, C;  // a vector: R = 1, C = n
    std::vector<float> vr, vc;
  };
  struct Named {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<float>* v;
  };
  static std::vector<Named> tensors(const Slot& s) {
    auto& m = const_cast<Slot&>(s);
    if (!s.factored) return {{s.name + ".v", {s.C}, &m.vr}};
    return {{s.name + ".vr", {s.R}, &m.vr}, {s.name + ".vc", {s.C}, &m.vc}};
  }
  AdafactorConfig c_;
  std::vector<Slot> slots_;
  std::vector<float> rf_, cf_;  // per-step scratch: the row and column factors
  uint64_t t_ = 0;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"eps1",         "eps2",          "clip_threshold",  "decay_rate",
                                             "weight_decay", "relative_step", "scale_parameter", "warmup_init"};
  return k;
}

AdafactorConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  AdafactorConfig c;
  r.get("eps1", c.eps1);
  r.get("eps2", c.eps2);
  r.get("clip_threshold", c.clip_threshold);
  r.get("decay_rate", c.decay_rate);
  r.get("weight_decay", c.weight_decay);
  r.get("relative_step", c.relative_step);
  r.get("scale_parameter", c.scale_parameter);
  r.get("warmup_init", c.warmup_init);
  validate(c);
  return c;
}

}  // namespace

void validate(const AdafactorConfig& c) {
  if (!(c.eps1 > 0)) throw InputError(fmt::format("adafactor: eps1 = {} must be positive", c.eps1));
  if (!(c.eps2 >= 0)) throw InputError(fmt::format("adafactor: eps2 = {} must be ≥ 0", c.eps2));
  if (!(c.clip_threshold > 0))
    throw InputError(fmt::format("adafactor: clip_threshold = {} must be positive", c.clip_threshold));
  if (!(c.decay_rate < 0))
    throw InputError(fmt::format("adafactor: decay_rate = {} must be negative (β2t = 1 − t^decay_rate)", c.decay_rate));
  if (!(c.weight_decay >= 0)) throw InputError(fmt::format("adafactor: weight_decay = {} must be ≥ 0", c.weight_decay));
  if (c.warmup_init && !c.relative_step)
    throw InputError("adafactor: warmup_init = true requires relative_step = true");
}

std::unique_ptr<Optimizer> make_adafactor(const ParamSet& p, const AdafactorConfig& c) {
  validate(c);
  return std::make_unique<Adafactor>(p, c);
}

OptimizerEntry adafactor_entry() {
  return {"adafactor",
          "Adafactor as Hugging Face's (beta1 = None): factored second moment for matrices, update clipping; "
          "≈ 4(R + C)/(R·C) bytes per parameter",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_adafactor(p, parse(o)); }};
}

}  // namespace mantis
