// mantis formats — the named formats and a few family examples, one row each.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "common.h"

namespace mantis::cli {

namespace {

// 2^k when x is a power of two, else a decimal with 7 significant digits.
std::string pow2_or_decimal(double x) {
  int e = 0;
  const double m = std::frexp(x, &e);
  if (m == 0.5) return fmt::format("2^{}", e - 1);
  return fmt::format("{:.7g}", x);
}

struct FormatsArgs {
  std::vector<std::string> names;
};

int run_formats(const FormatsArgs& a) {
  std::vector<Format> rows;
  if (a.names.empty()) {
    for (const auto& n : named_formats()) rows.push_back(format_lookup(n));
    for (const char* n : {"ps4", "ps13", "e3m2", "e6m9", "e8m7", "p3109_p3", "p3109_p4", "int8", "int8tc", "uint8", "int4"})
      rows.push_back(format_lookup(n));
  } else {
    for (const auto& n : a.names) rows.push_back(format_lookup(n));
  }
  const size_t named = a.names.empty() ? named_formats().size() : 0;

  std::string out = fmt::format("{:<12} {:>3} {:>6} {:>6} {:>10} {:>8} {:>8} {:>9} {:>14} {:>14} {:>14} {:>18} {:>14}\n",
                                "name", "μ", "emin", "emax", "subnormals", "specials", "overflow", "sign/zero",
                                "largest finite", "lowest", "smallest normal", "smallest subnormal",
                                "unit roundoff");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Format& f = rows[i];
    if (named && i == named) out += "family examples:\n";
    // ±0: signed with both zeros; +0: no −0; tc: two's complement; u: unsigned; u,no0: unsigned without zero
    const std::string sz = !f.is_signed ? (f.has_zero ? "u" : "u,no0")
                         : f.twos_complement ? "tc,+0"
                         : f.negative_zero ? "±0" : "+0";
    out += fmt::format("{:<12} {:>3} {:>6} {:>6} {:>10} {:>8} {:>8} {:>9} {:>14} {:>14} {:>14} {:>18} {:>14}\n", f.name,
                       f.mu, f.emin, f.emax, f.subnormals ? "yes" : "no", to_string(f.specials), to_string(f.overflow),
                       sz, fmt::format("{:.7g}", max_finite(f)), fmt::format("{:.7g}", min_finite(f)),
                       pow2_or_decimal(min_normal(f)), f.subnormals ? pow2_or_decimal(min_subnormal(f)) : std::string("-"),
                       pow2_or_decimal(unit_roundoff(f)));
  }
  out += fmt::format("\nfamilies: {}\n", family_help());
  out += "aliases:";
  for (const auto& [alias, target] : format_aliases()) out += fmt::format(" {} = {};", alias, target);
  out += " (names and modes are matched without regard to case)\n";
  out += "convention: μ counts stored fraction bits (precision p = μ+1); CPFloat/chop t = μ+1 "
         "(bf16: μ = 7, t = 8). unit roundoff = 2^-(μ+1), the rne relative error bound.\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Runner setup_formats(CLI::App& sub) {
  auto a = std::make_shared<FormatsArgs>();
  sub.add_option("names", a->names, "show only these formats (names, family names or .toml paths)");
  return [a] { return run_formats(*a); };
}

}  // namespace mantis::cli
