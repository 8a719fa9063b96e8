#include "optim/nearest_code.h"

#include "optim/gefen_block.h"  // gefen_nearest

#include <algorithm>
#include <cmath>

namespace mantis {

uint8_t gefen_nearest_code(std::span<const float> C, float x) {
  return uint8_t(gefen_nearest(C.data(), uint32_t(C.size()), x));  // the rule, shared with the GPU kernel
}

namespace {

constexpr uint32_t kKeyMinusInf = 0x007fffffu, kKeyPlusInf = 0xff800000u;  // order_key(∓inf)

float from_key(uint32_t key) { return std::bit_cast<float>(key & 0x80000000u ? key ^ 0x80000000u : ~key); }

// The table path for W ≥ the window: code = base + Σ_{j<W} [L[base + j] < key] (L padded with
// 0xffffffff, which no key exceeds), 0 for NaN. Integer compares and arithmetic instead of ?:
// (GCC does not if-convert around a float compare under -ftrapping-math), restrict pointers and
// int32 indices, so that the loop vectorises and uses the hardware's gathers.
template <int W>
void table_codes(const float* __restrict x, size_t n, uint32_t* __restrict out, const uint32_t* __restrict base,
                 const uint32_t* __restrict L) {
  for (size_t e = 0; e < n; ++e) {
    const uint32_t key = order_key(x[e]);
    const int32_t b = int32_t(base[int32_t(key >> 16)]);
    uint32_t c = uint32_t(b);
    for (int j = 0; j < W; ++j) c += uint32_t(L[b + j] < key);
    out[e] = c & (0u - uint32_t(x[e] == x[e]));
  }
}

}  // namespace

NearestCode::NearestCode(std::span<const float> C) : C_(C.begin(), C.end()) {
  const size_t K = C.size();
  if (K == 0 || K > 256) return;
  for (size_t j = 0; j < K; ++j)
    if (!std::isfinite(C[j]) || (j > 0 && C[j] < C[j - 1])) return;
  // L_j (j = 1..K−1): the largest non-NaN key whose code is < j, by bisection on keys (the rule is
  // monotone in x: see the header).
  std::vector<uint32_t> L;
  for (uint32_t j = 1; j < K; ++j) {
    uint32_t lo = kKeyMinusInf, hi = kKeyPlusInf;  // code(lo) < j (code(−inf) = 0); code(hi) = K − 1 ≥ j
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (gefen_nearest_code(C, from_key(mid)) < j ? lo : hi) = mid;
    }
    L.push_back(lo);
  }
  std::vector<uint32_t> base(size_t(1) << 16, 0);
  size_t lo_count = 0, hi_count = 0;  // #{L < key} at a bucket's ends: pointers that only move forward
  int window = 1;
  for (uint32_t b = 0; b < (1u << 16); ++b) {
    const uint32_t kmin = b << 16, kmax = kmin | 0xffffu;
    while (lo_count < L.size() && L[lo_count] < kmin) ++lo_count;
    hi_count = std::max(hi_count, lo_count);
    while (hi_count < L.size() && L[hi_count] < kmax) ++hi_count;
    base[b] = uint32_t(lo_count);
    window = std::max(window, int(hi_count - lo_count));
  }
  if (window > kMaxWindow) return;
  base_ = std::move(base);
  L_ = std::move(L);
  L_.resize(K - 1 + kMaxWindow, 0xffffffffu);
  window_ = window;
}

void NearestCode::codes(const float* x, size_t n, uint32_t* out) const {
  switch (window_) {
    case 0:
      for (size_t e = 0; e < n; ++e) out[e] = gefen_nearest_code(C_, x[e]);
      return;
    case 1:
      return table_codes<1>(x, n, out, base_.data(), L_.data());
    case 2:
      return table_codes<2>(x, n, out, base_.data(), L_.data());
    case 3:
    case 4:
      return table_codes<4>(x, n, out, base_.data(), L_.data());
    default:
      return table_codes<kMaxWindow>(x, n, out, base_.data(), L_.data());
  }
}

uint8_t NearestCode::operator()(float x) const {
  uint32_t c;
  codes(&x, 1, &c);
  return uint8_t(c);
}

}  // namespace mantis
