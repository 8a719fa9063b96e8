// forward — see forward.h. Layout follows llm.c's train_gpt2.c: one function per layer kind,
// a shape comment on every buffer, the forward functions at the bottom.
// GCC 12 reports (maybe-)uninitialized `__Y` inside Eigen's AVX-512 packet code (the intrinsics'
// `__Y = __Y` idiom, inlined into gemm_pack_rhs), even from -isystem headers: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "nn/forward.h"
#include "nn/tape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "core/gemm.h"        // defines: gemm, GemmSpec
#include "nn/lamp.h"
#include "core/round_array.h" // defines: round_array, RoundOptions

namespace mantis {

using Eigen::Index;

namespace {

// ---------------------------------------------------------------------------------------------
// constants and small helpers

constexpr Index kTileRows = 256;    // native GEMM tiles: fixed, so results do not depend on threads
constexpr Index kTileCols = 1024;
constexpr Index kQueryBlock = 64;   // attention: query rows per block (keys 0..end of the block)

using detail::is_random;
using detail::kMaxRandomRows;
using detail::stream_of;

// Eigen's own GEMM threading splits work by the thread count; we tile ourselves instead.
void eigen_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { Eigen::setNbThreads(1); });
}

RoundOptions round_options(const SitePolicy& p, uint64_t stream, uint64_t index0 = 0) {
  return RoundOptions{.mode = p.rounding, .sr_bits = p.sr_bits, .seed = p.seed, .stream = stream, .index0 = index0};
}

// SiteHealth (forward.h) counting: each call counts locally and adds once, atomically (the
// attention sites run inside the parallel loop over heads).
void add_health(SiteHealth* h, uint64_t overflow, uint64_t nan = 0, uint64_t inf = 0) {
  if (overflow) {
#pragma omp atomic
    h->overflow += overflow;
  }
  if (nan) {
#pragma omp atomic
    h->nan += nan;
  }
  if (inf) {
#pragma omp atomic
    h->inf += inf;
  }
}

// Values of x [n] that a rounding to f sends out of range: finite and beyond its largest finite.
template <class T>
void count_overflow(SiteHealth* h, const T* x, size_t n, const Format& f) {
  if (!h) return;
  const double mx = max_finite(f);
  uint64_t c = 0;
  for (size_t i = 0; i < n; ++i) c += std::isfinite(x[i]) && std::abs(double(x[i])) > mx;
  add_health(h, c);
}
template <class T>
void count_overflow(SiteHealth* h, const Eigen::Ref<const Matrix<T>>& x, const Format& f) {
  if (h)
    for (Index i = 0; i < x.rows(); ++i) count_overflow(h, x.row(i).data(), size_t(x.cols()), f);
}

// The NaNs and infinities of a site's output x [n].
template <class T>
void count_nonfinite(SiteHealth* h, const T* x, size_t n) {
  if (!h) return;
  uint64_t nan = 0, inf = 0;
  for (size_t i = 0; i < n; ++i) nan += std::isnan(x[i]), inf += std::isinf(x[i]);
  add_health(h, 0, nan, inf);
}
template <class T>
void count_nonfinite(SiteHealth* h, const Eigen::Ref<const Matrix<T>>& x) {
  if (h)
    for (Index i = 0; i < x.rows(); ++i) count_nonfinite(h, x.row(i).data(), size_t(x.cols()));
}

// Rounds x [rows, cols] (any outer stride) in place; element (i, j) uses index i·cols + j.
template <class T>
void round_matrix(Eigen::Ref<Matrix<T>> x, const Format& f, const SitePolicy& p, uint64_t stream,
                  SiteHealth* h = nullptr) {
  count_overflow<T>(h, x, f);
  const Index rows = x.rows(), cols = x.cols();
  if (x.outerStride() == cols) {
    round_array(x.data(), x.data(), size_t(rows * cols), f, round_options(p, stream));
    return;
  }
  for (Index i = 0; i < rows; ++i)
    round_array(x.row(i).data(), x.row(i).data(), size_t(cols), f, round_options(p, stream, uint64_t(i * cols)));
}

// A parameter as a row-major binary32 matrix [shape[0], rest] (1-D: [1, n]); InputError if it
// is missing or has another shape.
Eigen::Map<const Matrix<float>> param(const Model& m, const std::string& name, std::vector<int64_t> shape) {
  const auto it = m.params.find(name);
  if (it == m.params.end())
    throw InputError(fmt::format("model: missing parameter '{}' [{}]", name, fmt::join(shape, ",")));
  const Tensor& t = it->second;
  if (t.shape != shape || int64_t(t.data.size()) != t.numel())
    throw InputError(fmt::format("model: parameter '{}' has shape [{}] ({} values), expected [{}]", name,
                                 fmt::join(t.shape, ","), t.data.size(), fmt::join(shape, ",")));
  const Index rows = shape.size() == 1 ? 1 : shape[0];
  return Eigen::Map<const Matrix<float>>(t.data.data(), rows, Index(t.numel()) / rows);
}

// The same in T: a view for float, a converted copy for double.
template <class T>
using Param = std::conditional_t<std::is_same_v<T, float>, Eigen::Map<const Matrix<float>>, Matrix<T>>;
template <class T>
Param<T> weight(const Model& m, const std::string& name, std::vector<int64_t> shape) {
  if constexpr (std::is_same_v<T, float>) return param(m, name, std::move(shape));
  else return param(m, name, std::move(shape)).template cast<T>();
}

// out [M,N] = A [M,K] · B ([K,N], or [N,K] transposed), Eigen on one thread per fixed tile.
template <class S>
void native_product(const Eigen::Ref<const Matrix<S>>& A, const Eigen::Ref<const Matrix<S>>& B, bool bt,
                    Eigen::Ref<Matrix<S>> out) {
  const Index M = out.rows(), N = out.cols();
  const Index tr = (M + kTileRows - 1) / kTileRows, tc = (N + kTileCols - 1) / kTileCols;
#pragma omp parallel for schedule(static) if (tr * tc > 1)
  for (Index tile = 0; tile < tr * tc; ++tile) {
    const Index r0 = (tile / tc) * kTileRows, c0 = (tile % tc) * kTileCols;
    const Index nr = std::min(kTileRows, M - r0), nc = std::min(kTileCols, N - c0);
    if (bt) out.block(r0, c0, nr, nc).noalias() = A.middleRows(r0, nr) * B.middleRows(c0, nc).transpose();
    else out.block(r0, c0, nr, nc).noalias() = A.middleRows(r0, nr) * B.middleCols(c0, nc);
  }
}

// ---------------------------------------------------------------------------------------------
// nonlinearities: binary32 (T) arithmetic between the site's input and output roundings.
// Streams: input + 1 (silu's second input + 2), output + 3.

// LayerNorm (gpt2, with bias) or RMSNorm (llama, bias null) of every row of x [T,C] into out [T,C].
template <class T>
void norm_forward(const SitePolicy& p, uint64_t stream, const Matrix<T>& x, const T* w, const T* b, T eps,
                  Matrix<T>& out, SiteHealth* h) {
  const Index T_ = x.rows(), C = x.cols();
  const Matrix<T>* in = &x;
  Matrix<T> xr;  // [T,C] the rounded input (x is the residual stream: left untouched)
  if (p.input) {
    xr = x;
    round_matrix<T>(xr, *p.input, p, stream + 1, h);
    in = &xr;
  }
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t) {
    const T* xt = in->row(t).data();  // [C]
    T* ot = out.row(t).data();        // [C]
    if (b) {                          // LayerNorm
      T mean = 0;
      for (Index i = 0; i < C; ++i) mean += xt[i];
      mean /= T(C);
      T var = 0;
      for (Index i = 0; i < C; ++i) var += (xt[i] - mean) * (xt[i] - mean);
      var /= T(C);
      const T rstd = T(1) / std::sqrt(var + eps);
      for (Index i = 0; i < C; ++i) ot[i] = (xt[i] - mean) * rstd * w[i] + b[i];
    } else {                          // RMSNorm
      T ms = 0;
      for (Index i = 0; i < C; ++i) ms += xt[i] * xt[i];
      ms /= T(C);
      const T rrms = T(1) / std::sqrt(ms + eps);
      for (Index i = 0; i < C; ++i) ot[i] = (xt[i] * rrms) * w[i];
    }
  }
  if (p.output) round_matrix<T>(out, *p.output, p, stream + 3, h);
  count_nonfinite<T>(h, out);
}

// GELU in place on h [T,H]: exact 0.5·x·(1 + erf(x/√2)) or the tanh approximation.
template <class T>
void gelu_forward(const SitePolicy& p, uint64_t stream, bool tanh_approx, Matrix<T>& h, SiteHealth* hl) {
  if (p.input) round_matrix<T>(h, *p.input, p, stream + 1, hl);
  const Index n = h.size();
  T* x = h.data();
  const T k = T(0.7978845608028654), c = T(0.044715), r2 = T(0.7071067811865476);  // √(2/π), √½
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T v = x[i];
    x[i] = tanh_approx ? T(0.5) * v * (T(1) + std::tanh(k * (v + c * v * v * v))) : T(0.5) * v * (T(1) + std::erf(v * r2));
  }
  if (p.output) round_matrix<T>(h, *p.output, p, stream + 3, hl);
  count_nonfinite<T>(hl, h);
}

// SwiGLU product in place: g [T,H] ← silu(g) ⊙ u, silu(x) = x / (1 + e^−x).
template <class T>
void silu_forward(const SitePolicy& p, uint64_t stream, Matrix<T>& g, Matrix<T>& u, SiteHealth* h) {
  if (p.input) {
    round_matrix<T>(g, *p.input, p, stream + 1, h);
    round_matrix<T>(u, *p.input, p, stream + 2, h);
  }
  const Index n = g.size();
  T* gp = g.data();
  const T* up = u.data();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) gp[i] = gp[i] / (T(1) + std::exp(-gp[i])) * up[i];
  if (p.output) round_matrix<T>(g, *p.output, p, stream + 3, h);
  count_nonfinite<T>(h, g);
}

// Causal softmax of one query block: row r of s [nr, r1] is query i = r0 + r, keys 0..i; the
// masked keys i+1..r1−1 get probability 0. Rounding: key j of query i uses index j of the
// streams of stream_of(softmax, layer, head, i) (`stream_row(i)`).
template <class T, class StreamOfRow>
void softmax_block(const SitePolicy& p, StreamOfRow stream_row, Eigen::Ref<Matrix<T>> s, Index r0, SiteHealth* h) {
  for (Index r = 0; r < s.rows(); ++r) {
    const Index i = r0 + r, n = i + 1;
    T* x = s.row(r).data();  // [r1]: the scores of query i
    const uint64_t stream = stream_row(i);
    if (p.input) {
      count_overflow(h, x, size_t(n), *p.input);
      round_array(x, x, size_t(n), *p.input, round_options(p, stream + 1));
    }
    T mx = x[0];
    for (Index j = 1; j < n; ++j) mx = std::max(mx, x[j]);
    T sum = 0;
    for (Index j = 0; j < n; ++j) {
      x[j] = std::exp(x[j] - mx);
      sum += x[j];
    }
    for (Index j = 0; j < n; ++j) x[j] /= sum;
    if (p.output) {
      count_overflow(h, x, size_t(n), *p.output);
      round_array(x, x, size_t(n), *p.output, round_options(p, stream + 3));
    }
    count_nonfinite(h, x, size_t(n));
    for (Index j = n; j < s.cols(); ++j) x[j] = 0;
  }
}

// RoPE (forward.h): rotates the pairs (x[2i], x[2i+1]) of each of the nh heads of x [T, nh·HS]
// at position t by the angle in cos_/sin_ [T, HS/2].
template <class T>
void rope_forward(Matrix<T>& x, Index nh, Index HS, const Matrix<T>& cos_, const Matrix<T>& sin_) {
  const Index T_ = x.rows();
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t)
    for (Index h = 0; h < nh; ++h) {
      T* v = x.row(t).data() + h * HS;  // [HS]: head h at position t
      for (Index i = 0; i < HS / 2; ++i) {
        const T c = cos_(t, i), s = sin_(t, i), v0 = v[2 * i], v1 = v[2 * i + 1];
        v[2 * i] = v0 * c - v1 * s;
        v[2 * i + 1] = v0 * s + v1 * c;
      }
    }
}

// ---------------------------------------------------------------------------------------------
// attention: q [T, NH·HS], k, v [T, NKV·HS] → out [T, NH·HS]; heads split over threads.

template <class T>
void attention_forward(const Policy& pol, int l, const Eigen::Ref<const Matrix<T>>& q,
                       const Eigen::Ref<const Matrix<T>>& k, const Eigen::Ref<const Matrix<T>>& v, Index NH,
                       Index NKV, Index HS, Matrix<T>& out, std::vector<Matrix<T>>* probs = nullptr,
                       ForwardStats* stats = nullptr) {
  const SitePolicy &qk = pol.at(Site::attn_qk, l), &pv = pol.at(Site::attn_pv, l), &sm = pol.at(Site::softmax, l);
  const Index T_ = q.rows(), nblocks = (T_ + kQueryBlock - 1) / kQueryBlock, group = NH / NKV;
  const T divisor = std::sqrt(T(HS));
  SiteHealth *hqk = stats ? &stats->health_at(Site::attn_qk, l) : nullptr,
             *hsm = stats ? &stats->health_at(Site::softmax, l) : nullptr,
             *hpv = stats ? &stats->health_at(Site::attn_pv, l) : nullptr;
  if (probs) probs->assign(size_t(NH), Matrix<T>::Zero(T_, T_));
  // Random rounding at a score GEMM is keyed per query row (forward.h), so those rows are
  // multiplied one at a time; deterministic ones in blocks (the same values either way).
  const bool by_row = is_random(qk) || is_random(pv);
  const std::optional<LampSpec>& lamp = pol.lamp;
  SitePolicy recompute;  // LAMP's high-precision scores: native binary32, or strict in a format
  if (lamp && lamp->recompute) {
    recompute.accumulation = Accumulation::strict;
    recompute.accumulator = recompute.output = lamp->recompute;
  }
  // Block path with health counts: overflow is counted before the output rounding, so the scores
  // are multiplied unrounded and rounded here (the same call site_gemm makes: deterministic, so
  // the same values).
  const bool count_qk_overflow = !by_row && hqk && qk.output;
  SitePolicy qk_unrounded = qk;
  qk_unrounded.output.reset();
  std::vector<uint64_t> selected(size_t(NH), 0);
  ParallelErrors errors;
#pragma omp parallel for schedule(static)
  for (Index h = 0; h < NH; ++h) errors.run([&] {
    const Index g = h / group;  // the key/value head of query head h
    Matrix<T> s(std::min(kQueryBlock, T_), T_);  // [Bq, T] scores, then probabilities, of one block
    Matrix<T> sh;                                // [Bq, T] LAMP: the recomputed scores
    std::vector<uint8_t> mark;                   // [T] LAMP: the selection of one row
    for (Index b = 0; b < nblocks; ++b) {
      const Index r0 = b * kQueryBlock, nr = std::min(kQueryBlock, T_ - r0), r1 = r0 + nr;
      auto S = s.topLeftCorner(nr, r1);  // [nr, r1]: queries r0..r1−1 against keys 0..r1−1
      if (!by_row) {
        // Health counts only the causal part, which is all that is used (row r: keys 0..r0 + r).
        site_gemm<T>(count_qk_overflow ? qk_unrounded : qk, q.block(r0, h * HS, nr, HS), k.block(0, g * HS, r1, HS),
                     true, S, stream_of(Site::attn_qk, l, h), divisor);
        if (count_qk_overflow) {
          for (Index r = 0; r < nr; ++r) count_overflow(hqk, S.row(r).data(), size_t(r0 + r + 1), *qk.output);
          round_matrix<T>(S, *qk.output, qk, stream_of(Site::attn_qk, l, h) + 3);
        }
        if (hqk)
          for (Index r = 0; r < nr; ++r) count_nonfinite(hqk, S.row(r).data(), size_t(r0 + r + 1));
      } else {
        for (Index i = r0; i < r1; ++i)  // query i against keys 0..i: [1, i+1]
          site_gemm<T>(qk, q.block(i, h * HS, 1, HS), k.block(0, g * HS, i + 1, HS), true,
                       S.block(i - r0, 0, 1, i + 1), stream_of(Site::attn_qk, l, h, i), divisor, nullptr, hqk);
      }
      if constexpr (std::is_same_v<T, float>)
        if (lamp) {
          sh.resize(nr, r1);
          site_gemm<T>(recompute, q.block(r0, h * HS, nr, HS), k.block(0, g * HS, r1, HS), true, sh,
                       stream_of(Site::attn_qk, l, h) + (uint64_t(4) << 30), divisor);
          mark.resize(size_t(r1));
          for (Index i = r0; i < r1; ++i) {
            const Index r = i - r0;
            selected[size_t(h)] += lamp_select_row(*lamp, std::span<const float>(S.row(r).data(), size_t(i + 1)), i,
                                                   mark, stream_of(Site::attn_qk, l, h, i) + (uint64_t(4) << 30));
            for (Index j = 0; j <= i; ++j)
              if (mark[size_t(j)]) S(r, j) = sh(r, j);
          }
        }
      softmax_block<T>(sm, [&](Index i) { return stream_of(Site::softmax, l, h, i); }, S, r0, hsm);
      if (probs) (*probs)[size_t(h)].block(r0, 0, nr, r1) = S;  // the rest of [T,T] stays 0
      if (!by_row) {
        site_gemm<T>(pv, S, v.block(0, g * HS, r1, HS), false, out.block(r0, h * HS, nr, HS),
                     stream_of(Site::attn_pv, l, h), T(1), nullptr, hpv);
      } else {
        for (Index i = r0; i < r1; ++i)  // probabilities [1, i+1] · values [i+1, HS]
          site_gemm<T>(pv, S.block(i - r0, 0, 1, i + 1), v.block(0, g * HS, i + 1, HS), false,
                       out.block(i, h * HS, 1, HS), stream_of(Site::attn_pv, l, h, i), T(1), nullptr, hpv);
      }
    }
  });
  errors.rethrow();
  if (stats && lamp) {
    for (uint64_t c : selected) stats->lamp_selected[size_t(l)] += c;
    stats->lamp_entries[size_t(l)] += uint64_t(NH) * uint64_t(T_) * uint64_t(T_ + 1) / 2;
  }
}

// ---------------------------------------------------------------------------------------------
// LAMP at the activation and at the norm inputs (policy.lamp_activation / lamp_layernorm)

SitePolicy recompute_site(const std::optional<Format>& f) {
  SitePolicy r;  // native binary32, or strict in f rounded to f
  if (f) r.accumulation = Accumulation::strict, r.accumulator = r.output = f;
  return r;
}

// y [T,N] = A·Wᵀ + b was computed at the site's precision; entries with |σ'(y)|·|y| > τ take the
// recomputed product. Returns how many.
template <class T, class W, class DSigma>
uint64_t lamp_activation_fix(const LampSiteSpec& s, const Matrix<T>& A, const W& w, const T* bias, Matrix<T>& y,
                             uint64_t stream, DSigma dsigma) {
  Matrix<T> yh(y.rows(), y.cols());  // [T,N]
  site_gemm<T>(recompute_site(s.recompute), A, w, true, yh, stream, T(1), bias);
  const size_t n = size_t(y.cols());
  std::vector<double> yd(n), dd(n);
  std::vector<uint8_t> mark(n);
  uint64_t sel = 0;
  for (Index t = 0; t < y.rows(); ++t) {
    for (size_t j = 0; j < n; ++j) yd[j] = double(y(t, Index(j))), dd[j] = double(dsigma(y(t, Index(j))));
    sel += lamp_select_activation(yd, dd, s.tau, mark);
    for (size_t j = 0; j < n; ++j)
      if (mark[j]) y(t, Index(j)) = yh(t, Index(j));
  }
  return sel;
}

// y [T,C] = A·Wᵀ + b (a projection) is about to be added to the residual stream r [T,C], whose sum
// the next norm (weight γ) reads: greedy on κ_j = |r_j + y_j|·|γ_j|/σ, the selected y_j take the
// recomputed product. Returns how many.
template <class T, class W>
uint64_t lamp_layernorm_fix(const LampSiteSpec& s, const Matrix<T>& A, const W& w, const T* bias, const Matrix<T>& r,
                            Matrix<T>& y, const T* gamma, T eps, uint64_t stream) {
  Matrix<T> yh(y.rows(), y.cols());  // [T,C]
  site_gemm<T>(recompute_site(s.recompute), A, w, true, yh, stream, T(1), bias);
  const size_t n = size_t(y.cols());
  std::vector<double> xin(n), g(n);
  std::vector<uint8_t> mark(n);
  for (size_t j = 0; j < n; ++j) g[j] = double(gamma[j]);
  uint64_t sel = 0;
  for (Index t = 0; t < y.rows(); ++t) {
    for (size_t j = 0; j < n; ++j) xin[j] = double(r(t, Index(j)) + y(t, Index(j)));
    sel += lamp_select_layernorm(xin, g, double(eps), s.tau, mark);
    for (size_t j = 0; j < n; ++j)
      if (mark[j]) y(t, Index(j)) = yh(t, Index(j));
  }
  return sel;
}

// The model functions' two LAMP hooks: act(l, A, W, bias, y, σ') after the mlp.fc GEMM and
// ln(l, A, W, bias, γ) after a projection whose output y is added to the residual stream x.
// No-ops unless the policy asks (and for the binary64 reference, which takes no LAMP).
template <class T>
auto lamp_hooks(const Policy& pol, ForwardStats* stats, T eps, const Matrix<T>& x, Matrix<T>& y) {
  auto act = [&pol, stats](int l, const Matrix<T>& A, const auto& w, const T* bias, Matrix<T>& out, auto dsigma) {
    if constexpr (std::is_same_v<T, float>)
      if (pol.lamp_activation) {
        const uint64_t n = lamp_activation_fix<T>(*pol.lamp_activation, A, w, bias, out, 0, dsigma);
        if (stats) stats->act_selected[size_t(l)] += n, stats->act_entries[size_t(l)] += uint64_t(out.size());
      }
  };
  auto ln = [&pol, stats, eps, &x, &y](int l, const Matrix<T>& A, const auto& w, const T* bias, const T* gamma) {
    if constexpr (std::is_same_v<T, float>)
      if (pol.lamp_layernorm) {
        const uint64_t n = lamp_layernorm_fix<T>(*pol.lamp_layernorm, A, w, bias, x, y, gamma, eps, 0);
        if (stats) stats->ln_selected[size_t(l)] += n, stats->ln_entries[size_t(l)] += uint64_t(y.size());
      }
  };
  return std::pair{act, ln};
}

// ---------------------------------------------------------------------------------------------
// the two models

template <class T>
Matrix<T> gpt2_forward(const Model& m, std::span<const int32_t> tokens, const Policy& pol, detail::Tape<T>* tape,
                       ForwardStats* stats) {
  const ModelConfig& cfg = m.cfg;
  const Index T_ = Index(tokens.size()), C = cfg.dim, NH = cfg.heads, HS = cfg.head_size(), H = cfg.hidden,
              V = cfg.vocab, maxT = cfg.ctx;
  const T eps = T(cfg.norm_eps);
  const auto wte = weight<T>(m, "wte", {V, C});     // [V,C]
  const auto wpe = weight<T>(m, "wpe", {maxT, C});  // [maxT,C]

  Matrix<T> x(T_, C);       // [T,C] the residual stream
  Matrix<T> xn(T_, C);      // [T,C] normalised x
  Matrix<T> qkv(T_, 3 * C); // [T,3C] q | k | v
  Matrix<T> att(T_, C);     // [T,C] attention output, heads side by side
  Matrix<T> y(T_, C);       // [T,C] a projection's output, added to x
  Matrix<T> hid(T_, H);     // [T,H] MLP hidden activations
  for (Index t = 0; t < T_; ++t) x.row(t) = wte.row(tokens[size_t(t)]) + wpe.row(t);
  if (tape) tape->layers.assign(size_t(cfg.layers), {});
  auto [act_lamp, ln_lamp] = lamp_hooks<T>(pol, stats, eps, x, y);
  auto health = [stats](Site s, int l) { return stats ? &stats->health_at(s, l) : nullptr; };

  for (int l = 0; l < cfg.layers; ++l) {
    detail::LayerTape<T>* lt = tape ? &tape->layers[size_t(l)] : nullptr;
    const std::string p = fmt::format("h.{}.", l);
    const auto ln1w = weight<T>(m, p + "ln_1.weight", {C}), ln1b = weight<T>(m, p + "ln_1.bias", {C});  // [C]
    const auto wqkv = weight<T>(m, p + "attn.c_attn.weight", {3 * C, C});                               // [3C,C]
    const auto bqkv = weight<T>(m, p + "attn.c_attn.bias", {3 * C});                                    // [3C]
    const auto wo = weight<T>(m, p + "attn.c_proj.weight", {C, C});                                     // [C,C]
    const auto bo = weight<T>(m, p + "attn.c_proj.bias", {C});                                          // [C]
    const auto ln2w = weight<T>(m, p + "ln_2.weight", {C}), ln2b = weight<T>(m, p + "ln_2.bias", {C});  // [C]
    const auto wfc = weight<T>(m, p + "mlp.c_fc.weight", {H, C});                                       // [H,C]
    const auto bfc = weight<T>(m, p + "mlp.c_fc.bias", {H});                                            // [H]
    const auto wpr = weight<T>(m, p + "mlp.c_proj.weight", {C, H});                                     // [C,H]
    const auto bpr = weight<T>(m, p + "mlp.c_proj.bias", {C});                                          // [C]

    if (lt) lt->x_in = x;
    norm_forward<T>(pol.at(Site::ln, l), stream_of(Site::ln, l, 0), x, ln1w.data(), ln1b.data(), eps, xn,
                    health(Site::ln, l));
    site_gemm<T>(pol.at(Site::attn_qkv, l), xn, wqkv, true, qkv, stream_of(Site::attn_qkv, l, 0), T(1), bqkv.data(),
                 health(Site::attn_qkv, l));
    attention_forward<T>(pol, l, qkv.leftCols(C), qkv.middleCols(C, C), qkv.rightCols(C), NH, NH, HS, att,
                         lt ? &lt->probs : nullptr, stats);
    if (lt) {
      lt->xn1 = xn;
      lt->q = qkv.leftCols(C), lt->k = qkv.middleCols(C, C), lt->v = qkv.rightCols(C);
      lt->att = att;
    }
    site_gemm<T>(pol.at(Site::attn_proj, l), att, wo, true, y, stream_of(Site::attn_proj, l, 0), T(1), bo.data(),
                 health(Site::attn_proj, l));
    ln_lamp(l, att, wo, bo.data(), ln2w.data());
    x += y;
    if (lt) lt->x_mid = x;
    norm_forward<T>(pol.at(Site::ln, l), stream_of(Site::ln, l, 1), x, ln2w.data(), ln2b.data(), eps, xn,
                    health(Site::ln, l));
    site_gemm<T>(pol.at(Site::mlp_fc, l), xn, wfc, true, hid, stream_of(Site::mlp_fc, l, 0), T(1), bfc.data(),
                 health(Site::mlp_fc, l));
    act_lamp(l, xn, wfc, bfc.data(), hid, [&](T v) { return detail::gelu_grad(v, cfg.gelu_tanh); });
    if (lt) lt->xn2 = xn, lt->pre = hid;
    gelu_forward<T>(pol.at(Site::gelu, l), stream_of(Site::gelu, l, 0), cfg.gelu_tanh, hid, health(Site::gelu, l));
    if (lt) lt->act = hid;
    site_gemm<T>(pol.at(Site::mlp_proj, l), hid, wpr, true, y, stream_of(Site::mlp_proj, l, 0), T(1), bpr.data(),
                 health(Site::mlp_proj, l));
    if (pol.lamp_layernorm)  // the next norm: ln_1 of layer l+1, or ln_f
      ln_lamp(l, hid, wpr, bpr.data(),
              weight<T>(m, l + 1 < cfg.layers ? fmt::format("h.{}.ln_1.weight", l + 1) : "ln_f.weight", {C}).data());
    x += y;
  }

  const auto lnfw = weight<T>(m, "ln_f.weight", {C}), lnfb = weight<T>(m, "ln_f.bias", {C});  // [C]
  norm_forward<T>(pol.at(Site::ln), stream_of(Site::ln, -1, 0), x, lnfw.data(), lnfb.data(), eps, xn, health(Site::ln, -1));
  if (tape) tape->x_final = x, tape->xnf = xn;
  Matrix<T> logits(T_, V);  // [T,V]
  site_gemm<T>(pol.at(Site::lm_head), xn, wte, true, logits, stream_of(Site::lm_head, -1, 0), T(1), nullptr,
               health(Site::lm_head, -1));
  return logits;
}

template <class T>
Matrix<T> llama_forward(const Model& m, std::span<const int32_t> tokens, const Policy& pol, detail::Tape<T>* tape,
                        ForwardStats* stats) {
  const ModelConfig& cfg = m.cfg;
  const Index T_ = Index(tokens.size()), C = cfg.dim, NH = cfg.heads, NKV = cfg.kv_heads, HS = cfg.head_size(),
              KVC = NKV * HS, H = cfg.hidden, V = cfg.vocab;
  const T eps = T(cfg.norm_eps);
  const auto emb = weight<T>(m, "tok_embeddings", {V, C});  // [V,C]

  // RoPE angles pos·θ^(−2i/HS) in binary64, then converted to T.
  Matrix<T> rcos(T_, HS / 2), rsin(T_, HS / 2);  // [T, HS/2]
  for (Index t = 0; t < T_; ++t)
    for (Index i = 0; i < HS / 2; ++i) {
      const double freq = 1.0 / std::pow(double(cfg.rope_theta), double(2 * i) / double(HS));
      rcos(t, i) = T(std::cos(double(t) * freq));
      rsin(t, i) = T(std::sin(double(t) * freq));
    }

  Matrix<T> x(T_, C);      // [T,C] the residual stream
  Matrix<T> xn(T_, C);     // [T,C] normalised x
  Matrix<T> q(T_, C);      // [T,C] queries, NH heads
  Matrix<T> k(T_, KVC);    // [T,NKV·HS] keys
  Matrix<T> v(T_, KVC);    // [T,NKV·HS] values
  Matrix<T> att(T_, C);    // [T,C] attention output, heads side by side
  Matrix<T> y(T_, C);      // [T,C] a projection's output, added to x
  Matrix<T> gate(T_, H);   // [T,H] w1·x, then silu(w1·x) ⊙ w3·x
  Matrix<T> up(T_, H);     // [T,H] w3·x
  for (Index t = 0; t < T_; ++t) x.row(t) = emb.row(tokens[size_t(t)]);
  if (tape) tape->layers.assign(size_t(cfg.layers), {}), tape->rcos = rcos, tape->rsin = rsin;
  auto [act_lamp, ln_lamp] = lamp_hooks<T>(pol, stats, eps, x, y);
  auto health = [stats](Site s, int l) { return stats ? &stats->health_at(s, l) : nullptr; };

  for (int l = 0; l < cfg.layers; ++l) {
    detail::LayerTape<T>* lt = tape ? &tape->layers[size_t(l)] : nullptr;
    const std::string p = fmt::format("layers.{}.", l);
    const auto anorm = weight<T>(m, p + "attention_norm", {C});             // [C]
    const auto wq = weight<T>(m, p + "attention.wq", {C, C});               // [C,C]
    const auto wk = weight<T>(m, p + "attention.wk", {KVC, C});             // [NKV·HS,C]
    const auto wv = weight<T>(m, p + "attention.wv", {KVC, C});             // [NKV·HS,C]
    const auto wo = weight<T>(m, p + "attention.wo", {C, C});               // [C,C]
    const auto fnorm = weight<T>(m, p + "ffn_norm", {C});                   // [C]
    const auto w1 = weight<T>(m, p + "feed_forward.w1", {H, C});            // [H,C]
    const auto w3 = weight<T>(m, p + "feed_forward.w3", {H, C});            // [H,C]
    const auto w2 = weight<T>(m, p + "feed_forward.w2", {C, H});            // [C,H]

    if (lt) lt->x_in = x;
    norm_forward<T>(pol.at(Site::ln, l), stream_of(Site::ln, l, 0), x, anorm.data(), nullptr, eps, xn, health(Site::ln, l));
    const SitePolicy& pqkv = pol.at(Site::attn_qkv, l);
    site_gemm<T>(pqkv, xn, wq, true, q, stream_of(Site::attn_qkv, l, 0), T(1), nullptr, health(Site::attn_qkv, l));
    site_gemm<T>(pqkv, xn, wk, true, k, stream_of(Site::attn_qkv, l, 1), T(1), nullptr, health(Site::attn_qkv, l));
    site_gemm<T>(pqkv, xn, wv, true, v, stream_of(Site::attn_qkv, l, 2), T(1), nullptr, health(Site::attn_qkv, l));
    rope_forward<T>(q, NH, HS, rcos, rsin);
    rope_forward<T>(k, NKV, HS, rcos, rsin);
    attention_forward<T>(pol, l, q, k, v, NH, NKV, HS, att, lt ? &lt->probs : nullptr, stats);
    if (lt) lt->xn1 = xn, lt->q = q, lt->k = k, lt->v = v, lt->att = att;
    site_gemm<T>(pol.at(Site::attn_proj, l), att, wo, true, y, stream_of(Site::attn_proj, l, 0), T(1), nullptr,
                 health(Site::attn_proj, l));
    ln_lamp(l, att, wo, nullptr, fnorm.data());
    x += y;
    if (lt) lt->x_mid = x;
    norm_forward<T>(pol.at(Site::ln, l), stream_of(Site::ln, l, 1), x, fnorm.data(), nullptr, eps, xn, health(Site::ln, l));
    const SitePolicy& pfc = pol.at(Site::mlp_fc, l);
    site_gemm<T>(pfc, xn, w1, true, gate, stream_of(Site::mlp_fc, l, 0), T(1), nullptr, health(Site::mlp_fc, l));
    act_lamp(l, xn, w1, nullptr, gate, [](T v) { return detail::silu_grad(v); });
    site_gemm<T>(pfc, xn, w3, true, up, stream_of(Site::mlp_fc, l, 1), T(1), nullptr, health(Site::mlp_fc, l));
    if (lt) lt->xn2 = xn, lt->pre = gate, lt->up = up;
    silu_forward<T>(pol.at(Site::silu, l), stream_of(Site::silu, l, 0), gate, up, health(Site::silu, l));
    if (lt) lt->act = gate;
    site_gemm<T>(pol.at(Site::mlp_proj, l), gate, w2, true, y, stream_of(Site::mlp_proj, l, 0), T(1), nullptr,
                 health(Site::mlp_proj, l));
    if (pol.lamp_layernorm)  // the next norm: attention_norm of layer l+1, or the final norm
      ln_lamp(l, gate, w2, nullptr,
              weight<T>(m, l + 1 < cfg.layers ? fmt::format("layers.{}.attention_norm", l + 1) : "norm", {C}).data());
    x += y;
  }

  const auto fnorm = weight<T>(m, "norm", {C});  // [C]
  norm_forward<T>(pol.at(Site::ln), stream_of(Site::ln, -1, 0), x, fnorm.data(), nullptr, eps, xn, health(Site::ln, -1));
  if (tape) tape->x_final = x, tape->xnf = xn;
  Matrix<T> logits(T_, V);  // [T,V]
  const SitePolicy& ph = pol.at(Site::lm_head);
  const uint64_t sh = stream_of(Site::lm_head, -1, 0);
  if (cfg.tied) site_gemm<T>(ph, xn, emb, true, logits, sh, T(1), nullptr, health(Site::lm_head, -1));
  else site_gemm<T>(ph, xn, weight<T>(m, "output", {V, C}), true, logits, sh, T(1), nullptr,
                    health(Site::lm_head, -1));
  return logits;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// public

template <class T>
void site_gemm(const SitePolicy& p, Eigen::Ref<const Matrix<T>> A, Eigen::Ref<const Matrix<T>> B, bool bt,
               Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor, const T* bias, SiteHealth* health) {
  eigen_single_threaded();
  const Index M = A.rows(), K = A.cols(), N = bt ? B.rows() : B.cols();
  if ((bt ? B.cols() : B.rows()) != K || out.rows() != M || out.cols() != N)
    throw std::logic_error(fmt::format("site_gemm: shapes [{},{}]·{}[{},{}] → [{},{}] do not match", M, K,
                                       bt ? "ᵀ" : "", B.rows(), B.cols(), out.rows(), out.cols()));
  if constexpr (std::is_same_v<T, double>)
    if (!p.is_native()) throw InputError("site_gemm<double> is the binary64 reference: native sites only");

  if (p.accumulation || p.input) {
    Matrix<float> Af = A.template cast<float>();  // [M,K] row-major binary32
    Matrix<float> Bf(K, N);                       // [K,N] row-major binary32
    if (bt) Bf = B.transpose().template cast<float>();
    else Bf = B.template cast<float>();
    if (p.input) count_overflow<float>(health, Af, *p.input), count_overflow<float>(health, Bf, *p.input);
    if (p.accumulation) {  // emulated: gemm() rounds the inputs itself (streams + 1, + 2)
      Matrix<double> Cd(M, N);  // [M,N] the accumulator values
      gemm(Af.data(), Bf.data(), Cd.data(), size_t(M), size_t(N), size_t(K), p.gemm_spec(stream));
      out = Cd.template cast<T>();
    } else {  // native with rounded operands, the same indices as gemm()
      round_array(Af.data(), Af.data(), size_t(M * K), *p.input, round_options(p, stream + 1));
      round_array(Bf.data(), Bf.data(), size_t(K * N), *p.input, round_options(p, stream + 2));
      if constexpr (std::is_same_v<T, float>) {
        native_product<float>(Af, Bf, false, out);
      } else {
        Matrix<float> Cf(M, N);  // [M,N]
        native_product<float>(Af, Bf, false, Cf);
        out = Cf.template cast<T>();
      }
    }
  } else {
    native_product<T>(A, B, bt, out);
  }
  if (divisor != T(1)) out /= divisor;
  if (bias) out.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, N);
  if (p.output) round_matrix<T>(out, *p.output, p, stream + 3, health);
  count_nonfinite<T>(health, out);
}

namespace {
// Everything forward<T> refuses, as InputErrors (forward.h).
template <class T>
void check_forward_input(const Model& m, std::span<const int32_t> tokens, const Policy& policy) {
  eigen_single_threaded();
  const ModelConfig& c = m.cfg;
  validate(c);  // model.h: sizes, divisibility, even RoPE head size, ...
  if (tokens.empty()) throw InputError("forward: empty token sequence");
  if (tokens.size() > size_t(c.ctx))
    throw InputError(fmt::format("forward: sequence of {} tokens is longer than the context ({})", tokens.size(), c.ctx));
  for (size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      throw InputError(fmt::format("forward: token {} at position {} is outside the vocabulary [0, {})", tokens[t], t,
                                   c.vocab));
  policy.check(c);
  for (int l = -1; l < c.layers; ++l)
    for (Site site : {Site::attn_qk, Site::softmax, Site::attn_pv})
      if (is_random(policy.at(site, l)) && Index(tokens.size()) > kMaxRandomRows)
        throw InputError(fmt::format("forward: stochastic rounding at {} is keyed per query row and allows at most "
                                     "{} tokens; this sequence has {}", to_string(site), kMaxRandomRows, tokens.size()));
  if constexpr (std::is_same_v<T, double>)
    if (!policy.forward_is_native()) {
      std::string d = describe(policy);
      d.pop_back();  // the last newline; the others become "; " (one line of error)
      std::replace(d.begin(), d.end(), '\n', ';');
      throw InputError(fmt::format("forward<double> is the binary64 reference and takes only the native policy; "
                                   "this one sets {}", d));
    }
}
}  // namespace

template <class T>
Matrix<T> forward(const Model& m, std::span<const int32_t> tokens, const Policy& policy, ForwardStats* stats) {
  check_forward_input<T>(m, tokens, policy);
  const ModelConfig& c = m.cfg;
  if (stats)
    for (auto* v : {&stats->lamp_selected, &stats->lamp_entries, &stats->act_selected, &stats->act_entries,
                    &stats->ln_selected, &stats->ln_entries})
      v->assign(size_t(c.layers), 0);
  if (stats) stats->health.assign(size_t(kSiteCount) * size_t(c.layers + 1), SiteHealth{});
  return c.arch == Arch::gpt2 ? gpt2_forward<T>(m, tokens, policy, nullptr, stats)
                              : llama_forward<T>(m, tokens, policy, nullptr, stats);
}

namespace detail {
template <class T>
Matrix<T> forward_tape(const Model& m, std::span<const int32_t> tokens, const Policy& policy, Tape<T>& tape) {
  check_forward_input<T>(m, tokens, policy);
  return m.cfg.arch == Arch::gpt2 ? gpt2_forward<T>(m, tokens, policy, &tape, nullptr)
                                  : llama_forward<T>(m, tokens, policy, &tape, nullptr);
}
template Matrix<float> forward_tape<float>(const Model&, std::span<const int32_t>, const Policy&, Tape<float>&);
template Matrix<double> forward_tape<double>(const Model&, std::span<const int32_t>, const Policy&, Tape<double>&);
}  // namespace detail

template Matrix<float> forward<float>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
template Matrix<double> forward<double>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
template void site_gemm<float>(const SitePolicy&, Eigen::Ref<const Matrix<float>>, Eigen::Ref<const Matrix<float>>,
                               bool, Eigen::Ref<Matrix<float>>, uint64_t, float, const float*, SiteHealth*);
template void site_gemm<double>(const SitePolicy&, Eigen::Ref<const Matrix<double>>, Eigen::Ref<const Matrix<double>>,
                                bool, Eigen::Ref<Matrix<double>>, uint64_t, double, const double*, SiteHealth*);

}  // namespace mantis
