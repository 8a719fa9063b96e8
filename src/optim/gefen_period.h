// gefen_period — Gefen's block period P per tensor, from the first step's gradient g (flattened
// row-major, length n): the released code's rule (ndvbd/Gefen partitioning.py at 27f3a284, CPU
// path; ../shared/reference/papers.md §3.2 A and §5.1–5.2) and, as an option, a precise reading
// of the brief's E(p) wording. Both in binary64.
//
// "code" (the reference):
//   candidates: the divisors p of n (n included) with n/p ≥ 4, ascending; none when n = 1.
//   score(p) = mean over the n/p − 1 adjacent block pairs of |μ_{i+1} − μ_i|, μ_i the mean over
//     block i (p consecutive elements) of ln(s + 1e−12), s = binary64 of the binary32 square g·g
//     (the CPU path squares in float32, then numpy works in float64; the CUDA path squares in
//     float64, so the two can differ on near-ties).
//   Sums in numpy's pairwise order (gefen_pairwise_sum): the per-block sums and the sum of the
//     differences, then each divided by its count. ln is the C library's log (glibc, correctly
//     rounded in practice); numpy may use its own SIMD log, which can differ in the last bit:
//     that only matters where two candidates' scores tie to within ~1e−15 relative and differ in
//     the exact values, never for exact structural ties (equal blocks give equal sums either way).
//     Checked against the authors' partitioning.py (numpy 1.24, AVX-512 SVML log) on 30 random
//     tensors: the periods all equal, 403 of 550 scores bit for bit, the rest within 2e−15
//     relative, all from log (the pairwise sums agree exactly).
//   choice: among interior candidates (not first, not last) with p > 8 whose score is strictly
//     greater than both neighbours', the largest score, ties to the larger p; none → P = 1.
//   cap: P > 1024 → the smallest divisor p of n with 1024 < p ≤ P and P mod p = 0.
//   (n < 8 always gives 1: at most two candidates, no interior one.)
// "brief" (our reading of "intra-block heterogeneity E(p), first pronounced drop, p < 8 → 1"; the
//   authors' constructor keeps an unused threshold = 0.25, which is taken as "pronounced"):
//   E(p) = mean over blocks of the unbiased sample variance (divisor p − 1) of ln(s + 1e−12)
//     within the block (values shifted by the block's first one, so a constant block gives 0);
//     E(1) = 0 (plain sequential binary64 sums: this rule has no reference code). Unbiased, so
//     that i.i.d. noise gives E(p) ≈ constant instead of rising like (p − 1)/p.
//   Read from the largest candidate down, E(p) drops while blocks straddle boundaries of
//     heterogeneity (rows, for a matrix whose v varies by row) and then stays at a floor
//     E_min = min_{p ≥ 2} E(p); the drop ends at P = the largest candidate p ≥ 2 with
//     E(p) ≤ 1.25·E_min (within 25% of the floor). P < 8, fewer than one candidate p ≥ 2, or
//     E(p) = 0 for every p (no heterogeneity at all) → 1; then the 1024 cap. (A first attempt,
//     "the first 25% drop between neighbouring candidates", picked 2 rows when the rows' scales
//     vary a lot, and sub-rows when a candidate between them straddles rows; this form does not.)
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace mantis {

enum class GefenPeriodRule { code, brief };
const char* to_string(GefenPeriodRule r);  // "code", "brief"

// numpy's pairwise summation of float64 (loops_utils.h: n < 8 sequential; ≤ 128 eight
// accumulators then ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) and the tail; above, split at
// n/2 rounded down to a multiple of 8), starting from numpy's reduction identity 0.
double gefen_pairwise_sum(std::span<const double> a);

// The ascending divisors of n, n included (partitioning.py's divisors(n)); {} for n = 0 or 1.
std::vector<size_t> gefen_divisors(size_t n);

struct GefenPeriodScore {
  size_t p;
  double score;
};
// The candidates and the code's scores (rule "code"), or E(p) (rule "brief"), ascending p.
// InputError when g has a non-finite element.
std::vector<GefenPeriodScore> gefen_period_scores(std::span<const float> g, GefenPeriodRule rule);
// The choice from those scores for a tensor of n elements (then the 1024 cap).
size_t gefen_period_choice(const std::vector<GefenPeriodScore>& scores, size_t n, GefenPeriodRule rule);
// The cap: P itself if P ≤ 1024, else the smallest divisor p of n with 1024 < p ≤ P, P mod p = 0.
size_t gefen_period_cap(size_t P, size_t n);
// gefen_period_choice(gefen_period_scores(g, rule), g.size(), rule); 1 for n < 8.
size_t gefen_period(std::span<const float> g, GefenPeriodRule rule);

// The momentum-magnitude block Q: P when P > 1, else the largest divisor of n that is ≤ 256.
size_t gefen_magnitude_block(size_t n, size_t P);

}  // namespace mantis
