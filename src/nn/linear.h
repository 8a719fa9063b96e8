// linear — the GEMM of a site: the forward product and the two backward products of a Linear.
//
// Order at a GEMM site: product → ÷ divisor (attn.qk: √HS) → + bias → output rounding.
// native → Eigen's binary32 product, cut into fixed tiles (not depending on the thread count)
// each multiplied by Eigen on one thread (Eigen's own threading is switched off); strict /
// unfused / blocked → mantis::gemm (gemm.h) on row-major binary32 operands, its double result
// converted to T (exact whenever the accumulator fits binary32).
#pragma once

#include <cstdint>

#include "nn/ops.h"

namespace mantis {

// The GEMM of one site call, as the forward pass does it (exposed for tests):
//   out[M,N] = round_output((A[M,K] · B) / divisor + bias)
// with B given as [K,N], or as its transpose [N,K] when b_transposed (Linear weights [out,in],
// keys [T,HS]); bias: N values or null. Input rounding (if any) applies to A and to B in its
// [K,N] orientation: A[i,k] uses index i·K + k of stream + 1, B[k,j] index k·N + j of stream + 2
// (as gemm.h); output rounding of out[i,j] uses index i·N + j of stream + 3.
// `health`, when given, receives the call's range events (SiteHealth; thread-safe).
// The plan overload is what the passes call (no validation); the SitePolicy one compiles the
// entry first (plan_site: InputError for an invalid entry). T = double takes native sites only.
template <class T>
void site_gemm(const SitePlan& p, Eigen::Ref<const Matrix<T>> A, Eigen::Ref<const Matrix<T>> B, bool b_transposed,
               Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor = T(1), const T* bias = nullptr,
               SiteHealth* health = nullptr);
template <class T>
void site_gemm(const SitePolicy& p, Eigen::Ref<const Matrix<T>> A, Eigen::Ref<const Matrix<T>> B, bool b_transposed,
               Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor = T(1), const T* bias = nullptr,
               SiteHealth* health = nullptr);

// The same with A given transposed, At [K,M] (read in place; the same bits as site_gemm on Atᵀ),
// no bias, no health counts: the backward's Xᵀ·dY products.
template <class T>
void site_gemm_at(const SitePlan& p, Eigen::Ref<const Matrix<T>> At, Eigen::Ref<const Matrix<T>> B, bool b_transposed,
                  Eigen::Ref<Matrix<T>> out, uint64_t stream, T divisor = T(1));

extern template void site_gemm<float>(const SitePlan&, Eigen::Ref<const Matrix<float>>,
                                     Eigen::Ref<const Matrix<float>>, bool, Eigen::Ref<Matrix<float>>, uint64_t, float,
                                     const float*, SiteHealth*);
extern template void site_gemm<double>(const SitePlan&, Eigen::Ref<const Matrix<double>>,
                                     Eigen::Ref<const Matrix<double>>, bool, Eigen::Ref<Matrix<double>>, uint64_t, double,
                                     const double*, SiteHealth*);
extern template void site_gemm<float>(const SitePolicy&, Eigen::Ref<const Matrix<float>>,
                                     Eigen::Ref<const Matrix<float>>, bool, Eigen::Ref<Matrix<float>>, uint64_t, float,
                                     const float*, SiteHealth*);
extern template void site_gemm<double>(const SitePolicy&, Eigen::Ref<const Matrix<double>>,
                                     Eigen::Ref<const Matrix<double>>, bool, Eigen::Ref<Matrix<double>>, uint64_t, double,
                                     const double*, SiteHealth*);

extern template void site_gemm_at<float>(const SitePlan&, Eigen::Ref<const Matrix<float>>,
                                        Eigen::Ref<const Matrix<float>>, bool, Eigen::Ref<Matrix<float>>, uint64_t,
                                        float);
extern template void site_gemm_at<double>(const SitePlan&, Eigen::Ref<const Matrix<double>>,
                                         Eigen::Ref<const Matrix<double>>, bool, Eigen::Ref<Matrix<double>>, uint64_t,
                                         double);

namespace detail {

// Eigen's own GEMM threading splits work by the thread count; we tile ourselves instead.
void eigen_single_threaded();

// Linear y = x·Wᵀ (+ b) at `site`, backward: dW += dyᵀ·x (Pass::dw), db += Σ_rows dy (rows in
// order; db null: no bias), and dx = dy·W (Pass::dx) when dx is given. dy [N,out], x [N,in],
// W [out,in], dW [out,in]. The GEMMs draw from grad_stream(site, layer, slot, pass).
// weight_grads false (a frozen weight): dW and db are left as they are, only dx is computed.
template <class T>
void linear_backward(const PolicyPlan& pol, Site site, int layer, Eigen::Index slot, const Matrix<T>& dy,
                     const Matrix<T>& x, Eigen::Ref<const Matrix<T>> w, Matrix<T>* dx, Eigen::Ref<Matrix<T>> dW, T* db,
                     bool weight_grads = true);

}  // namespace detail
}  // namespace mantis
