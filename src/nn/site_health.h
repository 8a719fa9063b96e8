// site_health — a site's range health (ForwardStats::health) and the per-element rules that define
// it, shared by the CPU's counts (nn/ops.h) and the GPU's (src/cuda/health.h, the attention
// kernels). MANTIS_HD: no Eigen, no host-only calls.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace mantis {

// Range health of one site at one layer, summed over the site's calls:
//   overflow  values whose magnitude exceeded the largest finite number of the format they were
//             rounded to, at one of the site's input or output roundings (they became ±inf, ±max
//             under `saturate`, or NaN, as the format's overflow rule says), and scaled-scheme
//             elements clipped to their block's range. Roundings inside an emulated GEMM's
//             accumulator are not seen here: an accumulator that overflows to inf (or NaN) shows in
//             `inf` / `nan` of the output.
//   nan, inf  NaNs and infinities in the site's output (binary32 overflow of a native product
//             or nonlinearity included).
// Each rounding of an element is one event: an operand that a site rounds in several calls counts
// in each (attention's per-block calls: nn/attention.cpp).
struct SiteHealth {
  uint64_t overflow = 0, nan = 0, inf = 0;
  MANTIS_HD bool clean() const { return overflow == 0 && nan == 0 && inf == 0; }
};

// Where an attention call (its attn.qk, softmax and attn.pv sites) reports its health: each may be
// null (not counted); on the GPU, device memory.
struct AttentionHealth {
  SiteHealth *qk = nullptr, *softmax = nullptr, *pv = nullptr;
};

// x, about to be rounded to a format whose largest finite value is max_finite, overflows it:
// finite (a NaN or ±inf is no overflow of this rounding) and beyond it.
template <class T>
MANTIS_HD bool health_overflows(T x, double max_finite) {
  const double a = x < 0 ? -double(x) : double(x);
  return a > max_finite && a - a == 0.0;  // a − a: NaN for ±inf
}
template <class T>
MANTIS_HD void health_count_overflow(SiteHealth& h, T x, double max_finite) {
  h.overflow += health_overflows(x, max_finite);
}
// x is a site's output value.
template <class T>
MANTIS_HD void health_count_nonfinite(SiteHealth& h, T x) {
  if (x != x) ++h.nan;
  else if (x - x != x - x) ++h.inf;
}

}  // namespace mantis
