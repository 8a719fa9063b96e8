#include "optim/gefen_codebook.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
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

namespace {

// What both DPs share: the checks, the padded codebook, the prefix sums. Returns false when the
// codebook is the padded one (already in r).
bool prepare(std::span<const double> points, std::span<const double> weights, int K, GefenCodebook& r,
             std::vector<double>& W, std::vector<double>& WX, std::vector<double>& WX2) {
  const size_t B = points.size();
  if (B == 0) throw InputError("gefen codebook: the histogram is empty");
  if (K < 2) throw InputError(fmt::format("gefen codebook: K = {} (at least 2: the pinned −1 and +1)", K));
  if (weights.size() != B) throw InputError("gefen codebook: points and weights differ in length");
  for (size_t i = 0; i < B; ++i)
    if (!(weights[i] > 0) || (i > 0 && !(points[i] > points[i - 1])))
      throw InputError("gefen codebook: points must ascend and weights be positive");
  r.codes.assign(size_t(K), 0.0f);
  r.cost = 0;
  if (size_t(K) > B) {  // the authors' padding
    for (size_t k = 0; k < size_t(K); ++k) r.codes[k] = float(points[std::min(k, B - 1)]);
    r.codes.front() = -1.0f, r.codes.back() = 1.0f;
    std::sort(r.codes.begin(), r.codes.end());
    return false;
  }
  W.assign(B + 1, 0.0), WX.assign(B + 1, 0.0), WX2.assign(B + 1, 0.0);  // prefix sums, in order
  for (size_t i = 0; i < B; ++i) {
    W[i + 1] = W[i] + weights[i];
    WX[i + 1] = WX[i] + weights[i] * points[i];
    WX2[i + 1] = WX2[i] + weights[i] * (points[i] * points[i]);
  }
  return true;
}

// The centres from the split points (from[e][c] = the first point of cluster c ending at e).
void backtrack(size_t B, size_t C, const std::function<uint32_t(size_t, size_t)>& from, const std::vector<double>& W,
               const std::vector<double>& WX, GefenCodebook& r) {
  size_t e = B;
  for (size_t c = C; c >= 1; --c) {
    const size_t s = from(e, c);
    r.codes[c - 1] = c == 1 ? -1.0f : c == C ? 1.0f : float((WX[e] - WX[s - 1]) / (W[e] - W[s - 1]));
    e = s - 1;
  }
  std::sort(r.codes.begin(), r.codes.end());
}

}  // namespace

GefenCodebook learn_gefen_codebook_reference(std::span<const double> points, std::span<const double> weights, int K) {
  GefenCodebook r;
  std::vector<double> W, WX, WX2;
  if (!prepare(points, weights, K, r, W, WX, WX2)) return r;
  const size_t B = points.size();
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
  backtrack(B, C, [&](size_t e, size_t c) { return from[e * (C + 1) + c]; }, W, WX, r);
  return r;
}

// The same DP, the same floating-point operations on the same operands, reorganised (so every
// D[e][c] and every split point is the reference's, bit for bit):
// - a middle cluster's cost depends on (s, e) only, so each row cost(·, e) is computed once for all
//   2 ≤ c < K (the reference recomputes it, division included, for every c);
// - e runs in tiles of kTile; within a tile c runs outer, so the tile's cost rows and the column
//   D[·][c − 1] stay in cache; the columns are stored c-major so the s loop reads contiguously;
// - the argmin over s runs in 8 interleaved lanes, each keeping the first s of its smallest value
//   (strict <, as the reference); the lanes combine to the smallest s among those whose value
//   equals the overall minimum — the reference's first minimum, and its stored value;
// - only the cells the answer can use are computed: D[e][c] for c ≤ e ≤ B − (K − c), and D[B][K];
// - one thread: sharing a tile's e among threads needs a barrier per (tile, c), which on a busy
//   machine costs far more than it saves.
GefenCodebook learn_gefen_codebook(std::span<const double> points, std::span<const double> weights, int K) {
  // 8 lanes of doubles and their 64-bit masks / indices (GCC vector extensions: the same IEEE
  // additions and comparisons, lane by lane)
  typedef double V __attribute__((vector_size(64)));
  typedef int64_t I __attribute__((vector_size(64)));
  GefenCodebook r;
  std::vector<double> W, WX, WX2;
  if (!prepare(points, weights, K, r, W, WX, WX2)) return r;
  const size_t B = points.size(), C = size_t(K), stride = B + 1;
  constexpr size_t kTile = 64, kLanes = 8;
  std::vector<double> D(C * stride, std::numeric_limits<double>::infinity());  // D[c][e] at c·stride + e, c < K
  std::vector<uint32_t> from((C + 1) * stride, 0);
  std::vector<double> M(kTile * stride);  // the tile's cost rows: M[(e − e0)·stride + s]
  D[0] = 0.0;                             // D[0][0]
  auto mid = [&](size_t s, size_t e) {
    const double w = W[e] - W[s - 1], wx = WX[e] - WX[s - 1], wx2 = WX2[e] - WX2[s - 1];
    return wx2 - (wx * wx) / w;
  };
  for (size_t e0 = 1; e0 <= B; e0 += kTile) {
    const size_t e1 = std::min(B, e0 + kTile - 1);
    for (size_t e = e0; e <= e1; ++e) {
      double* row = M.data() + (e - e0) * stride;
      for (size_t s = 2; s <= e; ++s) row[s] = mid(s, e);
      // column 1: only s = 1 is finite (D[s − 1][0] = ∞ for s > 1)
      const double w = W[e], wx = WX[e], wx2 = WX2[e];
      D[1 * stride + e] = D[0] + ((wx2 - (-2.0 * wx)) + w);
      from[e * (C + 1) + 1] = 1;
    }
    for (size_t c = 2; c < C; ++c) {
      const size_t last = B - (C - c);  // D[e][c] for larger e cannot be used
      const double* prev = D.data() + (c - 1) * stride;  // D[s − 1][c − 1] = prev[s − 1]
      for (size_t e = std::max(e0, c); e <= std::min(e1, last); ++e) {
        const double* row = M.data() + (e - e0) * stride;
        const double inf = std::numeric_limits<double>::infinity();
        V best = {inf, inf, inf, inf, inf, inf, inf, inf};
        I at = {0, 0, 0, 0, 0, 0, 0, 0}, idx = {0, 1, 2, 3, 4, 5, 6, 7};
        size_t s = c;
        idx += int64_t(c);
        for (; s + kLanes - 1 <= e; s += kLanes) {
          V pv, rv;
          std::memcpy(&pv, prev + s - 1, sizeof(V));
          std::memcpy(&rv, row + s, sizeof(V));
          const V cand = pv + rv;
          const I lt = cand < best;
          best = lt ? cand : best;
          at = lt ? idx : at;
          idx += int64_t(kLanes);
        }
        double bl[kLanes];
        int64_t al[kLanes];
        std::memcpy(bl, &best, sizeof(V)), std::memcpy(al, &at, sizeof(I));
        for (size_t j = 0; s <= e; ++s, ++j) {  // the tail, lane by lane
          const double cand = prev[s - 1] + row[s];
          if (cand < bl[j]) bl[j] = cand, al[j] = int64_t(s);
        }
        double m = bl[0];
        for (size_t j = 1; j < kLanes; ++j) m = bl[j] < m ? bl[j] : m;
        int64_t bs = 0;
        double bv = m;
        for (size_t j = 0; j < kLanes; ++j)
          if (al[j] != 0 && bl[j] == m && (bs == 0 || al[j] < bs)) bs = al[j], bv = bl[j];
        D[c * stride + e] = bv;
        from[e * (C + 1) + c] = uint32_t(bs);
      }
    }
  }
  // the last cluster (centre +1), at e = B only
  {
    double best = std::numeric_limits<double>::infinity();
    uint32_t bs = 0;
    for (size_t s = C; s <= B; ++s) {
      const double w = W[B] - W[s - 1], wx = WX[B] - WX[s - 1], wx2 = WX2[B] - WX2[s - 1];
      const double cand = D[(C - 1) * stride + (s - 1)] + ((wx2 - 2.0 * wx) + w);
      if (cand < best) best = cand, bs = uint32_t(s);
    }
    r.cost = best;
    from[B * (C + 1) + C] = bs;
  }
  backtrack(B, C, [&](size_t e, size_t c) { return from[e * (C + 1) + c]; }, W, WX, r);
  return r;
}

namespace {

void histogram_points(std::span<const int64_t> counts, std::vector<double>& points, std::vector<double>& weights) {
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] < 0) throw InputError(fmt::format("gefen codebook: negative count in bin {}", j));
    if (counts[j] == 0) continue;
    points.push_back(-1.0 + double(2 * j + 1) * 0x1p-12);  // the bin's centre (exact)
    weights.push_back(double(counts[j]));
  }
}

}  // namespace

GefenCodebook learn_gefen_codebook(std::span<const int64_t> counts, int K) {
  std::vector<double> points, weights;
  histogram_points(counts, points, weights);
  return learn_gefen_codebook(points, weights, K);
}

GefenCodebook learn_gefen_codebook_reference(std::span<const int64_t> counts, int K) {
  std::vector<double> points, weights;
  histogram_points(counts, points, weights);
  return learn_gefen_codebook_reference(points, weights, K);
}

}  // namespace mantis
