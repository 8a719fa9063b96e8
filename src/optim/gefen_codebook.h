// gefen_codebook — Gefen's global momentum codebook (Ben-David et al., ndvbd/Gefen
// quantization.py and gefen.py at 27f3a284; ../shared/reference/papers.md §3.2 B), learned once from
// the first step's gradients: used by the Gefen optimizer (optim/gefen.h; issue 11).
//
// Histogram: 4096 equal bins over [−1, 1]. Each gradient element is divided by the absmax of its
// block of `period` consecutive elements (0 where that absmax is 0) in binary32, and lands in bin
// ⌊(x + 1)/2⁻¹¹⌋ (the sum x + 1 in binary32, as torch does), clamped to 0..4095. Counts are exact
// integers here (the authors sum float32 counts, exact only up to 2²⁴ per bin).
// Points: the centres −1 + (2j + 1)·2⁻¹² of the occupied bins, ascending, weighted by their counts.
// Codebook (K entries, sorted, binary32):
//   K > B occupied bins: the B centres padded with the last one, entries 0 and K − 1 overwritten by
//     −1 and +1 (which drops the smallest centre, as the authors' code does), sorted;
//   otherwise the exact weighted 1-D k-means with pinned endpoints, by dynamic programming:
//     D[e][c] = min over s = c..e of D[s−1][c−1] + cost_c(s..e), D[0][0] = 0, ties to the smallest s,
//     cost_1 = Σw(x+1)², cost_K = Σw(x−1)² (written as Σwx² ∓ 2Σwx + Σw), others Σwx² − (Σwx)²/Σw,
//     from binary64 prefix sums accumulated in order; centres −1, the clusters' weighted means
//     (Σwx/Σw rounded to binary32), +1. O(K·B²) time, O(K·B) memory.
// Two implementations of that DP: learn_gefen_codebook_reference, the loops above as written (the
// authors' order); learn_gefen_codebook, the same operations on the same operands reorganised
// (each middle cost row computed once for all c, tiles of e, 8-lane first-minimum, only the cells
// the answer uses, threads over the e of a tile), hence identical D, split points, codes and
// cost, bit for bit (tested on many histograms); ~0.2 s instead of seconds at 4,096 bins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mantis {

inline constexpr int kGefenHistogramBins = 4096;
inline constexpr int kGefenCodebookSize = 256;

// Adds the elements of `g` (flattened row-major) to `counts` (kGefenHistogramBins entries), each
// normalised by the absmax of its block of `period` elements (the last block may be shorter only
// if period does not divide g.size(): an InputError, as Gefen's periods always divide n).
void add_to_gefen_histogram(std::span<const float> g, size_t period, std::vector<int64_t>& counts);

struct GefenCodebook {
  std::vector<float> codes;  // [K], ascending
  double cost = 0;           // D[B][K] (0 for a padded codebook)
};

// The codebook of a histogram (counts per bin); InputError when it is empty or K < 2.
GefenCodebook learn_gefen_codebook(std::span<const int64_t> counts, int K = kGefenCodebookSize);

// The same on explicit ascending points with positive weights (tests; the histogram form calls it).
GefenCodebook learn_gefen_codebook(std::span<const double> points, std::span<const double> weights, int K);

// The reference DP (the loops as written), both forms: what learn_gefen_codebook is tested against.
GefenCodebook learn_gefen_codebook_reference(std::span<const int64_t> counts, int K = kGefenCodebookSize);
GefenCodebook learn_gefen_codebook_reference(std::span<const double> points, std::span<const double> weights, int K);

}  // namespace mantis
