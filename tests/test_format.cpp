// Formats are data: named formats, families, TOML parsing, derived values, every error path.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/format.h"
#include "testutil.h"

using namespace mantis;

TEST_CASE("named formats have their IEEE / OCP parameters") {
  struct Want { const char* name; int mu, emin, emax; double max; };
  const Want w[] = {{"fp64", 52, -1022, 1023, 1.7976931348623157e308},
                    {"fp32", 23, -126, 127, 3.4028234663852886e38},
                    {"tf32", 10, -126, 127, (2 - std::ldexp(1, -10)) * std::ldexp(1, 127)},
                    {"bf16", 7, -126, 127, (2 - std::ldexp(1, -7)) * std::ldexp(1, 127)},
                    {"fp16", 10, -14, 15, 65504},
                    {"e5m2", 2, -14, 15, 57344},
                    {"e4m3", 3, -6, 8, 448}};
  for (auto& x : w) {
    INFO(x.name);
    const Format f = format_lookup(x.name);
    CHECK(f.mu == x.mu);
    CHECK(f.emin == x.emin);
    CHECK(f.emax == x.emax);
    CHECK(max_finite(f) == x.max);
  }
  CHECK(named_formats().size() == 14);
  CHECK(min_subnormal(format_lookup("fp16")) == std::ldexp(1, -24));
  CHECK(min_normal(format_lookup("bf16")) == std::ldexp(1, -126));
  CHECK(unit_roundoff(format_lookup("bf16")) == std::ldexp(1, -8));
  CHECK(format_lookup("e4m3").specials == Specials::fn);
  CHECK(format_lookup("e4m3").overflow == Overflow::nan);
}

TEST_CASE("OCP MX element formats, E8M0, the fnuz variants: parameters and every value of the small ones") {
  struct Want { const char* name; int mu, emin, emax; double max, min_sub; Specials sp; Overflow ovf; };
  const Want w[] = {{"fp6_e3m2", 2, -2, 4, 28, 0.0625, Specials::none, Overflow::saturate},
                    {"fp6_e2m3", 3, 0, 2, 7.5, 0.125, Specials::none, Overflow::saturate},
                    {"fp4_e2m1", 1, 0, 2, 6, 0.5, Specials::none, Overflow::saturate},
                    {"e4m3fnuz", 3, -7, 7, 240, std::ldexp(1, -10), Specials::fnuz, Overflow::nan},
                    {"e5m2fnuz", 2, -15, 15, 57344, std::ldexp(1, -17), Specials::fnuz, Overflow::nan},
                    {"e4m3b11fnuz", 3, -10, 4, 30, std::ldexp(1, -13), Specials::fnuz, Overflow::nan}};
  for (auto& x : w) {
    INFO(x.name);
    const Format f = format_lookup(x.name);
    CHECK(f.mu == x.mu);
    CHECK(f.emin == x.emin);
    CHECK(f.emax == x.emax);
    CHECK(max_finite(f) == x.max);
    CHECK(min_subnormal(f) == x.min_sub);
    CHECK(f.specials == x.sp);
    CHECK(f.overflow == x.ovf);
    CHECK(f.negative_zero == (x.sp == Specials::none));
  }
  // FP4 E2M1's eight magnitudes (OCP MX v1.0, table 5), as the grid of the format
  std::vector<double> fp4;
  const Format f4 = format_lookup("fp4_e2m1");
  for (int e = 0; e <= 2; ++e)
    for (int m = 0; m < 2; ++m) fp4.push_back(std::ldexp(1 + m / 2.0, e));
  CHECK(fp4 == std::vector<double>{1, 1.5, 2, 3, 4, 6});
  CHECK(min_subnormal(f4) == 0.5);
  // E8M0: unsigned powers of two, no zero
  const Format e8 = format_lookup("e8m0");
  CHECK(e8.mu == 0);
  CHECK(e8.emin == -127);
  CHECK(e8.emax == 127);
  CHECK_FALSE(e8.is_signed);
  CHECK_FALSE(e8.has_zero);
  CHECK_FALSE(e8.subnormals);
  CHECK(e8.overflow == Overflow::nan);
  CHECK(max_finite(e8) == std::ldexp(1, 127));
  CHECK(min_finite(e8) == std::ldexp(1, -127));
  CHECK_FALSE(e8.plain());
  CHECK(format_lookup("bf16").plain());
}

TEST_CASE("P3109 binary8 and integer families") {
  // P3109 interim report: K = 8, precision P, bias 2^(7−P), emax = 2^(7−P) − 1, the all-ones code
  // of the top binade is ±inf (largest finite one code below), no −0 (its code is the NaN).
  const double max[] = {0, std::ldexp(1, 62), (2 - 1.0) * std::ldexp(1, 31), 1.5 * std::ldexp(1, 15), 224, 15, 3.875,
                        1.96875};
  for (int P = 1; P <= 7; ++P) {
    INFO("P = " << P);
    const Format f = format_lookup("p3109_p" + std::to_string(P));
    CHECK(f.mu == P - 1);
    CHECK(f.emax == (1 << (7 - P)) - 1);
    CHECK(f.emin == 1 - (1 << (7 - P)));
    CHECK(f.specials == Specials::p3109);
    CHECK(f.has_inf());
    CHECK_FALSE(f.negative_zero);
    CHECK(f.overflow == Overflow::inf);
    CHECK(max_finite(f) == max[P]);
  }
  CHECK_THROWS_WITH(format_lookup("p3109_p8"), Catch::Contains("1..7"));
  CHECK_THROWS_WITH(format_lookup("p3109_p0"), Catch::Contains("1..7"));
  // B-bit integers: quantum 1, saturating, +0 only
  struct Int { const char* name; double lo, hi; };
  for (const Int& x : {Int{"int8", -127, 127}, Int{"int8tc", -128, 127}, Int{"uint8", 0, 255}, Int{"int4", -7, 7},
                       Int{"int4tc", -8, 7}, Int{"uint4", 0, 15}, Int{"int2", -1, 1}, Int{"int16", -32767, 32767},
                       Int{"int32tc", -2147483648.0, 2147483647.0}}) {
    INFO(x.name);
    const Format f = format_lookup(x.name);
    CHECK(max_finite(f) == x.hi);
    CHECK(min_finite(f) == x.lo);
    CHECK(min_subnormal(f) == 1);
    CHECK(f.overflow == Overflow::saturate);
    CHECK_FALSE(f.negative_zero);
  }
  CHECK_THROWS_WITH(format_lookup("int1"), Catch::Contains("2..32"));
  CHECK_THROWS_WITH(format_lookup("int33"), Catch::Contains("2..32"));
  CHECK_THROWS_AS(format_lookup("uint8tc"), InputError);
}

TEST_CASE("aliases (ml_dtypes' names and others) and case-insensitive names and modes") {
  for (const auto& [alias, target] : format_aliases()) {
    INFO(alias);
    const Format a = format_lookup(alias), t = format_lookup(target);
    CHECK(a.name == t.name);
    CHECK(a.mu == t.mu);
    CHECK(a.emin == t.emin);
    CHECK(a.emax == t.emax);
  }
  CHECK(format_lookup("float8_e4m3fn").name == "e4m3");
  CHECK(format_lookup("Float8_E4M3FN").name == "e4m3");
  CHECK(format_lookup("BF16").name == "bf16");
  CHECK(format_lookup("PS4").mu == 4);
  CHECK(format_lookup("half").name == "fp16");
  CHECK(format_lookup("float4_e2m1fn").name == "fp4_e2m1");
  CHECK(format_lookup("float8_e8m0fnu").name == "e8m0");
  CHECK(rounding_from_string("RNE") == Rounding::rne);
  CHECK(rounding_from_string("Sr") == Rounding::sr);
}

TEST_CASE("the new TOML keys and their validation") {
  const Format u = format_from_toml("mantissa_bits=2\nexponent_bits=5\nspecials='none'\nsigned=false", "u.toml");
  CHECK_FALSE(u.is_signed);
  CHECK(u.overflow == Overflow::saturate);  // the default without infinities or NaN
  CHECK(min_finite(u) == 0);
  const Format p = format_from_toml("mantissa_bits=3\nexponent_bits=4\nspecials='p3109'", "p.toml");
  CHECK(p.emax == 7);
  CHECK_FALSE(p.negative_zero);
  CHECK(p.overflow == Overflow::inf);
  auto err = [](const char* text) { return mantis::test::error_of([&] { format_from_toml(text, "bad.toml"); }); };
  CHECK_THAT(err("mantissa_bits=1\nexponent_bits=2\nspecials='none'\noverflow='inf'"), Catch::Contains("no infinities"));
  CHECK_THAT(err("mantissa_bits=1\nexponent_bits=2\nspecials='odd'"), Catch::Contains("none or p3109"));
  CHECK_THAT(err("mantissa_bits=3\nexponent_bits=4\nspecials='fnuz'\nnegative_zero=true"), Catch::Contains("negative zero"));
  CHECK_THAT(err("mantissa_bits=0\nexponent_bits=8\nspecials='none'\nsigned=false\nzero=false"), Catch::Contains("subnormals"));
  CHECK_THAT(err("mantissa_bits=0\nemin=-3\nemax=3\nsubnormals=false\nzero=false\nspecials='none'"), Catch::Contains("unsigned"));
  CHECK_THAT(err("mantissa_bits=2\nexponent_bits=5\nsigned=false"), Catch::Contains("none"));
  CHECK_THAT(err("mantissa_bits=6\nemin=6\nemax=7\nspecials='none'\ntwos_complement=true"), Catch::Contains("integer grids"));
  CHECK_THAT(err("mantissa_bits=6\nemin=6\nemax=6\nspecials='none'\ntwos_complement=true\noverflow='nan'"),
             Catch::Contains("integer grids"));
  CHECK_THAT(err("mantissa_bits=6\nemin=6\nemax=6\nspecials='none'\nsigned='no'"), Catch::Contains("true or false"));
}

TEST_CASE("generated families") {
  for (int mu = 1; mu <= 23; ++mu) {
    const Format f = format_lookup("ps" + std::to_string(mu));
    CHECK(f.mu == mu);
    CHECK(f.emin == -126);
    CHECK(f.emax == 127);
    CHECK(fits_float(f));
  }
  const Format e = format_lookup("e11m52");
  CHECK(e.emin == -1022);
  CHECK(e.emax == 1023);
  CHECK(fits_double(e));
  CHECK_FALSE(fits_float(e));
  const Format t = format_lookup("e2m0");
  CHECK(t.emax == 1);
  CHECK(t.emin == 0);
  CHECK(max_finite(t) == 2);
  CHECK_THROWS_AS(format_lookup("ps0"), InputError);
  CHECK_THROWS_AS(format_lookup("ps24"), InputError);
  CHECK_THROWS_AS(format_lookup("e12m3"), InputError);
  CHECK_THROWS_AS(format_lookup("e5m53"), InputError);
}

TEST_CASE("TOML formats: explicit exponent range, fnuz, errors name the problem") {
  const Format f = format_from_toml("name='x'\nmantissa_bits=3\nexponent_bits=4\nspecials='fnuz'\noverflow='saturate'", "t.toml");
  CHECK(f.emax == 7);
  CHECK(f.emin == -7);
  CHECK(max_finite(f) == 240);
  const Format g = format_from_toml("mantissa_bits=5\nemin=-20\nemax=10\nsubnormals=false", "dir/g.toml");
  CHECK(g.name == "g");
  CHECK(min_subnormal(g) == std::ldexp(1, -20));

  auto err = [](const char* text) { return mantis::test::error_of([&] { format_from_toml(text, "bad.toml"); }); };
  CHECK_THAT(err("mantissa_bits = [1,"), Catch::Contains("bad.toml:1") && Catch::Contains("malformed TOML"));
  CHECK_THAT(err("mantissa_bits=3\nexponent_bits=4\ncolour='red'"), Catch::Contains("bad.toml:3") && Catch::Contains("colour"));
  CHECK_THAT(err("exponent_bits=4"), Catch::Contains("mantissa_bits"));
  CHECK_THAT(err("mantissa_bits=60\nexponent_bits=4"), Catch::Contains("out of range"));
  CHECK_THAT(err("mantissa_bits=3\nexponent_bits=4\nspecials='fn'\noverflow='inf'"), Catch::Contains("no infinities"));
  CHECK_THAT(err("mantissa_bits=3\nexponent_bits=4\nemin=1\nemax=2"), Catch::Contains("either"));
  CHECK_THAT(err("mantissa_bits=3\nexponent_bits=4\noverflow='wrap'"), Catch::Contains("overflow"));
  CHECK_THAT(err("mantissa_bits=3\nemin=5\nemax=2"), Catch::Contains("emin"));
  CHECK_THAT(err("mantissa_bits=60\nemin=-1020\nemax=0"), Catch::Contains("range"));
  CHECK_THAT(err("mantissa_bits='a'\nexponent_bits=4"), Catch::Contains("integer"));
  // a name with a line break made a Format's repr span lines (issue 32)
  CHECK(err("name = \"x\\ny\"\nmantissa_bits=3\nexponent_bits=4") == "format name 'x\\x0ay' holds control characters");
  CHECK_THAT(err("name = \"a\\u007fb\"\nmantissa_bits=3\nexponent_bits=4"), Catch::Contains("'a\\x7fb' holds control"));
}

TEST_CASE("unknown names list the known ones; rounding names") {
  try {
    format_lookup("bf17");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("bf16") && Catch::Contains("ps<") && Catch::Contains("bf17"));
  }
  CHECK_THROWS_AS(format_lookup("/nonexistent/x.toml"), InputError);
  for (auto& n : rounding_names()) CHECK(to_string(rounding_from_string(n)) == n);
  CHECK_THROWS_AS(rounding_from_string("nearest"), InputError);
}

TEST_CASE("format whose subnormals fall below binary64 is rejected") {
  Format f;
  f.name = "deep";
  f.mu = 52;
  f.emin = -1022;
  f.emax = 0;
  CHECK_NOTHROW(validate(f));
  f.mu = 40;
  f.emin = -1040 + 10;
  CHECK_THROWS_AS(validate(f), InputError);
}

TEST_CASE("family names with parameters too large for int are range errors") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(format_lookup("ps99999999999999999999"), InputError);
  CHECK_THROWS_WITH(format_lookup("ps99999999999999999999"), Contains("out of range 1..23"));
  CHECK_THROWS_WITH(format_lookup("e99999999999999999999m2"), Contains("exponent_bits") && Contains("2..11"));
  CHECK_THROWS_WITH(format_lookup("e5m99999999999999999999"), Contains("0..52"));
  CHECK(format_lookup("ps0023").mu == 23);  // leading zeros are still the number
}

TEST_CASE("escape_control writes control bytes as \\xNN and keeps the rest") {
  CHECK(escape_control(std::string("a\0b\x1b[1m\n\x7f μ", 12)) == "a\\x00b\\x1b[1m\\x0a\\x7f μ");
  CHECK(escape_control("plain") == "plain");
}
