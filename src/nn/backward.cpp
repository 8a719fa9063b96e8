// backward — see backward.h: the loss, the saved activations and the two model graphs backward,
// llm.c's layout, shape comments on every buffer; the operations' backward passes live next to
// their forward ones (linear, norm, activation, attention).
#include "nn/backward.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <cmath>
#include <optional>
#include <type_traits>

#include "core/philox.h"
#include "core/reduce.h"
#include "core/quant.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/lora.h"
#include "nn/norm.h"
#include "nn/params.h"
#include "nn/streams.h"
#include "nn/tape.h"

namespace mantis {

using Eigen::Index;
using detail::LayerTape;
using detail::Tape;

const char* to_string(Unit u) { return to_string(site_of(u)); }

std::optional<Unit> unit_of(Role r) {
  switch (r) {
    case Role::attn_qkv: case Role::wq: case Role::wk: case Role::wv: return Unit::qkv;
    case Role::attn_proj: return Unit::proj;
    case Role::mlp_fc: case Role::mlp_gate: case Role::mlp_up: return Unit::fc;
    case Role::mlp_proj: return Unit::down;
    default: return std::nullopt;
  }
}

std::vector<std::string> unit_parameters(const ModelConfig& c, int l, Unit u) {
  std::vector<std::string> names;
  for (const ParamInfo& p : parameter_infos(c))
    if (p.layer == l && unit_of(p.role) == u) names.push_back(p.name);
  return names;
}

int64_t saved_cols(const ModelConfig& c, Unit u) { return u == Unit::down ? c.hidden : c.dim; }

std::string SavedQuant::label() const { return scheme ? scheme->name : std::to_string(bits); }

void validate(const SavedQuant& q) {
  if (q.scheme) {
    if (q.bits != 0 || q.block != 0)
      throw InputError(fmt::format("saved-activation quantisation: scheme {} replaces bits and block (give one)",
                                   q.scheme->name));
    validate(*q.scheme);
  }
  if (q.bits != 0 && (q.bits < 2 || q.bits > 8))
    throw InputError(fmt::format("saved-activation quantisation: bits = {} (0 for exact, or 2..8)", q.bits));
  if (q.block < 0) throw InputError(fmt::format("saved-activation quantisation: block = {} < 0", q.block));
  if (q.rounding != Rounding::rne && q.rounding != Rounding::sr)
    throw InputError(fmt::format("saved-activation quantisation: rounding {} (rne or sr)", to_string(q.rounding)));
}

template <class T>
void quantize_saved(const T* x, T* out, size_t rows, size_t cols, const SavedQuant& q, uint64_t stream) {
  if (q.scheme) {
    Scheme s = *q.scheme;
    std::swap(s.block_rows, s.block_cols);  // blocks along the tokens: the dW GEMM's reduction
    const int sr_bits = std::min(32, 52 - s.element.precision());
    quantize_scheme<T>(s, x, out, int64_t(rows), int64_t(cols), q.rounding, sr_bits, q.seed, stream, 0);
    return;
  }
  if (q.bits == 0) {
    if (out != x) std::copy(x, x + rows * cols, out);
    return;
  }
  quantize_absmax(x, out, rows, cols, AbsmaxQuant{q.bits, size_t(q.block), q.rounding, q.seed}, stream);
}

template void quantize_saved<float>(const float*, float*, size_t, size_t, const SavedQuant&, uint64_t);
template void quantize_saved<double>(const double*, double*, size_t, size_t, const SavedQuant&, uint64_t);

template <class T>
GradMap<T> zero_grads(const Model& m) {
  GradMap<T> g;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    g.emplace(name, std::vector<T>(size_t(n), T(0)));
  }
  for (auto& [name, t] : m.lora.params) g.emplace(name, std::vector<T>(t.data.size(), T(0)));  // lora.h
  return g;
}
template GradMap<float> zero_grads<float>(const Model&);
template GradMap<double> zero_grads<double>(const Model&);

namespace {

using namespace detail;

// Cross-entropy: loss over rows with a target; dlogits = scale·(softmax − onehot) (0 elsewhere).
template <class T>
LossSum cross_entropy_backward(const Matrix<T>& logits, std::span<const int32_t> targets, double scale,
                               Matrix<T>& dlogits) {
  const Index T_ = logits.rows(), V = logits.cols();
  dlogits.setZero(T_, V);
  std::vector<double> loss(size_t(T_), 0.0);
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t) {
    const int32_t y = targets[size_t(t)];
    if (y < 0) continue;
    const T* x = logits.row(t).data();
    T* d = dlogits.row(t).data();
    T mx;
    const T sum = softmax_numerators(x, d, V, mx);
    for (Index j = 0; j < V; ++j) d[j] = T(double(d[j] / sum) * scale);
    d[y] -= T(scale);
    loss[size_t(t)] = double(mx) + std::log(double(sum)) - double(x[y]);
  }
  LossSum ls;
  for (Index t = 0; t < T_; ++t)
    if (targets[size_t(t)] >= 0) ls.sum += loss[size_t(t)], ++ls.count;
  return ls;
}

// max |x[i]| over the non-NaN x[i] (0 if none), as a sequential std::max would give it; on the bit
// patterns, where |x| orders as an unsigned integer, so that it vectorises.
template <class T>
T abs_max(const T* x, size_t n) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr U kAbs = ~U(0) >> 1, kInf = std::bit_cast<U>(std::numeric_limits<T>::infinity());
  U mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const U a = std::bit_cast<U>(x[i]) & kAbs;
    const U b = a & -U(a <= kInf);  // a NaN counts as 0 (this form vectorises; a select does not)
    mx = mx > b ? mx : b;
  }
  return std::bit_cast<T>(mx);
}

// The saved activation a unit's dW reads: x itself, or its quantisation (backward.h).
template <class T>
class Saved {
 public:
  Saved(const BackwardOptions& o, const ModelConfig& c) : opt_(o), layers_(c.layers) {}
  const Matrix<T>& get(int l, Unit u, const Matrix<T>& x) {
    const SavedQuant q = opt_.saved ? opt_.saved(l, u) : SavedQuant{};
    const SavedBlocks* sb = opt_.blocks ? opt_.blocks(l, u) : nullptr;
    if (sb && sb->block <= 0) sb = nullptr;
    const size_t rows = size_t(x.rows()), cols = size_t(x.cols()), n = rows * cols;
    const uint64_t stream = saved_stream(opt_.step, l, u);
    UnitActivation* a = opt_.activations ? &(*opt_.activations)[size_t(l * kUnitCount + int(u))] : nullptr;
    const T* xs = x.data();
    auto err = [&](const T* qs) {
      return lane_sum(n, [xs, qs](size_t i) {
        const double e = double(qs[i]) - double(xs[i]);
        return e * e;
      });
    };
    const Matrix<T>* use = &x;
    if (q.active()) {
      validate(q);
      buf_.resize(x.rows(), x.cols());
      quantize_saved<T>(xs, buf_.data(), rows, cols, q, stream);
      use = &buf_;
    }
    std::optional<double> own_err;  // with blocks: the unit's own path's Σ (x̃ − x)², before recovery
    if (sb) {
      const size_t nb = sb->count(cols), w = size_t(sb->block);
      if (a) {
        a->block_sum_sq.resize(nb), a->block_low_err_sq.resize(nb);
        const T* qs = use->data();
        for (size_t r = 0; r < rows; ++r)
          for (size_t c = 0; c < cols; ++c) {
            const double v = double(xs[r * cols + c]), e = double(qs[r * cols + c]) - v;
            a->block_sum_sq[c / w] += v * v, a->block_low_err_sq[c / w] += e * e;
          }
        own_err = use != &x ? err(use->data()) : 0.0;
      }
      if (std::find(sb->recovered.begin(), sb->recovered.end(), uint8_t(1)) != sb->recovered.end()) {
        if (use == &x) buf_ = x, use = &buf_;
        const T* src = xs;
        if (sb->recover.active()) {
          probe_.resize(x.rows(), x.cols());
          quantize_saved<T>(xs, probe_.data(), rows, cols, sb->recover, stream);
          src = probe_.data();
        }
        for (size_t b = 0; b < nb; ++b)
          if (sb->recovered[b])
            for (size_t r = 0; r < rows; ++r)
              std::copy(src + r * cols + b * w, src + r * cols + std::min(cols, (b + 1) * w), buf_.data() + r * cols + b * w);
      }
    }
    if (a) {
      a->absmax = std::max(a->absmax, double(abs_max(xs, n)));
      a->sum_sq += lane_sum(n, [xs](size_t i) { return double(xs[i]) * double(xs[i]); });
      const double e = use != &x ? err(use->data()) : 0.0;
      a->err_sq += e;
      const std::optional<SavedQuant> low = opt_.low ? opt_.low(l, u) : std::nullopt;
      if (own_err) {
        a->low_err_sq += *own_err;
      } else if (low && low->active()) {
        probe_.resize(x.rows(), x.cols());
        quantize_saved<T>(xs, probe_.data(), rows, cols, *low, stream);
        a->low_err_sq += err(probe_.data());
      } else if (!low) {
        a->low_err_sq += e;
      }
      a->count += uint64_t(n);
    }
    return *use;
  }

 private:
  const BackwardOptions& opt_;
  int layers_;
  Matrix<T> buf_, probe_;
};

// dtok[token_t] += dx_t, dpos[t] += dx_t (when given), positions in order.
template <class T>
void embed_backward(const Matrix<T>& dx, std::span<const int32_t> tokens, Eigen::Map<Matrix<T>>& dtok,
                    Eigen::Map<Matrix<T>>* dpos) {
  for (Index t = 0; t < dx.rows(); ++t) {  // positions in order
    dtok.row(tokens[size_t(t)]) += dx.row(t);
    if (dpos) dpos->row(t) += dx.row(t);
  }
}

template <class T>
void gpt2_backward(const Model& m, std::span<const int32_t> tokens, const Tape<T>& tape, const Matrix<T>& dlogits,
                   const PolicyPlan& pol, GradMap<T>& grads, Saved<T>& saved, bool base) {
  const ModelConfig& c = m.cfg;
  const Index T_ = Index(tokens.size()), C = c.dim, NH = c.heads, HS = c.head_size(), H = c.hidden;
  const T eps = T(c.norm_eps);
  const Weights<T> W(m);
  Grads<T> G(c, grads);
  Matrix<T> dxn(T_, C);                   // [T,C] gradient of a norm's output
  Matrix<T> dx = Matrix<T>::Zero(T_, C);  // [T,C] gradient of the residual stream
  linear_backward<T>(pol, Site::lm_head, -1, 0, dlogits, tape.xnf, W(Role::tok_emb), &dxn, G(Role::tok_emb), nullptr, base);
  norm_backward<T>(tape.x_final, W(Role::norm_f).data(), eps, true, dxn, dx, G(Role::norm_f).data(),
                   G.bias(Role::norm_f));
  Matrix<T> dh(T_, H);    // [T,H]
  Matrix<T> datt(T_, C);  // [T,C]
  Matrix<T> dq, dk, dv;   // [T,C] each
  // Linear `role` of layer l at `site` (weight and bias), backward; dy → din.
  const LoraViews<T> lora(m, &grads);
  auto linear = [&](Site site, Role role, int l, const Matrix<T>& dy, const Matrix<T>& x, Matrix<T>& din) {
    linear_backward<T>(pol, site, l, 0, dy, x, W(role, l), &din, G(role, l), G.bias(role, l), base);
    lora.backward(role, l, dy, x, din);
  };
  auto norm = [&](Role role, int l, const Matrix<T>& x) {
    norm_backward<T>(x, W(role, l).data(), eps, true, dxn, dx, G(role, l).data(), G.bias(role, l));
  };
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerTape<T>& lt = tape.layers[size_t(l)];
    // MLP: x += c_proj(GELU(c_fc(ln_2(x))))
    linear(Site::mlp_proj, Role::mlp_proj, l, dx, saved.get(l, Unit::down, lt.act), dh);
    gelu_backward<T>(lt.pre, c.gelu_tanh, dh, &lt.aux);
    linear(Site::mlp_fc, Role::mlp_fc, l, dh, saved.get(l, Unit::fc, lt.xn2), dxn);
    norm(Role::norm2, l, lt.x_mid);
    // attention: x += c_proj(attn(ln_1(x)))
    linear(Site::attn_proj, Role::attn_proj, l, dx, saved.get(l, Unit::proj, lt.att), datt);
    attention_backward<T>(pol, l, lt.probs, lt.q, lt.k, lt.v, datt, NH, NH, HS, dq, dk, dv);
    Matrix<T> dqkv(T_, 3 * C);  // [T,3C]
    dqkv << dq, dk, dv;
    linear(Site::attn_qkv, Role::attn_qkv, l, dqkv, saved.get(l, Unit::qkv, lt.xn1), dxn);
    norm(Role::norm1, l, lt.x_in);
  }
  embed_backward<T>(dx, tokens, G(Role::tok_emb), &G(Role::pos_emb));
}

template <class T>
void llama_backward(const Model& m, std::span<const int32_t> tokens, const Tape<T>& tape, const Matrix<T>& dlogits,
                    const PolicyPlan& pol, GradMap<T>& grads, Saved<T>& saved, bool base) {
  const ModelConfig& c = m.cfg;
  const Index T_ = Index(tokens.size()), C = c.dim, NH = c.heads, NKV = c.kv_heads, HS = c.head_size(), H = c.hidden;
  const T eps = T(c.norm_eps);
  const Weights<T> W(m);
  Grads<T> G(c, grads);
  Matrix<T> dxn(T_, C), tmp(T_, C);       // [T,C]
  Matrix<T> dx = Matrix<T>::Zero(T_, C);  // [T,C] gradient of the residual stream
  const Role out = c.tied ? Role::tok_emb : Role::lm_head;
  linear_backward<T>(pol, Site::lm_head, -1, 0, dlogits, tape.xnf, W(out), &dxn, G(out), nullptr, base);
  norm_backward<T>(tape.x_final, W(Role::norm_f).data(), eps, false, dxn, dx, G(Role::norm_f).data(), nullptr);
  Matrix<T> dh(T_, H), dup(T_, H);  // [T,H]
  Matrix<T> datt(T_, C);            // [T,C]
  Matrix<T> dq, dk, dv;             // [T,C], [T,KVC], [T,KVC]
  // Linear `role` of layer l at `site` (no bias), backward; slot: its key among the site's GEMMs.
  const LoraViews<T> lora(m, &grads);
  auto linear = [&](Site site, Role role, int l, Index slot, const Matrix<T>& dy, const Matrix<T>& x, Matrix<T>& din) {
    linear_backward<T>(pol, site, l, slot, dy, x, W(role, l), &din, G(role, l), nullptr, base);
    lora.backward(role, l, dy, x, din);
  };
  auto norm = [&](Role role, int l, const Matrix<T>& x) {
    norm_backward<T>(x, W(role, l).data(), eps, false, dxn, dx, G(role, l).data(), nullptr);
  };
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerTape<T>& lt = tape.layers[size_t(l)];
    // MLP: x += w2(silu(w1·x) ⊙ w3·x), x = ffn_norm(x)
    linear(Site::mlp_proj, Role::mlp_proj, l, 0, dx, saved.get(l, Unit::down, lt.act), dh);
    swiglu_backward<T>(lt.pre, lt.up, dh, dup, &lt.aux);
    const Matrix<T>& xn2 = saved.get(l, Unit::fc, lt.xn2);
    linear(Site::mlp_fc, Role::mlp_gate, l, 0, dh, xn2, dxn);
    linear(Site::mlp_fc, Role::mlp_up, l, 1, dup, xn2, tmp);
    dxn += tmp;
    norm(Role::norm2, l, lt.x_mid);
    // attention
    linear(Site::attn_proj, Role::attn_proj, l, 0, dx, saved.get(l, Unit::proj, lt.att), datt);
    attention_backward<T>(pol, l, lt.probs, lt.q, lt.k, lt.v, datt, NH, NKV, HS, dq, dk, dv);
    rope_backward<T>(dq, NH, HS, tape.rcos, tape.rsin);
    rope_backward<T>(dk, NKV, HS, tape.rcos, tape.rsin);
    const Matrix<T>& xn1 = saved.get(l, Unit::qkv, lt.xn1);
    linear(Site::attn_qkv, Role::wq, l, 0, dq, xn1, dxn);
    linear(Site::attn_qkv, Role::wk, l, 1, dk, xn1, tmp);
    dxn += tmp;
    linear(Site::attn_qkv, Role::wv, l, 2, dv, xn1, tmp);
    dxn += tmp;
    norm(Role::norm1, l, lt.x_in);
  }
  embed_backward<T>(dx, tokens, G(Role::tok_emb), nullptr);
}

// targets [T]: −1 (none) or a token.
void check_targets(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  if (targets.size() != tokens.size())
    throw InputError(fmt::format("backward: {} targets for {} tokens", targets.size(), tokens.size()));
  for (size_t t = 0; t < targets.size(); ++t)
    if (targets[t] < -1 || targets[t] >= m.cfg.vocab)
      throw InputError(fmt::format("backward: target {} at position {} is outside the vocabulary [0, {}) (−1: none)",
                                   targets[t], t, m.cfg.vocab));
}

}  // namespace

template <class T>
LossSum sequence_backward(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                          const PolicyPlan& plan, double scale, GradMap<T>& grads, const BackwardOptions& opt) {
  check_targets(m, tokens, targets);
  if (opt.activations) opt.activations->resize(size_t(m.cfg.layers * kUnitCount));
  Tape<T> tape;
  const Matrix<T> logits = detail::forward_tape<T>(m, tokens, plan, tape);  // [T,V]
  Matrix<T> dlogits;                                                         // [T,V]
  const LossSum loss = cross_entropy_backward<T>(logits, targets, scale, dlogits);
  Saved<T> saved(opt, m.cfg);
  if (m.cfg.arch == Arch::gpt2) gpt2_backward<T>(m, tokens, tape, dlogits, plan, grads, saved, opt.base_weight_grads);
  else llama_backward<T>(m, tokens, tape, dlogits, plan, grads, saved, opt.base_weight_grads);
  return loss;
}

template <class T>
LossSum sequence_backward(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                          const Policy& policy, double scale, GradMap<T>& grads, const BackwardOptions& opt) {
  check_targets(m, tokens, targets);  // the targets', then the tokens' errors before the policy's
  detail::check_tokens(m, tokens);
  return sequence_backward<T>(m, tokens, targets, PolicyPlan(policy, m.cfg), scale, grads, opt);
}

template LossSum sequence_backward<float>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                          const Policy&, double, GradMap<float>&, const BackwardOptions&);
template LossSum sequence_backward<double>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                           const Policy&, double, GradMap<double>&, const BackwardOptions&);
template LossSum sequence_backward<float>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                          const PolicyPlan&, double, GradMap<float>&, const BackwardOptions&);
template LossSum sequence_backward<double>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                           const PolicyPlan&, double, GradMap<double>&, const BackwardOptions&);

}  // namespace mantis
