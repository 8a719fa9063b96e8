#include "core/sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "core/format.h"
#include "core/philox.h"

namespace mantis {

namespace {
// u in [0,1): top 24 bits of the word, an exact binary32 value.
inline double unit(uint32_t w) { return double(w >> 8) * 0x1p-24; }

template <class T>
void fill_impl(T* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  if (d == Distribution::uniform01) {
    for (size_t i = 0; i < n; ++i) x[i] = T(float(unit(random_word(seed, stream, i))));
    return;
  }
  // Box–Muller on words 2i, 2i+1: u1 in (0,1], u2 in [0,1).
  for (size_t i = 0; i < n; ++i) {
    const double u1 = double((random_word(seed, stream, 2 * i) >> 8) + 1) * 0x1p-24;
    const double u2 = unit(random_word(seed, stream, 2 * i + 1));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    x[i] = T(float(z));
  }
}
}  // namespace

void fill_random(float* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  fill_impl(x, n, d, seed, stream);
}
void fill_random(double* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  fill_impl(x, n, d, seed, stream);
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + m, v.end());
  if (v.size() % 2) return v[m];
  const double hi = v[m];
  const double lo = *std::max_element(v.begin(), v.begin() + m);
  return lo + (hi - lo) / 2;
}

namespace {

// The generator of the stratified values (stream 7 of the seed).
struct Rng {
  uint64_t seed, i = 0;
  uint32_t next() { return random_word(seed, 7, i++); }
  uint64_t next64() { return (uint64_t(next()) << 32) | next(); }
};

// A value with exponent uniform in [lo, hi], random significand bits and sign.
double draw(Rng& r, int lo, int hi, int mant_bits) {
  const int e = lo + int(r.next() % uint32_t(hi - lo + 1));
  const uint64_t m = r.next64() >> (64 - mant_bits);
  double v = std::ldexp(1.0 + std::ldexp(double(m), -mant_bits), e);
  return (r.next() & 1) ? -v : v;
}

}  // namespace

std::vector<double> stratified_doubles(const Format& f, size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<double> v;
  v.reserve(n);
  const int lo = std::max(-1074, f.emin - f.mu - 4), hi = std::min(1023, f.emax + 2);
  while (v.size() < n) {
    const uint32_t kind = r.next() % 8;
    if (kind == 0) {  // raw bit pattern: any double at all
      const uint64_t u = r.next64();
      double x;
      std::memcpy(&x, &u, 8);
      v.push_back(x);
    } else {
      v.push_back(draw(r, lo, hi, 52));
    }
  }
  return v;
}

std::vector<float> stratified_floats(const Format& f, size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<float> v;
  v.reserve(n);
  const int lo = std::max(-149, f.emin - f.mu - 4), hi = std::min(127, f.emax + 2);
  while (v.size() < n) {
    const uint32_t kind = r.next() % 8;
    if (kind == 0) {
      const uint32_t u = r.next();
      float x;
      std::memcpy(&x, &u, 4);
      v.push_back(x);
    } else {
      v.push_back(float(draw(r, lo, hi, 23)));  // exact except below 2^-126: rounded to a float
    }
  }
  return v;
}

std::vector<double> boundary_doubles(const Format& f) {
  std::vector<double> c;
  const double inf = std::numeric_limits<double>::infinity();
  auto add = [&](double x) {
    for (double s : {1.0, -1.0}) {
      const double y = s * x;
      c.push_back(y);
      c.push_back(std::nextafter(y, inf));
      c.push_back(std::nextafter(y, -inf));
    }
  };
  const double mx = max_finite(f), ulp_max = std::ldexp(1.0, f.emax - f.mu);
  add(0.0);
  add(mx);
  add(mx + ulp_max / 2);  // overflow threshold (rne)
  add(mx + ulp_max);      // next grid value
  add(std::ldexp(1.0, f.emax + 1));
  add(min_normal(f));
  add(min_normal(f) * (1 - std::ldexp(1.0, -f.mu - 1)));
  add(min_subnormal(f));
  add(min_subnormal(f) / 2);
  add(min_subnormal(f) * 1.5);
  add(std::numeric_limits<double>::max());
  add(std::numeric_limits<double>::denorm_min());
  // Midpoints between consecutive representable values in a few binades, incl. subnormals.
  for (int e : {f.emin - 1, f.emin, f.emin + 1, -1, 0, 1, f.emax - 1, f.emax}) {
    const double q = std::ldexp(1.0, std::max(e, f.emin) - f.mu);
    const double base = std::ldexp(1.0, e);
    for (double k : {0.0, 1.0, 2.0, 3.0}) {
      add(base + k * q);
      add(base + (k + 0.5) * q);
    }
    add(base * 2 - q / 2);
  }
  c.push_back(inf);
  c.push_back(-inf);
  c.push_back(std::numeric_limits<double>::quiet_NaN());
  std::vector<double> out;
  for (double x : c)
    if (std::isnan(x) || std::isinf(x) || std::fabs(x) <= std::numeric_limits<double>::max()) out.push_back(x);
  return out;
}

std::vector<float> boundary_floats(const Format& f) {
  std::vector<float> out;
  for (double x : boundary_doubles(f)) {
    const float y = float(x);
    if (std::isnan(x) || double(y) == x) {
      out.push_back(y);
      out.push_back(std::nextafter(y, INFINITY));
      out.push_back(std::nextafter(y, -INFINITY));
    }
  }
  return out;
}

std::vector<Format> test_formats() {
  std::vector<Format> v;
  for (auto& n : named_formats()) v.push_back(format_lookup(n));
  // (the P3109 and integer families at every parameter: test_round_oracle's family test)
  for (auto& n : {"ps1", "ps4", "ps13", "ps23", "e2m0", "e3m1", "e11m20", "e5m0", "p3109_p4", "int8tc", "uint8"})
    v.push_back(format_lookup(n));
  auto custom = [&](const char* toml) { v.push_back(format_from_toml(toml, "test")); };
  custom("name='e4m3fnuz'\nmantissa_bits=3\nexponent_bits=4\nspecials='fnuz'\noverflow='nan'");
  custom("name='e5m2fnuz_sat'\nmantissa_bits=2\nexponent_bits=5\nspecials='fnuz'\noverflow='saturate'");
  custom("name='e4m3_sat'\nmantissa_bits=3\nexponent_bits=4\nspecials='fn'\noverflow='saturate'");
  custom("name='bf16_nosub'\nmantissa_bits=7\nexponent_bits=8\nsubnormals=false");
  custom("name='p5_nosub_sat'\nmantissa_bits=4\nemin=-20\nemax=20\nsubnormals=false\noverflow='saturate'");
  custom("name='fp16_nanovf'\nmantissa_bits=10\nexponent_bits=5\noverflow='nan'");
  custom("name='m0_fn'\nmantissa_bits=0\nexponent_bits=3\nspecials='fn'\noverflow='nan'");
  custom("name='wide_p12'\nmantissa_bits=11\nemin=-1000\nemax=1000");
  custom("name='u_e5m2_nan'\nmantissa_bits=2\nexponent_bits=5\nspecials='none'\nsigned=false\noverflow='nan'");
  custom("name='u_p4_nozero'\nmantissa_bits=3\nemin=-6\nemax=6\nsubnormals=false\nspecials='none'\nsigned=false\n"
         "zero=false");
  custom("name='p3109_p4_sat'\nmantissa_bits=3\nexponent_bits=4\nspecials='p3109'\noverflow='saturate'");
  custom("name='e2m1_none_nz'\nmantissa_bits=1\nexponent_bits=2\nspecials='none'\nnegative_zero=false");
  return v;
}

}  // namespace mantis
