// ops — what the operations of the two graphs share (linear.h, norm.h, activation.h,
// attention.h): the matrix type, a site's range health counted over buffers (its rules:
// site_health.h), and a site's rounding of a buffer with its health counts.
#pragma once

// GCC 12 reports (maybe-)uninitialized `__Y` inside Eigen's AVX-512 packet code (the intrinsics'
// `__Y = __Y` idiom, inlined into gemm_pack_rhs), even from -isystem headers: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Dense>

#include <cmath>
#include <cstdint>

#include "core/round_array.h"  // defines: round_array
#include "nn/policy.h"      // defines: RoundStep, SitePlan
#include "nn/site_health.h"  // defines: SiteHealth

namespace mantis {

template <class T> using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace detail {

// SiteHealth counting: each call counts locally and adds once, atomically (the attention sites
// run inside the parallel loop over heads).
inline void add_health(SiteHealth* h, uint64_t overflow, uint64_t nan = 0, uint64_t inf = 0) {
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

// Values of x [n] that a rounding sends out of range: finite and beyond the format's largest
// finite value mx.
template <class T>
void count_overflow(SiteHealth* h, const T* x, size_t n, double mx) {
  if (!h) return;
  SiteHealth local;
  for (size_t i = 0; i < n; ++i) health_count_overflow(local, x[i], mx);
  add_health(h, local.overflow);
}
template <class T>
void count_overflow(SiteHealth* h, const Eigen::Ref<const Matrix<T>>& x, double mx) {
  if (h)
    for (Eigen::Index i = 0; i < x.rows(); ++i) count_overflow(h, x.row(i).data(), size_t(x.cols()), mx);
}

// The NaNs and infinities of a site's output x [n].
template <class T>
void count_nonfinite(SiteHealth* h, const T* x, size_t n) {
  if (!h) return;
  SiteHealth local;
  for (size_t i = 0; i < n; ++i) health_count_nonfinite(local, x[i]);
  add_health(h, 0, local.nan, local.inf);
}
template <class T>
void count_nonfinite(SiteHealth* h, const Eigen::Ref<const Matrix<T>>& x) {
  if (h)
    for (Eigen::Index i = 0; i < x.rows(); ++i) count_nonfinite(h, x.row(i).data(), size_t(x.cols()));
}

// One rounding step of a site (policy.h RoundStep) on x [n]: counts, then rounds in place;
// element i uses index index0 + i of `stream`.
template <class T>
void round_step(T* x, size_t n, const RoundStep& r, uint64_t stream, SiteHealth* h, uint64_t index0 = 0) {
  count_overflow(h, x, n, r.max_finite);
  round_array(r.plan, x, x, n, stream, index0);
}

// The same on x [rows, cols] (any outer stride); element (i, j) uses index i·cols + j.
template <class T>
void round_matrix(Eigen::Ref<Matrix<T>> x, const RoundStep& r, uint64_t stream, SiteHealth* h = nullptr) {
  count_overflow<T>(h, x, r.max_finite);
  const Eigen::Index rows = x.rows(), cols = x.cols();
  if (x.outerStride() == cols) {
    round_array(r.plan, x.data(), x.data(), size_t(rows * cols), stream);
    return;
  }
  for (Eigen::Index i = 0; i < rows; ++i)
    round_array(r.plan, x.row(i).data(), x.row(i).data(), size_t(cols), stream, uint64_t(i * cols));
}

}  // namespace detail
}  // namespace mantis
