// scheme — see scheme.h.
#include "core/scheme.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/file.h"
#include "core/round.h"
#include "core/round_array.h"
#include "core/scheme_block.h"
#include "core/toml.h"

namespace mantis {

double div_round_odd(double a, double b) { return div_odd(a, b); }

namespace {

// Why plain_quotient (scheme_block.h) may divide plainly. Write a binary32 value a = A·2^α and
// a scale S = B·2^β with integers 2^23 ≤ A, B < 2^24 (subnormals shifted up), so q = a/S lies in
// (2^(α−β−1), 2^(α−β+1)). Every point g where a deterministic rounding to a grid of ≤ 24
// significant bits changes its result (a grid value or a midpoint: ≤ 25 bits; subnormal grids are
// coarser) is near q a multiple of 2^(α−β−25): g = G·2^(α−β−26), G an integer. If q ≠ g,
// |q − g| = 2^(α−26)·|2^26·A − G·B| / (B·2^β) > 2^(α−β−50), while |RN64(q) − q| ≤ 2^(α−β−53).
// So RN64(q) equals such a g exactly when q does and otherwise lies on q's side of it: every
// deterministic mode rounds both alike. (Stochastic modes read bits past the 25th: round-to-odd.)

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

void validate_quantize(const Scheme& s, Rounding mode, int sr_bits) {
  validate_sr_bits(sr_bits);
  if (mode == Rounding::sr && sr_bits > 52 - s.element.precision())
    throw InputError(fmt::format("sr_bits {} > 52 − p = {} for the element format {}", sr_bits,
                                 52 - s.element.precision(), s.element.name));
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

SchemeBlockPlan plan_scheme_blocks(const Scheme& s, int64_t rows, int64_t cols, Rounding mode, int sr_bits,
                                   uint64_t seed) {
  SchemeBlockPlan p;
  p.rule = s.rule;
  p.two_level = s.two_level;
  p.reciprocal = s.division == Division::reciprocal;
  p.elem_emax = s.element.emax, p.elem_mu = s.element.mu;
  p.negative_zero = s.element.negative_zero;
  p.rows = rows, p.cols = cols;
  p.br = s.block_rows ? std::min(s.block_rows, rows) : rows;
  p.bc = s.block_cols ? std::min(s.block_cols, cols) : cols;
  p.nbr = (rows + p.br - 1) / p.br, p.nbc = (cols + p.bc - 1) / p.bc;
  p.M = max_finite(s.element), p.Ms = max_finite(s.scale);
  p.half = std::ldexp(1.0, s.element.emax - s.element.mu - 1);
  p.elem = plan_round(s.element, mode, sr_bits, seed);
  // e8m0 of the floor and ceil rules is never rounded to
  if (s.rule != ScaleRule::floor && s.rule != ScaleRule::ceil) p.scale = plan_round(s.scale, Rounding::rne).td;
  return p;
}

template <class T>
SchemeStats quantize_scheme(const Scheme& s, const T* x, T* y, int64_t rows, int64_t cols, Rounding mode, int sr_bits,
                            uint64_t seed, uint64_t stream, uint64_t index0, std::vector<double>* scales,
                            std::vector<double>* zero_points) {
  SchemeStats st;
  st.elements = uint64_t(rows * cols);
  if (rows == 0 || cols == 0) return st;
  const SchemeBlockPlan p = plan_scheme_blocks(s, rows, cols, mode, sr_bits, seed);
  const int64_t br = p.br, bc = p.bc, nbr = p.nbr, nbc = p.nbc;

  // two-level: the per-tensor scale first
  TensorScale ts;
  if (s.two_level) {
    BlockAmax t;
    for (int64_t i = 0; i < rows * cols; ++i) amax_add(t, double(x[i]));
    ts = tensor_scale(p, t.amax, t.bad);
    st.global_scale = ts.G;
  }
  if (scales) scales->assign(size_t(nbr * nbc), 0.0);
  if (zero_points) zero_points->assign(size_t(nbr * nbc), 0.0);

  // One block: its scale, its elements, its counts into bs (q: scratch for the quotients).
  auto block = [&](int64_t bi, int64_t bj, SchemeStats& bs, std::vector<double>& q) {
    const int64_t r0 = bi * br, c0 = bj * bc, nr = std::min(br, rows - r0), nc = std::min(bc, cols - c0);
    ++bs.blocks;
    BlockAmax a;
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t j = 0; j < nc; ++j) amax_add(a, double(x[(r0 + i) * cols + c0 + j]));
    const BlockScale b = block_scale(p, ts, a);
    if (scales) (*scales)[size_t(bi * nbc + bj)] = b.reported;
    if (zero_points) (*zero_points)[size_t(bi * nbc + bj)] = b.z;
    const BlockKind kind = block_kind(a, b);
    if (kind != BlockKind::values) {
      ++(kind == BlockKind::nan ? bs.nan_blocks : bs.zero_blocks);
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) {
          const int64_t at = (r0 + i) * cols + c0 + j;
          y[at] = kind == BlockKind::nan ? nan_output<T>() : zero_output(p, x[at]);
        }
      return;
    }
    // quotients, then the element rounding row by row (random words by global index): the
    // vectorised round_array, which rounds as round_value (scheme_element's rounding) does
    const bool plain = plain_quotient<T>(p, b);
    for (int64_t i = 0; i < nr; ++i) {
      double* qi = q.data() + i * nc;
      const T* xi = x + (r0 + i) * cols + c0;
      uint64_t clipped = 0;
      if (plain) {
        for (int64_t j = 0; j < nc; ++j) {
          const double v = double(xi[j]);
          clipped += element_clipped(p, b, v);
          qi[j] = element_quotient<true>(p, b, v);
        }
      } else {
        for (int64_t j = 0; j < nc; ++j) {
          const double v = double(xi[j]);
          clipped += element_clipped(p, b, v);
          qi[j] = element_quotient<false>(p, b, v);
        }
      }
      bs.clipped += clipped;
      const uint64_t at0 = uint64_t((r0 + i) * cols + c0);
      round_array(p.elem, qi, qi, size_t(nc), stream, index0 + at0);
      for (int64_t j = 0; j < nc; ++j) y[at0 + uint64_t(j)] = element_output<T>(b, qi[j]);
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
  for (const SchemeStats& part : parts)
    st.blocks += part.blocks, st.nan_blocks += part.nan_blocks, st.zero_blocks += part.zero_blocks,
        st.clipped += part.clipped;
  return st;
}

template SchemeStats quantize_scheme<float>(const Scheme&, const float*, float*, int64_t, int64_t, Rounding, int,
                                            uint64_t, uint64_t, uint64_t, std::vector<double>*, std::vector<double>*);
template SchemeStats quantize_scheme<double>(const Scheme&, const double*, double*, int64_t, int64_t, Rounding, int,
                                             uint64_t, uint64_t, uint64_t, std::vector<double>*, std::vector<double>*);

}  // namespace mantis
