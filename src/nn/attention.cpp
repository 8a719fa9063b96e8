// attention — see attention.h.
#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <type_traits>

#include "nn/activation.h"  // defines: softmax_numerators
#include "nn/attention_row.h"  // defines: softmax_divide
#include "nn/lamp.h"
#include "nn/linear.h"
#include "nn/streams.h"

namespace mantis::detail {

using Eigen::Index;

namespace {

constexpr Index kQueryBlock = 64;  // query rows per block (keys 0..end of the block)

// Causal softmax of one query block: row r of s [nr, r1] is query i = r0 + r, keys 0..i; the
// masked keys i+1..r1−1 get probability 0. Rounding: key j of query i uses index j of the
// streams of softmax_stream(l, head, i).
template <class T>
void softmax_block(const SitePlan& p, int l, Index head, Eigen::Ref<Matrix<T>> s, Index r0, SiteHealth* h) {
  for (Index r = 0; r < s.rows(); ++r) {
    const Index i = r0 + r, n = i + 1;
    T* x = s.row(r).data();  // [r1]: the scores of query i
    const uint64_t stream = softmax_stream(l, head, i);
    if (p.input) round_step(x, size_t(n), *p.input, stream + kStreamA, h);
    T mx;
    softmax_divide(x, n, softmax_numerators(x, x, n, mx));  // softmax_row's steps, the numerators vectorised
    if (p.output) round_step(x, size_t(n), *p.output, stream + kStreamOutput, h);
    count_nonfinite(h, x, size_t(n));
    for (Index j = n; j < s.cols(); ++j) x[j] = 0;
  }
}

}  // namespace

template <class T>
uint64_t attention_forward(const PolicyPlan& pol, int l, const Eigen::Ref<const Matrix<T>>& q,
                           const Eigen::Ref<const Matrix<T>>& k, const Eigen::Ref<const Matrix<T>>& v, Index NH,
                           Index NKV, Index HS, Matrix<T>& out, std::vector<Matrix<T>>* probs,
                           const AttentionHealth& health) {
  const SitePlan &qk = pol.at(Site::attn_qk, l), &pv = pol.at(Site::attn_pv, l), &sm = pol.at(Site::softmax, l);
  const Index T_ = q.rows(), nblocks = (T_ + kQueryBlock - 1) / kQueryBlock, group = NH / NKV;
  const T divisor = std::sqrt(T(HS));
  SiteHealth *hqk = health.qk, *hsm = health.softmax, *hpv = health.pv;
  if (probs) probs->assign(size_t(NH), Matrix<T>::Zero(T_, T_));
  // Random rounding at a score GEMM is keyed per query row (streams.h), so those rows are
  // multiplied one at a time; deterministic ones in blocks (the same values either way).
  const bool by_row = qk.random || pv.random;
  const std::optional<LampSpec>& lamp = pol.policy().lamp;
  const SitePlan& recompute = pol.lamp_scores();  // LAMP's recomputed scores
  // Block path with health counts: overflow is counted before the output rounding, so the scores
  // are multiplied unrounded and rounded here (the same call site_gemm makes: deterministic, so
  // the same values).
  const bool count_qk_overflow = !by_row && hqk && qk.output;
  SitePlan qk_unrounded = qk;
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
                     true, S, qk_stream(l, h), divisor);
        if (count_qk_overflow) {
          for (Index r = 0; r < nr; ++r) count_overflow(hqk, S.row(r).data(), size_t(r0 + r + 1), qk.output->max_finite);
          round_matrix<T>(S, *qk.output, qk_stream(l, h) + kStreamOutput);
        }
        if (hqk)
          for (Index r = 0; r < nr; ++r) count_nonfinite(hqk, S.row(r).data(), size_t(r0 + r + 1));
      } else {
        for (Index i = r0; i < r1; ++i)  // query i against keys 0..i: [1, i+1]
          site_gemm<T>(qk, q.block(i, h * HS, 1, HS), k.block(0, g * HS, i + 1, HS), true,
                       S.block(i - r0, 0, 1, i + 1), qk_stream(l, h, i), divisor, nullptr, hqk);
      }
      if constexpr (std::is_same_v<T, float>)
        if (lamp) {
          sh.resize(nr, r1);
          site_gemm<T>(recompute, q.block(r0, h * HS, nr, HS), k.block(0, g * HS, r1, HS), true, sh,
                       lamp_stream(l, h), divisor);
          mark.resize(size_t(r1));
          for (Index i = r0; i < r1; ++i) {
            const Index r = i - r0;
            selected[size_t(h)] += lamp_select_row(*lamp, std::span<const float>(S.row(r).data(), size_t(i + 1)), i,
                                                   mark, lamp_stream(l, h, i));
            for (Index j = 0; j <= i; ++j)
              if (mark[size_t(j)]) S(r, j) = sh(r, j);
          }
        }
      softmax_block<T>(sm, l, h, S, r0, hsm);
      if (probs) (*probs)[size_t(h)].block(r0, 0, nr, r1) = S;  // the rest of [T,T] stays 0
      // Row by row when random, or when the block's values are not all finite (a masked zero would
      // meet a later key's inf or NaN: attention_row.h attention_values_finite).
      if (!by_row && attention_values_finite(v.data(), Index(v.outerStride()), g * HS, HS, r0, r1)) {
        site_gemm<T>(pv, S, v.block(0, g * HS, r1, HS), false, out.block(r0, h * HS, nr, HS),
                     pv_stream(l, h), T(1), nullptr, hpv);
      } else {
        for (Index i = r0; i < r1; ++i)  // probabilities [1, i+1] · values [i+1, HS]
          site_gemm<T>(pv, S.block(i - r0, 0, 1, i + 1), v.block(0, g * HS, i + 1, HS), false,
                       out.block(i, h * HS, 1, HS), pv_stream(l, h, i), T(1), nullptr, hpv);
      }
    }
  });
  errors.rethrow();
  uint64_t total = 0;
  for (uint64_t c : selected) total += c;
  return total;
}

template <class T>
void attention_backward(const PolicyPlan& pol, int l, const std::vector<Matrix<T>>& probs, const Matrix<T>& q,
                        const Matrix<T>& k, const Matrix<T>& v, const Matrix<T>& datt, Index NH, Index NKV, Index HS,
                        Matrix<T>& dq, Matrix<T>& dk, Matrix<T>& dv) {
  const Index T_ = datt.rows(), group = NH / NKV;
  const T divisor = std::sqrt(T(HS));
  dq.resize(T_, NH * HS);  // every column block is written below
  std::vector<Matrix<T>> dk_h(static_cast<size_t>(NH)), dv_h(static_cast<size_t>(NH));  // per query head, reduced in order
  ParallelErrors errors;
#pragma omp parallel for schedule(static)
  for (Index h = 0; h < NH; ++h) errors.run([&] {
    const Index g = h / group;
    const Matrix<T>& P = probs[size_t(h)];  // [T,T]
    const auto dO = datt.middleCols(h * HS, HS);  // [T,HS] (views: the GEMMs read strided operands)
    const auto Vg = v.middleCols(g * HS, HS);     // [T,HS]
    const auto Kg = k.middleCols(g * HS, HS);     // [T,HS]
    const auto Qh = q.middleCols(h * HS, HS);     // [T,HS]
    Matrix<T> dP(T_, T_);                         // [T,T] = dO·Vᵀ
    site_gemm<T>(pol.at(Site::attn_pv, l, Pass::dx), dO, Vg, true, dP, grad_stream(Site::attn_pv, l, h, Pass::dx));
    dv_h[size_t(h)].resize(T_, HS);               // [T,HS] = Pᵀ·dO
    site_gemm_at<T>(pol.at(Site::attn_pv, l, Pass::dw), P, dO, false, dv_h[size_t(h)],
                    grad_stream(Site::attn_pv, l, h, Pass::dw));
    Matrix<T>& dS = dP;                           // [T,T] = P ⊙ (dP − rowsum(dP ⊙ P)), in place
    for (Index i = 0; i < T_; ++i) {
      const T* p = P.row(i).data();
      T* d = dS.row(i).data();
      T s = 0;
      for (Index j = 0; j <= i; ++j) s += d[j] * p[j];
      for (Index j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - s);
      std::fill(d + i + 1, d + T_, T(0));
    }
    // dQ_h [T,HS] = dS·K / √HS, straight into its columns of dq
    site_gemm<T>(pol.at(Site::attn_qk, l, Pass::dx), dS, Kg, false, dq.middleCols(h * HS, HS),
                 grad_stream(Site::attn_qk, l, h, Pass::dx), divisor);
    dk_h[size_t(h)].resize(T_, HS);               // [T,HS] = dSᵀ·Q / √HS
    site_gemm_at<T>(pol.at(Site::attn_qk, l, Pass::dw), dS, Qh, false, dk_h[size_t(h)],
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

template <class T>
void rope_tables(Index T_, Index HS, double theta, Matrix<T>& rcos, Matrix<T>& rsin) {
  rcos.resize(T_, HS / 2), rsin.resize(T_, HS / 2);
  for (Index t = 0; t < T_; ++t)
    for (Index i = 0; i < HS / 2; ++i) {
      const double freq = 1.0 / std::pow(theta, double(2 * i) / double(HS));
      rcos(t, i) = T(std::cos(double(t) * freq));
      rsin(t, i) = T(std::sin(double(t) * freq));
    }
}

template <class T>
void rope_rotate(Matrix<T>& x, Index nh, Index HS, const Matrix<T>& cos_, const Matrix<T>& sin_, bool inverse) {
  const Index T_ = x.rows();
  const T sign = inverse ? T(-1) : T(1);  // the inverse rotation: the angle negated (exactly)
#pragma omp parallel for schedule(static)
  for (Index t = 0; t < T_; ++t)
    for (Index h = 0; h < nh; ++h) {
      T* v = x.row(t).data() + h * HS;  // [HS]: head h at position t
      for (Index i = 0; i < HS / 2; ++i) {
        const T c = cos_(t, i), s = sign * sin_(t, i), v0 = v[2 * i], v1 = v[2 * i + 1];
        v[2 * i] = v0 * c - v1 * s;
        v[2 * i + 1] = v0 * s + v1 * c;
      }
    }
}

template uint64_t attention_forward<float>(const PolicyPlan&, int, const Eigen::Ref<const Matrix<float>>&,
                                         const Eigen::Ref<const Matrix<float>>&, const Eigen::Ref<const Matrix<float>>&, Index,
                                         Index, Index, Matrix<float>&, std::vector<Matrix<float>>*,
                                         const AttentionHealth&);
template void attention_backward<float>(const PolicyPlan&, int, const std::vector<Matrix<float>>&,
                                      const Matrix<float>&, const Matrix<float>&, const Matrix<float>&, const Matrix<float>&,
                                      Index, Index, Index, Matrix<float>&, Matrix<float>&, Matrix<float>&);
template void rope_tables<float>(Index, Index, double, Matrix<float>&, Matrix<float>&);
template void rope_rotate<float>(Matrix<float>&, Index, Index, const Matrix<float>&, const Matrix<float>&, bool);
template uint64_t attention_forward<double>(const PolicyPlan&, int, const Eigen::Ref<const Matrix<double>>&,
                                         const Eigen::Ref<const Matrix<double>>&, const Eigen::Ref<const Matrix<double>>&, Index,
                                         Index, Index, Matrix<double>&, std::vector<Matrix<double>>*,
                                         const AttentionHealth&);
template void attention_backward<double>(const PolicyPlan&, int, const std::vector<Matrix<double>>&,
                                      const Matrix<double>&, const Matrix<double>&, const Matrix<double>&, const Matrix<double>&,
                                      Index, Index, Index, Matrix<double>&, Matrix<double>&, Matrix<double>&);
template void rope_tables<double>(Index, Index, double, Matrix<double>&, Matrix<double>&);
template void rope_rotate<double>(Matrix<double>&, Index, Index, const Matrix<double>&, const Matrix<double>&, bool);

}  // namespace mantis::detail
