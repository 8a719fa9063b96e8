// mantis round / mantis dot — stdin in, %a out.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/gemm.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "core/round_array.h"

namespace mantis::cli {

namespace {

std::string shown(std::string_view s) {
  constexpr size_t kMax = 60;
  return escape_control(s.substr(0, kMax)) + (s.size() > kMax ? "…" : "");
}

struct RoundArgs : RoundingArgs {
  bool reference = false;
};
struct DotArgs : RoundingArgs {
  std::string accumulation = "strict";
  int block = 32;
  bool reference = false;
};

int run_round(const RoundArgs& a) {
  const Format f = format_lookup(a.format);
  RoundOptions o;
  o.mode = rounding_from_string(a.rounding);
  validate_sr_bits(a.sr_bits);
  o.sr_bits = a.sr_bits;
  o.seed = a.seed;
  o.stream = a.stream;
  o.index0 = 0;

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
      y[i] = oracle_round(x[i], f, o.mode, random_word(o.seed, o.stream, o.index0 + i), o.sr_bits);
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
  GemmSpec s;
  s.acc = format_lookup(a.format);
  s.acc_mode = rounding_from_string(a.rounding);
  s.accumulation = accumulation_from_string(a.accumulation);
  s.block = a.block;
  s.sr_bits = a.sr_bits;
  s.seed = a.seed;
  s.stream = a.stream;
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
  add_threads(sub);
  return [a] { return run_round(*a); };
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

}  // namespace mantis::cli
