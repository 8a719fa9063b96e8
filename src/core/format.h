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
//     specials = none : no infinities and no NaN among the finite codes: the whole top binade is
//                       finite (OCP FP6 / FP4: largest 28, 7.5, 6; E8M0; integer grids). A NaN
//                       input still gives NaN in the container (it is not a value of the format).
//     specials = p3109: IEEE P3109 binary8 (interim report): the top binade is finite except its
//                       all-ones code, which is ±inf; no negative zero (its code is the one NaN).
//   * Sign and zero (defaults: signed, with ±0):
//     is_signed = false     no negative values (E8M0, unsigned integers): a negative input is below
//                           the range, so it becomes the smallest value under overflow = saturate and
//                           NaN under nan (−0 counts as zero).
//     has_zero = false      no zero (E8M0; needs subnormals = false): every result below the
//                           smallest value, zero included, is that value, 2^emin.
//     negative_zero = false −0 becomes +0 (implied by fnuz and p3109; integer grids).
//     twos_complement       a grid with emin = emax (integers) whose negative side reaches
//                           −2^(emax+1), one quantum past −max: INT8's −128, MXINT8's −2. Needs
//                           specials = none and overflow = saturate.
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
#include <utility>
#include <vector>

#include "core/error.h"

namespace mantis {

enum class Overflow : uint8_t { inf, saturate, nan };
enum class Specials : uint8_t { ieee, fn, fnuz, none, p3109 };

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
  bool is_signed = true;
  bool has_zero = true;
  bool negative_zero = true;
  bool twos_complement = false;

  int precision() const { return mu + 1; }
  bool has_inf() const { return specials == Specials::ieee || specials == Specials::p3109; }
  // Every feature beyond (μ, exponent range, subnormals, overflow, ieee/fn specials): kernels that
  // know only those (the AVX-512 GEMM) leave such formats to the general code.
  bool plain() const {
    return (specials == Specials::ieee || specials == Specials::fn) && is_signed && has_zero && negative_zero &&
           !twos_complement;
  }
};

// Throws InputError naming the problem unless the format is well formed.
void validate(const Format& f);

// Whether every value of `f` is representable in a float (double) container, so arrays of
// that container can be rounded to it in place.
bool fits_float(const Format& f);
bool fits_double(const Format& f);

// Derived values, as doubles (exact: every validated format fits in binary64).
double max_finite(const Format& f);
double min_finite(const Format& f);      // the most negative value: −max_finite, −2^(emax+1) with
                                         // twos_complement, the smallest value (0 or 2^emin) unsigned
double min_normal(const Format& f);
double min_subnormal(const Format& f);   // = min_normal when subnormals are off
double unit_roundoff(const Format& f);   // 2^-p, the rne relative error bound

// Lookup: a named format (formats/*.toml, built in), an alias (ml_dtypes' names and a few others,
// format_aliases()), a generated family name (ps<μ>: μ = 1..23 in the binary32 exponent range;
// e<E>m<M>: IEEE-style, E = 2..11, M = 0..52; p3109_p<P>: P3109 binary8, P = 1..7; int<B> /
// int<B>tc / uint<B>: B-bit integers, symmetric, two's complement, unsigned), or a path to a TOML
// file. Names and aliases are matched without regard to case. Throws InputError listing the
// known names.
Format format_lookup(const std::string& name_or_path);
Format format_from_toml(const std::string& text, const std::string& source);
std::vector<std::string> named_formats();   // the TOML-defined names, in order
// (alias, what it names), in listing order.
const std::vector<std::pair<std::string, std::string>>& format_aliases();
std::string family_help();                   // "ps<μ> (μ = 1..23), e<E>m<M> (...)"

Rounding rounding_from_string(const std::string& s);  // case-insensitive
const char* to_string(Rounding r);
const char* to_string(Overflow o);
const char* to_string(Specials s);
std::vector<std::string> rounding_names();

}  // namespace mantis
