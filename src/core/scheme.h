// scheme — scaled (block) formats: the blocks of a matrix share a scale; each element is divided
// by its block's scale and rounded to an element format (format.h). A scheme is data: element
// format, block shape, scale format and scale rule, validated once.
//
// The arithmetic, for one block B of x (rows × cols, row-major; a trailing partial block behaves
// as if padded with zeros):
//   amax = max |x_i| over B, exactly. A NaN or ±inf anywhere in B makes every element of B NaN.
//   The scale S of B, by `rule` (M = the element format's largest finite value):
//     floor    OCP MX v1.0 (Rouhani et al. 2023, Algorithm 1): S = 2^(⌊log2 amax⌋ − emax_elem),
//              ⌊log2 amax⌋ read exactly from the exponent of amax; clamped below at 2^−127 (E8M0's
//              smallest); above 2^127 (float64 inputs only) the block is NaN. amax = 0: S = 2^−127.
//     ceil     the smallest power of two with amax / S ≤ M (no element saturates), same clamps.
//     nearest  S = RN_E8M0(amax / M), the exact quotient rounded once to E8M0 (format.h).
//     absmax   S = RN_scale(amax / M): the exact quotient rounded once (ties to even, saturating)
//              to the scale format (binary32, bf16, e4m3 …); S = 0 makes the block's elements ±0.
//     minmax   asymmetric, with a zero point (unsigned integer elements uint<B>, Q = 2^B − 1):
//              lo = min(min x, 0), hi = max(max x, 0), S = RN_scale(RN64(hi − lo) / Q) (the quotient
//              exact), zero point z = RN_int(−lo / S) clamped to [0, Q] (ties to even); the element
//              is q = round(x / S + z) to the uint grid with the mode, saturating at 0 and Q, and the
//              output y = (q − z) · S. S = 0 (a block of zeros) gives zeros.
//   two-level (NVFP4): a NaN or ±inf anywhere makes the whole tensor NaN; a per-tensor scale G = RN_binary32(amax_tensor / (M · M_scale)) first (the
//   "amax/2688" of NVFP4: 6 · 448), then the block scale S_b = RN_scale(amax / (M · G)) and S =
//   S_b · G (exact). G = 0 (an all-zero tensor) gives zeros.
//   Elements: q_i = round(x_i / S) to the element format with the given mode, the quotient exact
//   (x_i / S is rounded once: round-to-odd in binary64, then the element rounding — the same value
//   as rounding the exact quotient); beyond the element's range it saturates (the schemes' element
//   formats saturate: OCP MX, NVFP4, DeepSeek); −0 stays −0 for floating-point elements.
//   Output: y_i = q_i · S, exact in binary64, rounded once (to nearest) to the array's type.
// division = reciprocal (NVFP4 only, the order of NVIDIA's kernels, modelled with correctly
// rounded binary32 operations — the GPUs' approximate reciprocal instruction is not modelled):
//   g = RN32(M·M_scale / amax_tensor), S_b = RN_scale(RN32(g · RN32(amax · RN32(1/M)))),
//   r = RN32(1 / RN32(S_b · RN32(1/g))), q_i = round(RN32(x_i · r)), y_i = q_i · S_b · RN32(1/g).
// Random words (sr, sre): element (i, j) uses index index0 + i·cols + j of (seed, stream), so
// results do not depend on the thread count or the block order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/format.h"

namespace mantis {

enum class ScaleRule : uint8_t { floor, ceil, nearest, absmax, minmax };
enum class Division : uint8_t { exact, reciprocal };

struct Scheme {
  std::string name;
  Format element;                 // the element format (overflow = saturate)
  int64_t block_rows = 1;         // block shape; 0 = the whole dimension
  int64_t block_cols = 32;
  ScaleRule rule = ScaleRule::floor;
  Format scale;                   // e8m0 for floor / ceil / nearest; the absmax rule's scale format
  bool two_level = false;         // a per-tensor binary32 scale beneath the block scales (NVFP4)
  Division division = Division::exact;
  std::string source;             // where it was defined: a preset, or the TOML file
};

// Throws InputError naming the problem unless the scheme is well formed.
void validate(const Scheme& s);
// The element rounding of a quantize_scheme call: sr_bits in 1..32 and, for sr, ≤ 52 − p of the
// element format (InputError naming the limit).
void validate_quantize(const Scheme& s, Rounding mode, int sr_bits);

// The presets (README: "Scaled formats"), or a TOML file:
//   element = "fp4_e2m1"        block = [1, 32] (0: whole dimension) or "tensor" / "row" / "column"
//   rule = "floor" | "ceil" | "nearest" | "absmax" | "minmax"    scale = "e8m0" | "fp32" | "bf16" | "e4m3" …
//   two_level = false           division = "exact" | "reciprocal"        name = "…"
Scheme scheme_lookup(const std::string& name_or_path);
Scheme scheme_from_toml(const std::string& text, const std::string& source);
std::vector<std::string> scheme_presets();
const char* to_string(ScaleRule r);

// What a quantisation did.
struct SchemeStats {
  uint64_t elements = 0, blocks = 0;
  uint64_t nan_blocks = 0;    // blocks with a NaN or ±inf (or a non-finite scale): all NaN
  uint64_t zero_blocks = 0;   // amax = 0 (or a zero scale)
  uint64_t clipped = 0;       // elements with |x / S| past the midpoint above the element's largest
                              // value (saturated rather than rounded)
  double global_scale = 1;    // two-level: G
};

// y [rows × cols] (row-major, may alias x) ← the dequantised values of x under s (header), each
// element rounded with `mode` (sr: sr_bits random bits). `scales`, if given, receives the scale
// of every block (S_b for two-level), blocks in row-major order. Needs validate(s) and, for sr,
// sr_bits ≤ 52 − p of the element format.
// zero_points (minmax), if given, receives each block's z.
template <class T>
SchemeStats quantize_scheme(const Scheme& s, const T* x, T* y, int64_t rows, int64_t cols, Rounding mode,
                            int sr_bits = 32, uint64_t seed = 0, uint64_t stream = 0, uint64_t index0 = 0,
                            std::vector<double>* scales = nullptr, std::vector<double>* zero_points = nullptr);

extern template SchemeStats quantize_scheme<float>(const Scheme&, const float*, float*, int64_t, int64_t, Rounding,
                                                   int, uint64_t, uint64_t, uint64_t, std::vector<double>*,
                                                   std::vector<double>*);
extern template SchemeStats quantize_scheme<double>(const Scheme&, const double*, double*, int64_t, int64_t, Rounding,
                                                    int, uint64_t, uint64_t, uint64_t, std::vector<double>*,
                                                    std::vector<double>*);

// Round-to-odd of a / b in binary64 (a, b finite, b ≠ 0): rounding it once more to any precision
// p ≤ 51 equals rounding the exact quotient (Boldo–Melquiond), for every mode (sr: sr_bits ≤ 52 − p).
// Quotients below 2^−1000 in magnitude come back as ±2^−1060 (far below any element format).
double div_round_odd(double a, double b);

}  // namespace mantis
