// gefen_block — Gefen's update of one magnitude block (gefen.h gives the rule and its order),
// written once for the CPU optimizer (gefen.cpp, one Q-block per loop iteration, threads over
// blocks) and the CUDA kernel (cuda/device.cu, one thread per Q-block). Binary32 operations in the
// order gefen.h states, fma where ATen fuses, nothing else contracted (-ffp-contract=off, nvcc
// --fmad=false), so both give the same bits. The loops have no branches and restrict pointers so
// that the CPU build vectorises them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hd.h"  // MANTIS_HD, hd_fma, hd_sqrt, hd_abs

namespace mantis {

// The step's scalars (binary64 → binary32 once per step, host side).
struct GefenScalars {
  float b2, a2;       // β2, 1 − β2
  float w;            // 1 − β1 (lerp's weight)
  float inv_bc1;      // 1 / (1 − β1^t)
  float bc2_sqrt;     // √(1 − β2^t)
  float eps, lr;
  float decay;        // 1 − lr·wd
  bool wd;            // weight decay applies to this tensor
};

// std::max's rule (a NaN b keeps a), spelled out for both compilers.
MANTIS_HD float gefen_max(float a, float b) { return a < b ? b : a; }

// ATen's (torch 1.13 CPU) binary32 sum of `size` elements of L lanes (element e at x + e·L): its
// multi_row_sum + row_sum, 4 interleaved accumulators (ilp), each a 4-level cascade of
// 2^level_power-element chunks. Sq: the elements are the squares x·x (binary32), as torch's g·g.
template <size_t L, bool Sq>
MANTIS_HD void gefen_torch_row_sum(const float* x, int64_t size, float out[L]) {
  constexpr int64_t ilp = 4, levels = 4;
  const int64_t size_ilp = size / ilp;
  int64_t lg = 0;  // ATen's utils::CeilLog2(size_ilp)
  if (size_ilp <= 2) lg = 1;
  else
    for (uint64_t v = uint64_t(size_ilp - 1); v; v >>= 1) ++lg;
  const int64_t power = lg / levels > 4 ? lg / levels : 4, step = int64_t(1) << power;
  const int64_t mask = step - 1;
  float acc[levels][ilp][L] = {};
  int64_t i = 0;
  while (i + step <= size_ilp) {
    for (int64_t j = 0; j < step; ++j)
      for (int64_t k = 0; k < ilp; ++k) {
        const float* b = x + ((i + j) * ilp + k) * int64_t(L);
        for (size_t l = 0; l < L; ++l) acc[0][k][l] += Sq ? b[l] * b[l] : b[l];
      }
    i += step;
    for (int64_t j = 1; j < levels; ++j) {
      for (int64_t k = 0; k < ilp; ++k)
        for (size_t l = 0; l < L; ++l) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0;
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size_ilp; ++i)
    for (int64_t k = 0; k < ilp; ++k) {
      const float* b = x + (i * ilp + k) * int64_t(L);
      for (size_t l = 0; l < L; ++l) acc[0][k][l] += Sq ? b[l] * b[l] : b[l];
    }
  for (int64_t j = 1; j < levels; ++j)
    for (int64_t k = 0; k < ilp; ++k)
      for (size_t l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t e = size_ilp * ilp; e < size; ++e) {
    const float* b = x + e * int64_t(L);
    for (size_t l = 0; l < L; ++l) acc[0][0][l] += Sq ? b[l] * b[l] : b[l];
  }
  for (int64_t k = 1; k < ilp; ++k)
    for (size_t l = 0; l < L; ++l) acc[0][0][l] += acc[0][k][l];
  for (size_t l = 0; l < L; ++l) out[l] = acc[0][0][l];
}

// The lanes of the Vectorized<float> that torch 1.13's CPU kernels ran with (gefen.h).
inline constexpr size_t kGefenTorchLanes = 8;

// ATen's binary32 sum of n contiguous floats (or of their squares): for n ≥ L the ⌊n/L⌋ vectors
// lane-wise, then the scalar tail from 0 in order, then the L lanes in order; for n < L the same
// cascade over single floats.
template <bool Sq>
MANTIS_HD float gefen_aten_sum(const float* x, size_t n) {
  constexpr size_t L = kGefenTorchLanes;
  if (n < L) {
    float r[1];
    gefen_torch_row_sum<1, Sq>(x, int64_t(n), r);
    return r[0];
  }
  const size_t vs = n / L;
  float lanes[L];
  gefen_torch_row_sum<L, Sq>(x, int64_t(vs), lanes);
  float fin = 0;
  for (size_t k = vs * L; k < n; ++k) fin += Sq ? x[k] * x[k] : x[k];
  for (size_t l = 0; l < L; ++l) fin += lanes[l];
  return fin;
}

// P = 1: v_i and s_i of every element of the block.
MANTIS_HD void gefen_second_moment_each(const float* __restrict g, float* __restrict v, size_t Q,
                                        const GefenScalars& k, float* __restrict st) {
  for (size_t j = 0; j < Q; ++j) {
    v[j] = hd_fma(g[j] * g[j], k.a2, k.b2 * v[j]);
    const float h = hd_sqrt(v[j]) / k.bc2_sqrt + k.eps;
    st[j] = (1.0f / h) * k.inv_bc1;
  }
}

// P > 1 (Q = P): the block's one v and s.
MANTIS_HD float gefen_second_moment_block(const float* g, float& v, size_t P, const GefenScalars& k) {
  const float ms = gefen_aten_sum<true>(g, P) / float(P);
  v = hd_fma(ms, k.a2, k.b2 * v);
  const float h = hd_sqrt(v) / k.bc2_sqrt + k.eps;
  return (1.0f / h) * k.inv_bc1;
}

// m_i = lerp(C[idx_i]·mag_old, g_i, w) into m; returns max |m_i| (16 lanes: the max of
// non-negative values is the same in any order, and NaNs are skipped either way).
MANTIS_HD float gefen_momentum_block(const float* __restrict g, const uint8_t* __restrict idx,
                                     const float* __restrict C, float mag_old, float w, size_t Q,
                                     float* __restrict m) {
  if (hd_abs(w) < 0.5f) {
    for (size_t i = 0; i < Q; ++i) {
      const float mo = C[idx[i]] * mag_old;
      m[i] = hd_fma(w, g[i] - mo, mo);
    }
  } else {
    for (size_t i = 0; i < Q; ++i) {
      const float mo = C[idx[i]] * mag_old;
      m[i] = hd_fma(w - 1.0f, g[i] - mo, g[i]);
    }
  }
  float lane[16] = {}, mx = 0;
  size_t i = 0;
  for (; i + 16 <= Q; i += 16)
    for (size_t l = 0; l < 16; ++l) lane[l] = gefen_max(lane[l], hd_abs(m[i + l]));
  for (; i < Q; ++i) mx = gefen_max(mx, hd_abs(m[i]));
  for (size_t l = 0; l < 16; ++l) mx = gefen_max(mx, lane[l]);
  return mx;
}

// x_i = m_i / mx, or 0 when mx is not positive (a loop each: a division under ?: does not vectorise).
MANTIS_HD void gefen_normalise_block(float* m, float mx, size_t Q) {
  if (mx > 0)
    for (size_t e = 0; e < Q; ++e) m[e] = m[e] / mx;
  else
    for (size_t e = 0; e < Q; ++e) m[e] = 0.0f;
}

// The code nearest x in the ascending codebook C[0..K): k = #{C < x} (lower_bound), then the lower
// neighbour if |x − C[k−1]| ≤ |x − C[k]|; NaN: 0 (nearest_code.h's rule; its reference).
MANTIS_HD uint32_t gefen_nearest(const float* C, uint32_t K, float x) {
  uint32_t lo = 0, n = K;  // lower_bound
  while (n > 0) {
    const uint32_t half = n / 2;
    if (C[lo + half] < x) lo += half + 1, n -= half + 1;
    else n = half;
  }
  const uint32_t last = K - 1, left = lo == 0 ? 0 : (lo - 1 < last ? lo - 1 : last), right = lo < last ? lo : last;
  return hd_abs(x - C[left]) <= hd_abs(x - C[right]) ? left : right;
}

// idx_i ← c_i; θ_i ← θ_i·decay (if wd); θ_i ← θ_i − ((C[c_i]·mx)·s)·lr, s = st[i] (per_element) or st[0].
MANTIS_HD void gefen_apply_block(float* __restrict p, uint8_t* __restrict idx, const uint32_t* __restrict c,
                                 const float* __restrict C, const float* __restrict st, bool per_element, float mx,
                                 const GefenScalars& k, size_t Q) {
  for (size_t i = 0; i < Q; ++i) idx[i] = uint8_t(c[i]);
  if (k.wd)
    for (size_t i = 0; i < Q; ++i) p[i] *= k.decay;
  if (per_element) {
    for (size_t i = 0; i < Q; ++i) p[i] = p[i] - ((C[int32_t(c[i])] * mx) * st[i]) * k.lr;
  } else {
    const float s0 = st[0];
    for (size_t i = 0; i < Q; ++i) p[i] = p[i] - ((C[int32_t(c[i])] * mx) * s0) * k.lr;
  }
}

// Q-block q of a tensor with period P and magnitude block Q (Q = P, or P = 1): the whole update.
// p, g, idx: the tensor's [n]; mag [n/Q]; v [n/P]; C the codebook [256]; scratch m [Q], c [Q], st
// [Q/P]. `codes(x, Q, c)` writes the nearest codes of x[0..Q) (the CPU's table, NearestCode, or
// gefen_nearest: the same codes).
template <class Codes>
MANTIS_HD void gefen_update_block(size_t q, size_t P, size_t Q, float* p, const float* g, uint8_t* idx, float* mag,
                                  float* v, const float* C, const GefenScalars& k, float* m, uint32_t* c, float* st,
                                  const Codes& codes) {
  const size_t i0 = q * Q;
  if (P == 1) gefen_second_moment_each(g + i0, v + i0, Q, k, st);
  else st[0] = gefen_second_moment_block(g + i0, v[q], P, k);
  const float mx = gefen_momentum_block(g + i0, idx + i0, C, mag[q], k.w, Q, m);
  mag[q] = mx;
  gefen_normalise_block(m, mx, Q);
  codes(m, Q, c);
  gefen_apply_block(p + i0, idx + i0, c, C, st, P == 1, mx, k, Q);
}

}  // namespace mantis
