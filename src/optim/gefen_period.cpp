#include "optim/gefen_period.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mantis {

const char* to_string(GefenPeriodRule r) { return r == GefenPeriodRule::code ? "code" : "brief"; }

namespace {

// numpy's DOUBLE_pairwise_sum, restated.
double pairwise(const double* a, size_t n) {
  if (n < 8) {
    double r = 0.;
    for (size_t i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + size_t(j)];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

}  // namespace

// The reduction starts from the identity 0 and adds the row's pairwise sum (0 + x = x but for −0).
double gefen_pairwise_sum(std::span<const double> a) { return 0.0 + pairwise(a.data(), a.size()); }

std::vector<size_t> gefen_divisors(size_t n) {
  std::vector<size_t> small, large;
  if (n < 2) return small;
  for (size_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      small.push_back(i);
      if (i != n / i) large.push_back(n / i);
    }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

std::vector<GefenPeriodScore> gefen_period_scores(std::span<const float> g, GefenPeriodRule rule) {
  const size_t n = g.size();
  std::vector<double> lg(n);
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(g[i]))
      throw InputError(fmt::format("gefen period: gradient element {} is not finite ({})", i, g[i]));
    const float sq = g[i] * g[i];  // binary32, as grad.float().square()
    lg[i] = std::log(double(sq) + 1e-12);
  }
  std::vector<GefenPeriodScore> out;
  for (size_t p : gefen_divisors(n)) {
    if (n / p < 4) continue;
    const size_t nb = n / p;
    std::vector<double> mu(nb), e(nb);
    // Blocks are independent (each its own pairwise sum): the partition cannot change a bit.
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t b = 0; b < nb; ++b) {
      const double* x = lg.data() + b * p;
      if (rule == GefenPeriodRule::code) {
        mu[b] = gefen_pairwise_sum({x, p}) / double(p);
      } else if (p > 1) {
        // shifted by the block's first value, so that a constant block gives exactly 0
        double s = 0, d = 0;
        for (size_t i = 0; i < p; ++i) s += x[i] - x[0];
        const double m = s / double(p);
        for (size_t i = 0; i < p; ++i) d += ((x[i] - x[0]) - m) * ((x[i] - x[0]) - m);
        e[b] = d / double(p - 1);
      } else {
        e[b] = 0;
      }
    }
    double score;
    if (rule == GefenPeriodRule::code) {
      std::vector<double> diff(nb - 1);
      for (size_t b = 0; b + 1 < nb; ++b) diff[b] = std::abs(mu[b + 1] - mu[b]);
      score = gefen_pairwise_sum(diff) / double(nb - 1);
    } else {
      double s = 0;
      for (double x : e) s += x;
      score = s / double(nb);
    }
    out.push_back({p, score});
  }
  return out;
}

size_t gefen_period_cap(size_t P, size_t n) {
  if (P <= 1024) return P;
  for (size_t p : gefen_divisors(n))
    if (p > 1024 && p <= P && P % p == 0) return p;
  return P;  // unreachable: P itself qualifies
}

size_t gefen_period_choice(const std::vector<GefenPeriodScore>& s, size_t n, GefenPeriodRule rule) {
  size_t best = 1;
  if (rule == GefenPeriodRule::code) {
    double best_score = 0;
    bool found = false;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
      if (s[i].p <= 8 || !(s[i].score > s[i - 1].score) || !(s[i].score > s[i + 1].score)) continue;
      // max over (score, p) tuples: larger score, then larger p
      if (!found || s[i].score > best_score || (s[i].score == best_score && s[i].p > best))
        best = s[i].p, best_score = s[i].score, found = true;
    }
  } else {
    double emin = INFINITY, emax = 0;
    for (auto& x : s)
      if (x.p >= 2) emin = std::min(emin, x.score), emax = std::max(emax, x.score);
    if (emax > 0)
      for (auto& x : s)
        if (x.p >= 2 && x.score <= 1.25 * emin) best = std::max(best, x.p);
    if (best < 8) best = 1;
  }
  return gefen_period_cap(best, n);
}

size_t gefen_period(std::span<const float> g, GefenPeriodRule rule) {
  if (g.size() < 8) return 1;
  return gefen_period_choice(gefen_period_scores(g, rule), g.size(), rule);
}

size_t gefen_magnitude_block(size_t n, size_t P) {
  if (P > 1) return P;
  size_t q = 1;
  for (size_t d : gefen_divisors(n))
    if (d <= 256) q = d;
  return n <= 256 ? std::max<size_t>(n, 1) : q;
}

}  // namespace mantis
