// linear — see linear.h.
#include "nn/linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <type_traits>

#include "core/gemm.h"  // defines: gemm, GemmSpec
#include "nn/streams.h"

namespace mantis {

using Eigen::Index;
using detail::count_nonfinite;
using detail::count_overflow;
using detail::round_matrix;

namespace {

constexpr Index kTileRows = 256;  // native GEMM tiles: fixed, so results do not depend on threads
constexpr Index kTileCols = 1024;

// out [M,N] = A [M,K] (or [K,M] transposed) · B ([K,N], or [N,K] transposed), Eigen on one thread
// per fixed tile. A transposed operand is read in place: Eigen packs either storage order into
// the same panels, so the products are the bits of a transposed copy's.
template <class S>
void native_product(const Eigen::Ref<const Matrix<S>>& A, bool at, const Eigen::Ref<const Matrix<S>>& B, bool bt,
                    Eigen::Ref<Matrix<S>> out) {
  const Index M = out.rows(), N = out.cols();
  const Index tr = (M + kTileRows - 1) / kTileRows, tc = (N + kTileCols - 1) / kTileCols;
#pragma omp parallel for schedule(static) if (tr * tc > 1)
  for (Index tile = 0; tile < tr * tc; ++tile) {
    const Index r0 = (tile / tc) * kTileRows, c0 = (tile % tc) * kTileCols;
    const Index nr = std::min(kTileRows, M - r0), nc = std::min(kTileCols, N - c0);
    auto o = out.block(r0, c0, nr, nc);
    if (at) {
      const auto a = A.middleCols(r0, nr).transpose();
      if (bt) o.noalias() = a * B.middleRows(c0, nc).transpose();
      else o.noalias() = a * B.middleCols(c0, nc);
    } else {
      const auto a = A.middleRows(r0, nr);
      if (bt) o.noalias() = a * B.middleRows(c0, nc).transpose();
      else o.noalias() = a * B.middleCols(c0, nc);
    }
  }
}

}  // namespace

namespace detail {

void eigen_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { Eigen::setNbThreads(1); });
}

template <class T>
void linear_backward(const PolicyPlan& pol, Site site, int l, Index slot, const Matrix<T>& dy, const Matrix<T>& x,
                     Eigen::Ref<const Matrix<T>> w, Matrix<T>* dx, Eigen::Ref<Matrix<T>> dW, T* db, bool weight_grads) {
  const Index N = dy.rows(), out = dy.cols(), in = x.cols();
  if (weight_grads) {
    Matrix<T> d(out, in);  // [out,in] = dyᵀ·x
    site_gemm_at<T>(pol.at(site, l, Pass::dw), dy, x, false, d, grad_stream(site, l, slot, Pass::dw));
    dW += d;
  }
  if (db && weight_grads) {
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> b(db, out);
    for (Index r = 0; r < N; ++r) b += dy.row(r);  // rows in order
  }
  if (dx) {
    dx->resize(N, in);
    site_gemm<T>(pol.at(site, l, Pass::dx), dy, w, false, *dx, grad_stream(site, l, slot, Pass::dx));
  }
}

template void linear_backward<float>(const PolicyPlan&, Site, int, Index, const Matrix<float>&, const Matrix<float>&,
                                     Eigen::Ref<const Matrix<float>>, Matrix<float>*, Eigen::Ref<Matrix<float>>,
                                     float*, bool);
template void linear_backward<double>(const PolicyPlan&, Site, int, Index, const Matrix<double>&, const Matrix<double>&,
                                      Eigen::Ref<const Matrix<double>>, Matrix<double>*, Eigen::Ref<Matrix<double>>,
                                      double*, bool);

}  // namespace detail

namespace {

// An operand's own rounding (policy.h input_a / input_b) on x [rows, cols], in place: element
// (i, j) draws index i·cols + j of `stream`. Saturated (clipped) scheme elements count as overflow.
void round_operand(const OperandStep& o, Matrix<float>& x, uint64_t stream, SiteHealth* health) {
  if (o.round) {
    count_overflow<float>(health, x, o.round->max_finite);
    round_array(o.round->plan, x.data(), x.data(), size_t(x.size()), stream);
    return;
  }
  const SchemeStats st =
      quantize_scheme<float>(*o.scheme, x.data(), x.data(), x.rows(), x.cols(), o.mode, o.sr_bits, o.seed, stream, 0);
  if (health) detail::add_health(health, st.clipped);
}

// site_gemm (linear.h) with A given as [M,K], or as its transpose [K,M] when `at`.
template <class T>
void site_gemm_impl(const SitePlan& p, Eigen::Ref<const Matrix<T>> A, bool at, Eigen::Ref<const Matrix<T>> B,
                    bool bt, Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor, const T* bias,
                    SiteHealth* health) {
  detail::eigen_single_threaded();
  const Index M = at ? A.cols() : A.rows(), K = at ? A.rows() : A.cols(), N = bt ? B.rows() : B.cols();
  if ((bt ? B.cols() : B.rows()) != K || out.rows() != M || out.cols() != N)
    throw std::logic_error(fmt::format("site_gemm: shapes {}[{},{}]·{}[{},{}] → [{},{}] do not match", at ? "ᵀ" : "",
                                       A.rows(), A.cols(), bt ? "ᵀ" : "", B.rows(), B.cols(), out.rows(), out.cols()));
  if constexpr (std::is_same_v<T, double>)
    if (!p.is_native()) throw InputError("site_gemm<double> is the binary64 reference: native sites only");

  if (p.gemm || p.input || p.input_a || p.input_b) {
    Matrix<float> Af(M, K);  // [M,K] row-major binary32
    if (at) Af = A.transpose().template cast<float>();
    else Af = A.template cast<float>();
    Matrix<float> Bf(K, N);  // [K,N] row-major binary32
    if (bt) Bf = B.transpose().template cast<float>();
    else Bf = B.template cast<float>();
    if (p.input) count_overflow<float>(health, Af, p.input->max_finite), count_overflow<float>(health, Bf, p.input->max_finite);
    if (p.input_a) round_operand(*p.input_a, Af, stream + kStreamA, health);
    if (p.input_b) round_operand(*p.input_b, Bf, stream + kStreamB, health);
    if (p.gemm) {  // emulated: gemm() rounds the inputs itself (streams + kStreamA, + kStreamB)
      Matrix<double> Cd(M, N);  // [M,N] the accumulator values
      gemm(*p.gemm, Af.data(), Bf.data(), Cd.data(), size_t(M), size_t(N), size_t(K), stream);
      out = Cd.template cast<T>();
    } else {  // native with rounded operands, the same indices as gemm()
      if (p.input) {
        round_array(p.input->plan, Af.data(), Af.data(), size_t(M * K), stream + kStreamA);
        round_array(p.input->plan, Bf.data(), Bf.data(), size_t(K * N), stream + kStreamB);
      }
      if constexpr (std::is_same_v<T, float>) {
        native_product<float>(Af, false, Bf, false, out);
      } else {
        Matrix<float> Cf(M, N);  // [M,N]
        native_product<float>(Af, false, Bf, false, Cf);
        out = Cf.template cast<T>();
      }
    }
  } else {
    native_product<T>(A, at, B, bt, out);
  }
  if (divisor != T(1)) out /= divisor;
  if (bias) out.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, N);
  if (p.output) round_matrix<T>(out, *p.output, stream + kStreamOutput, health);
  count_nonfinite<T>(health, out);
}

}  // namespace

template <class T>
void site_gemm(const SitePlan& p, Eigen::Ref<const Matrix<T>> A, Eigen::Ref<const Matrix<T>> B, bool bt,
               Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor, const T* bias, SiteHealth* health) {
  site_gemm_impl<T>(p, A, false, B, bt, out, stream, divisor, bias, health);
}

template <class T>
void site_gemm_at(const SitePlan& p, Eigen::Ref<const Matrix<T>> At, Eigen::Ref<const Matrix<T>> B, bool bt,
                  Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor) {
  site_gemm_impl<T>(p, At, true, B, bt, out, stream, divisor, nullptr, nullptr);
}

template <class T>
void site_gemm(const SitePolicy& p, Eigen::Ref<const Matrix<T>> A, Eigen::Ref<const Matrix<T>> B, bool bt,
               Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor, const T* bias, SiteHealth* health) {
  if constexpr (std::is_same_v<T, double>)  // before plan_site: this is the error to report
    if (!p.is_native()) throw InputError("site_gemm<double> is the binary64 reference: native sites only");
  site_gemm<T>(plan_site(p), A, B, bt, out, stream, divisor, bias, health);
}

template void site_gemm<float>(const SitePlan&, Eigen::Ref<const Matrix<float>>, Eigen::Ref<const Matrix<float>>,
                              bool, Eigen::Ref<Matrix<float>>, uint64_t, float, const float*, SiteHealth*);
template void site_gemm<double>(const SitePlan&, Eigen::Ref<const Matrix<double>>, Eigen::Ref<const Matrix<double>>,
                              bool, Eigen::Ref<Matrix<double>>, uint64_t, double, const double*, SiteHealth*);
template void site_gemm_at<float>(const SitePlan&, Eigen::Ref<const Matrix<float>>, Eigen::Ref<const Matrix<float>>,
                                 bool, Eigen::Ref<Matrix<float>>, uint64_t, float);
template void site_gemm_at<double>(const SitePlan&, Eigen::Ref<const Matrix<double>>, Eigen::Ref<const Matrix<double>>,
                                  bool, Eigen::Ref<Matrix<double>>, uint64_t, double);
template void site_gemm<float>(const SitePolicy&, Eigen::Ref<const Matrix<float>>, Eigen::Ref<const Matrix<float>>,
                              bool, Eigen::Ref<Matrix<float>>, uint64_t, float, const float*, SiteHealth*);
template void site_gemm<double>(const SitePolicy&, Eigen::Ref<const Matrix<double>>, Eigen::Ref<const Matrix<double>>,
                              bool, Eigen::Ref<Matrix<double>>, uint64_t, double, const double*, SiteHealth*);

}  // namespace mantis
