// adam_mini — Adam-mini with a role-based partition; the semantics are in adam_mini.h.
#include "optim/adam_mini.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"
#include "optim/gefen.h"  // gefen_torch_sum: ATen's binary32 sum order

namespace mantis {

uint64_t AdamMiniPartition::blocks() const {
  uint64_t n = 0;
  for (auto& s : segments) n += s.count;
  return n;
}

AdamMiniPartition adam_mini_partition(const ParamInfo& p) {
  uint64_t n = 1;
  for (int64_t d : p.shape) n *= uint64_t(d);
  if (p.bias) return {true, {{n, 1}}};
  auto bad = [&](const char* why) {
    return InputError(fmt::format("adam-mini: parameter '{}' (shape {}): {}", p.name, fmt::join(p.shape, "×"), why));
  };
  switch (p.role) {
    case Role::norm1:
    case Role::norm2:
    case Role::norm_f: return {false, {{1, n}}};
    default: break;
  }
  if (p.shape.size() != 2) throw bad("a weight matrix must have 2 dimensions");
  const uint64_t rows = uint64_t(p.shape[0]), cols = uint64_t(p.shape[1]);
  if (p.role == Role::wq || p.role == Role::wk || p.role == Role::attn_qkv) {
    const uint64_t hb = uint64_t(p.head_blocks), hr = uint64_t(p.head_rows);
    if (p.head_blocks <= 0 || p.head_rows <= 0 || hb * hr != rows) throw bad("its head blocks do not cover its rows");
    if (p.role != Role::attn_qkv) return {false, {{hb, hr * cols}}};
    if (hb % 3 != 0) throw bad("a fused q|k|v weight needs 3·NH head blocks");
    // q and k heads one v each; the v third one v per row (as a separate wv would get)
    return {false, {{2 * hb / 3, hr * cols}, {hb / 3 * hr, cols}}};
  }
  return {false, {{rows, cols}}};  // embeddings, lm_head, wv, attn_proj, MLP: one v per output row
}

namespace {

// PyTorch's lerp(start, end, w) for a binary32 weight (its vectorised CPU form).
inline float lerp(float start, float end, float w) {
  return w < 0.5f ? std::fma(w, end - start, start) : std::fma(w - 1.0f, end - start, end);
}

class AdamMini final : public Optimizer {
 public:
  AdamMini(const ParamSet& ps, const AdamMiniConfig& c) : c_(c) {
    if (!ps.roles)
      throw InputError(
          "adam-mini needs parameter roles (a model's parameter layout) to partition v by head and row; "
          "this parameter set has names and shapes only (give the model configuration)");
    for (auto& p : ps.params) {
      const std::vector<uint64_t> dims(p.shape.begin(), p.shape.end());
      Slot s{p.name, dims, decays(p), adam_mini_partition(p), {}, {}};
      s.m.assign(StateTensor{p.name, DType::f32, dims, {}}.numel(), 0.0f);
      s.v.assign(s.part.blocks(), 0.0f);
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "adam-mini"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = sizeof(t_);
    for (auto& s : slots_) b += (s.m.size() + s.v.size()) * sizeof(float);
    return b;
  }

  void step(Model& m, const GradMap<float>& g, double lr) override {
    ++t_;
    const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
    const float w = float(1 - c_.beta1), b2 = float(c_.beta2), a2 = float(1 - c_.beta2);
    const float bc2_sqrt = float(std::sqrt(bc2)), eps = float(c_.eps), lr_f = float(lr);
    const float inv_bc1 = float(1 / bc1), neg_step = float(-(lr / bc1));
    const float decay = float(1 - lr * c_.weight_decay);
    for (auto& s : slots_) {
      float* p = m.params.at(s.name).data.data();
      const float* gr = g.at(s.name).data();
      float *mm = s.m.data(), *vv = s.v.data();
      const bool wd = s.decay && c_.weight_decay > 0;
      if (s.part.adam) {
        const size_t n = s.m.size();
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; ++i) {
          vv[i] = std::fma(a2 * gr[i], gr[i], b2 * vv[i]);  // torch's addcmul, as its CPU kernel contracts it
          if (wd) p[i] *= decay;
          mm[i] = lerp(mm[i], gr[i], w);
          const float h = std::sqrt(vv[i]) / bc2_sqrt + eps;
          p[i] = p[i] + neg_step * mm[i] / h;
        }
        continue;
      }
      uint64_t off = 0, vb = 0;  // element offset and v index of the segment
      for (const VSegment& seg : s.part.segments) {
        const int64_t count = int64_t(seg.count);
        const uint64_t len = seg.length;
#pragma omp parallel if (seg.count * len > 65536 && seg.count > 1)
        {
          std::vector<float> sq(len);  // this thread's g·g of one block (torch's temporary)
#pragma omp for schedule(static)
          for (int64_t b = 0; b < count; ++b) {
            const uint64_t o = off + uint64_t(b) * len;
            for (uint64_t i = 0; i < len; ++i) sq[i] = gr[o + i] * gr[o + i];
            const float mean = gefen_torch_sum(sq.data(), len) / float(len);
            float& v = vv[vb + uint64_t(b)];
            v = std::fma(mean, a2, b2 * v);
            const float h = std::sqrt(v) / bc2_sqrt + eps;
            const float k = (1.0f / h) * inv_bc1;
            for (uint64_t i = o; i < o + len; ++i) {
              if (wd) p[i] *= decay;
              mm[i] = lerp(mm[i], gr[i], w);
              p[i] = p[i] + -((mm[i] * k) * lr_f);
            }
          }
        }
        off += seg.count * len;
        vb += seg.count;
      }
    }
  }

  // m and v of every parameter, in name order (as AdamW).
  std::vector<StateTensor> state() const override {
    std::map<std::string, StateTensor> by_name;
    for (auto& s : slots_) {
      by_name.emplace(s.name + ".m", StateTensor::of<float>(s.name + ".m", s.shape, s.m));
      by_name.emplace(s.name + ".v", StateTensor::of<float>(s.name + ".v", {s.v.size()}, s.v));
    }
    std::vector<StateTensor> out;
    for (auto& [k, t] : by_name) out.push_back(std::move(t));
    return out;
  }
  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    for (auto& s : slots_) {  // every tensor checked before any is taken
      expect_state(st, s.name + ".m", DType::f32, s.shape);
      expect_state(st, s.name + ".v", DType::f32, {s.v.size()});
    }
    expect_state_count(st, 2 * slots_.size());
    for (auto& s : slots_) {
      expect_state(st, s.name + ".m", DType::f32, s.shape).copy_to(std::span<float>(s.m));
      expect_state(st, s.name + ".v", DType::f32, {s.v.size()}).copy_to(std::span<float>(s.v));
    }
    t_ = steps;
  }

 private:
  struct Slot {
    std::string name;
    std::vector<uint64_t> shape;
    bool decay;
    AdamMiniPartition part;
    std::vector<float> m, v;
  };
  AdamMiniConfig c_;
  std::vector<Slot> slots_;
  uint64_t t_ = 0;
};

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = {"beta1", "beta2", "eps", "weight_decay"};
  return k;
}

AdamMiniConfig parse(const OptimizerOptions& o) {
  const OptionReader r(o, keys());
  AdamMiniConfig c;
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  validate(c);
  return c;
}

}  // namespace

void validate(const AdamMiniConfig& c) {
  check_adam_settings("adam-mini", c.beta1, c.beta2, c.eps, c.weight_decay);
}

std::unique_ptr<Optimizer> make_adam_mini(const ParamSet& p, const AdamMiniConfig& c) {
  validate(c);
  return std::make_unique<AdamMini>(p, c);
}

OptimizerEntry adam_mini_entry() {
  return {"adam-mini",
          "Adam-mini 1.1.1: full binary32 m, one v per head / output row / norm tensor from the parameter roles "
          "(plain Adam for biases); ≈ 4 bytes per parameter",
          keys(), [](const OptimizerOptions& o) { parse(o); },
          [](const ParamSet& p, const OptimizerOptions& o) { return make_adam_mini(p, parse(o)); }};
}

}  // namespace mantis
