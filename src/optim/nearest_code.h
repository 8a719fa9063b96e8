// nearest_code — the nearest entry of an ascending binary32 codebook: Gefen's rule
// (gefen_nearest_code, the reference: searchsorted, then ties to the lower index) and NearestCode,
// the same answer in O(1) per element, bit for bit.
//
// Rule: k = #{j : C[j] < x} (lower_bound), then the lower neighbour k−1 if |x − C[k−1]| ≤
// |x − C[k]| (binary32), both clamped to 0..K−1; NaN x: every comparison is false, so k = 0 and
// the code is 0.
//
// Why NearestCode: std::lower_bound over 256 codes is 8 unpredictable branches per element, 80 %
// of a Gefen step. The rule is monotone in x (k = #{C < x} does not decrease; between C[k−1] and
// C[k] the rounded |x − C[k−1]| does not decrease and |x − C[k]| does not increase, so the choice
// moves from k−1 to k once), so code(x) = #{j ≥ 1 : L_j < key(x)} where L_j is the largest
// order_key whose code is < j (found by bisection on keys against the reference). A table over
// the top 16 bits of the key holds base = #{L_j < the bucket's smallest key}; then code = base +
// Σ_{i<W} [L[base + i] < key], exact for every key of the bucket, W (window) being the most L_j
// inside one bucket (a bucket spans 2^-8 at [0.5, 1), 8 histogram bins; 1–2 for the learned
// codebooks seen here). Integer compares only, no branches: the batch loop vectorises. Built per
// codebook (~255·32 reference calls and a sweep of 65,536 buckets: 0.15 ms). Codebooks that are
// not ascending, hold a NaN or an infinity, have more than 256 codes or a window over kMaxWindow
// (a padded codebook: its repeated codes repeat a threshold) take the reference (fast() false).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mantis {

// The reference (any ascending codebook; K ≥ 1).
uint8_t gefen_nearest_code(std::span<const float> C, float x);

// Order-preserving integer key of a binary32: a < b (floats, not NaN) ⇒ key(a) < key(b); key(−0) + 1
// = key(+0); negative NaNs below −inf's key, positive NaNs above +inf's.
inline uint32_t order_key(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
}

class NearestCode {
 public:
  static constexpr int kMaxWindow = 8;

  explicit NearestCode(std::span<const float> C);

  bool fast() const { return window_ > 0; }
  int window() const { return window_; }  // 0 when !fast()

  // The code nearest x (as gefen_nearest_code(C, x)).
  uint8_t operator()(float x) const;
  // out[e] = the code nearest x[e] for e < n.
  void codes(const float* x, size_t n, uint32_t* out) const;

 private:
  std::vector<float> C_;        // [K] the codebook
  std::vector<uint32_t> base_;  // [65536] per key bucket
  std::vector<uint32_t> L_;     // [K − 1 + kMaxWindow] L_1 … L_{K−1}, then 0xffffffff
  int window_ = 0;
};

}  // namespace mantis
