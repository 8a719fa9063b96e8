// quant_map — the code tables of the low-bit Adam baselines (bitsandbytes 8-bit, torchao 4-bit)
// and their nearest-code rules, each computed exactly as its Python / kernel does.
//
// dynamic_map(signed, E, B): the "dynamic tree" map of create_dynamic_map (bitsandbytes
// functional.py; torchao quant_utils.py is the same function without bnb's zero padding, which
// never pads for the sizes used here). With S = B − 1 and, for i = 0 … E−1,
//   k_i = 2^(i+S−E) + 1 (signed) or 2^(i+S−E+1) + 1 (unsigned) boundaries
//   b = torch.linspace(0.1, 1, k_i)          binary32 (torch's CPU kernel, see torch_linspace_f32)
//   means = (b[:-1] + b[1:]) / 2.0           binary32
//   codes += float(10^(i−E+1)) · means       binary32 product; 10^x is Python's binary64 pow (1 for
//                                            x = 0), rounded to binary32 as torch casts a Python
//                                            scalar into a float32 op; signed: also −float(10^x)·means
// then 2^(S−E) − 1 extra means (none for bnb (7, 8) and torchao (3, 4)), then 0 and 1.0, sorted.
// Every value is binary32-exact before the sort, so the Python list of doubles equals these floats.
//   bnb signed (7, 8): 256 codes, +1 but not −1 (lowest −0.99297), smallest |code| 5.5e-7, codes per
//   decade 1, 2, …, 64; unsigned (7, 8): smallest 3.25e-7, 2, 4, …, 128 per decade.
//   torchao 4-bit m: dynamic_map(true, 3, 4) = ±{0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625,
//   0.8875}, 0, 1. torchao 4-bit v: torch.linspace(0, 1, 17)[1:] = {1/16, …, 1} (exact).
//
// Nearest-code rules (both take a value already divided by its block's scale):
//   bnb_nearest_code: csrc/kernels.cu quantize_2D (the blockwise optimizer's rule): a 7-step binary
//   search from pivot 127 (x > code[pivot] moves up), then the nearer of the last probe and its
//   bracketing neighbour by a binary32 midpoint (a + b)·0.5f; a tie goes to the last probe. NaN
//   compares false throughout and lands on code 0.
//   torchao_nearest_code_4bit: quantize_4bit_with_qmap's branchless search (x ≥ qmap[c + 8], +4,
//   +2, +1), then up one code when x − qmap[c] ≥ (qmap[c+1] − qmap[c])·0.5f: ties go up; values
//   below qmap[0] (and NaN) give code 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mantis {

// torch.linspace(start, end, steps, dtype=float32)[idx] as ATen's CPU kernel computes it:
// step = (end − start) / (steps − 1), then start + step·idx for idx < steps/2, else
// end − step·(steps − idx − 1), all in binary32.
float torch_linspace_f32(float start, float end, int64_t steps, int64_t idx);

// create_dynamic_map(is_signed, max_exponent_bits, total_bits): 2^total_bits sorted codes.
std::vector<float> dynamic_map(bool is_signed, int max_exponent_bits, int total_bits);
// bitsandbytes' maps for the 8-bit optimizers: "dynamic" (signed, for m) and "udynamic" (for v).
inline std::vector<float> bnb_dynamic_map(bool is_signed) { return dynamic_map(is_signed, 7, 8); }
// torchao's 4-bit maps: m = dynamic_map(true, 3, 4); v = 16 linear levels without zero.
inline std::vector<float> torchao_4bit_map_m() { return dynamic_map(true, 3, 4); }
std::vector<float> torchao_4bit_map_v();

// bnb quantize_2D<is_signed> on a 256-code table.
uint8_t bnb_nearest_code(std::span<const float> code, float x, bool is_signed);
// torchao quantize_4bit_with_qmap on a 16-code table.
uint8_t torchao_nearest_code_4bit(std::span<const float> qmap, float x);

}  // namespace mantis
