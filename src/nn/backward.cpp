// backward — see backward.h. One function per layer kind, the two models at the bottom, llm.c's
// layout; shape comments on every buffer.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // Eigen AVX-512 false positive (forward.cpp)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "nn/backward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/quant.h"
#include "core/round_array.h"  // defines: ParallelErrors
#include "nn/tape.h"

namespace mantis {

using Eigen::Index;
using detail::LayerTape;
using detail::stream_of;
using detail::Tape;

const char* to_string(Unit u) {
  static const char* n[] = {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"};
  return n[int(u)];
}

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
  return g;
}
template GradMap<float> zero_grads<float>(const Model&);
template GradMap<double> zero_grads<double>(const Model&);

namespace {

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

uint64_t grad_stream(Site s, int l, Index slot, Pass p) { return stream_of(s, l, slot + 1024 * Index(p)); }

// Linear y = x·Wᵀ (+ b) at `site`: dW += dyᵀ·x (Pass::dw), db += Σ_rows dy, and dx = dy·W
// (Pass::dx) when dx is given. dy [N,out], x [N,in], W [out,in].
template <class T, class W>
void linear_backward(const Policy& pol, Site site, int l, Index slot, const Matrix<T>& dy, const Matrix<T>& x,
                     const W& w, Matrix<T>* dx, GradMap<T>& g, const std::string& wname, const std::string& bname) {
  const Index N = dy.rows(), out = dy.cols(), in = x.cols();
  {
    const Matrix<T> dyT = dy.transpose();  // [out,N]
    Matrix<T> dW(out, in);                 // [out,in]
    site_gemm<T>(pol.at(site, l, Pass::dw), dyT, x, false, dW, grad_stream(site, l, slot, Pass::dw));
    grad(g, wname, out, in) += dW;
  }
  if (!bname.empty()) {
    auto db = grad(g, bname, 1, out);
    for (Index r = 0; r < N; ++r) db += dy.row(r);  // rows in order
  }
  if (dx) {
    dx->resize(N, in);
    site_gemm<T>(pol.at(site, l, Pass::dx), dy, w, false, *dx, grad_stream(site, l, slot, Pass::dx));
  }
}

// LayerNorm (b non-null) or RMSNorm of x [T,C] with weight w: dx += ∂, dw += Σ, db += Σ.
template <class T>
void norm_backward(const Matrix<T>& x, const T* w, T eps, bool layer_norm, const Matrix<T>& dy, Matrix<T>& dx,
                   T* dw, T* db) {
  const Index T_ = x.rows(), C = x.cols();
  auto stats = [&](const T* xt, T& mean, T& r) {
    if (layer_norm) {
      mean = 0;
      for (Index i = 0; i < C; ++i) mean += xt[i];
      mean /= T(C);
      T var = 0;
      for (Index i = 0; i < C; ++i) var += (xt[i] - mean) * (xt[i] - mean);
      var /= T(C);
      r = T(1) / std::sqrt(var + eps);
    } else {
      mean = 0;
      T ms = 0;
      for (Index i = 0; i < C; ++i) ms += xt[i] * xt[i];
      ms /= T(C);
      r = T(1) / std::sqrt(ms + eps);
    }
  };
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t) {
    const T* xt = x.row(t).data();  // [C]
    const T* gt = dy.row(t).data(); // [C]
    T* dxt = dx.row(t).data();      // [C]
    T mean, r;
    stats(xt, mean, r);
    T a = 0, b = 0;  // mean(g), mean(g ⊙ x̂)  (RMSNorm: mean(g ⊙ x))
    for (Index i = 0; i < C; ++i) {
      const T gi = gt[i] * w[i];
      a += gi;
      b += layer_norm ? gi * (xt[i] - mean) * r : gi * xt[i];
    }
    a /= T(C), b /= T(C);
    for (Index i = 0; i < C; ++i) {
      const T gi = gt[i] * w[i];
      dxt[i] += layer_norm ? r * (gi - a - (xt[i] - mean) * r * b) : r * (gi - xt[i] * r * r * b);
    }
  }
  for (Index t = 0; t < T_; ++t) {  // parameter sums: rows in order
    const T* xt = x.row(t).data();
    const T* gt = dy.row(t).data();
    T mean, r;
    stats(xt, mean, r);
    for (Index i = 0; i < C; ++i) {
      dw[i] += gt[i] * (xt[i] - mean) * r;
      if (db) db[i] += gt[i];
    }
  }
}

// d (GELU(pre)) into dact in place.
template <class T>
void gelu_backward(const Matrix<T>& pre, bool tanh_approx, Matrix<T>& d) {
  const Index n = pre.size();
  const T* x = pre.data();
  T* g = d.data();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) g[i] *= detail::gelu_grad(x[i], tanh_approx);
}

// RoPE's inverse rotation of the gradient d [T, nh·HS].
template <class T>
void rope_backward(Matrix<T>& d, Index nh, Index HS, const Matrix<T>& cos_, const Matrix<T>& sin_) {
  const Index T_ = d.rows();
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t)
    for (Index h = 0; h < nh; ++h) {
      T* v = d.row(t).data() + h * HS;
      for (Index i = 0; i < HS / 2; ++i) {
        const T c = cos_(t, i), s = sin_(t, i), d0 = v[2 * i], d1 = v[2 * i + 1];
        v[2 * i] = d0 * c + d1 * s;
        v[2 * i + 1] = -d0 * s + d1 * c;
      }
    }
}

// Attention backward: datt [T,C] → dq [T,C], dk, dv [T,NKV·HS].
template <class T>
void attention_backward(const Policy& pol, int l, const LayerTape<T>& lt, const Matrix<T>& datt, Index NH, Index NKV,
                        Index HS, Matrix<T>& dq, Matrix<T>& dk, Matrix<T>& dv) {
  const Index T_ = datt.rows(), group = NH / NKV;
  const T divisor = std::sqrt(T(HS));
  dq.setZero(T_, NH * HS);
  std::vector<Matrix<T>> dk_h(static_cast<size_t>(NH)), dv_h(static_cast<size_t>(NH));  // per query head, reduced in order
  ParallelErrors errors;
#pragma omp parallel for schedule(static)
  for (Index h = 0; h < NH; ++h) errors.run([&] {
    const Index g = h / group;
    const Matrix<T>& P = lt.probs[size_t(h)];                 // [T,T]
    const Matrix<T> dO = datt.middleCols(h * HS, HS);         // [T,HS]
    const Matrix<T> Vg = lt.v.middleCols(g * HS, HS);         // [T,HS]
    const Matrix<T> Kg = lt.k.middleCols(g * HS, HS);         // [T,HS]
    const Matrix<T> Qh = lt.q.middleCols(h * HS, HS);         // [T,HS]
    Matrix<T> dP(T_, T_);                                     // [T,T] = dO·Vᵀ
    site_gemm<T>(pol.at(Site::attn_pv, l, Pass::dx), dO, Vg, true, dP, grad_stream(Site::attn_pv, l, h, Pass::dx));
    dv_h[size_t(h)].resize(T_, HS);                           // [T,HS] = Pᵀ·dO
    const Matrix<T> Pt = P.transpose();
    site_gemm<T>(pol.at(Site::attn_pv, l, Pass::dw), Pt, dO, false, dv_h[size_t(h)],
                 grad_stream(Site::attn_pv, l, h, Pass::dw));
    Matrix<T> dS(T_, T_);                                     // [T,T] = P ⊙ (dP − rowsum(dP ⊙ P))
    for (Index i = 0; i < T_; ++i) {
      T s = 0;
      for (Index j = 0; j <= i; ++j) s += dP(i, j) * P(i, j);
      for (Index j = 0; j < T_; ++j) dS(i, j) = j <= i ? P(i, j) * (dP(i, j) - s) : T(0);
    }
    Matrix<T> dQh(T_, HS);                                    // [T,HS] = dS·K / √HS
    site_gemm<T>(pol.at(Site::attn_qk, l, Pass::dx), dS, Kg, false, dQh, grad_stream(Site::attn_qk, l, h, Pass::dx),
                 divisor);
    dq.middleCols(h * HS, HS) = dQh;
    const Matrix<T> dSt = dS.transpose();
    dk_h[size_t(h)].resize(T_, HS);                           // [T,HS] = dSᵀ·Q / √HS
    site_gemm<T>(pol.at(Site::attn_qk, l, Pass::dw), dSt, Qh, false, dk_h[size_t(h)],
                 grad_stream(Site::attn_qk, l, h, Pass::dw), divisor);
  });
  errors.rethrow();
  dk.setZero(T_, NKV * HS);
  dv.setZero(T_, NKV * HS);
  for (Index h = 0; h < NH; ++h) {
    const Index g = h / group;
    dk.middleCols(g * HS, HS) += dk_h[size_t(h)];
    dv.middleCols(g * HS, HS) += dv_h[size_t(h)];
  }
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
      const uint64_t stream = (opt_.step << 20) | uint64_t(l) << 2 | uint64_t(u);
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
  linear_backward(pol, Site::lm_head, -1, 0, dlogits, tape.xnf, wte, &dxn, g, "wte", "");
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
    linear_backward(pol, Site::mlp_proj, l, 0, dx, saved.get(l, Unit::down, lt.act), weight<T>(m, p + "mlp.c_proj.weight", C, H),
                    &dh, g, p + "mlp.c_proj.weight", p + "mlp.c_proj.bias");
    gelu_backward<T>(lt.pre, c.gelu_tanh, dh);
    linear_backward(pol, Site::mlp_fc, l, 0, dh, saved.get(l, Unit::fc, lt.xn2), weight<T>(m, p + "mlp.c_fc.weight", H, C),
                    &dxn, g, p + "mlp.c_fc.weight", p + "mlp.c_fc.bias");
    norm_backward<T>(lt.x_mid, weight<T>(m, p + "ln_2.weight", 1, C).data(), eps, true, dxn, dx,
                     grad(g, p + "ln_2.weight", 1, C).data(), grad(g, p + "ln_2.bias", 1, C).data());
    // attention: x += c_proj(attn(ln_1(x)))
    linear_backward(pol, Site::attn_proj, l, 0, dx, saved.get(l, Unit::proj, lt.att), weight<T>(m, p + "attn.c_proj.weight", C, C),
                    &datt, g, p + "attn.c_proj.weight", p + "attn.c_proj.bias");
    attention_backward<T>(pol, l, lt, datt, NH, NH, HS, dq, dk, dv);
    Matrix<T> dqkv(T_, 3 * C);  // [T,3C]
    dqkv << dq, dk, dv;
    linear_backward(pol, Site::attn_qkv, l, 0, dqkv, saved.get(l, Unit::qkv, lt.xn1),
                    weight<T>(m, p + "attn.c_attn.weight", 3 * C, C), &dxn, g, p + "attn.c_attn.weight",
                    p + "attn.c_attn.bias");
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
  linear_backward(pol, Site::lm_head, -1, 0, dlogits, tape.xnf, weight<T>(m, out_name, V, C), &dxn, g, out_name, "");
  norm_backward<T>(tape.x_final, weight<T>(m, "norm", 1, C).data(), eps, false, dxn, dx, grad(g, "norm", 1, C).data(),
                   nullptr);
  Matrix<T> dh(T_, H), dup(T_, H);  // [T,H]
  Matrix<T> datt(T_, C);            // [T,C]
  Matrix<T> dq, dk, dv;             // [T,C], [T,KVC], [T,KVC]
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerTape<T>& lt = tape.layers[size_t(l)];
    const std::string p = fmt::format("layers.{}.", l);
    // MLP: x += w2(silu(w1·x) ⊙ w3·x), x = ffn_norm(x)
    linear_backward(pol, Site::mlp_proj, l, 0, dx, saved.get(l, Unit::down, lt.act), weight<T>(m, p + "feed_forward.w2", C, H),
                    &dh, g, p + "feed_forward.w2", "");
    {
      const Index n = dh.size();
      const T *gp = lt.pre.data(), *up = lt.up.data();
      T *dg = dh.data(), *du = dup.data();
#pragma omp parallel for schedule(static)
      for (Index i = 0; i < n; ++i) {
        const T sg = T(1) / (T(1) + std::exp(-gp[i]));
        du[i] = dg[i] * gp[i] * sg;                                 // d up = dh ⊙ silu(g)
        dg[i] = dg[i] * up[i] * sg * (T(1) + gp[i] * (T(1) - sg));  // d gate (= dh ⊙ up ⊙ silu'(g))
      }
    }
    const Matrix<T>& xn2 = saved.get(l, Unit::fc, lt.xn2);
    linear_backward(pol, Site::mlp_fc, l, 0, dh, xn2, weight<T>(m, p + "feed_forward.w1", H, C), &dxn, g,
                    p + "feed_forward.w1", "");
    linear_backward(pol, Site::mlp_fc, l, 1, dup, xn2, weight<T>(m, p + "feed_forward.w3", H, C), &tmp, g,
                    p + "feed_forward.w3", "");
    dxn += tmp;
    norm_backward<T>(lt.x_mid, weight<T>(m, p + "ffn_norm", 1, C).data(), eps, false, dxn, dx,
                     grad(g, p + "ffn_norm", 1, C).data(), nullptr);
    // attention
    linear_backward(pol, Site::attn_proj, l, 0, dx, saved.get(l, Unit::proj, lt.att), weight<T>(m, p + "attention.wo", C, C),
                    &datt, g, p + "attention.wo", "");
    attention_backward<T>(pol, l, lt, datt, NH, NKV, HS, dq, dk, dv);
    rope_backward<T>(dq, NH, HS, tape.rcos, tape.rsin);
    rope_backward<T>(dk, NKV, HS, tape.rcos, tape.rsin);
    const Matrix<T>& xn1 = saved.get(l, Unit::qkv, lt.xn1);
    linear_backward(pol, Site::attn_qkv, l, 0, dq, xn1, weight<T>(m, p + "attention.wq", C, C), &dxn, g,
                    p + "attention.wq", "");
    linear_backward(pol, Site::attn_qkv, l, 1, dk, xn1, weight<T>(m, p + "attention.wk", KVC, C), &tmp, g,
                    p + "attention.wk", "");
    dxn += tmp;
    linear_backward(pol, Site::attn_qkv, l, 2, dv, xn1, weight<T>(m, p + "attention.wv", KVC, C), &tmp, g,
                    p + "attention.wv", "");
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
