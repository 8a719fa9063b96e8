// activation — see activation.h.
#include "nn/activation.h"

#include <vector>

#include "nn/lamp.h"
#include "nn/linear.h"
#include "nn/streams.h"

namespace mantis::detail {

using Eigen::Index;

template <class T>
void gelu_forward(const SitePlan& p, uint64_t stream, bool tanh_approx, Matrix<T>& h, SiteHealth* hl) {
  if (p.input) round_matrix<T>(h, *p.input, stream + kStreamA, hl);
  const Index n = h.size();
  T* x = h.data();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) x[i] = act::gelu(x[i], tanh_approx);
  if (p.output) round_matrix<T>(h, *p.output, stream + kStreamOutput, hl);
  count_nonfinite<T>(hl, h);
}

template <class T>
void silu_forward(const SitePlan& p, uint64_t stream, Matrix<T>& g, Matrix<T>& u, SiteHealth* h) {
  if (p.input) {
    round_matrix<T>(g, *p.input, stream + kStreamA, h);
    round_matrix<T>(u, *p.input, stream + kStreamB, h);
  }
  const Index n = g.size();
  T* gp = g.data();
  const T* up = u.data();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) gp[i] = act::swiglu(gp[i], up[i]);
  if (p.output) round_matrix<T>(g, *p.output, stream + kStreamOutput, h);
  count_nonfinite<T>(h, g);
}

template <class T>
void gelu_backward(const Matrix<T>& pre, bool tanh_approx, Matrix<T>& d) {
  const Index n = pre.size();
  const T* x = pre.data();
  T* g = d.data();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) g[i] *= act::gelu_grad(x[i], tanh_approx);
}

template <class T>
void swiglu_backward(const Matrix<T>& gate, const Matrix<T>& up, Matrix<T>& dh, Matrix<T>& dup) {
  const Index n = dh.size();
  const T *gp = gate.data(), *u = up.data();
  T *dg = dh.data(), *du = dup.data();
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) act::swiglu_backward(dg[i], gp[i], u[i], dg[i], du[i]);
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

template void gelu_forward<float>(const SitePlan&, uint64_t, bool, Matrix<float>&, SiteHealth*);
template void gelu_forward<double>(const SitePlan&, uint64_t, bool, Matrix<double>&, SiteHealth*);
template void silu_forward<float>(const SitePlan&, uint64_t, Matrix<float>&, Matrix<float>&, SiteHealth*);
template void silu_forward<double>(const SitePlan&, uint64_t, Matrix<double>&, Matrix<double>&, SiteHealth*);
template void gelu_backward<float>(const Matrix<float>&, bool, Matrix<float>&);
template void gelu_backward<double>(const Matrix<double>&, bool, Matrix<double>&);
template void swiglu_backward<float>(const Matrix<float>&, const Matrix<float>&, Matrix<float>&, Matrix<float>&);
template void swiglu_backward<double>(const Matrix<double>&, const Matrix<double>&, Matrix<double>&, Matrix<double>&);

}  // namespace mantis::detail
