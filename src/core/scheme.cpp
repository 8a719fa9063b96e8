// scheme — see scheme.h.
#include "core/scheme.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/file.h"
#include "core/round.h"
#include "core/round_array.h"
#include "core/toml.h"

namespace mantis {

double div_round_odd(double a, double b) {
  const double d = a / b;
  if (d == 0 || std::fabs(d) < 0x1p-1000) return a == 0 ? d : std::copysign(0x1p-1060, d);
  if (!std::isfinite(d)) return d;
  const double r = std::fma(-d, b, a);  // exact: the remainder of a correctly rounded quotient
  if (r == 0) return d;
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  if (bits & 1) return d;  // already odd
  // the exact quotient is d + r/b: step one ulp toward it
  const bool above = (r > 0) == (b > 0);
  return std::nextafter(d, above ? INFINITY : -INFINITY);
}

namespace {

// Why quantize_scheme may divide plainly (its `plain` case). Write a binary32 value a = A·2^α and
// a scale S = B·2^β with integers 2^23 ≤ A, B < 2^24 (subnormals shifted up), so q = a/S lies in
// (2^(α−β−1), 2^(α−β+1)). Every point g where a deterministic rounding to a grid of ≤ 24
// significant bits changes its result (a grid value or a midpoint: ≤ 25 bits; subnormal grids are
// coarser) is near q a multiple of 2^(α−β−25): g = G·2^(α−β−26), G an integer. If q ≠ g,
// |q − g| = 2^(α−26)·|2^26·A − G·B| / (B·2^β) > 2^(α−β−50), while |RN64(q) − q| ≤ 2^(α−β−53).
// So RN64(q) equals such a g exactly when q does and otherwise lies on q's side of it: every
// deterministic mode rounds both alike. (Stochastic modes read bits past the 25th: round-to-odd.)

// Round-to-odd of a · b in binary64 (the exact product is p + e, e from one fma).
double mul_round_odd(double a, double b) {
  const double p = a * b;
  if (!std::isfinite(p) || p == 0) return p;
  const double e = std::fma(a, b, -p);
  uint64_t bits;
  std::memcpy(&bits, &p, 8);
  if (e == 0 || (bits & 1)) return p;
  return std::nextafter(p, e > 0 ? INFINITY : -INFINITY);
}

// A copy of a named format that saturates (the schemes' element formats and NVFP4's scale).
Format saturating(const std::string& name) {
  Format f = format_lookup(name);
  f.overflow = Overflow::saturate;
  return f;
}

// MXINT8's elements: k/64, k = −128 … 127 (two's complement, +0 only): a fixed-point grid.
Format mxint8_element() {
  Format f;
  f.name = "mxint8_element";
  f.mu = 6;
  f.emin = f.emax = 0;
  f.specials = Specials::none;
  f.overflow = Overflow::saturate;
  f.negative_zero = false;
  f.twos_complement = true;
  return f;
}

Scheme preset(const std::string& name) {
  Scheme s;
  s.name = name;
  s.source = "preset";
  s.scale = format_lookup("e8m0");
  auto mx = [&](Format elem) {
    s.element = elem;
    s.block_rows = 1, s.block_cols = 32;
    s.rule = ScaleRule::floor;
  };
  if (name == "mxfp8_e4m3") mx(saturating("e4m3"));
  else if (name == "mxfp8_e5m2") mx(saturating("e5m2"));
  else if (name == "mxfp6_e3m2") mx(format_lookup("fp6_e3m2"));
  else if (name == "mxfp6_e2m3") mx(format_lookup("fp6_e2m3"));
  else if (name == "mxfp4") mx(format_lookup("fp4_e2m1"));
  else if (name == "mxint8") mx(mxint8_element());
  else if (name == "nvfp4") {
    s.element = format_lookup("fp4_e2m1");
    s.block_rows = 1, s.block_cols = 16;
    s.rule = ScaleRule::absmax;
    s.scale = saturating("e4m3");
    s.two_level = true;
  } else if (name == "deepseek_act" || name == "deepseek_weight") {
    s.element = saturating("e4m3");
    s.block_rows = name == "deepseek_act" ? 1 : 128, s.block_cols = 128;
    s.rule = ScaleRule::absmax;
    s.scale = saturating("fp32");
  } else if (name == "uint8_channel_zp" || name == "uint8_tensor_zp") {
    s.element = format_lookup("uint8");
    s.block_rows = name == "uint8_channel_zp" ? 1 : 0, s.block_cols = 0;
    s.rule = ScaleRule::minmax;
    s.scale = saturating("fp32");
  } else if (name == "int8_channel" || name == "int8_tensor") {
    s.element = format_lookup("int8");
    s.block_rows = name == "int8_channel" ? 1 : 0, s.block_cols = 0;
    s.rule = ScaleRule::absmax;
    s.scale = saturating("fp32");
  } else {
    s.name.clear();
  }
  return s;
}

}  // namespace

std::vector<std::string> scheme_presets() {
  return {"mxfp8_e4m3",   "mxfp8_e5m2",  "mxfp6_e3m2",       "mxfp6_e2m3",      "mxfp4",        "mxint8",
          "nvfp4",        "deepseek_act", "deepseek_weight", "int8_channel",    "int8_tensor", "uint8_channel_zp",
          "uint8_tensor_zp"};
}

const char* to_string(ScaleRule r) {
  static const char* n[] = {"floor", "ceil", "nearest", "absmax", "minmax"};
  return n[int(r)];
}

void validate(const Scheme& s) {
  const std::string n = "scheme " + (s.name.empty() ? std::string("(unnamed)") : s.name);
  validate(s.element);
  validate(s.scale);
  if (!fits_float(s.element))
    throw InputError(fmt::format("{}: element format {} must fit binary32 (p ≤ 24)", n, s.element.name));
  if (s.element.overflow != Overflow::saturate)
    throw InputError(fmt::format("{}: element format {} must saturate (overflow = \"saturate\")", n, s.element.name));
  if (s.block_rows < 0 || s.block_cols < 0)
    throw InputError(fmt::format("{}: block [{}, {}] (sizes ≥ 1, or 0 for a whole dimension)", n, s.block_rows,
                                 s.block_cols));
  const bool pow2 = s.rule != ScaleRule::absmax && s.rule != ScaleRule::minmax;
  const Format& e = s.element;
  if ((s.rule == ScaleRule::minmax) !=
      (!e.is_signed && e.has_zero && e.emin == e.emax && e.emin == e.mu && e.subnormals))
    throw InputError(fmt::format("{}: the minmax rule (a zero point) goes with unsigned integer elements uint<B>, "
                                 "and they with it (element {})", n, e.name));
  if (s.rule == ScaleRule::minmax && e.mu > 15)
    throw InputError(fmt::format("{}: minmax elements of at most 16 bits (uint16), not {}", n, e.name));
  if (pow2 && s.scale.mu != 0)
    throw InputError(fmt::format("{}: rule {} makes power-of-two scales: scale must be e8m0, not {}", n,
                                 to_string(s.rule), s.scale.name));
  if (!pow2 && (!s.scale.is_signed || !s.scale.has_zero || s.scale.mu == 0 || s.scale.overflow != Overflow::saturate))
    throw InputError(fmt::format("{}: the absmax rule needs a signed, saturating scale format with a fraction and a "
                                 "zero, not {}", n, s.scale.name));
  if (s.two_level && s.rule != ScaleRule::absmax)
    throw InputError(fmt::format("{}: two_level needs rule = \"absmax\"", n));
  if (s.division == Division::reciprocal && !s.two_level)
    throw InputError(fmt::format("{}: division = \"reciprocal\" is NVIDIA's two-level order (two_level = true)", n));
}

Scheme scheme_from_toml(const std::string& text, const std::string& source) {
  const toml::table t = parse_toml(text, source);
  check_known_keys(t, source, {"name", "element", "block", "rule", "scale", "two_level", "division"});
  auto line = [&](const char* key) { return toml_where(source, *t.get(key)); };
  auto str = [&](const char* key) -> std::optional<std::string> {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_string()) throw InputError(fmt::format("{}: '{}' must be a string", line(key), key));
    return n->as_string()->get();
  };
  Scheme s;
  s.source = source;
  s.name = str("name").value_or(std::filesystem::path(source).stem().string());
  const auto elem = str("element");
  if (!elem) throw InputError(fmt::format("{}: missing 'element' (the element format)", source));
  s.element = format_lookup(*elem);
  if (const toml::node* b = t.get("block")) {
    if (b->is_string()) {
      const std::string v = b->as_string()->get();
      if (v == "tensor") s.block_rows = s.block_cols = 0;
      else if (v == "row") s.block_rows = 1, s.block_cols = 0;
      else if (v == "column") s.block_rows = 0, s.block_cols = 1;
      else throw InputError(fmt::format("{}: block = '{}' (expected [rows, cols], tensor, row or column)", line("block"), v));
    } else if (const toml::array* a = b->as_array(); a && a->size() == 2 && (*a)[0].is_integer() && (*a)[1].is_integer()) {
      s.block_rows = (*a)[0].as_integer()->get(), s.block_cols = (*a)[1].as_integer()->get();
    } else {
      throw InputError(fmt::format("{}: block must be [rows, cols] (integers, 0 = whole dimension) or tensor / row / "
                                   "column", line("block")));
    }
  }
  const std::string rule = str("rule").value_or("floor");
  bool found = false;
  for (ScaleRule r : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest, ScaleRule::absmax, ScaleRule::minmax})
    if (rule == to_string(r)) s.rule = r, found = true;
  if (!found)
    throw InputError(fmt::format("{}: rule = '{}' (expected floor, ceil, nearest, absmax or minmax)", line("rule"), rule));
  const bool float_scale = s.rule == ScaleRule::absmax || s.rule == ScaleRule::minmax;
  s.scale = format_lookup(str("scale").value_or(float_scale ? "fp32" : "e8m0"));
  if (float_scale) s.scale.overflow = Overflow::saturate;  // float scales saturate
  if (const toml::node* n = t.get("two_level")) {
    if (!n->is_boolean()) throw InputError(fmt::format("{}: 'two_level' must be true or false", line("two_level")));
    s.two_level = n->as_boolean()->get();
  }
  if (auto d = str("division")) {
    if (*d == "exact") s.division = Division::exact;
    else if (*d == "reciprocal") s.division = Division::reciprocal;
    else throw InputError(fmt::format("{}: division = '{}' (expected exact or reciprocal)", line("division"), *d));
  }
  validate(s);
  return s;
}

Scheme scheme_lookup(const std::string& given) {
  std::string lower = given;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  Scheme s = preset(lower);
  if (!s.name.empty()) {
    validate(s);
    return s;
  }
  if (given.find('/') != std::string::npos || given.ends_with(".toml"))
    return scheme_from_toml(read_text_file(given, "scheme file"), given);
  std::string names;
  for (auto& p : scheme_presets()) names += (names.empty() ? "" : ", ") + p;
  throw InputError(fmt::format("unknown scheme '{}' (known: {}; or a path to a .toml file)", given, names));
}

namespace {

// ⌊log2 |a|⌋ of a finite nonzero binary64, exactly (subnormals included).
int floor_log2(double a) { return std::ilogb(a); }

// Power-of-two scale exponent k (S = 2^k) of a block with amax > 0, or nullopt for a NaN block.
std::optional<int> pow2_scale(const Scheme& s, double amax, double M) {
  int k;
  if (amax == 0) return -127;
  if (s.rule == ScaleRule::floor) {
    k = floor_log2(amax) - s.element.emax;
  } else if (s.rule == ScaleRule::ceil) {
    k = floor_log2(amax) - floor_log2(M);
    while (std::ldexp(M, k) < amax) ++k;          // exact comparisons (M has few bits)
    while (std::ldexp(M, k - 1) >= amax) --k;
  } else {  // nearest: E8M0's rounding of the exact quotient
    const double q = round_scalar(div_round_odd(amax, M), s.scale, RoundOptions{.mode = Rounding::rne});
    if (!std::isfinite(q)) return std::nullopt;
    return floor_log2(q);
  }
  if (k > 127) return std::nullopt;
  return std::max(k, -127);
}

// The binary32 operations of the reciprocal order, each rounded once to nearest from its exact
// value (through round-to-odd in binary64, so that a binary64 operand loses nothing).
float mul32(double a, double b) { return float(mul_round_odd(a, b)); }
float div32(double a, double b) { return float(div_round_odd(a, b)); }

}  // namespace

template <class T>
SchemeStats quantize_scheme(const Scheme& s, const T* x, T* y, int64_t rows, int64_t cols, Rounding mode, int sr_bits,
                            uint64_t seed, uint64_t stream, uint64_t index0, std::vector<double>* scales,
                            std::vector<double>* zero_points) {
  SchemeStats st;
  st.elements = uint64_t(rows * cols);
  if (rows == 0 || cols == 0) return st;
  const int64_t br = s.block_rows ? std::min(s.block_rows, rows) : rows;
  const int64_t bc = s.block_cols ? std::min(s.block_cols, cols) : cols;
  const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
  const double M = max_finite(s.element), Ms = max_finite(s.scale);
  const RoundPlan elem = plan_round(s.element, mode, sr_bits, seed);
  const double nan = std::numeric_limits<double>::quiet_NaN();

  // two-level: the per-tensor scale first
  double G = 1, g_enc = 0, g_dec = 0;
  bool tensor_nan = false;
  if (s.two_level) {
    double amax = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double v = std::fabs(double(x[i]));
      if (!std::isfinite(v)) tensor_nan = true;
      amax = std::max(amax, v);
    }
    if (s.division == Division::exact) {
      G = amax == 0 ? 0.0 : double(div32(amax, M * Ms));
    } else {
      g_enc = amax == 0 ? 0.0 : double(div32(M * Ms, amax));
      g_dec = g_enc == 0 ? 0.0 : double(div32(1.0, g_enc));
      G = g_dec;
    }
    st.global_scale = G;
  }
  if (scales) scales->assign(size_t(nbr * nbc), 0.0);
  if (zero_points) zero_points->assign(size_t(nbr * nbc), 0.0);

  // One block: its scale, its elements, its counts into bs (q: scratch for the quotients).
  auto block = [&](int64_t bi, int64_t bj, SchemeStats& bs, std::vector<double>& q) {
    const int64_t r0 = bi * br, c0 = bj * bc, nr = std::min(br, rows - r0), nc = std::min(bc, cols - c0);
    ++bs.blocks;
    double amax = 0, lo = 0, hi = 0;
    bool bad = tensor_nan;
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t j = 0; j < nc; ++j) {
        const double v = double(x[(r0 + i) * cols + c0 + j]);
        if (!std::isfinite(v)) bad = true;
        amax = std::max(amax, std::fabs(v));
        lo = std::min(lo, v), hi = std::max(hi, v);
      }
    // the block's scale S (effective, exact in binary64; NaN: a NaN block) and the one reported
    // (two-level: S_b)
    double S = nan, reported = nan, r = 0, z = 0;  // r: the reciprocal order's multiplier; z: minmax's zero point
    if (!bad) {
      if (s.rule == ScaleRule::minmax) {
        S = reported = round_scalar(div_round_odd(hi - lo, M), s.scale, RoundOptions{.mode = Rounding::rne});
        if (S != 0 && std::isfinite(S)) z = std::min(M, std::max(0.0, std::nearbyint(div_round_odd(-lo, S))));
        if (zero_points) (*zero_points)[size_t(bi * nbc + bj)] = z;
      } else if (s.rule != ScaleRule::absmax) {
        if (const auto k = pow2_scale(s, amax, M)) S = std::ldexp(1.0, *k);
        reported = S;
      } else if (!s.two_level) {
        S = reported = round_scalar(div_round_odd(amax, M), s.scale, RoundOptions{.mode = Rounding::rne});
      } else if (s.division == Division::exact) {
        reported = G == 0 ? 0.0 : round_scalar(div_round_odd(amax, M * G), s.scale, RoundOptions{.mode = Rounding::rne});
        S = reported * G;  // exact: ≤ 4 + 24 significant bits
      } else {
        const double inv_m = div32(1.0, M);
        reported = g_enc == 0 ? 0.0
                              : round_scalar(double(mul32(g_enc, double(mul32(amax, inv_m)))), s.scale,
                                             RoundOptions{.mode = Rounding::rne});
        r = reported == 0 ? 0.0 : double(div32(1.0, double(mul32(reported, g_dec))));
        S = reported * g_dec;  // exact
      }
    }
    if (scales) (*scales)[size_t(bi * nbc + bj)] = reported;
    if (!std::isfinite(S)) {
      ++bs.nan_blocks;
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) y[(r0 + i) * cols + c0 + j] = T(nan);
      return;
    }
    if (amax == 0 || S == 0) {
      ++bs.zero_blocks;
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) {
          const int64_t at = (r0 + i) * cols + c0 + j;
          const double z = std::signbit(double(x[at])) && s.element.negative_zero ? -0.0 : 0.0;
          y[at] = T(z);
        }
      return;
    }
    // quotients, then the element rounding row by row (random words by global index)
    // past the midpoint between the largest value and the next grid step: where saturation, not
    // rounding, decides the element (exact: ≤ p + 1 bits times ≤ 28 bits); minmax: outside
    // [−1/2, Q + 1/2] after the shift by z
    const double half = std::ldexp(1.0, s.element.emax - s.element.mu - 1);
    const double lim = (M + half) * S, lim_hi = (M + half - z) * S, lim_lo = (-half - z) * S;
    const bool asym = s.rule == ScaleRule::minmax;
    // Binary32 data, a scale of ≤ 24 significant bits, a grid of ≤ 24 and a deterministic mode:
    // the correctly rounded binary64 quotient rounds to the element grid as the exact one does,
    // so the round-to-odd step is skipped (the proof is at the top of this file; tested bit for bit).
    const bool plain = std::is_same_v<T, float> && !asym && s.division == Division::exact && !is_stochastic(mode) &&
                       s.element.mu <= 23 && double(float(S)) == S;
    for (int64_t i = 0; i < nr; ++i) {
      double* qi = q.data() + i * nc;
      const T* xi = x + (r0 + i) * cols + c0;
      if (plain) {
        uint64_t clipped = 0;
        for (int64_t j = 0; j < nc; ++j) {
          const double v = double(xi[j]);
          clipped += std::fabs(v) > lim;
          qi[j] = v / S;
        }
        bs.clipped += clipped;
      } else {
        for (int64_t j = 0; j < nc; ++j) {
          const double v = double(xi[j]);
          bs.clipped += asym ? (v > lim_hi || v < lim_lo) : std::fabs(v) > lim;
          // minmax: x/S + z rounded once (round-to-odd twice, then the integer rounding: exact for
          // |x/S + z| < 2^18; beyond, both saturate)
          qi[j] = asym ? add_round_odd(div_round_odd(v, S), z)
                : s.division == Division::reciprocal ? double(mul32(v, r)) : div_round_odd(v, S);
        }
      }
      const uint64_t at0 = uint64_t((r0 + i) * cols + c0);
      round_array(elem, qi, qi, size_t(nc), stream, index0 + at0);
      for (int64_t j = 0; j < nc; ++j) y[at0 + uint64_t(j)] = T((qi[j] - z) * S);  // exact, one rounding to T
    }
  };
  // Blocks are independent (random words by element index): rows of blocks over threads give
  // the same bits for any thread count.
  const bool parallel = nbr > 1 && rows * cols >= (int64_t(1) << 16);
  std::vector<SchemeStats> parts;
#pragma omp parallel if (parallel)
  {
    SchemeStats local;
    std::vector<double> q(size_t(br * bc));  // the block's quotients (round-to-odd), then elements
#pragma omp for schedule(static)
    for (int64_t bi = 0; bi < nbr; ++bi)
      for (int64_t bj = 0; bj < nbc; ++bj) block(bi, bj, local, q);
#pragma omp critical
    parts.push_back(local);
  }
  for (const SchemeStats& p : parts)
    st.blocks += p.blocks, st.nan_blocks += p.nan_blocks, st.zero_blocks += p.zero_blocks, st.clipped += p.clipped;
  return st;
}

template SchemeStats quantize_scheme<float>(const Scheme&, const float*, float*, int64_t, int64_t, Rounding, int,
                                            uint64_t, uint64_t, uint64_t, std::vector<double>*, std::vector<double>*);
template SchemeStats quantize_scheme<double>(const Scheme&, const double*, double*, int64_t, int64_t, Rounding, int,
                                             uint64_t, uint64_t, uint64_t, std::vector<double>*, std::vector<double>*);

}  // namespace mantis
