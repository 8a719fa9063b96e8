// mantis round / mantis dot — stdin in, %a out; mantis gemm — .npy in and out.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common.h"
#include "core/gemm.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "core/file.h"
#include "core/round_array.h"
#include "core/scheme.h"

namespace mantis::cli {

namespace {

std::string shown(std::string_view s) {
  constexpr size_t kMax = 60;
  return escape_control(s.substr(0, kMax)) + (s.size() > kMax ? "…" : "");
}

struct RoundArgs : RoundingArgs {
  bool reference = false;
  std::string in, out;  // .npy arrays instead of stdin / stdout
};

// The array of a float32 / float64 .npy as [rows, cols]: the last axis is the columns (a 0-D or
// 1-D array is one row).
std::pair<int64_t, int64_t> matrix_shape(const std::vector<int64_t>& shape) {
  int64_t rows = 1, cols = shape.empty() ? 1 : shape.back();
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return {rows, cols};
}

struct QuantizeArgs {
  std::string scheme, in, out, rounding = "rne";
  uint64_t seed = 0, stream = 0;
  int sr_bits = 32;
  bool json = false;
};

// mantis quantize: a .npy through a scheme (scheme.h), dequantised values out in the input's dtype.
int run_quantize(const QuantizeArgs& a) {
  const Scheme s = scheme_lookup(a.scheme);
  const Rounding mode = rounding_from_string(a.rounding);
  validate_quantize(s, mode, a.sr_bits);
  check_output_path(a.out, "--out");
  NpyFloats x = read_npy_floats(a.in);
  const auto [rows, cols] = matrix_shape(x.shape);
  std::vector<double> scales, zero_points;
  SchemeStats st;
  if (x.f8) {
    std::vector<double> y(x.f8_data.size());
    st = quantize_scheme<double>(s, x.f8_data.data(), y.data(), rows, cols, mode, a.sr_bits, a.seed, a.stream, 0,
                                 &scales, &zero_points);
    write_npy(a.out, std::span<const double>(y), x.shape);
  } else {
    std::vector<float> y(x.f4_data.size());
    st = quantize_scheme<float>(s, x.f4_data.data(), y.data(), rows, cols, mode, a.sr_bits, a.seed, a.stream, 0, &scales,
                                &zero_points);
    write_npy(a.out, std::span<const float>(y), x.shape);
  }
  if (a.json) {
    nlohmann::json j = {{"scheme", s.name},
                        {"element", s.element.name},
                        {"scale_format", s.scale.name},
                        {"rule", to_string(s.rule)},
                        {"block", {s.block_rows, s.block_cols}},
                        {"dtype", x.f8 ? "float64" : "float32"},
                        {"shape", x.shape},
                        {"rows", rows},
                        {"cols", cols},
                        {"rounding", to_string(mode)},
                        {"seed", a.seed},
                        {"stream", a.stream},
                        {"elements", st.elements},
                        {"blocks", st.blocks},
                        {"nan_blocks", st.nan_blocks},
                        {"zero_blocks", st.zero_blocks},
                        {"clipped", st.clipped},
                        {"scales", nlohmann::json::array()}};
    if (s.two_level) j["global_scale"] = st.global_scale;
    if (s.rule == ScaleRule::minmax) j["zero_points"] = zero_points;
    for (double v : scales) j["scales"].push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("nan"));
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %s, %lld x %lld (%s), %llu blocks: %llu NaN, %llu zero; %llu elements clipped; wrote %s\n",
                s.name.c_str(), to_string(mode), (long long)rows, (long long)cols, x.f8 ? "float64" : "float32",
                (unsigned long long)st.blocks, (unsigned long long)st.nan_blocks, (unsigned long long)st.zero_blocks,
                (unsigned long long)st.clipped, a.out.c_str());
  }
  return 0;
}
struct DotArgs : RoundingArgs {
  std::string accumulation = "strict";
  int block = 32;
  bool reference = false;
};

struct GemmArgs : DotArgs {
  std::string a, b, c, out, tensor_core, input, input_rounding = "rne";
  int align_bits = 24, promote_every = 0, split_k = 1;
};

// A float32 matrix .npy (the operands and the addend are binary32, as in Python's mantis.gemm).
NpyFloats read_matrix(const std::string& path, const char* what) {
  NpyFloats x = read_npy_floats(path);
  if (x.f8 || x.shape.size() != 2)
    throw InputError(fmt::format("{} {}: expected a float32 matrix (2-D), got {} {}-D", what, path,
                                 x.f8 ? "float64" : "float32", x.shape.size()));
  return x;
}

// The GemmSpec of dot's options (gemm's add theirs).
GemmSpec dot_spec(const DotArgs& a) {
  GemmSpec s;
  s.acc = format_lookup(a.format);
  s.acc_mode = rounding_from_string(a.rounding);
  s.accumulation = accumulation_from_string(a.accumulation);
  s.block = a.block;
  s.sr_bits = a.sr_bits;
  s.sr_packed = a.sr_packed;
  s.seed = a.seed;
  s.stream = a.stream;
  return s;
}

// mantis gemm: D = C + A·B under a GemmSpec (core/gemm.h), D as float64 (the accumulator's exact values).
int run_gemm(const GemmArgs& a) {
  GemmSpec s = dot_spec(a);
  s.align_bits = a.align_bits;
  s.tensor_core = a.tensor_core;
  s.promote_every = a.promote_every;
  s.split_k = a.split_k;
  if (!a.input.empty()) s.input = format_lookup(a.input);
  s.input_mode = rounding_from_string(a.input_rounding);
  const GemmPlan p = plan_gemm(s);
  check_output_path(a.out, "--out");
  const NpyFloats A = read_matrix(a.a, "--a"), B = read_matrix(a.b, "--b");
  const size_t M = size_t(A.shape[0]), K = size_t(A.shape[1]), N = size_t(B.shape[1]);
  if (size_t(B.shape[0]) != K)
    throw InputError(fmt::format("--a is [{}, {}] and --b is [{}, {}]: inner dimensions differ", M, K, B.shape[0], N));
  std::vector<double> C0;
  if (!a.c.empty()) {
    const NpyFloats C = read_matrix(a.c, "--c");
    if (size_t(C.shape[0]) != M || size_t(C.shape[1]) != N)
      throw InputError(fmt::format("--c is [{}, {}]; the product is [{}, {}]", C.shape[0], C.shape[1], M, N));
    C0.assign(C.f4_data.begin(), C.f4_data.end());
  }
  std::vector<double> D(M * N);
  if (a.reference)
    oracle_gemm(A.f4_data.data(), B.f4_data.data(), D.data(), M, N, K, s, C0.empty() ? nullptr : C0.data());
  else
    gemm(p, A.f4_data.data(), B.f4_data.data(), D.data(), M, N, K, s.stream, C0.empty() ? nullptr : C0.data());
  const int64_t shape[2] = {int64_t(M), int64_t(N)};
  write_npy(a.out, std::span<const double>(D), shape);
  return 0;
}

int run_round(const RoundArgs& a) {
  const Format f = format_lookup(a.format);
  RoundOptions o;
  o.mode = rounding_from_string(a.rounding);
  validate_sr_bits(a.sr_bits);
  validate_sr_packed(a.sr_packed, a.sr_bits, is_stochastic(o.mode));
  o.sr_bits = a.sr_bits;
  o.sr_packed = a.sr_packed;
  o.seed = a.seed;
  o.stream = a.stream;
  o.index0 = 0;
  if (a.in.empty() != a.out.empty()) throw InputError("round: --in and --out go together (.npy arrays)");
  if (!a.in.empty()) {  // element i of the flattened array uses the random word (seed, stream, i)
    if (a.reference) throw InputError("round: --reference reads stdin (not --in)");
    check_output_path(a.out, "--out");
    NpyFloats x = read_npy_floats(a.in);
    if (x.f8) {
      std::vector<double> y(x.f8_data.size());
      round_array(x.f8_data.data(), y.data(), y.size(), f, o);
      write_npy(a.out, std::span<const double>(y), x.shape);
    } else {
      if (!fits_float(f))
        throw InputError(fmt::format("format {} does not fit binary32: a float32 array cannot hold its values", f.name));
      std::vector<float> y(x.f4_data.size());
      round_array(x.f4_data.data(), y.data(), y.size(), f, o);
      write_npy(a.out, std::span<const float>(y), x.shape);
    }
    return 0;
  }

  const std::string text = read_all_stdin();
  auto lines = split_lines(text);
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();  // trailing blank lines
  std::vector<double> x(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i]);
    if (t.empty()) throw InputError(fmt::format("stdin line {}: empty line (expected a number)", i + 1));
    if (!parse_double(t, x[i]))
      throw InputError(fmt::format("stdin line {}: cannot parse '{}' as a number", i + 1, shown(t)));
  }

  std::vector<double> y(x.size());
  if (a.reference) {
    for (size_t i = 0; i < x.size(); ++i)
      y[i] = oracle_round(x[i], f, o.mode, oracle_sr_word(o.seed, o.stream, o.index0 + i, 1 << sr_pack(o.sr_bits, o.sr_packed)),
                          o.sr_bits);
  } else if (!x.empty()) {
    round_array(x.data(), y.data(), x.size(), f, o);
  }

  std::string out;
  out.reserve(y.size() * 24);
  for (double v : y) {
    out += hex(v);
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);  // main() checks that it arrived
  return 0;
}

int run_dot(const DotArgs& a) {
  const GemmSpec s = dot_spec(a);
  validate(s);

  const std::string text = read_all_stdin();
  auto lines = split_lines(text);
  while (lines.size() > 2 && trim(lines.back()).empty()) lines.pop_back();  // trailing blank lines
  if (lines.size() != 2)
    throw InputError(fmt::format("dot expects exactly two lines on stdin (two comma-separated vectors), got {}",
                                 lines.size()));
  std::vector<float> v[2];
  for (int l = 0; l < 2; ++l) {
    const std::string_view line = trim(lines[l]);
    if (line.empty()) continue;  // an empty vector
    size_t pos = 0, k = 0;
    for (;;) {
      const size_t comma = line.find(',', pos);
      const std::string_view t = trim(line.substr(pos, comma == std::string_view::npos ? line.npos : comma - pos));
      ++k;
      float val;
      if (t.empty()) throw InputError(fmt::format("stdin line {}, element {}: empty element", l + 1, k));
      if (!parse_float(t, val))
        throw InputError(
            fmt::format("stdin line {}, element {}: cannot parse '{}' as a binary32 number", l + 1, k, shown(t)));
      v[l].push_back(val);
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
  }
  if (v[0].size() != v[1].size())
    throw InputError(fmt::format("vectors of different lengths: line 1 has {} elements, line 2 has {}",
                                 v[0].size(), v[1].size()));
  const size_t K = v[0].size();
  double r;
  if (a.reference) {
    oracle_gemm(v[0].data(), v[1].data(), &r, 1, 1, K, s);
  } else {
    r = dot(v[0].data(), v[1].data(), K, s);
  }
  std::fputs((hex(r) + "\n").c_str(), stdout);  // main() checks that it arrived
  return 0;
}

}  // namespace

Runner setup_round(CLI::App& sub) {
  auto a = std::make_shared<RoundArgs>();
  sub.description(
      "round numbers read from stdin (one per line: decimal or C99 hex float, inf, -inf, nan; "
      "each first converted to binary64 by strtod; blank lines at the end are ignored) and print each result "
      "as %a of a double. "
      "Element i (0-based line number) uses the random word (seed, stream, i).");
  add_rounding(sub, *a);
  sub.add_flag("--reference", a->reference, "use the MPFR oracle instead of the fast path (same results)");
  sub.add_option("--in", a->in, "round a float32 / float64 .npy array instead of stdin (element i of the flattened "
                                "array uses the word (seed, stream, i))")->check(kPath);
  sub.add_option("--out", a->out, "where --in's rounded array goes (.npy, the input's dtype and shape)")->check(kPath);
  add_threads(sub);
  return [a] { return run_round(*a); };
}

Runner setup_quantize(CLI::App& sub) {
  auto a = std::make_shared<QuantizeArgs>();
  sub.description(
      "quantise a float32 / float64 .npy array to a scaled format (a scheme: OCP MX, NVFP4, DeepSeek tiles, INT8; "
      "src/core/scheme.h) and write the dequantised values in the input's dtype and shape. The array is a matrix "
      "whose columns are its last axis (blocks run along rows, e.g. 1x32 for MX). --rounding applies to the "
      "element conversion; element (i, j) uses the random word (seed, stream, i·cols + j).");
  sub.add_option("--scheme", a->scheme, "a preset (mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4, mxint8, "
                                        "nvfp4, deepseek_act, deepseek_weight, int8_channel, int8_tensor, uint8_channel_zp, "
                                        "uint8_tensor_zp) or a .toml")
      ->required();
  sub.add_option("--in", a->in, "input .npy (float32 or float64, C order)")->required()->check(kPath);
  sub.add_option("--out", a->out, "output .npy (written atomically)")->required()->check(kPath);
  sub.add_option("--rounding,-r", a->rounding, "element rounding: " + rounding_help())->capture_default_str();
  sub.add_option("--seed", a->seed, "Philox seed for sr/sre")->capture_default_str()->check(kUint64);
  sub.add_option("--stream", a->stream, "Philox stream for sr/sre")->capture_default_str()->check(kUint64);
  sub.add_option("--sr-bits", a->sr_bits, "random bits used by sr (≤ 52 − p of the element format)")->capture_default_str();
  add_json(sub, a->json, "print the scales, the block counts and the clipped elements as JSON");
  return [a] { return run_quantize(*a); };
}

Runner setup_dot(CLI::App& sub) {
  auto a = std::make_shared<DotArgs>();
  sub.description(
      "dot product with a rounded accumulator (μ ≤ 50). Reads two lines from stdin, each a comma-separated "
      "vector (decimal or hex floats) of equal length; the operands are binary32: every element is "
      "converted with strtof (correctly rounded decimal -> binary32). Prints the accumulated result "
      "as %a of a double. Accumulation step k uses the random word (seed, stream, k).");
  add_rounding(sub, *a, "accumulator ", "random bits used by sr (strict needs ≤ 52 − (μ+1))");
  sub.add_option("--accumulation", a->accumulation, "strict (fused a·b+acc), unfused or blocked")->capture_default_str();
  sub.add_option("--block", a->block, "chunk length for --accumulation blocked")->capture_default_str();
  sub.add_flag("--reference", a->reference, "use the MPFR reference GEMM (M = N = 1) instead of the fast path");
  return [a] { return run_dot(*a); };
}

Runner setup_gemm(CLI::App& sub) {
  auto a = std::make_shared<GemmArgs>();
  sub.description(
      "D = C + A·B with a rounded accumulator (core/gemm.h), as Python's mantis.gemm: --a [M, K] and --b [K, N] "
      "float32 .npy, --c [M, N] float32 the addend (rounded to nearest-even into the accumulator format; default "
      "zeros); writes D [M, N] float64 (the accumulator's exact values). --accumulation tensor_core --tensor-core "
      "h100 (v100, a100, a2, ada, l40s, h100, h200, b200; :mma or :wgmma to choose) is that GPU's matrix unit bit "
      "for bit: --format fp32 or fp16 (its output), --input fp16, bf16, tf32, e4m3 or e5m2.");
  add_rounding(sub, *a, "accumulator ", "random bits used by sr (strict needs ≤ 52 − (μ+1))");
  sub.add_option("--a", a->a, "A [M, K], float32 .npy")->required()->check(kPath);
  sub.add_option("--b", a->b, "B [K, N], float32 .npy")->required()->check(kPath);
  sub.add_option("--c", a->c, "C [M, N], float32 .npy: the addend")->check(kPath);
  add_out(sub, a->out, "D [M, N], float64 .npy")->required();
  sub.add_option("--accumulation", a->accumulation, "strict, unfused, blocked, promoted or tensor_core")->capture_default_str();
  sub.add_option("--block", a->block, "k_b of blocked, promoted and the superseded tensor_core model")->capture_default_str();
  sub.add_option("--align-bits", a->align_bits, "F of the superseded tensor_core model")->capture_default_str();
  sub.add_option("--tensor-core", a->tensor_core, "a GPU's matrix unit (needs --accumulation tensor_core and --input)");
  sub.add_option("--promote-every", a->promote_every, "with --tensor-core: add each run of this many products into "
                 "a binary32 register (DeepGEMM: 128; 0: never)")->capture_default_str();
  sub.add_option("--split-k", a->split_k, "with --tensor-core: K in this many parts summed in binary32")->capture_default_str();
  sub.add_option("--input", a->input, "round A and B to this format first");
  sub.add_option("--input-rounding", a->input_rounding, "rounding of A and B")->capture_default_str();
  sub.add_flag("--reference", a->reference, "use the MPFR reference GEMM instead of the fast path");
  return [a] { return run_gemm(*a); };
}

}  // namespace mantis::cli
