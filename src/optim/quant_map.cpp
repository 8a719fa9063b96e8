#include "optim/quant_map.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mantis {

float torch_linspace_f32(float start, float end, int64_t steps, int64_t idx) {
  if (steps == 1) return start;
  const float step = (end - start) / float(steps - 1);
  const int64_t halfway = steps / 2;
  return idx < halfway ? start + step * float(idx) : end - step * float(steps - idx - 1);
}

std::vector<float> dynamic_map(bool is_signed, int max_exponent_bits, int total_bits) {
  const int e = max_exponent_bits, s = total_bits - 1;
  if (e < 1 || e > s || total_bits > 8) throw std::logic_error("dynamic_map: bad bit counts");
  std::vector<float> data;
  // One decade: the means of k linspace boundaries, scaled by 10^x (x = i − e + 1) as Python makes it
  // (binary64 pow) and torch casts it into the float32 product.
  auto decade = [&](int64_t k, int i) {
    const float scale = float(std::pow(10.0, double(i - e + 1)));
    for (int64_t j = 0; j + 1 < k; ++j) {
      const float mean = (torch_linspace_f32(0.1f, 1.0f, k, j) + torch_linspace_f32(0.1f, 1.0f, k, j + 1)) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  };
  for (int i = 0; i < e; ++i) decade((int64_t(1) << (i + s - e + (is_signed ? 0 : 1))) + 1, i);
  const int64_t additional = (int64_t(1) << (s - e)) - 1;
  if (additional > 0) decade(additional + 1, e - 1);  // Python reuses the loop's last i
  data.push_back(0.0f);
  data.push_back(1.0f);
  if (data.size() != (size_t(1) << total_bits)) throw std::logic_error("dynamic_map: wrong code count");
  std::sort(data.begin(), data.end());
  return data;
}

std::vector<float> torchao_4bit_map_v() {
  std::vector<float> q;
  for (int64_t i = 1; i <= 16; ++i) q.push_back(torch_linspace_f32(0.0f, 1.0f, 17, i));
  return q;
}

uint8_t bnb_nearest_code(std::span<const float> code, float x, bool is_signed) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = is_signed ? -1.0f : 0.0f, upper = 1.0f;
  float val = code[size_t(pivot)];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot, lower = val, pivot += i;
    } else {
      upper_pivot = pivot, upper = val, pivot -= i;
    }
    val = code[size_t(pivot)];
  }
  if (x > val) return uint8_t(x > (upper + val) * 0.5f ? upper_pivot : pivot);
  return uint8_t(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

uint8_t torchao_nearest_code_4bit(std::span<const float> qmap, float x) {
  int c = x >= qmap[8] ? 8 : 0;
  for (int step : {4, 2, 1}) c += x >= qmap[size_t(c + step)] ? step : 0;
  const int up = std::min(c + 1, 15);
  const float down_val = qmap[size_t(c)], up_val = qmap[size_t(up)];
  return uint8_t(x - down_val >= (up_val - down_val) * 0.5f ? up : c);
}

}  // namespace mantis
