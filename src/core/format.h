// format — a floating-point format is data: PS(μ) and friends, validated once.
//
// Conventions (the one place they are written down):
//   * μ (`mu`) counts the STORED fraction bits. Precision p = μ + 1 (the hidden bit).
//     CPFloat's / chop's / gfloat's `precision` (`t`) is μ + 1: bf16 is μ = 7, t = 8.
//   * A normal number is ±1.f × 2^e with e ∈ [emin, emax] and f of μ bits.
//     Subnormals (if enabled) are ±0.f × 2^emin; the smallest is 2^(emin − μ).
//   * specials = ieee : ±inf, NaN, ±0 (exponent field all-ones reserved; emax = bias).
//     specials = fn   : no infinities; the top binade holds finite numbers except its all-ones
//                       fraction code, which is NaN (OCP E4M3: emax = 8, largest finite 448).
//     specials = fnuz : no infinities, no negative zero (−0 becomes +0), the top binade is finite.
//   * overflow = what a finite value that rounds past the largest finite number becomes:
//     inf (IEEE; needs specials = ieee), saturate (± largest finite), nan.
//     Directed modes that round toward zero for that sign (rz, ro, rd on +, ru on −) always give
//     ± largest finite, as IEEE 754 says. Infinite inputs stay infinite where the format has
//     infinities; elsewhere they become ± largest finite under `saturate` and NaN under `nan`.
//   * Without subnormals, values below 2^emin round onto {0, 2^emin} with the same mode rules
//     (a tie at 2^(emin−1) goes to 0 under rne, to 2^emin under rna).
//   * NaN inputs give the canonical quiet NaN (positive sign).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace mantis {

enum class Overflow : uint8_t { inf, saturate, nan };
enum class Specials : uint8_t { ieee, fn, fnuz };

// Rounding modes. sr: up with probability proportional to the distance (quantised to
// `sr_bits` random bits); sre: up or down with probability 1/2 whenever inexact.
enum class Rounding : uint8_t { rne, rna, rz, ru, rd, ro, sr, sre };
constexpr int kRoundingCount = 8;

struct Format {
  std::string name;
  int mu = 23;          // stored fraction bits, 0..52
  int emin = -126;      // smallest normal exponent
  int emax = 127;       // largest normal exponent
  bool subnormals = true;
  Overflow overflow = Overflow::inf;
  Specials specials = Specials::ieee;

  int precision() const { return mu + 1; }
};

// Throws InputError naming the problem unless the format is well formed.
void validate(const Format& f);

// Whether every value of `f` is representable in a float (double) container, so arrays of
// that container can be rounded to it in place.
bool fits_float(const Format& f);
bool fits_double(const Format& f);

// Derived values, as doubles (exact: every validated format fits in binary64).
double max_finite(const Format& f);
double min_normal(const Format& f);
double min_subnormal(const Format& f);   // = min_normal when subnormals are off
double unit_roundoff(const Format& f);   // 2^-p, the rne relative error bound

// Lookup: a named format (formats/*.toml, built in), a generated family name
// (ps<μ>: μ = 1..23 in the binary32 exponent range; e<E>m<M>: IEEE-style, E = 2..11,
// M = 0..52), or a path to a TOML file. Throws InputError listing the known names.
Format format_lookup(const std::string& name_or_path);
Format format_from_toml(const std::string& text, const std::string& source);
std::vector<std::string> named_formats();   // the TOML-defined names, in order
std::string family_help();                   // "ps<μ> (μ = 1..23), e<E>m<M> (...)"

Rounding rounding_from_string(const std::string& s);
const char* to_string(Rounding r);
const char* to_string(Overflow o);
const char* to_string(Specials s);
std::vector<std::string> rounding_names();

}  // namespace mantis
