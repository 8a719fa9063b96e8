// activation — see activation.h.
#include "nn/activation.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "nn/lamp.h"
#include "nn/linear.h"
#include "nn/streams.h"

namespace mantis::detail {

using Eigen::Index;

namespace {

constexpr Index kChunk = 1024;  // elements per pass of the binary32 kernels (their buffers stay in L1)

// fn(i0, n) over [0, total) in chunks of kChunk, chunks over OpenMP threads.
template <class F>
void for_chunks(Index total, F fn) {
  const Index nc = (total + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nc > 1)
  for (Index c = 0; c < nc; ++c) fn(c * kChunk, std::min(kChunk, total - c * kChunk));
}

// The aux buffer of a site (activation.h): sized like h when it is to be kept, else emptied.
template <class T>
T* prepare_aux(Matrix<T>* aux, bool keep, const Matrix<T>& h) {
  if (!aux) return nullptr;
  if (!keep) {
    aux->resize(0, 0);
    return nullptr;
  }
  aux->resize(h.rows(), h.cols());
  return aux->data();
}

}  // namespace

template <class T>
void gelu_forward(const SitePlan& p, uint64_t stream, bool tanh_approx, Matrix<T>& h, SiteHealth* hl,
                  Matrix<T>* aux) {
  if (p.input) round_matrix<T>(h, *p.input, stream + kStreamA, hl);
  T* keep = prepare_aux(aux, !p.input, h);
  T* x = h.data();
  if constexpr (std::is_same_v<T, float>) {  // act::gelu's operations, erf / tanh through the array kernels
    const T r2 = T(0.7071067811865476);
    for_chunks(h.size(), [&](Index i0, Index n) {
      T buf[kChunk];
      T* e = keep ? keep + i0 : buf;  // [n] erf(x·√½), or tanh(√(2/π)(x + 0.044715x³))
      T* xi = x + i0;
      if (tanh_approx) {
        for (Index i = 0; i < n; ++i) e[i] = act::gelu_tanh_arg(xi[i]);
        cr_tanhf_array(e, e, size_t(n));
      } else {
        for (Index i = 0; i < n; ++i) e[i] = xi[i] * r2;
        cr_erff_array(e, e, size_t(n));
      }
      for (Index i = 0; i < n; ++i) xi[i] = T(0.5) * xi[i] * (T(1) + e[i]);
    });
  } else {
    const Index n = h.size();
    if (keep)
      for (Index i = 0; i < n; ++i)
        keep[i] = tanh_approx ? act::tanh(act::gelu_tanh_arg(x[i])) : act::erf(x[i] * T(0.7071067811865476));
#pragma omp parallel for schedule(static)
    for (Index i = 0; i < n; ++i) x[i] = act::gelu(x[i], tanh_approx);
  }
  if (p.output) round_matrix<T>(h, *p.output, stream + kStreamOutput, hl);
  count_nonfinite<T>(hl, h);
}

template <class T>
void silu_forward(const SitePlan& p, uint64_t stream, Matrix<T>& g, Matrix<T>& u, SiteHealth* h, Matrix<T>* aux) {
  if (p.input) {
    round_matrix<T>(g, *p.input, stream + kStreamA, h);
    round_matrix<T>(u, *p.input, stream + kStreamB, h);
  }
  T* keep = prepare_aux(aux, !p.input, g);
  T* gp = g.data();
  const T* up = u.data();
  if constexpr (std::is_same_v<T, float>) {  // act::swiglu's operations, exp through the array kernel
    for_chunks(g.size(), [&](Index i0, Index n) {
      T buf[kChunk];
      T* e = keep ? keep + i0 : buf;  // [n] exp(−g)
      T* gi = gp + i0;
      const T* ui = up + i0;
      for (Index i = 0; i < n; ++i) e[i] = -gi[i];
      cr_expf_array(e, e, size_t(n));
      for (Index i = 0; i < n; ++i) gi[i] = gi[i] / (T(1) + e[i]) * ui[i];
    });
  } else {
    const Index n = g.size();
    if (keep)
      for (Index i = 0; i < n; ++i) keep[i] = act::exp(-gp[i]);
#pragma omp parallel for schedule(static)
    for (Index i = 0; i < n; ++i) gp[i] = act::swiglu(gp[i], up[i]);
  }
  if (p.output) round_matrix<T>(g, *p.output, stream + kStreamOutput, h);
  count_nonfinite<T>(h, g);
}

template <class T>
void gelu_backward(const Matrix<T>& pre, bool tanh_approx, Matrix<T>& d, const Matrix<T>* aux) {
  const T* x = pre.data();
  T* g = d.data();
  const T* kept = aux && aux->size() ? aux->data() : nullptr;  // erf(x·√½) / tanh(…) of the forward
  if constexpr (std::is_same_v<T, float>) {
    if (tanh_approx) {  // act::gelu_grad_from_tanh's operations, tanh through the array kernel
      for_chunks(pre.size(), [&](Index i0, Index n) {
        T buf[kChunk];
        const T* xi = x + i0;
        const T* th = kept ? kept + i0 : buf;
        if (!kept) {
          for (Index i = 0; i < n; ++i) buf[i] = act::gelu_tanh_arg(xi[i]);
          cr_tanhf_array(buf, buf, size_t(n));
        }
        T* gi = g + i0;
        for (Index i = 0; i < n; ++i) gi[i] *= act::gelu_grad_from_tanh(xi[i], th[i]);
      });
      return;
    }
    {  // act::gelu_grad_from_erf's operations, erf and exp through the array kernels
      const T r2 = T(0.7071067811865476), inv_sqrt_2pi = T(0.3989422804014327);
      for_chunks(pre.size(), [&](Index i0, Index n) {
        T ebuf[kChunk], pbuf[kChunk];
        const T* xi = x + i0;
        const T* e = kept ? kept + i0 : ebuf;
        if (!kept) {
          for (Index i = 0; i < n; ++i) ebuf[i] = xi[i] * r2;
          cr_erff_array(ebuf, ebuf, size_t(n));
        }
        for (Index i = 0; i < n; ++i) pbuf[i] = T(-0.5) * xi[i] * xi[i];
        cr_expf_array(pbuf, pbuf, size_t(n));
        T* gi = g + i0;
        for (Index i = 0; i < n; ++i) gi[i] *= T(0.5) * (T(1) + e[i]) + xi[i] * inv_sqrt_2pi * pbuf[i];
      });
      return;
    }
  }
  const Index n = pre.size();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i)
    g[i] *= !kept ? act::gelu_grad(x[i], tanh_approx)
          : tanh_approx ? act::gelu_grad_from_tanh(x[i], kept[i]) : act::gelu_grad_from_erf(x[i], kept[i]);
}

template <class T>
void swiglu_backward(const Matrix<T>& gate, const Matrix<T>& up, Matrix<T>& dh, Matrix<T>& dup, const Matrix<T>* aux) {
  const T *gp = gate.data(), *u = up.data();
  T *dg = dh.data(), *du = dup.data();
  const T* kept = aux && aux->size() ? aux->data() : nullptr;  // exp(−g) of the forward
  if constexpr (std::is_same_v<T, float>) {
    for_chunks(gate.size(), [&](Index i0, Index n) {
      T buf[kChunk];
      const T* e = kept ? kept + i0 : buf;
      if (!kept) {
        for (Index i = 0; i < n; ++i) buf[i] = -gp[i0 + i];
        cr_expf_array(buf, buf, size_t(n));
      }
      for (Index i = 0; i < n; ++i)
        act::swiglu_backward_from_exp(dg[i0 + i], gp[i0 + i], u[i0 + i], e[i], dg[i0 + i], du[i0 + i]);
    });
  } else {
    const Index n = dh.size();
#pragma omp parallel for schedule(static)
    for (Index i = 0; i < n; ++i)
      act::swiglu_backward_from_exp(dg[i], gp[i], u[i], kept ? kept[i] : act::exp(-gp[i]), dg[i], du[i]);
  }
}

template <class T>
T softmax_numerators(const T* x, T* e, int64_t n, T& mx) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t L = 16;
    if (n >= L) {
      // act::softmax_numerators's maximum: the first x[j] of the largest value (NaNs skipped unless
      // x[0] is one), taken in L lanes that each start from x[0]; a zero maximum is re-found in order
      // (its sign is the first zero's).
      T m[L];
      for (int64_t k = 0; k < L; ++k) m[k] = x[0];
      int64_t j = 0;
      for (; j + L <= n; j += L)
        for (int64_t k = 0; k < L; ++k) m[k] = m[k] < x[j + k] ? x[j + k] : m[k];
      for (; j < n; ++j) m[0] = m[0] < x[j] ? x[j] : m[0];
      mx = m[0];
      for (int64_t k = 1; k < L; ++k) mx = mx < m[k] ? m[k] : mx;
      if (mx == 0)
        for (j = 0; j < n; ++j)
          if (x[j] == 0) {
            mx = x[j];
            break;
          }
      for (j = 0; j < n; ++j) e[j] = x[j] - mx;
      cr_expf_array(e, e, size_t(n));
      T sum = 0;
      for (j = 0; j < n; ++j) sum += e[j];
      return sum;
    }
  }
  return act::softmax_numerators(x, e, n, mx);
}

uint64_t lamp_activation_fix(const LampSiteSpec& s, const SitePlan& recompute, const Matrix<float>& A,
                             Eigen::Ref<const Matrix<float>> w, const float* bias, Matrix<float>& y, Site activation,
                             bool gelu_tanh) {
  using T = float;
  Matrix<T> yh(y.rows(), y.cols());  // [T,N]
  site_gemm<T>(recompute, A, w, true, yh, kLampFixStream, T(1), bias);
  const size_t n = size_t(y.cols());
  std::vector<double> yd(n), dd(n);
  std::vector<uint8_t> mark(n);
  uint64_t sel = 0;
  for (Index t = 0; t < y.rows(); ++t) {
    for (size_t j = 0; j < n; ++j) {
      const T v = y(t, Index(j));
      yd[j] = double(v), dd[j] = double(activation == Site::gelu ? act::gelu_grad(v, gelu_tanh) : act::silu_grad(v));
    }
    sel += lamp_select_activation(yd, dd, s.tau, mark);
    for (size_t j = 0; j < n; ++j)
      if (mark[j]) y(t, Index(j)) = yh(t, Index(j));
  }
  return sel;
}

template void gelu_forward<float>(const SitePlan&, uint64_t, bool, Matrix<float>&, SiteHealth*, Matrix<float>*);
template void gelu_forward<double>(const SitePlan&, uint64_t, bool, Matrix<double>&, SiteHealth*, Matrix<double>*);
template void silu_forward<float>(const SitePlan&, uint64_t, Matrix<float>&, Matrix<float>&, SiteHealth*,
                                  Matrix<float>*);
template void silu_forward<double>(const SitePlan&, uint64_t, Matrix<double>&, Matrix<double>&, SiteHealth*,
                                   Matrix<double>*);
template void gelu_backward<float>(const Matrix<float>&, bool, Matrix<float>&, const Matrix<float>*);
template void gelu_backward<double>(const Matrix<double>&, bool, Matrix<double>&, const Matrix<double>*);
template void swiglu_backward<float>(const Matrix<float>&, const Matrix<float>&, Matrix<float>&, Matrix<float>&,
                                     const Matrix<float>*);
template void swiglu_backward<double>(const Matrix<double>&, const Matrix<double>&, Matrix<double>&,
                                      Matrix<double>&, const Matrix<double>*);
template float softmax_numerators<float>(const float*, float*, int64_t, float&);
template double softmax_numerators<double>(const double*, double*, int64_t, double&);

}  // namespace mantis::detail
