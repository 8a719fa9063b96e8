#include "core/quant.h"

#include <algorithm>

#include "core/philox.h"
#include "core/quant_block.h"

namespace mantis {

template <class T>
void quantize_absmax(const T* x, T* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                     uint64_t stream) noexcept {
  const size_t group = q.block == 0 ? cols : q.block;
  const double Q = absmax_levels(q.bits);
  const bool sr = q.rounding == Rounding::sr;
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; ++r)
    for (size_t g0 = 0; g0 < cols; g0 += group) {
      const size_t g1 = std::min(cols, g0 + group);
      T amax = 0;
      for (size_t i = g0; i < g1; ++i) amax = absmax_step(amax, x[r * cols + i]);
      const T s = absmax_scale(amax, Q);  // the stored scale
      for (size_t i = g0; i < g1; ++i) {
        const size_t idx = r * cols + i;
        out[idx] = absmax_element(x[idx], s, Q, sr, sr ? random_word(q.seed, stream, idx) : 0u);
      }
    }
}

template void quantize_absmax<float>(const float*, float*, size_t, size_t, const AbsmaxQuant&, uint64_t) noexcept;
template void quantize_absmax<double>(const double*, double*, size_t, size_t, const AbsmaxQuant&,
                                      uint64_t) noexcept;

}  // namespace mantis
