// Formats are data: named formats, families, TOML parsing, derived values, every error path.
#include <catch2/catch.hpp>

#include <cmath>

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
  CHECK(named_formats().size() == 7);
  CHECK(min_subnormal(format_lookup("fp16")) == std::ldexp(1, -24));
  CHECK(min_normal(format_lookup("bf16")) == std::ldexp(1, -126));
  CHECK(unit_roundoff(format_lookup("bf16")) == std::ldexp(1, -8));
  CHECK(format_lookup("e4m3").specials == Specials::fn);
  CHECK(format_lookup("e4m3").overflow == Overflow::nan);
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
