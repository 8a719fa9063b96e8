#include "optim/gefen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "optim/gefen_codebook.h"
#include "optim/nearest_code.h"

namespace mantis {

std::vector<float> gefen_learn_codebook(const std::vector<std::span<const float>>& grads,
                                        const std::vector<size_t>& periods) {
  std::vector<int64_t> counts(kGefenHistogramBins, 0);
  for (size_t i = 0; i < grads.size(); ++i) add_to_gefen_histogram(grads[i], periods[i], counts);
  return learn_gefen_codebook(counts, kGefenCodebookSize).codes;
}

float gefen_torch_sum(const float* x, size_t n) { return gefen_aten_sum<false>(x, n); }

namespace {

struct Slot {
  std::string name;
  std::vector<uint64_t> shape;
  size_t n = 0;
  bool decay = false;
  size_t P = 0, Q = 0;  // 0: before the first step
  std::vector<uint8_t> idx;
  std::vector<float> mag, v;
};

class Gefen final : public Optimizer {
 public:
  Gefen(const ParamSet& ps, const GefenConfig& c) : c_(c), codebook_(kGefenCodebookSize, 0.0f) {
    for (auto& p : ps.params) {
      Slot s;
      s.name = p.name;
      s.shape.assign(p.shape.begin(), p.shape.end());
      s.n = StateTensor{p.name, DType::u8, s.shape, {}}.numel();
      s.decay = decays(p);
      s.idx.assign(s.n, 0);
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "gefen"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_) + codebook_.size() * sizeof(float);
    for (auto& s : slots_) b += s.idx.size() + (s.mag.size() + s.v.size()) * sizeof(float) + sizeof(uint64_t);
    return b;
  }

  void step(Model& m, const GradMap<float>& g, double lr) override {
    if (!ready()) first_step(g);
    else if (c_.relearn_every > 0 && t_ % c_.relearn_every == 0) relearn(g);
    ++t_;
    const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
    GefenScalars k{};
    k.b2 = float(c_.beta2), k.a2 = float(1 - c_.beta2), k.w = float(1 - c_.beta1);
    k.inv_bc1 = float(1 / bc1), k.bc2_sqrt = float(std::sqrt(bc2)), k.eps = float(c_.eps), k.lr = float(lr);
    k.decay = float(1 - lr * c_.weight_decay);
    const NearestCode nc(codebook_);  // built per step (~0.15 ms), never stale
    for (auto& s : slots_) {
      k.wd = s.decay && c_.weight_decay > 0;
      update(s, m.params.at(s.name).data.data(), g.at(s.name).data(), k, nc);
    }
  }

  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    out.push_back(StateTensor::of<float>("codebook", {uint64_t(codebook_.size())}, codebook_));
    for (auto& s : slots_) {
      out.push_back(StateTensor::of<uint8_t>(s.name + ".idx", s.shape, s.idx));
      out.push_back(StateTensor::of<float>(s.name + ".mag", {uint64_t(s.mag.size())}, s.mag));
      out.push_back(StateTensor::of<float>(s.name + ".v", {uint64_t(s.v.size())}, s.v));
      const uint64_t P = s.P;
      out.push_back(StateTensor::of<uint64_t>(s.name + ".period", {}, std::span<const uint64_t>(&P, 1)));
    }
    return out;
  }

  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    // Everything is checked before anything is taken.
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
      P[i] = size_t(p);
      set += p != 0;
      const size_t Q = p ? gefen_magnitude_block(s.n, P[i]) : 0;
      expect_state(st, s.name + ".idx", DType::u8, s.shape);
      expect_state(st, s.name + ".mag", DType::f32, {uint64_t(p ? s.n / Q : 0)});
      expect_state(st, s.name + ".v", DType::f32, {uint64_t(p ? s.n / P[i] : 0)});
    }
    expect_state_count(st, 1 + 4 * slots_.size());
    if (set != 0 && set != slots_.size())
      throw InputError("optimizer state: gefen periods are set for some tensors but not for others");
    if (set == 0 && steps != 0)
      throw InputError(fmt::format("optimizer state: gefen has no periods but {} steps", steps));
    if (set != 0 && !std::is_sorted(cb.begin(), cb.end()))
      throw InputError("optimizer state: the gefen codebook is not ascending");
    codebook_ = cb;
    for (size_t i = 0; i < slots_.size(); ++i) {
      auto& s = slots_[i];
      s.P = P[i], s.Q = P[i] ? gefen_magnitude_block(s.n, P[i]) : 0;
      s.mag.assign(s.P ? s.n / s.Q : 0, 0.0f), s.v.assign(s.P ? s.n / s.P : 0, 0.0f);
      expect_state(st, s.name + ".idx", DType::u8, s.shape).copy_to(std::span(s.idx));
      expect_state(st, s.name + ".mag", DType::f32, {uint64_t(s.mag.size())}).copy_to(std::span(s.mag));
      expect_state(st, s.name + ".v", DType::f32, {uint64_t(s.v.size())}).copy_to(std::span(s.v));
    }
    t_ = steps;
  }

 private:
  bool ready() const { return slots_.empty() || slots_.front().P != 0; }

  void first_step(const GradMap<float>& g) {
    std::vector<std::span<const float>> grads;
    std::vector<size_t> periods;
    for (auto& s : slots_) {
      const std::vector<float>& gr = g.at(s.name);
      s.P = std::max<size_t>(1, gefen_period(gr, c_.period_rule));
      s.Q = gefen_magnitude_block(s.n, s.P);
      s.mag.assign(s.n / s.Q, 0.0f), s.v.assign(s.n / s.P, 0.0f);
      grads.push_back(gr), periods.push_back(s.P);
    }
    codebook_ = gefen_learn_codebook(grads, periods);
  }

  void relearn(const GradMap<float>& g) {
    std::vector<std::span<const float>> grads;
    std::vector<size_t> periods;
    for (auto& s : slots_) grads.push_back(g.at(s.name)), periods.push_back(s.P);
    const std::vector<float> old = codebook_;
    codebook_ = gefen_learn_codebook(grads, periods);
    const NearestCode nc(codebook_);
    for (auto& s : slots_) {
      uint8_t* idx = s.idx.data();
      const size_t n = s.n;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (size_t i = 0; i < n; ++i) idx[i] = nc(old[idx[i]]);
    }
  }

  // The update of one tensor, one Q-block at a time (gefen_block.h), the codes by NearestCode.
  void update(Slot& s, float* p, const float* g, const GefenScalars& k, const NearestCode& nc) const {
    const size_t P = s.P, Q = s.Q, nq = s.n / Q, nv = Q / P;  // nv: P-blocks per Q-block (1, or Q when P = 1)
    const float* C = codebook_.data();
    auto codes = [&nc](const float* x, size_t n, uint32_t* out) { nc.codes(x, n, out); };
#pragma omp parallel if (s.n > 16384)
    {
      std::vector<float> mbuf(Q), sbuf(nv);  // [Q] m, then m/mag; [nv] s_b
      std::vector<uint32_t> cbuf(Q);         // [Q] the new codes
#pragma omp for schedule(static)
      for (size_t q = 0; q < nq; ++q)
        gefen_update_block(q, P, Q, p, g, s.idx.data(), s.mag.data(), s.v.data(), C, k, mbuf.data(), cbuf.data(),
                           sbuf.data(), codes);
    }
  }

  GefenConfig c_;
  std::vector<float> codebook_;
  std::vector<Slot> slots_;
  uint64_t t_ = 0;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"beta1", "beta2", "eps", "weight_decay", "period_rule", "relearn_every"};
  return k;
}

GefenConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  GefenConfig c;
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  std::string rule = to_string(c.period_rule);
  r.get("period_rule", rule);
  if (rule == "code") c.period_rule = GefenPeriodRule::code;
  else if (rule == "brief") c.period_rule = GefenPeriodRule::brief;
  else throw InputError(fmt::format("{}: gefen: period_rule = '{}' (known: code, brief)", o.source, rule));
  r.get("relearn_every", c.relearn_every);
  validate(c);
  return c;
}

}  // namespace

void validate(const GefenConfig& c) {
  check_adam_settings("gefen", c.beta1, c.beta2, c.eps, c.weight_decay);
}

std::unique_ptr<Optimizer> make_gefen(const ParamSet& p, const GefenConfig& c) {
  validate(c);
  return std::make_unique<Gefen>(p, c);
}

OptimizerEntry gefen_entry() {
  return {"gefen",
          "Gefen as released (ndvbd/Gefen): per-block shared v, momentum as 8-bit codes of a learned 256-entry "
          "codebook; ~1 byte per parameter",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_gefen(p, parse(o)); }};
}

std::vector<float> gefen_momentum(const std::vector<StateTensor>& state, const std::string& param) {
  auto find = [&](const std::string& name) -> const StateTensor& {
    for (auto& t : state)
      if (t.name == name) return t;
    throw InputError(fmt::format("gefen momentum: no state tensor '{}'", name));
  };
  const StateTensor& cb = find("codebook");
  const StateTensor &idx = find(param + ".idx"), &mag = find(param + ".mag"), &per = find(param + ".period");
  if (cb.dtype != DType::f32 || cb.numel() != uint64_t(kGefenCodebookSize) || idx.dtype != DType::u8 ||
      mag.dtype != DType::f32 || per.dtype != DType::u64 || per.numel() != 1)
    throw InputError(fmt::format("gefen momentum: the state of '{}' has unexpected dtypes or shapes", param));
  const size_t n = idx.numel();
  uint64_t P = 0;
  per.copy_to(std::span<uint64_t>(&P, 1));
  std::vector<float> out(n, 0.0f);
  if (P == 0) return out;
  const size_t Q = gefen_magnitude_block(n, P);
  if (n % P != 0 || mag.numel() != n / Q)
    throw InputError(fmt::format("gefen momentum: the state of '{}' is inconsistent with period {}", param, P));
  std::vector<float> C(kGefenCodebookSize), M(n / Q);
  std::vector<uint8_t> I(n);
  cb.copy_to(std::span<float>(C));
  if (n == 0) return out;
  mag.copy_to(std::span<float>(M)), idx.copy_to(std::span<uint8_t>(I));
  for (size_t i = 0; i < n; ++i) out[i] = C[I[i]] * M[i / Q];
  return out;
}

}  // namespace mantis
