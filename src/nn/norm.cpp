// norm — see norm.h.
#include "nn/norm.h"

#include <vector>

#include "nn/lamp.h"
#include "nn/norm_row.h"
#include "nn/linear.h"
#include "nn/streams.h"

namespace mantis::detail {

using Eigen::Index;

template <class T>
void norm_forward(const SitePlan& p, uint64_t stream, const Matrix<T>& x, const T* w, const T* b, T eps,
                  Matrix<T>& out, SiteHealth* h) {
  const Index T_ = x.rows(), C = x.cols();
  const Matrix<T>* in = &x;
  Matrix<T> xr;  // [T,C] the rounded input (x is the residual stream: left untouched)
  if (p.input) {
    xr = x;
    round_matrix<T>(xr, *p.input, stream + kStreamA, h);
    in = &xr;
  }
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t) {
    norm_row<T>(in->row(t).data(), out.row(t).data(), w, b, eps, C);  // [C] → [C]
  }
  if (p.output) round_matrix<T>(out, *p.output, stream + kStreamOutput, h);
  count_nonfinite<T>(h, out);
}

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
  std::vector<T> means(static_cast<size_t>(T_)), rs(static_cast<size_t>(T_));  // [T] each row's statistics, for both loops
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t) {
    const T* xt = x.row(t).data();  // [C]
    const T* gt = dy.row(t).data(); // [C]
    T* dxt = dx.row(t).data();      // [C]
    T mean, r;
    stats(xt, mean, r);
    means[size_t(t)] = mean, rs[size_t(t)] = r;
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
    const T mean = means[size_t(t)], r = rs[size_t(t)];
    for (Index i = 0; i < C; ++i) {
      dw[i] += gt[i] * (xt[i] - mean) * r;
      if (db) db[i] += gt[i];
    }
  }
}

uint64_t lamp_layernorm_fix(const LampSiteSpec& s, const SitePlan& recompute, const Matrix<float>& A,
                            Eigen::Ref<const Matrix<float>> w, const float* bias, const Matrix<float>& r,
                            Matrix<float>& y, const float* gamma, float eps) {
  using T = float;
  Matrix<T> yh(y.rows(), y.cols());  // [T,C]
  site_gemm<T>(recompute, A, w, true, yh, kLampFixStream, T(1), bias);
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

template void norm_forward<float>(const SitePlan&, uint64_t, const Matrix<float>&, const float*, const float*, float,
                                  Matrix<float>&, SiteHealth*);
template void norm_forward<double>(const SitePlan&, uint64_t, const Matrix<double>&, const double*, const double*,
                                   double, Matrix<double>&, SiteHealth*);
template void norm_backward<float>(const Matrix<float>&, const float*, float, bool, const Matrix<float>&,
                                   Matrix<float>&, float*, float*);
template void norm_backward<double>(const Matrix<double>&, const double*, double, bool, const Matrix<double>&,
                                    Matrix<double>&, double*, double*);

}  // namespace mantis::detail
