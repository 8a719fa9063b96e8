#include "optim/gefen_codebook.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace mantis {

void add_to_gefen_histogram(std::span<const float> g, size_t period, std::vector<int64_t>& counts) {
  if (counts.size() != size_t(kGefenHistogramBins))
    throw InputError(fmt::format("gefen histogram: {} bins, expected {}", counts.size(), kGefenHistogramBins));
  if (period == 0 || g.size() % period != 0)
    throw InputError(fmt::format("gefen histogram: period {} does not divide {} elements", period, g.size()));
  const float bin_width = 2.0f / float(kGefenHistogramBins);  // 2^-11, exact
  for (size_t b = 0; b < g.size(); b += period) {
    float absmax = 0;
    for (size_t i = b; i < b + period; ++i) absmax = std::max(absmax, std::abs(g[i]));
    for (size_t i = b; i < b + period; ++i) {
      const float x = absmax > 0 ? g[i] / absmax : 0.0f;
      const float bin = std::floor((x + 1.0f) / bin_width);
      counts[size_t(std::clamp(bin, 0.0f, float(kGefenHistogramBins - 1)))] += 1;
    }
  }
}

GefenCodebook learn_gefen_codebook(std::span<const double> points, std::span<const double> weights, int K) {
  const size_t B = points.size();
  if (B == 0) throw InputError("gefen codebook: the histogram is empty");
  if (K < 2) throw InputError(fmt::format("gefen codebook: K = {} (at least 2: the pinned −1 and +1)", K));
  if (weights.size() != B) throw InputError("gefen codebook: points and weights differ in length");
  for (size_t i = 0; i < B; ++i)
    if (!(weights[i] > 0) || (i > 0 && !(points[i] > points[i - 1])))
      throw InputError("gefen codebook: points must ascend and weights be positive");
  GefenCodebook r;
  r.codes.resize(size_t(K));
  if (size_t(K) > B) {  // the authors' padding
    for (size_t k = 0; k < size_t(K); ++k) r.codes[k] = float(points[std::min(k, B - 1)]);
    r.codes.front() = -1.0f, r.codes.back() = 1.0f;
    std::sort(r.codes.begin(), r.codes.end());
    return r;
  }
  std::vector<double> W(B + 1, 0.0), WX(B + 1, 0.0), WX2(B + 1, 0.0);  // prefix sums, in order
  for (size_t i = 0; i < B; ++i) {
    W[i + 1] = W[i] + weights[i];
    WX[i + 1] = WX[i] + weights[i] * points[i];
    WX2[i + 1] = WX2[i] + weights[i] * (points[i] * points[i]);
  }
  const size_t C = size_t(K);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> D((B + 1) * (C + 1), inf);  // D[e][c] at e·(C+1) + c
  std::vector<uint32_t> from((B + 1) * (C + 1), 0);
  D[0] = 0.0;
  for (size_t c = 1; c <= C; ++c) {
    for (size_t e = c; e <= B; ++e) {
      double best = inf;
      uint32_t best_s = 0;
      for (size_t s = c; s <= e; ++s) {
        const double w = W[e] - W[s - 1], wx = WX[e] - WX[s - 1], wx2 = WX2[e] - WX2[s - 1];
        double cost;
        if (c == 1) cost = (wx2 - (-2.0 * wx)) + w;   // centre −1
        else if (c == C) cost = (wx2 - 2.0 * wx) + w;  // centre +1
        else cost = wx2 - (wx * wx) / w;
        const double cand = D[(s - 1) * (C + 1) + (c - 1)] + cost;
        if (cand < best) best = cand, best_s = uint32_t(s);
      }
      D[e * (C + 1) + c] = best;
      from[e * (C + 1) + c] = best_s;
    }
  }
  r.cost = D[B * (C + 1) + C];
  size_t e = B;
  for (size_t c = C; c >= 1; --c) {
    const size_t s = from[e * (C + 1) + c];
    r.codes[c - 1] = c == 1 ? -1.0f : c == C ? 1.0f : float((WX[e] - WX[s - 1]) / (W[e] - W[s - 1]));
    e = s - 1;
  }
  std::sort(r.codes.begin(), r.codes.end());
  return r;
}

GefenCodebook learn_gefen_codebook(std::span<const int64_t> counts, int K) {
  std::vector<double> points, weights;
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] < 0) throw InputError(fmt::format("gefen codebook: negative count in bin {}", j));
    if (counts[j] == 0) continue;
    points.push_back(-1.0 + double(2 * j + 1) * 0x1p-12);  // the bin's centre (exact)
    weights.push_back(double(counts[j]));
  }
  return learn_gefen_codebook(points, weights, K);
}

}  // namespace mantis
