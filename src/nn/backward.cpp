// backward — see backward.h: the loss, the saved activations and the two model graphs backward,
// llm.c's layout, shape comments on every buffer; the operations' backward passes live next to
// their forward ones (linear, norm, activation, attention).
#include "nn/backward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/philox.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/norm.h"
#include "nn/streams.h"
#include "nn/tape.h"

namespace mantis {

using Eigen::Index;
using detail::LayerTape;
using detail::Tape;

const char* to_string(Unit u) { return to_string(site_of(u)); }

std::vector<std::string> unit_parameters(const ModelConfig& c, int l, Unit u) {
  if (c.arch == Arch::gpt2) {
    const std::string p = fmt::format("h.{}.", l);
    const char* base[] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    return {p + base[int(u)] + ".weight", p + base[int(u)] + ".bias"};
  }
  const std::string p = fmt::format("layers.{}.", l);
  switch (u) {
    case Unit::qkv: return {p + "attention.wq", p + "attention.wk", p + "attention.wv"};
    case Unit::proj: return {p + "attention.wo"};
    case Unit::fc: return {p + "feed_forward.w1", p + "feed_forward.w3"};
    case Unit::down: return {p + "feed_forward.w2"};
  }
  return {};
}

void validate(const SavedQuant& q) {
  if (q.bits != 0 && (q.bits < 2 || q.bits > 8))
    throw InputError(fmt::format("saved-activation quantisation: bits = {} (0 for exact, or 2..8)", q.bits));
  if (q.block < 0) throw InputError(fmt::format("saved-activation quantisation: block = {} < 0", q.block));
  if (q.rounding != Rounding::rne && q.rounding != Rounding::sr)
    throw InputError(fmt::format("saved-activation quantisation: rounding {} (rne or sr)", to_string(q.rounding)));
}

template <class T>
void quantize_saved(const T* x, T* out, size_t rows, size_t cols, const SavedQuant& q, uint64_t stream) {
  if (q.bits == 0) {
    if (out != x) std::copy(x, x + rows * cols, out);
    return;
  }
  const size_t group = q.block == 0 ? cols : size_t(q.block);
  const double Q = double((1 << (q.bits - 1)) - 1);
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; ++r)
    for (size_t g0 = 0; g0 < cols; g0 += group) {
      const size_t g1 = std::min(cols, g0 + group);
      T amax = 0;
      for (size_t i = g0; i < g1; ++i) amax = std::max(amax, std::abs(x[r * cols + i]));
      const T s = T(double(amax) / Q);  // the stored scale
      for (size_t i = g0; i < g1; ++i) {
        const size_t idx = r * cols + i;
        if (s == T(0)) {
          out[idx] = T(0);
          continue;
        }
        const double v = double(x[idx]) / double(s);
        double k = q.rounding == Rounding::sr
                       ? std::floor(v + double(random_word(q.seed, stream, idx)) * 0x1p-32)
                       : std::nearbyint(v);
        k = std::clamp(k, -Q, Q);
        out[idx] = T(k) * s;
      }
    }
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
  return g;
}
template GradMap<float> zero_grads<float>(const Model&);
template GradMap<double> zero_grads<double>(const Model&);

namespace {

using namespace detail;

// A parameter as [rows, cols] in T: a view for float, a converted copy for double.
template <class T>
using WeightView = std::conditional_t<std::is_same_v<T, float>, Eigen::Map<const Matrix<float>>, Matrix<T>>;
template <class T>
WeightView<T> weight(const Model& m, const std::string& name, Index rows, Index cols) {
  const Tensor& t = m.params.at(name);  // forward_tape has checked names and shapes
  Eigen::Map<const Matrix<float>> f(t.data.data(), rows, cols);
  if constexpr (std::is_same_v<T, float>) return f;
  else return f.template cast<T>();
}

template <class T>
Eigen::Map<Matrix<T>> grad(GradMap<T>& g, const std::string& name, Index rows, Index cols) {
  auto it = g.find(name);
  if (it == g.end() || Index(it->second.size()) != rows * cols)
    throw std::logic_error(fmt::format("backward: gradient buffer '{}' missing or mis-sized", name));
  return Eigen::Map<Matrix<T>>(it->second.data(), rows, cols);
}

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
    T mx = x[0];
    for (Index j = 1; j < V; ++j) mx = std::max(mx, x[j]);
    T sum = 0;
    for (Index j = 0; j < V; ++j) {
      d[j] = std::exp(x[j] - mx);
      sum += d[j];
    }
    for (Index j = 0; j < V; ++j) d[j] = T(double(d[j] / sum) * scale);
    d[y] -= T(scale);
    loss[size_t(t)] = double(mx) + std::log(double(sum)) - double(x[y]);
  }
  LossSum ls;
  for (Index t = 0; t < T_; ++t)
    if (targets[size_t(t)] >= 0) ls.sum += loss[size_t(t)], ++ls.count;
  return ls;
}

// The saved activation a unit's dW reads: x itself, or its quantisation (backward.h).
template <class T>
class Saved {
 public:
  Saved(const BackwardOptions& o, const ModelConfig& c) : opt_(o), layers_(c.layers) {}
  const Matrix<T>& get(int l, Unit u, const Matrix<T>& x) {
    const SavedQuant q = opt_.saved ? opt_.saved(l, u) : SavedQuant{};
    const Matrix<T>* use = &x;
    if (q.bits != 0) {
      validate(q);
      buf_.resize(x.rows(), x.cols());
      const uint64_t stream = saved_stream(opt_.step, l, u);
      quantize_saved<T>(x.data(), buf_.data(), size_t(x.rows()), size_t(x.cols()), q, stream);
      use = &buf_;
    }
    if (opt_.activations) {
      UnitActivation& a = (*opt_.activations)[size_t(l * kUnitCount + int(u))];
      const Index n = x.size();
      for (Index i = 0; i < n; ++i) {
        const double v = double(x.data()[i]), e = double(use->data()[i]) - v;
        a.absmax = std::max(a.absmax, std::abs(v));
        a.sum_sq += v * v;
        a.err_sq += e * e;
      }
      a.count += uint64_t(n);
    }
    return *use;
  }

 private:
  const BackwardOptions& opt_;
  int layers_;
  Matrix<T> buf_;
};

template <class T>
void embed_backward(const Matrix<T>& dx, std::span<const int32_t> tokens, Eigen::Map<Matrix<T>> dtok,
                    Eigen::Map<Matrix<T>>* dpos) {
  for (Index t = 0; t < dx.rows(); ++t) {  // positions in order
    dtok.row(tokens[size_t(t)]) += dx.row(t);
    if (dpos) dpos->row(t) += dx.row(t);
  }
}

template <class T>
void gpt2_backward(const Model& m, std::span<const int32_t> tokens, const Tape<T>& tape, const Matrix<T>& dlogits,
                   const Policy& pol, GradMap<T>& g, Saved<T>& saved) {
  const ModelConfig& c = m.cfg;
  const Index T_ = Index(tokens.size()), C = c.dim, NH = c.heads, HS = c.head_size(), H = c.hidden, V = c.vocab;
  const T eps = T(c.norm_eps);
  Matrix<T> dxn(T_, C);   // [T,C] gradient of a norm's output
  Matrix<T> dx = Matrix<T>::Zero(T_, C);  // [T,C] gradient of the residual stream
  const auto wte = weight<T>(m, "wte", V, C);
  linear_backward<T>(pol, Site::lm_head, -1, 0, dlogits, tape.xnf, wte, &dxn, grad(g, "wte", V, C), nullptr);
  {
    const auto w = weight<T>(m, "ln_f.weight", 1, C);
    norm_backward<T>(tape.x_final, w.data(), eps, true, dxn, dx, grad(g, "ln_f.weight", 1, C).data(),
                     grad(g, "ln_f.bias", 1, C).data());
  }
  Matrix<T> dh(T_, H);                            // [T,H]
  Matrix<T> datt(T_, C);                          // [T,C]
  Matrix<T> dq, dk, dv;                           // [T,C] each
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerTape<T>& lt = tape.layers[size_t(l)];
    const std::string p = fmt::format("h.{}.", l);
    // MLP: x += c_proj(GELU(c_fc(ln_2(x))))
    linear_backward<T>(pol, Site::mlp_proj, l, 0, dx, saved.get(l, Unit::down, lt.act), weight<T>(m, p + "mlp.c_proj.weight", C, H),
                       &dh, grad(g, p + "mlp.c_proj.weight", C, H), grad(g, p + "mlp.c_proj.bias", 1, C).data());
    gelu_backward<T>(lt.pre, c.gelu_tanh, dh);
    linear_backward<T>(pol, Site::mlp_fc, l, 0, dh, saved.get(l, Unit::fc, lt.xn2), weight<T>(m, p + "mlp.c_fc.weight", H, C),
                       &dxn, grad(g, p + "mlp.c_fc.weight", H, C), grad(g, p + "mlp.c_fc.bias", 1, H).data());
    norm_backward<T>(lt.x_mid, weight<T>(m, p + "ln_2.weight", 1, C).data(), eps, true, dxn, dx,
                     grad(g, p + "ln_2.weight", 1, C).data(), grad(g, p + "ln_2.bias", 1, C).data());
    // attention: x += c_proj(attn(ln_1(x)))
    linear_backward<T>(pol, Site::attn_proj, l, 0, dx, saved.get(l, Unit::proj, lt.att), weight<T>(m, p + "attn.c_proj.weight", C, C),
                       &datt, grad(g, p + "attn.c_proj.weight", C, C), grad(g, p + "attn.c_proj.bias", 1, C).data());
    attention_backward<T>(pol, l, lt.probs, lt.q, lt.k, lt.v, datt, NH, NH, HS, dq, dk, dv);
    Matrix<T> dqkv(T_, 3 * C);  // [T,3C]
    dqkv << dq, dk, dv;
    linear_backward<T>(pol, Site::attn_qkv, l, 0, dqkv, saved.get(l, Unit::qkv, lt.xn1),
                       weight<T>(m, p + "attn.c_attn.weight", 3 * C, C), &dxn, grad(g, p + "attn.c_attn.weight", 3 * C, C),
                       grad(g, p + "attn.c_attn.bias", 1, 3 * C).data());
    norm_backward<T>(lt.x_in, weight<T>(m, p + "ln_1.weight", 1, C).data(), eps, true, dxn, dx,
                     grad(g, p + "ln_1.weight", 1, C).data(), grad(g, p + "ln_1.bias", 1, C).data());
  }
  auto dpos = grad(g, "wpe", c.ctx, C);
  embed_backward<T>(dx, tokens, grad(g, "wte", V, C), &dpos);
}

template <class T>
void llama_backward(const Model& m, std::span<const int32_t> tokens, const Tape<T>& tape, const Matrix<T>& dlogits,
                    const Policy& pol, GradMap<T>& g, Saved<T>& saved) {
  const ModelConfig& c = m.cfg;
  const Index T_ = Index(tokens.size()), C = c.dim, NH = c.heads, NKV = c.kv_heads, HS = c.head_size(),
              KVC = NKV * HS, H = c.hidden, V = c.vocab;
  const T eps = T(c.norm_eps);
  Matrix<T> dxn(T_, C), tmp(T_, C);       // [T,C]
  Matrix<T> dx = Matrix<T>::Zero(T_, C);  // [T,C] gradient of the residual stream
  const std::string out_name = c.tied ? "tok_embeddings" : "output";
  linear_backward<T>(pol, Site::lm_head, -1, 0, dlogits, tape.xnf, weight<T>(m, out_name, V, C), &dxn, grad(g, out_name, V, C),
                     nullptr);
  norm_backward<T>(tape.x_final, weight<T>(m, "norm", 1, C).data(), eps, false, dxn, dx, grad(g, "norm", 1, C).data(),
                   nullptr);
  Matrix<T> dh(T_, H), dup(T_, H);  // [T,H]
  Matrix<T> datt(T_, C);            // [T,C]
  Matrix<T> dq, dk, dv;             // [T,C], [T,KVC], [T,KVC]
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerTape<T>& lt = tape.layers[size_t(l)];
    const std::string p = fmt::format("layers.{}.", l);
    // MLP: x += w2(silu(w1·x) ⊙ w3·x), x = ffn_norm(x)
    linear_backward<T>(pol, Site::mlp_proj, l, 0, dx, saved.get(l, Unit::down, lt.act), weight<T>(m, p + "feed_forward.w2", C, H),
                       &dh, grad(g, p + "feed_forward.w2", C, H), nullptr);
    swiglu_backward<T>(lt.pre, lt.up, dh, dup);
    const Matrix<T>& xn2 = saved.get(l, Unit::fc, lt.xn2);
    linear_backward<T>(pol, Site::mlp_fc, l, 0, dh, xn2, weight<T>(m, p + "feed_forward.w1", H, C), &dxn,
                       grad(g, p + "feed_forward.w1", H, C), nullptr);
    linear_backward<T>(pol, Site::mlp_fc, l, 1, dup, xn2, weight<T>(m, p + "feed_forward.w3", H, C), &tmp,
                       grad(g, p + "feed_forward.w3", H, C), nullptr);
    dxn += tmp;
    norm_backward<T>(lt.x_mid, weight<T>(m, p + "ffn_norm", 1, C).data(), eps, false, dxn, dx,
                     grad(g, p + "ffn_norm", 1, C).data(), nullptr);
    // attention
    linear_backward<T>(pol, Site::attn_proj, l, 0, dx, saved.get(l, Unit::proj, lt.att), weight<T>(m, p + "attention.wo", C, C),
                       &datt, grad(g, p + "attention.wo", C, C), nullptr);
    attention_backward<T>(pol, l, lt.probs, lt.q, lt.k, lt.v, datt, NH, NKV, HS, dq, dk, dv);
    rope_backward<T>(dq, NH, HS, tape.rcos, tape.rsin);
    rope_backward<T>(dk, NKV, HS, tape.rcos, tape.rsin);
    const Matrix<T>& xn1 = saved.get(l, Unit::qkv, lt.xn1);
    linear_backward<T>(pol, Site::attn_qkv, l, 0, dq, xn1, weight<T>(m, p + "attention.wq", C, C), &dxn,
                       grad(g, p + "attention.wq", C, C), nullptr);
    linear_backward<T>(pol, Site::attn_qkv, l, 1, dk, xn1, weight<T>(m, p + "attention.wk", KVC, C), &tmp,
                       grad(g, p + "attention.wk", KVC, C), nullptr);
    dxn += tmp;
    linear_backward<T>(pol, Site::attn_qkv, l, 2, dv, xn1, weight<T>(m, p + "attention.wv", KVC, C), &tmp,
                       grad(g, p + "attention.wv", KVC, C), nullptr);
    dxn += tmp;
    norm_backward<T>(lt.x_in, weight<T>(m, p + "attention_norm", 1, C).data(), eps, false, dxn, dx,
                     grad(g, p + "attention_norm", 1, C).data(), nullptr);
  }
  embed_backward<T>(dx, tokens, grad(g, "tok_embeddings", V, C), nullptr);
}

}  // namespace

template <class T>
LossSum sequence_backward(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                          const Policy& policy, double scale, GradMap<T>& grads, const BackwardOptions& opt) {
  if (targets.size() != tokens.size())
    throw InputError(fmt::format("backward: {} targets for {} tokens", targets.size(), tokens.size()));
  for (size_t t = 0; t < targets.size(); ++t)
    if (targets[t] < -1 || targets[t] >= m.cfg.vocab)
      throw InputError(fmt::format("backward: target {} at position {} is outside the vocabulary [0, {}) (−1: none)",
                                   targets[t], t, m.cfg.vocab));
  if (opt.activations) opt.activations->resize(size_t(m.cfg.layers * kUnitCount));
  Tape<T> tape;
  const Matrix<T> logits = detail::forward_tape<T>(m, tokens, policy, tape);  // [T,V]
  Matrix<T> dlogits;                                                           // [T,V]
  const LossSum loss = cross_entropy_backward<T>(logits, targets, scale, dlogits);
  Saved<T> saved(opt, m.cfg);
  if (m.cfg.arch == Arch::gpt2) gpt2_backward<T>(m, tokens, tape, dlogits, policy, grads, saved);
  else llama_backward<T>(m, tokens, tape, dlogits, policy, grads, saved);
  return loss;
}

template LossSum sequence_backward<float>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                          const Policy&, double, GradMap<float>&, const BackwardOptions&);
template LossSum sequence_backward<double>(const Model&, std::span<const int32_t>, std::span<const int32_t>,
                                           const Policy&, double, GradMap<double>&, const BackwardOptions&);

}  // namespace mantis
