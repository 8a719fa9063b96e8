#include "core/format.h"

#include <fmt/format.h>

#include <cctype>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <toml++/toml.h>

#include "core/file.h"
#include "core/toml.h"

namespace mantis {

const std::vector<std::pair<std::string_view, std::string_view>>& embedded_formats();

namespace {

// Exponent range of an E-bit exponent field under each special-encoding policy.
void set_exponent_bits(Format& f, int E, const std::string& where) {
  if (E < 2 || E > 11) throw InputError(fmt::format("{}: exponent_bits {} out of range 2..11", where, E));
  const int bias = (1 << (E - 1)) - 1;
  switch (f.specials) {
    case Specials::ieee: f.emax = bias; f.emin = 1 - bias; break;
    case Specials::fn:
    case Specials::none: f.emax = bias + 1; f.emin = 1 - bias; break;   // top binade finite
    case Specials::fnuz:
    case Specials::p3109: f.emax = bias; f.emin = -bias; break;         // bias 2^(E−1)
  }
}

// B-bit integers: the grid of quantum 1 below 2^(B−1) (symmetric, or two's complement), or below
// 2^B (unsigned), as the fixed-point format μ = emin = emax, subnormals on. +0 only; saturating.
Format integer_format(const std::string& name, int B, bool tc, bool is_unsigned) {
  Format f;
  f.name = name;
  f.mu = is_unsigned ? B - 1 : B - 2;
  f.emin = f.emax = f.mu;
  f.specials = Specials::none;
  f.overflow = Overflow::saturate;
  f.negative_zero = false;
  f.twos_complement = tc;
  f.is_signed = !is_unsigned;
  return f;
}

Format family(const std::string& name) {
  std::smatch m;
  static const std::regex ps(R"(ps(\d+))"), em(R"(e(\d+)m(\d+))"), p3109(R"(p3109_p(\d+))"),
      integer(R"((u?)int(\d+)(tc)?)");
  Format f;
  f.name = name;
  // Valid parameters are below 100: more than 4 digits (leading zeros allowed) is out of range, and could overflow int.
  auto number = [&](const std::ssub_match& digits, const char* what, const char* range) {
    if (digits.length() > 4)
      throw InputError(fmt::format("format {}: {} = {} out of range {}", name, what, digits.str(), range));
    return std::stoi(digits.str());
  };
  if (std::regex_match(name, m, ps)) {
    const int mu = number(m[1], "μ", "1..23 for ps<μ>");
    if (mu < 1 || mu > 23) throw InputError(fmt::format("format {}: μ = {} out of range 1..23 for ps<μ>", name, mu));
    f.mu = mu;  // binary32 exponent range, subnormals, IEEE specials
    return f;
  }
  if (std::regex_match(name, m, em)) {
    const int E = number(m[1], "exponent_bits", "2..11"), M = number(m[2], "μ", "0..52 for e<E>m<M>");
    if (M > 52) throw InputError(fmt::format("format {}: μ = {} out of range 0..52 for e<E>m<M>", name, M));
    f.mu = M;
    set_exponent_bits(f, E, "format " + name);
    return f;
  }
  if (std::regex_match(name, m, p3109)) {  // binary8pP: P − 1 stored bits, 8 − P exponent bits
    const int P = number(m[1], "P", "1..7 for p3109_p<P>");
    if (P < 1 || P > 7) throw InputError(fmt::format("format {}: P = {} out of range 1..7 for p3109_p<P>", name, P));
    f.mu = P - 1;
    f.specials = Specials::p3109;
    f.negative_zero = false;
    if (P == 7) f.emin = 0, f.emax = 0;  // one exponent bit: bias 1
    else set_exponent_bits(f, 8 - P, "format " + name);
    return f;
  }
  if (std::regex_match(name, m, integer)) {
    const bool is_unsigned = m[1].length() > 0, tc = m[3].length() > 0;
    const int B = number(m[2], "bits", "2..32 for int<B>, int<B>tc, uint<B>");
    if (B < 2 || B > 32 || (is_unsigned && tc))
      throw InputError(fmt::format("format {}: B = {} out of range 2..32 for int<B>, int<B>tc, uint<B>", name, B));
    return integer_format(name, B, tc, is_unsigned);
  }
  return Format{.name = ""};
}

}  // namespace

void validate(const Format& f) {
  const std::string n = f.name.empty() ? "format" : "format " + f.name;
  // A name is printed in tables, reprs and file names: no control bytes (a line break split them).
  if (std::any_of(f.name.begin(), f.name.end(), [](char c) { return (unsigned char)c < 0x20 || c == 0x7f; }))
    throw InputError(fmt::format("format name '{}' holds control characters", f.name));
  if (f.mu < 0 || f.mu > 52) throw InputError(fmt::format("{}: μ = {} out of range 0..52", n, f.mu));
  if (f.emin > f.emax) throw InputError(fmt::format("{}: emin {} > emax {}", n, f.emin, f.emax));
  if (f.emin < -1022 || f.emax > 1023)
    throw InputError(fmt::format("{}: exponent range [{}, {}] exceeds binary64's [-1022, 1023]", n, f.emin, f.emax));
  if (f.subnormals && f.emin - f.mu < -1074)
    throw InputError(fmt::format("{}: smallest subnormal 2^{} is below binary64's 2^-1074", n, f.emin - f.mu));
  if (!f.has_inf() && f.overflow == Overflow::inf)
    throw InputError(fmt::format("{}: specials = \"{}\" has no infinities; overflow must be \"saturate\" or \"nan\"",
                                 n, to_string(f.specials)));
  if ((f.specials == Specials::fn || f.specials == Specials::p3109) && f.mu == 0 && f.emin == f.emax)
    throw InputError(fmt::format("{}: {} with μ = 0 and a single binade has no finite values", n, to_string(f.specials)));
  if ((f.specials == Specials::fnuz || f.specials == Specials::p3109) && f.negative_zero)
    throw InputError(fmt::format("{}: specials = \"{}\" has no negative zero (negative_zero = false)", n,
                                 to_string(f.specials)));
  if (!f.has_zero && f.subnormals)
    throw InputError(fmt::format("{}: has_zero = false needs subnormals = false (subnormals end at zero)", n));
  if (!f.has_zero && f.is_signed)
    throw InputError(fmt::format("{}: has_zero = false is for unsigned formats (signed = false)", n));
  if (!f.is_signed && f.specials != Specials::none)
    throw InputError(fmt::format("{}: signed = false needs specials = \"none\"", n));
  if (f.twos_complement &&
      (f.specials != Specials::none || f.emin != f.emax || !f.subnormals || !f.is_signed || f.overflow != Overflow::saturate))
    throw InputError(fmt::format("{}: twos_complement is for signed integer grids: specials = \"none\", emin = emax, "
                                 "subnormals, overflow = \"saturate\"", n));
}

bool fits_double(const Format& f) {
  return f.mu <= 52 && f.emin >= -1022 && f.emax <= 1023 && (f.subnormals ? f.emin - f.mu : f.emin) >= -1074;
}
bool fits_float(const Format& f) {
  return f.mu <= 23 && f.emin >= -126 && f.emax <= 127 && (f.subnormals ? f.emin - f.mu : f.emin) >= -149;
}

double max_finite(const Format& f) {
  if (f.specials != Specials::fn && f.specials != Specials::p3109) return std::ldexp(2.0 - std::ldexp(1.0, -f.mu), f.emax);
  // fn / p3109: the all-ones code of the top binade is NaN / inf; with μ = 0 that is the whole binade.
  return f.mu == 0 ? std::ldexp(1.0, f.emax - 1) : std::ldexp(2.0 - std::ldexp(1.0, 1 - f.mu), f.emax);
}
double min_finite(const Format& f) {
  if (!f.is_signed) return f.has_zero ? 0.0 : min_normal(f);
  return f.twos_complement ? -std::ldexp(1.0, f.emax + 1) : -max_finite(f);
}
double min_normal(const Format& f) { return std::ldexp(1.0, f.emin); }
double min_subnormal(const Format& f) { return f.subnormals ? std::ldexp(1.0, f.emin - f.mu) : min_normal(f); }
double unit_roundoff(const Format& f) { return std::ldexp(1.0, -(f.mu + 1)); }

Format format_from_toml(const std::string& text, const std::string& source) {
  const toml::table t = parse_toml(text, source);
  Format f;
  auto line = [&](const toml::node& n) { return toml_where(source, n); };
  check_known_keys(t, source, {"name", "mantissa_bits", "exponent_bits", "emin", "emax", "subnormals", "overflow",
                               "specials", "signed", "zero", "negative_zero", "twos_complement"});
  auto get_int = [&](const char* key) -> std::optional<int> {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_integer()) throw InputError(fmt::format("{}: '{}' must be an integer", line(*n), key));
    const int64_t v = n->as_integer()->get();
    if (v < -100000 || v > 100000) throw InputError(fmt::format("{}: '{}' = {} out of range", line(*n), key, v));
    return int(v);
  };
  auto get_str = [&](const char* key) -> std::optional<std::string> {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_string()) throw InputError(fmt::format("{}: '{}' must be a string", line(*n), key));
    return n->as_string()->get();
  };
  f.name = get_str("name").value_or(std::filesystem::path(source).stem().string());
  const auto mu = get_int("mantissa_bits");
  if (!mu) throw InputError(fmt::format("{}: missing 'mantissa_bits' (μ, stored fraction bits)", source));
  f.mu = *mu;
  if (f.mu < 0 || f.mu > 52) throw InputError(fmt::format("{}: mantissa_bits (μ) = {} out of range 0..52", source, f.mu));
  auto get_bool = [&](const char* key, bool& out) {
    if (const toml::node* n = t.get(key)) {
      if (!n->is_boolean()) throw InputError(fmt::format("{}: '{}' must be true or false", line(*n), key));
      out = n->as_boolean()->get();
    }
  };
  get_bool("subnormals", f.subnormals);
  if (auto s = get_str("specials")) {
    bool found = false;
    for (Specials sp : {Specials::ieee, Specials::fn, Specials::fnuz, Specials::none, Specials::p3109})
      if (*s == to_string(sp)) f.specials = sp, found = true;
    if (!found)
      throw InputError(fmt::format("{}: specials = '{}' (expected ieee, fn, fnuz, none or p3109)",
                                   line(*t.get("specials")), *s));
  }
  f.negative_zero = f.specials != Specials::fnuz && f.specials != Specials::p3109;
  get_bool("signed", f.is_signed);
  get_bool("zero", f.has_zero);
  get_bool("negative_zero", f.negative_zero);
  get_bool("twos_complement", f.twos_complement);
  f.overflow = f.has_inf() ? Overflow::inf : f.specials == Specials::none ? Overflow::saturate : Overflow::nan;
  if (auto s = get_str("overflow")) {
    if (*s == "inf") f.overflow = Overflow::inf;
    else if (*s == "saturate") f.overflow = Overflow::saturate;
    else if (*s == "nan") f.overflow = Overflow::nan;
    else throw InputError(fmt::format("{}: overflow = '{}' (expected inf, saturate or nan)", line(*t.get("overflow")), *s));
  }
  const auto E = get_int("exponent_bits");
  const auto emin = get_int("emin"), emax = get_int("emax");
  if (E && (emin || emax)) throw InputError(fmt::format("{}: give either exponent_bits or emin/emax, not both", source));
  if (E) set_exponent_bits(f, *E, source);
  else if (emin && emax) { f.emin = *emin; f.emax = *emax; }
  else throw InputError(fmt::format("{}: missing 'exponent_bits' (or both 'emin' and 'emax')", source));
  validate(f);
  return f;
}

std::vector<std::string> named_formats() {
  std::vector<std::string> v;
  for (auto& [name, text] : embedded_formats()) v.emplace_back(name);
  return v;
}

std::string family_help() {
  return "ps<μ> (μ = 1..23, binary32 exponent range), e<E>m<M> (IEEE-style, E = 2..11, M = 0..52), p3109_p<P> "
         "(IEEE P3109 binary8, P = 1..7), int<B> / int<B>tc / uint<B> (B-bit integers: symmetric, two's complement, "
         "unsigned; B = 2..32)";
}

const std::vector<std::pair<std::string, std::string>>& format_aliases() {
  static const std::vector<std::pair<std::string, std::string>> a = {
      // ml_dtypes' (and PyTorch's) names
      {"float8_e4m3fn", "e4m3"}, {"float8_e5m2", "e5m2"}, {"float8_e4m3fnuz", "e4m3fnuz"},
      {"float8_e5m2fnuz", "e5m2fnuz"}, {"float8_e4m3b11fnuz", "e4m3b11fnuz"}, {"float6_e2m3fn", "fp6_e2m3"},
      {"float6_e3m2fn", "fp6_e3m2"}, {"float4_e2m1fn", "fp4_e2m1"}, {"float8_e8m0fnu", "e8m0"},
      {"bfloat16", "bf16"}, {"float16", "fp16"}, {"float32", "fp32"}, {"float64", "fp64"},
      // IEEE 754's and C's
      {"half", "fp16"}, {"binary16", "fp16"}, {"binary32", "fp32"}, {"single", "fp32"}, {"binary64", "fp64"},
      {"double", "fp64"}};
  return a;
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Format format_lookup(const std::string& given) {
  std::string s = lower(given);
  for (auto& [alias, target] : format_aliases())
    if (alias == s) {
      s = target;
      break;
    }
  for (auto& [name, text] : embedded_formats())
    if (name == s) return format_from_toml(std::string(text), "formats/" + std::string(name) + ".toml");
  if (given.find('/') != std::string::npos || given.ends_with(".toml")) s = given;  // a path keeps its case
  Format f = family(s);
  if (!f.name.empty()) { validate(f); return f; }
  if (s.find('/') != std::string::npos || s.ends_with(".toml")) {
    return format_from_toml(read_text_file(s, "format file"), s);
  }
  std::string names;
  for (auto& n : named_formats()) names += (names.empty() ? "" : ", ") + n;
  throw InputError(fmt::format("unknown format '{}' (known: {}; aliases such as float8_e4m3fn, bfloat16, half; "
                               "families {}; or a path to a .toml file)", given, names, family_help()));
}

Rounding rounding_from_string(const std::string& given) {
  const std::string s = lower(given);
  for (int i = 0; i < kRoundingCount; ++i)
    if (s == to_string(Rounding(i))) return Rounding(i);
  std::string names;
  for (auto& n : rounding_names()) names += (names.empty() ? "" : ", ") + n;
  throw InputError(fmt::format("unknown rounding mode '{}' (known: {})", given, names));
}

const char* to_string(Rounding r) {
  static const char* n[] = {"rne", "rna", "rz", "ru", "rd", "ro", "sr", "sre"};
  return n[int(r)];
}
const char* to_string(Overflow o) {
  static const char* n[] = {"inf", "saturate", "nan"};
  return n[int(o)];
}
const char* to_string(Specials s) {
  static const char* n[] = {"ieee", "fn", "fnuz", "none", "p3109"};
  return n[int(s)];
}
std::vector<std::string> rounding_names() {
  std::vector<std::string> v;
  for (int i = 0; i < kRoundingCount; ++i) v.emplace_back(to_string(Rounding(i)));
  return v;
}

}  // namespace mantis
