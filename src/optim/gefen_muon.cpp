#include "optim/gefen_muon.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/format.h"
#include "core/round.h"
#include "optim/adamw.h"
#include "optim/gefen.h"
#include "optim/gefen_codebook.h"

namespace mantis {

namespace {

const Target<float>& bf16_target() {
  static const Target<float> t = make_target<float>(format_lookup("bf16"));
  return t;
}
float bf16(float x) { return round_value<Rounding::rne>(x, bf16_target()); }

// out (n × m) = bf16(alpha·(A·B) + beta·Cin), A n × k, B k × m, row-major; acc in binary32, k ascending.
// Row i's m accumulators advance together over l (each still sums its products in ascending l, the
// order of a plain dot product, so the result is that of the scalar loops bit for bit — test_gefen
// checks it), which reads B row by row and lets the compiler vectorise across j.
void gemm_bf16(const std::vector<float>& A, const std::vector<float>& B, size_t n, size_t k, size_t m, float alpha,
               float beta, const std::vector<float>* Cin, std::vector<float>& out) {
  out.assign(n * m, 0.0f);
#pragma omp parallel for schedule(static) if (n * m * k > (1u << 20))
  for (size_t i = 0; i < n; ++i) {
    float* acc = out.data() + i * m;  // row i, zero
    for (size_t l = 0; l < k; ++l) {
      const float a = A[i * k + l];
      const float* b = B.data() + l * m;
      for (size_t j = 0; j < m; ++j) acc[j] += a * b[j];
    }
    for (size_t j = 0; j < m; ++j) {
      float r = alpha == 1.0f ? acc[j] : alpha * acc[j];
      if (Cin) r = r + beta * (*Cin)[i * m + j];
      acc[j] = bf16(r);
    }
  }
}

}  // namespace

double gefen_muon_lr_ratio(size_t rows, size_t cols, bool match_rms_adamw) {
  if (match_rms_adamw) return 0.2 * std::sqrt(double(std::max(rows, cols)));
  return std::sqrt(std::max(1.0, double(rows) / double(cols)));
}

std::vector<float> gefen_newton_schulz(std::span<const float> G, size_t rows, size_t cols, const GefenMuonConfig& c) {
  const bool tr = rows > cols;
  const size_t r = tr ? cols : rows, k = tr ? rows : cols;  // X is r × k, r ≤ k
  std::vector<float> X(r * k);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) X[tr ? j * k + i : i * cols + j] = bf16(G[i * cols + j]);
  double ss = 0;
  for (float x : X) ss += double(x) * double(x);
  const float nrm = bf16(float(std::sqrt(ss)));
  const float den = bf16(std::max(nrm, float(c.eps)));
  for (auto& x : X) x = bf16(x / den);
  std::vector<float> Xt(k * r), A, B, Xn;
  const float a = float(c.ns_a), b = float(c.ns_b), cc = float(c.ns_c);
  for (uint64_t step = 0; step < c.ns_steps; ++step) {
    for (size_t i = 0; i < r; ++i)
      for (size_t j = 0; j < k; ++j) Xt[j * r + i] = X[i * k + j];
    gemm_bf16(X, Xt, r, k, r, 1.0f, 0.0f, nullptr, A);  // X·Xᵀ
    gemm_bf16(A, A, r, r, r, cc, b, &A, B);             // c·(A·A) + b·A
    gemm_bf16(B, X, r, r, k, 1.0f, a, &X, Xn);          // B·X + a·X
    X.swap(Xn);
  }
  std::vector<float> out(rows * cols);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) out[i * cols + j] = X[tr ? j * k + i : i * cols + j];
  return out;
}

namespace {

struct Slot {
  std::string name;
  std::vector<uint64_t> shape;
  size_t rows = 0, cols = 0, n = 0, P = 0, Q = 0;
  std::vector<uint8_t> idx;
  std::vector<float> mag;
};

// The Muon group: matrices only (the caller partitions).
class MuonGroup final : public Optimizer {
 public:
  MuonGroup(const ParamSet& ps, const GefenMuonConfig& c) : c_(c), codebook_(kGefenCodebookSize, 0.0f) {
    for (auto& p : ps.params) {
      Slot s;
      s.name = p.name;
      s.shape.assign(p.shape.begin(), p.shape.end());
      s.rows = size_t(p.shape[0]), s.cols = size_t(p.shape[1]), s.n = s.rows * s.cols;
      s.idx.assign(s.n, 0);
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "gefen-muon"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_) + codebook_.size() * sizeof(float);
    for (auto& s : slots_) b += s.idx.size() + s.mag.size() * sizeof(float) + sizeof(uint64_t);
    return b;
  }

  void step(Model& m, const GradMap<float>& g, double lr) override {
    if (!slots_.empty() && slots_.front().P == 0) {
      std::vector<std::span<const float>> grads;
      std::vector<size_t> periods;
      for (auto& s : slots_) {
        const std::vector<float>& gr = g.at(s.name);
        s.P = std::max<size_t>(1, gefen_period(gr, c_.period_rule));
        s.Q = gefen_magnitude_block(s.n, s.P);
        s.mag.assign(s.n / s.Q, 0.0f);
        grads.push_back(gr), periods.push_back(s.P);
      }
      codebook_ = gefen_learn_codebook(grads, periods);
    }
    ++t_;
    const float w = float(1 - c_.momentum), mu = float(c_.momentum), decay = float(1 - lr * c_.weight_decay);
    const NearestCode nc(codebook_);
    const float* C = codebook_.data();
    for (auto& s : slots_) {
      const float* gr = g.at(s.name).data();
      float* p = m.params.at(s.name).data.data();
      std::vector<float> u(s.n);
      const size_t Q = s.Q;
      uint8_t* idx = s.idx.data();
      float* mag = s.mag.data();
#pragma omp parallel for schedule(static) if (s.n > 16384)
      for (size_t q = 0; q < s.n / Q; ++q) {
        const size_t i0 = q * Q;
        const float mag_old = mag[q];
        float mx = 0;
        for (size_t i = i0; i < i0 + Q; ++i) {
          const float mo = C[idx[i]] * mag_old, d = gr[i] - mo;
          u[i] = std::abs(w) < 0.5f ? std::fma(w, d, mo) : std::fma(w - 1.0f, d, gr[i]);
          mx = std::max(mx, std::abs(u[i]));
        }
        mag[q] = mx;
        const float den = std::max(mx, FLT_MIN);
        for (size_t i = i0; i < i0 + Q; ++i) {
          const uint8_t k = nc(mx > 0 ? u[i] / den : 0.0f);
          idx[i] = k;
          const float qm = C[k] * mx;
          u[i] = c_.nesterov ? std::fma(gr[i], w, qm * mu) : qm;
        }
      }
      const std::vector<float> O = gefen_newton_schulz(u, s.rows, s.cols, c_);
      const float step = float(-(lr * gefen_muon_lr_ratio(s.rows, s.cols, c_.match_rms_adamw)));
      const bool wd = c_.weight_decay > 0;
      for (size_t i = 0; i < s.n; ++i) {
        if (wd) p[i] *= decay;
        p[i] = std::fma(O[i], step, p[i]);
      }
    }
  }

  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    out.push_back(StateTensor::of<float>("codebook", {uint64_t(codebook_.size())}, codebook_));
    for (auto& s : slots_) {
      out.push_back(StateTensor::of<uint8_t>(s.name + ".idx", s.shape, s.idx));
      out.push_back(StateTensor::of<float>(s.name + ".mag", {uint64_t(s.mag.size())}, s.mag));
      const uint64_t P = s.P;
      out.push_back(StateTensor::of<uint64_t>(s.name + ".period", {}, std::span<const uint64_t>(&P, 1)));
    }
    return out;
  }

  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    std::vector<float> cb(kGefenCodebookSize);
    expect_state(st, "codebook", DType::f32, {uint64_t(kGefenCodebookSize)}).copy_to(std::span<float>(cb));
    std::vector<size_t> P(slots_.size());
    size_t set = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      auto& s = slots_[i];
      uint64_t p = 0;
      expect_state(st, s.name + ".period", DType::u64, {}).copy_to(std::span<uint64_t>(&p, 1));
      if (p != 0 && s.n % p != 0)
        throw InputError(fmt::format("optimizer state: gefen period {} of '{}' does not divide its {} elements", p,
                                     s.name, s.n));
      P[i] = size_t(p), set += p != 0;
      expect_state(st, s.name + ".idx", DType::u8, s.shape);
      expect_state(st, s.name + ".mag", DType::f32, {uint64_t(p ? s.n / gefen_magnitude_block(s.n, P[i]) : 0)});
    }
    expect_state_count(st, 1 + 3 * slots_.size());
    if (set != 0 && set != slots_.size())
      throw InputError("optimizer state: gefen periods are set for some tensors but not for others");
    if (set == 0 && steps != 0 && !slots_.empty())
      throw InputError(fmt::format("optimizer state: gefen has no periods but {} steps", steps));
    if (set != 0 && !std::is_sorted(cb.begin(), cb.end()))
      throw InputError("optimizer state: the gefen codebook is not ascending");
    codebook_ = cb;
    for (size_t i = 0; i < slots_.size(); ++i) {
      auto& s = slots_[i];
      s.P = P[i], s.Q = P[i] ? gefen_magnitude_block(s.n, P[i]) : 0;
      s.mag.assign(s.P ? s.n / s.Q : 0, 0.0f);
      expect_state(st, s.name + ".idx", DType::u8, s.shape).copy_to(std::span(s.idx));
      expect_state(st, s.name + ".mag", DType::f32, {uint64_t(s.mag.size())}).copy_to(std::span(s.mag));
    }
    t_ = steps;
  }

 private:
  GefenMuonConfig c_;
  std::vector<float> codebook_;
  std::vector<Slot> slots_;
  uint64_t t_ = 0;
};

constexpr const char* kRestPrefix = "rest.";

// The whole optimizer: the Muon group, then the rest group (absent when no parameter is left to it).
class GefenMuon final : public Optimizer {
 public:
  GefenMuon(const ParamSet& ps, const GefenMuonConfig& c) {
    ParamSet mu{{}, ps.roles}, rest{{}, ps.roles};
    for (auto& p : ps.params) {
      if (gefen_muon_takes(p, ps.roles, c)) mu.params.push_back(p);
      else if (c.rest == GefenMuonRest::refuse)
        throw InputError(fmt::format("gefen-muon: parameter '{}' has shape [{}]: GefenMuon takes only matrices "
                                     "(2-D parameters), as the authors' code",
                                     p.name, fmt::join(p.shape, ", ")));
      else rest.params.push_back(p);
    }
    if (!rest.params.empty())
      for (auto& p : mu.params)  // its state tensors could collide with the rest group's
        if (p.name.starts_with(kRestPrefix))
          throw InputError(fmt::format("gefen-muon: parameter '{}' of the Muon group begins with '{}', the rest "
                                       "group's state prefix",
                                       p.name, kRestPrefix));
    muon_ = std::make_unique<MuonGroup>(mu, c);
    if (rest.params.empty()) return;
    if (c.rest == GefenMuonRest::adamw) {
      AdamWConfig a;
      a.beta1 = c.rest_beta1, a.beta2 = c.rest_beta2, a.eps = c.rest_eps, a.weight_decay = c.rest_weight_decay;
      rest_ = make_adamw(rest, a);
    } else {
      GefenConfig g;
      g.beta1 = c.rest_beta1, g.beta2 = c.rest_beta2, g.eps = c.rest_eps, g.weight_decay = c.rest_weight_decay;
      g.period_rule = c.period_rule;
      rest_ = make_gefen(rest, g);
    }
  }
  std::string name() const override { return "gefen-muon"; }
  uint64_t steps() const override { return muon_->steps(); }
  uint64_t state_bytes() const override {  // one step count, not two
    return muon_->state_bytes() + (rest_ ? rest_->state_bytes() - sizeof(uint64_t) : 0);
  }
  void step(Model& m, const GradMap<float>& g, double lr) override {
    muon_->step(m, g, lr);
    if (rest_) rest_->step(m, g, lr);
  }
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out = muon_->state();
    if (rest_)
      for (auto& t : rest_->state()) {
        t.name = kRestPrefix + t.name;
        out.push_back(std::move(t));
      }
    return out;
  }
  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    std::vector<StateTensor> mu, rest;
    for (auto& t : st)
      if (rest_ && t.name.starts_with(kRestPrefix)) {
        rest.push_back(t);
        rest.back().name.erase(0, std::string_view(kRestPrefix).size());
      } else {
        mu.push_back(t);
      }
    // Both checked before either takes anything: a failed load leaves the optimizer as it was.
    auto m2 = std::make_unique<MuonGroup>(*muon_);
    m2->load_state(mu, steps);
    if (rest_) {
      try {
        rest_->load_state(rest, steps);
      } catch (const InputError& e) {
        throw InputError(fmt::format("{} (gefen-muon's rest group, prefix '{}')", e.what(), kRestPrefix));
      }
    }
    muon_ = std::move(m2);
  }

 private:
  std::unique_ptr<MuonGroup> muon_;
  std::unique_ptr<Optimizer> rest_;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"momentum",   "nesterov",   "weight_decay", "eps",
                                             "ns_steps",   "ns_a",       "ns_b",         "ns_c",
                                             "adjust_lr_fn", "period_rule", "rest",      "rest_beta1",
                                             "rest_beta2", "rest_eps",   "rest_weight_decay", "embeddings"};
  return k;
}

GefenMuonConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  GefenMuonConfig c;
  r.get("momentum", c.momentum);
  r.get("nesterov", c.nesterov);
  r.get("weight_decay", c.weight_decay);
  r.get("eps", c.eps);
  r.get("ns_steps", c.ns_steps);
  r.get("ns_a", c.ns_a);
  r.get("ns_b", c.ns_b);
  r.get("ns_c", c.ns_c);
  std::string fn = "original", rule = "code";
  r.get("adjust_lr_fn", fn);
  if (fn != "original" && fn != "match_rms_adamw")
    throw InputError(fmt::format("{}: gefen-muon: adjust_lr_fn = '{}' (known: original, match_rms_adamw)", o.source, fn));
  c.match_rms_adamw = fn == "match_rms_adamw";
  r.get("period_rule", rule);
  if (rule == "code") c.period_rule = GefenPeriodRule::code;
  else if (rule == "brief") c.period_rule = GefenPeriodRule::brief;
  else throw InputError(fmt::format("{}: gefen-muon: period_rule = '{}' (known: code, brief)", o.source, rule));
  std::string rest = "gefen", emb = "rest";
  r.get("rest", rest);
  if (rest == "gefen") c.rest = GefenMuonRest::gefen;
  else if (rest == "adamw") c.rest = GefenMuonRest::adamw;
  else if (rest == "refuse") c.rest = GefenMuonRest::refuse;
  else throw InputError(fmt::format("{}: gefen-muon: rest = '{}' (known: gefen, adamw, refuse)", o.source, rest));
  r.get("rest_beta1", c.rest_beta1);
  r.get("rest_beta2", c.rest_beta2);
  r.get("rest_eps", c.rest_eps);
  r.get("rest_weight_decay", c.rest_weight_decay);
  r.get("embeddings", emb);
  if (emb != "rest" && emb != "muon")
    throw InputError(fmt::format("{}: gefen-muon: embeddings = '{}' (known: rest, muon)", o.source, emb));
  c.embeddings_muon = emb == "muon";
  validate(c);
  return c;
}

}  // namespace

void validate(const GefenMuonConfig& c) {
  if (!(c.momentum >= 0 && c.momentum < 1))
    throw InputError(fmt::format("gefen-muon: momentum = {} must lie in [0, 1)", c.momentum));
  if (!(c.weight_decay >= 0))
    throw InputError(fmt::format("gefen-muon: weight_decay = {} must be ≥ 0", c.weight_decay));
  if (!(c.eps > 0)) throw InputError(fmt::format("gefen-muon: eps = {} must be positive", c.eps));
  if (c.ns_steps >= 100) throw InputError(fmt::format("gefen-muon: ns_steps = {} must be < 100", c.ns_steps));
  if (!std::isfinite(c.ns_a) || !std::isfinite(c.ns_b) || !std::isfinite(c.ns_c))
    throw InputError("gefen-muon: ns_a, ns_b and ns_c must be finite");
  for (auto [key, b] : {std::pair{"rest_beta1", c.rest_beta1}, std::pair{"rest_beta2", c.rest_beta2}})
    if (!(b >= 0 && b < 1)) throw InputError(fmt::format("gefen-muon: {} = {} must lie in [0, 1)", key, b));
  if (!(c.rest_eps > 0)) throw InputError(fmt::format("gefen-muon: rest_eps = {} must be positive", c.rest_eps));
  if (!(c.rest_weight_decay >= 0))
    throw InputError(fmt::format("gefen-muon: rest_weight_decay = {} must be ≥ 0", c.rest_weight_decay));
}

bool gefen_muon_takes(const ParamInfo& p, bool roles, const GefenMuonConfig& c) {
  if (p.shape.size() != 2) return false;
  if (c.rest == GefenMuonRest::refuse || c.embeddings_muon || !roles) return true;
  return p.role != Role::tok_emb && p.role != Role::pos_emb && p.role != Role::lm_head;
}

std::unique_ptr<Optimizer> make_gefen_muon(const ParamSet& p, const GefenMuonConfig& c) {
  validate(c);
  return std::make_unique<GefenMuon>(p, c);
}

OptimizerEntry gefen_muon_entry() {
  return {"gefen-muon",
          "GefenMuon (ndvbd/Gefen): Muon's bf16 Newton-Schulz step on a Gefen 8-bit codebook momentum for the "
          "matrices; Gefen (or AdamW) for the rest",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_gefen_muon(p, parse(o)); }};
}

}  // namespace mantis
