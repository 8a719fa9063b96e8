// test_cli — the `mantis` binary end to end: stdin in, stdout / stderr / exit status out.
//
// The binary's path comes from the environment variable MANTIS_BIN (set by Meson). Expected values
// are derived from the semantics documented in src/core/format.h and src/core/gemm.h, not from running the
// code. Error paths: exit status 2 and exactly one line "mantis: error: …" on stderr.
#define CATCH_CONFIG_MAIN
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <catch2/catch_reporter_tap.hpp>  // `-r tap` (Meson's protocol: 'tap')
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cliutil.h"
#include "mantis_config.h"

namespace {

using namespace mantis_test_cli;

struct Case {
  const char* format;
  const char* mode;
  const char* in;
  const char* out;
};

}  // namespace

TEST_CASE("version and help", "[cli]") {
  auto v = run({"--version"});
  CHECK(v.status == 0);
  CHECK(v.out.find(MANTIS_VERSION) != std::string::npos);

  auto h = run({"--help"});
  CHECK(h.status == 0);
  for (const char* sub : {"formats", "round", "dot", "bench", "verify", "sweep"})
    CHECK(h.out.find(sub) != std::string::npos);

  auto r = run({"round", "--help"});
  CHECK(r.status == 0);
  CHECK(r.out.find("strtod") != std::string::npos);

  auto d = run({"dot", "--help"});
  CHECK(d.status == 0);
  CHECK(d.out.find("strtof") != std::string::npos);
  CHECK(d.out.find("binary32") != std::string::npos);
}

TEST_CASE("usage errors: status 2 and one line", "[cli][errors]") {
  check_error(run({}), {"subcommand"});
  check_error(run({"frobnicate"}), {"unknown subcommand", "frobnicate"});
  check_error(run({"round", "--bogus"}), {"--bogus"});
  check_error(run({"round", "--format", "bf16", "--bogus"}, "1\n"), {"--bogus"});
  check_error(run({"--bogus"}), {"--bogus"});
  check_error(run({"round"}), {"--format"});
  check_error(run({"round", "--format", "bf16", "--threads", "0"}, "1\n"), {"--threads"});
  check_error(run({"bench", "nonsense"}), {"nonsense"});
  check_error(run({"verify", "--format", "bf16"}), {"--exhaustive"});
  check_error(run({"verify", "--exhaustive", "--format", "fp64"}), {"fp64", "float"});
  check_error(run({"verify", "--exhaustive", "--format", "bf16", "--container", "half"}), {"half"});
}

TEST_CASE("input errors: status 2 and one line naming the problem", "[cli][errors]") {
  SECTION("unknown format lists the known ones") {
    auto r = run({"round", "--format", "nosuch"}, "1\n");
    check_error(r, {"nosuch", "bf16", "fp16", "e4m3", "e5m2", "tf32", "fp32", "fp64", "ps<"});
  }
  SECTION("μ out of range") {
    check_error(run({"round", "--format", "ps24"}, "1\n"), {"ps24", "24"});
    check_error(run({"round", "--format", "ps0"}, "1\n"), {"ps0"});
    check_error(run({"dot", "--format", "fp64"}, "1\n1\n"), {"fp64", "52"});
  }
  SECTION("unknown rounding") {
    check_error(run({"round", "--format", "bf16", "--rounding", "nearest"}, "1\n"), {"nearest", "rne"});
    check_error(run({"dot", "--format", "bf16", "--rounding", "nearest"}, "1\n1\n"), {"nearest"});
  }
  SECTION("sr bits out of range") {
    check_error(run({"round", "--format", "bf16", "--rounding", "sr", "--sr-bits", "33"}, "1\n"), {"33"});
    check_error(run({"round", "--format", "bf16", "--rounding", "sr", "--sr-bits", "17", "--sr-packed"}, "1\n"),
                {"sr_bits = 17 does not fit"});
    check_error(run({"round", "--format", "bf16", "--sr-bits", "8", "--sr-packed"}, "1\n"),
                {"sr_packed is for stochastic rounding"});
  }
  SECTION("unparsable number names its line") {
    check_error(run({"round", "--format", "bf16"}, "1\n2.5\n1.5x\n4\n"), {"line 3", "1.5x"});
    check_error(run({"round", "--format", "bf16"}, "1\n\n2\n"), {"line 2", "empty"});
    check_error(run({"round", "--format", "bf16"}, "0x1p+\n"), {"line 1"});
  }
  SECTION("dot: malformed vectors") {
    check_error(run({"dot", "--format", "fp32"}, "1,2,3\n1,2\n"), {"different lengths", "3", "2"});
    check_error(run({"dot", "--format", "fp32"}, "1,2\n1,zz\n"), {"line 2", "element 2", "zz"});
    check_error(run({"dot", "--format", "fp32"}, "1,,2\n1,2,3\n"), {"line 1", "element 2"});
    check_error(run({"dot", "--format", "fp32"}, "1,2\n"), {"two lines"});
    check_error(run({"dot", "--format", "fp32"}, "1\n2\n3\n"), {"two lines"});
  }
}

TEST_CASE("sweep config errors", "[cli][errors][sweep]") {
  const std::string good = "mu = [3]\nlengths = [16]\ntrials = 2\n";
  SECTION("malformed TOML names file and line") {
    const auto p = write_config("bad.toml", "mu = [3]\nlengths = [16]\ntrials = = 2\n");
    check_error(run({"sweep", p.string()}), {"bad.toml:3", "TOML"});
  }
  SECTION("unknown key names key and file") {
    const auto p = write_config("unknown.toml", good + "lenghts = [4]\n");
    check_error(run({"sweep", p.string()}), {"unknown.toml", "lenghts"});
  }
  SECTION("μ out of range") {
    const auto p = write_config("mu.toml", "mu = [3, 24]\nlengths = [16]\n");
    check_error(run({"sweep", p.string()}), {"mu.toml:1", "24", "1..23"});
  }
  SECTION("unknown rounding and distribution") {
    check_error(run({"sweep", write_config("rnd.toml", good + "rounding = \"up\"\n").string()}),
                {"rnd.toml:4", "'up'"});
    check_error(run({"sweep", write_config("dist.toml", good + "distribution = \"cauchy\"\n").string()}),
                {"dist.toml:4", "cauchy"});
  }
  SECTION("sr_bits too many for strict accumulation in ps23 (≤ 52 − 24)") {
    const auto p = write_config("srbits.toml", "mu = [4, 23]\nlengths = [16]\nrounding = \"sr\"\nsr_bits = 32\n");
    check_error(run({"sweep", p.string()}), {"srbits.toml:4", "sr_bits", "28"});
  }
  SECTION("wrong types, missing keys, missing file") {
    check_error(run({"sweep", write_config("type.toml", "mu = 3\nlengths = [16]\n").string()}), {"type.toml", "mu"});
    check_error(run({"sweep", write_config("nomu.toml", "lengths = [16]\n").string()}), {"nomu.toml", "mu"});
    check_error(run({"sweep", write_config("shape.toml", "mu = [3]\ngemm_shapes = [[4, 4]]\n").string()}),
                {"shape.toml:2"});
    check_error(run({"sweep", (scratch_dir() / "does-not-exist.toml").string()}), {"does-not-exist.toml"});
  }
}

TEST_CASE("round: exact values from the documented semantics", "[cli][round]") {
  const Case cases[] = {
      // bf16 (μ = 7): ties to even at 1 + 2^-8, up at 1 + 3·2^-9
      {"bf16", "rne", "1.00390625", "0x1p+0"},
      {"bf16", "rne", "0x1.018p+0", "0x1.02p+0"},
      {"bf16", "rz", "-1.00390625", "-0x1p+0"},
      {"bf16", "rd", "-1.00390625", "-0x1.02p+0"},
      {"bf16", "ru", "-1.00390625", "-0x1p+0"},
      {"bf16", "ru", "1.00390625", "0x1.02p+0"},
      {"bf16", "rna", "1.00390625", "0x1.02p+0"},
      // e4m3 (fn, overflow nan): 448 is the largest finite, 480 would be the NaN code
      {"e4m3", "rne", "464", "0x1.cp+8"},
      {"e4m3", "rne", "465", "nan"},
      {"e4m3", "rne", "-448", "-0x1.cp+8"},
      {"e4m3", "rz", "1000", "0x1.cp+8"},
      {"e4m3", "rne", "inf", "nan"},
      {"e4m3", "rne", "0x1p-9", "0x1p-9"},
      // fp16: 65520 is the tie between 65504 (odd) and 2^16 (even): overflows under rne
      {"fp16", "rne", "65520", "inf"},
      {"fp16", "rne", "65519", "0x1.ffcp+15"},
      {"fp16", "rz", "65520", "0x1.ffcp+15"},
      {"fp16", "ru", "-65520", "-0x1.ffcp+15"},
      {"fp16", "rd", "-65520", "-inf"},
      {"fp16", "rne", "-inf", "-inf"},
      {"fp16", "rne", "0x1p-25", "0x0p+0"},       // half the smallest subnormal: tie to 0
      {"fp16", "rne", "0x1.8p-25", "0x1p-24"},    // 0.75 of it: up
      {"fp16", "rne", "-0", "-0x0p+0"},
      {"fp16", "ru", "1e-30", "0x1p-24"},
      {"fp16", "rne", "nan", "nan"},
      {"fp16", "rne", "-nan", "nan"},             // canonical quiet NaN, positive
      // e5m2: largest finite 57344 (odd), 61440 ties to 2^16: overflow
      {"e5m2", "rne", "61440", "inf"},
      {"e5m2", "rne", "61439", "0x1.cp+15"},
      // ps4: rna/ro
      {"ps4", "rne", "0x1.08p+0", "0x1p+0"},
      {"ps4", "rna", "0x1.08p+0", "0x1.1p+0"},
      {"ps4", "ro", "0x1.04p+0", "0x1.1p+0"},
      {"ps4", "ro", "0x1.1p+0", "0x1.1p+0"},
      {"fp32", "ro", "0x1.0000001p+0", "0x1.000002p+0"},
      // exact values stay exact under the stochastic modes
      {"bf16", "sr", "1.5", "0x1.8p+0"},
      {"bf16", "sre", "-0.75", "-0x1.8p-1"},
      {"fp64", "rne", "0x1.fffffffffffffp+1023", "0x1.fffffffffffffp+1023"},
  };
  // One run per (format, mode, path), the cases of a group as consecutive lines.
  std::vector<std::pair<std::string, std::string>> groups;
  for (const Case& c : cases)
    if (std::find(groups.begin(), groups.end(), std::pair<std::string, std::string>(c.format, c.mode)) == groups.end())
      groups.emplace_back(c.format, c.mode);
  for (const auto& [f, m] : groups) {
    std::vector<std::string> in, want;
    for (const Case& c : cases)
      if (f == c.format && m == c.mode) in.push_back(c.in), want.push_back(c.out);
    for (bool ref : {false, true}) {
      std::vector<std::string> args{"round", "--format", f, "--rounding", m, "--seed", "5"};
      if (ref) args.push_back("--reference");
      const auto r = run(args, join(in));
      INFO(f << " " << m << (ref ? " --reference" : "") << " " << flat(r.err));
      CHECK(r.status == 0);
      CHECK(r.err.empty());
      const auto got = lines(r.out);
      REQUIRE(got.size() == in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        INFO("input " << in[i]);
        CHECK(got[i] == want[i]);
      }
    }
  }
}

// Inputs in [q, 2q), q the smallest subnormal of the target, where the container's exponent field
// is even: the truncated value q is one quantum, odd (a regression of round.h's lsb at s = MANT).
TEST_CASE("round: parity of the smallest subnormal", "[cli][round]") {
  const Case cases[] = {
      {"bf16", "rne", "0x1.8p-133", "0x1p-132"},
      {"e4m3", "rne", "0x1.8p-9", "0x1p-8"},
      {"e4m3", "ro", "0x1.1p-9", "0x1p-9"},
      {"bf16", "ro", "1e-40", "0x1p-133"},
  };
  for (const Case& c : cases) {
    INFO(c.format << " " << c.mode << " " << c.in);
    const auto r = run({"round", "--format", c.format, "--rounding", c.mode}, std::string(c.in) + "\n");
    CHECK(lines(r.out) == std::vector<std::string>{c.out});
  }
}

TEST_CASE("round: fast path equals --reference", "[cli][round]") {
  std::vector<std::string> in{"0", "-0", "inf", "-inf", "nan", "1", "-1", "0x1.0000000000001p+0", "65520", "464",
                              "1e-40", "-3.75", "1e300", "-1e-310", "0x1.fffffffffffffp+1023", "3.14159",
                              "0.1", "-2.5e-7", "1234567.875", "0x1.00ffp-126"};
  uint64_t s = 88172645463325252ull;  // xorshift: fixed, varied inputs
  for (int i = 0; i < 200; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", std::ldexp(double(s >> 11) * 0x1p-53 * ((s & 1) ? -1 : 1), int(s % 80) - 40));
    in.push_back(buf);
  }
  const std::string input = join(in);
  for (const char* f : {"bf16", "fp16", "e4m3", "ps3", "e3m2"}) {
    for (const char* m : {"rne", "rna", "rz", "ru", "rd", "ro", "sr", "sre"}) {
      std::vector<std::string> args{"round", "--format", f, "--rounding", m, "--seed", "42", "--stream", "3"};
      if (std::string(m) == "sr") args.insert(args.end(), {"--sr-bits", "13"});
      if (std::string(m) == "sre" && std::string(f) == "bf16") args.insert(args.end(), {"--sr-bits", "8", "--sr-packed"});
      if (std::string(m) == "sr" && std::string(f) == "e4m3") args.insert(args.end(), {"--sr-packed"});  // 13 bits: 2 a word
      const auto fast = run(args, input);
      args.push_back("--reference");
      const auto ref = run(args, input);
      INFO(f << " " << m << " " << flat(fast.err + ref.err));
      REQUIRE(fast.status == 0);
      REQUIRE(ref.status == 0);
      REQUIRE(lines(fast.out).size() == in.size());
      const auto a = lines(fast.out), b = lines(ref.out);
      for (size_t i = 0; i < in.size(); ++i) {
        INFO("line " << i + 1 << ": " << in[i]);
        CHECK(a[i] == b[i]);
      }
    }
  }
}

TEST_CASE("round: stochastic results depend on (seed, index), not on threads", "[cli][round]") {
  std::vector<std::string> in;
  for (int i = 0; i < 40000; ++i) in.push_back(std::to_string(1.0 + (i % 997) * 1e-4));  // > parallel threshold
  const std::string input = join(in);
  const auto one = run({"round", "-f", "ps4", "-r", "sr", "--seed", "7", "--threads", "1"}, input);
  const auto two = run({"round", "-f", "ps4", "-r", "sr", "--seed", "7", "--threads", "2"}, input);
  const auto other = run({"round", "-f", "ps4", "-r", "sr", "--seed", "8", "--threads", "2"}, input);
  REQUIRE(one.status == 0);
  CHECK(lines(one.out).size() == in.size());
  CHECK((one.out == two.out));    // (( )): compare without printing 40000 lines
  CHECK((one.out != other.out));
}

TEST_CASE("round: empty input", "[cli][round]") {
  const auto r = run({"round", "--format", "bf16"}, "");
  CHECK(r.status == 0);
  CHECK(r.out.empty());
  CHECK(r.err.empty());
  const auto ws = run({"round", "--format", "bf16"}, "  1.5  \r\n\t-2\n");  // surrounding whitespace is trimmed
  CHECK(ws.status == 0);
  CHECK(lines(ws.out) == std::vector<std::string>{"0x1.8p+0", "-0x1p+1"});
  const auto tail = run({"round", "--format", "bf16"}, "1.5\n\n  \n");  // trailing blank lines are ignored
  CHECK(tail.status == 0);
  CHECK(lines(tail.out) == std::vector<std::string>{"0x1.8p+0"});
  const auto blank = run({"round", "--format", "bf16"}, "\n\n");
  CHECK(blank.status == 0);
  CHECK(blank.out.empty());
}

TEST_CASE("dot: hand-computed cases", "[cli][dot]") {
  struct D {
    const char* format;
    const char* mode;
    const char* in;
    const char* out;
  };
  const D cases[] = {
      // ps2 (precision 3): 1 + 1/8 is a tie between 1 (even) and 1.25; stays 1 under rne.
      {"ps2", "rne", "1,1,1\n1,0.125,0.125\n", "0x1p+0"},
      // ru: 1 → 1.125 ↑ 1.25 → 1.375 ↑ 1.5
      {"ps2", "ru", "1,1,1\n1,0.125,0.125\n", "0x1.8p+0"},
      {"fp32", "rne", "1,1,1\n1,0.125,0.125\n", "0x1.4p+0"},
      {"fp32", "rne", "1, 2, 3\n4, 5, 6\n", "0x1p+5"},
      {"fp32", "rne", "0x1p+0,-0x1p+0\n0x1p+0,0x1p+0\n", "0x0p+0"},
      // operands are binary32 via strtof: 0.1f exactly
      {"fp32", "rne", "0.1\n1\n", "0x1.99999ap-4"},
      // strtof rounds the decimal once: just above the midpoint of 1 and 1 + 2^-23 goes up
      // (strtod then a cast to float would tie to 1).
      {"fp32", "rne", "1.00000005960464477539062501\n1\n", "0x1.000002p+0"},
      // fused: 3·(1/3 in binary32) is computed exactly, then rounded once to bf16
      {"bf16", "rne", "3\n0x1.555556p-2\n", "0x1p+0"},
      // empty vectors: the empty sum
      {"fp32", "rne", "\n\n", "0x0p+0"},
      // trailing blank lines are ignored; no trailing newline is needed
      {"fp32", "rne", "1,2\n3,4\n\n \n", "0x1.6p+3"},
      {"fp32", "rne", "1,2\n3,4", "0x1.6p+3"},
  };
  for (const D& c : cases) {
    for (bool ref : {false, true}) {
      std::vector<std::string> args{"dot", "--format", c.format, "--rounding", c.mode};
      if (ref) args.push_back("--reference");
      INFO(c.format << " " << c.mode << " " << flat(c.in) << (ref ? " --reference" : ""));
      const auto r = run(args, c.in);
      CHECK(r.status == 0);
      CHECK(r.err.empty());
      CHECK(lines(r.out) == std::vector<std::string>{c.out});
    }
  }
}

TEST_CASE("dot: fast path equals --reference", "[cli][dot]") {
  std::string x, y;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 300; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const double a = double(s >> 40) * 0x1p-24 - 0.5, b = double((s >> 8) & 0xffffff) * 0x1p-20 - 8;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? "," : "", a);
    x += buf;
    std::snprintf(buf, sizeof buf, "%s%a", i ? "," : "", b);
    y += buf;
  }
  const std::string input = x + "\n" + y + "\n";
  struct Combo {
    const char* format;
    const char* mode;
    const char* acc;
  };
  std::vector<Combo> combos;
  for (const char* f : {"bf16", "ps3"})
    for (const char* m : {"rne", "rna", "rz", "ru", "rd", "ro", "sr", "sre"}) combos.push_back({f, m, "strict"});
  for (const char* f : {"fp16", "tf32"})
    for (const char* m : {"rne", "ro", "sr"})
      for (const char* acc : {"unfused", "blocked"}) combos.push_back({f, m, acc});
  for (const Combo& c : combos) {
    std::vector<std::string> args{"dot", "-f", c.format, "-r", c.mode, "--accumulation", c.acc, "--block", "7",
                                  "--seed", "11", "--sr-bits", "20"};
    const auto fast = run(args, input);
    args.push_back("--reference");
    const auto ref = run(args, input);
    INFO(c.format << " " << c.mode << " " << c.acc << " " << flat(fast.err + ref.err));
    REQUIRE(fast.status == 0);
    REQUIRE(ref.status == 0);
    CHECK(lines(fast.out) == lines(ref.out));
  }
}

// Overflow of an e4m3 accumulator gives the canonical (positive) quiet NaN, on both paths.
TEST_CASE("dot: overflow to NaN", "[cli][dot]") {
  const auto fast = run({"dot", "--format", "e4m3"}, "400,400\n1,1\n");
  CHECK(fast.status == 0);
  CHECK(lines(fast.out) == std::vector<std::string>{"nan"});
  const auto ref = run({"dot", "--format", "e4m3", "--reference"}, "400,400\n1,1\n");
  CHECK(ref.status == 0);
  CHECK(lines(ref.out) == std::vector<std::string>{"nan"});
}

TEST_CASE("formats lists every named format", "[cli][formats]") {
  const auto r = run({"formats"});
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  const auto rows = lines(r.out);
  int named = 0;
  for (const auto& e : fs::directory_iterator(fs::path(MANTIS_SOURCE_DIR) / "formats")) {
    if (e.path().extension() != ".toml") continue;
    ++named;
    const std::string name = e.path().stem().string();
    INFO(name);
    CHECK(std::any_of(rows.begin(), rows.end(), [&](const std::string& l) { return l.rfind(name + " ", 0) == 0; }));
  }
  CHECK(named >= 7);
  for (const char* n : {"ps4 ", "ps13 "})
    CHECK(std::any_of(rows.begin(), rows.end(), [&](const std::string& l) { return l.rfind(n, 0) == 0; }));
  for (const char* col : {"μ", "emin", "emax", "subnormals", "specials", "overflow", "largest finite",
                          "smallest normal", "smallest subnormal", "unit roundoff", "t = μ+1"})
    CHECK(r.out.find(col) != std::string::npos);
  CHECK(r.out.find("65504") != std::string::npos);  // fp16's largest finite
  CHECK(r.out.find("448") != std::string::npos);    // e4m3's

  const auto one = run({"formats", "e4m3"});
  CHECK(one.status == 0);
  const auto one_rows = lines(one.out);
  CHECK(std::count_if(one_rows.begin(), one_rows.end(), [](const std::string& l) { return l.rfind("e4m3 ", 0) == 0; }) == 1);
  CHECK(std::none_of(one_rows.begin(), one_rows.end(), [](const std::string& l) { return l.rfind("bf16 ", 0) == 0; }));
  check_error(run({"formats", "nosuch"}), {"nosuch"});
}

TEST_CASE("verify --exhaustive --limit: no mismatches", "[cli][verify]") {
  for (const char* m : {"rne", "rz", "sr"}) {
    const auto r = run({"verify", "--exhaustive", "--format", "bf16", "--rounding", m, "--limit", "100000",
                        "--threads", "2", "--seed", "3"});
    INFO(m << " " << flat(r.out + r.err));
    CHECK(r.status == 0);
    CHECK(r.out.find("mismatches: 0") != std::string::npos);
    CHECK(r.out.find("elapsed") != std::string::npos);
  }
  const auto d = run({"verify", "--exhaustive", "--format", "fp16", "--container", "double", "--limit", "50000"});
  INFO(flat(d.out + d.err));
  CHECK(d.status == 0);
  CHECK(d.out.find("mismatches: 0") != std::string::npos);
}

TEST_CASE("verify --function: crmath's exp, erf and tanh against MPFR", "[cli][verify]") {
  for (const char* f : {"exp", "erf", "tanh"}) {
    const auto r = run({"verify", "--exhaustive", "--function", f, "--limit", "200000", "--threads", "2",
                        "--exceptions"});
    INFO(f << " " << flat(r.out + r.err));
    CHECK(r.status == 0);
    CHECK(r.out.find("mismatches: 0") != std::string::npos);
    CHECK(r.out.find(std::string("cr_") + f + "f") != std::string::npos);
    CHECK(r.out.find("_EXCEPTIONS") != std::string::npos);  // the table lines (none needed here)
  }
  check_error(run({"verify", "--exhaustive", "--function", "sin"}), {"sin", "exp, erf, tanh"});
  check_error(run({"verify", "--exhaustive", "--function", "exp", "--format", "bf16"}), {"--format", "--function"});
  check_error(run({"verify", "--exhaustive"}), {"--format", "--function"});
}

TEST_CASE("sweep writes its results atomically", "[cli][sweep]") {
  const auto cfg = write_config("tiny.toml",
                                "# tiny sweep\nmu = [2, 8]\nlengths = [16, 64]\ngemm_shapes = [[4, 4, 32]]\n"
                                "trials = 3\nseed = 1\nrounding = \"rne\"\ndistribution = \"normal\"\n");
  const fs::path out = scratch_dir() / "sweep-out" / "nested";
  for (int pass = 0; pass < 2; ++pass) {  // the second run reuses the stored cells and replaces the set's files
    const auto r = run({"sweep", cfg.string(), "--out", out.string(), "--threads", "2"});
    INFO(flat(r.out + r.err));
    REQUIRE(r.status == 0);
    CHECK(r.out.find("n=16") != std::string::npos);
    CHECK(r.out.find("4x4x32") != std::string::npos);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    // one result set beside its cells, and no temporary files left
    CHECK(names == std::vector<std::string>{"cells", "manifest.json", "results.csv", "results.json"});
    CHECK(slurp(out / "manifest.json").find("\"results.csv\": \"") != std::string::npos);  // its SHA-256
    const auto csv = lines(slurp(out / "results.csv"));
    REQUIRE(csv.size() == 1 + 2 * 3);
    CHECK(csv[0] == "mu,kind,M,N,K,trials,median_rel_err,min_rel_err,max_rel_err,gamma");
    CHECK(csv[1].rfind("2,dot,1,1,16,3,", 0) == 0);
    CHECK(csv[3].rfind("2,gemm,4,4,32,3,", 0) == 0);
    const std::string json = slurp(out / "results.json");
    CHECK(json.rfind("{", 0) == 0);
    CHECK(json.find("\"results\"") != std::string::npos);
    CHECK(json.find("\"median_rel_err\"") != std::string::npos);
  }
}

TEST_CASE("bench --json shapes", "[cli][bench]") {
  const auto r = run({"bench", "round", "--json", "--reps", "1", "--n", "1000", "--threads", "1"});
  INFO(flat(r.out + r.err));
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("{\"results\":[{\"container\":\"double\",\"format\":\"bf16\",\"rounding\":\"rne\",\"sr_bits\":32,"
                    "\"sr_packed\":false,\"threads\":1,\"ns_per_elem\":",
                    0) == 0);
  CHECK(r.out.find("\"rounding\":\"sr\",\"sr_bits\":8,\"sr_packed\":true") != std::string::npos);
  CHECK(r.out.find("\"memcpy_ns_per_elem\":") != std::string::npos);
  CHECK(r.out.find("\"container\":\"float\",\"format\":\"ps4\",\"rounding\":\"sr\"") != std::string::npos);
  const auto g = run({"bench", "gemm", "--json", "--reps", "1", "--sizes", "16", "--threads", "1"});
  INFO(flat(g.out + g.err));
  REQUIRE(g.status == 0);
  CHECK(g.out.rfind("{\"results\":[{\"shape\":[16,16,16],\"threads\":1,\"case\":\"strict ps4 rne\",", 0) == 0);
  const auto gj = nlohmann::json::parse(g.out);
  std::vector<std::string> cases;
  for (auto& r : gj["results"]) {
    cases.push_back(r["case"]);
    CHECK(r["gflops"].get<double>() > 0);
    CHECK(r["slowdown"].get<double>() > 0);
  }
  CHECK(cases == std::vector<std::string>{"strict ps4 rne", "strict ps4 portable", "strict ps4 sr", "strict ps4 sr18",
                                          "strict ps4 sr8 packed", "unfused ps4 rne", "blocked ps4 rne", "strict bf16 rne", "e4m3 in, ps4 rne",
                                          "h100 fp16 -> fp32", "h100 e4m3 -> fp32"});
  CHECK(gj["results"][8]["input"] == "e4m3");
  CHECK(gj["results"][7]["accumulator"] == "bf16");
  CHECK(gj["results"][1]["kernel"] == "portable");
  CHECK(gj["results"][3]["sr_bits"] == 18);
  CHECK(gj["results"][4]["sr_packed"] == true);
  for (auto& r : gj["results"])  // the kernel a case ran: one of the three, named
    CHECK((r["kernel"] == "portable" || r["kernel"] == "avx512-binary32" || r["kernel"] == "avx512-binary64"));
}

TEST_CASE("an unwritable standard output is status 2 (not 0 with truncated output)", "[cli][errors]") {
  REQUIRE(fs::exists("/dev/full"));
  const std::string full = "/dev/full";  // every write fails with ENOSPC
  check_error(run({"formats"}, "", full), {"cannot write standard output"});
  check_error(run({"formats", "bf16"}, "", full), {"cannot write standard output"});
  check_error(run({"tokenize", "-t", "bytes"}, "hello\n", full), {"cannot write standard output"});
  check_error(run({"detokenize", "-t", "bytes"}, "104 105\n", full), {"cannot write standard output"});
  check_error(run({"round", "--format", "bf16"}, "1\n2\n", full), {"cannot write standard output"});
  check_error(run({"dot", "--format", "ps4"}, "1,2\n3,4\n", full), {"cannot write standard output"});
  check_error(run({"--help"}, "", full), {"cannot write standard output"});
}

TEST_CASE("seeds and streams outside 0..2^64-1 are rejected, not wrapped", "[cli][errors]") {
  for (const char* opt : {"--seed", "--stream"})
    for (const char* bad : {"-1", "18446744073709551616", "99999999999999999999999", "1e3", "+1", "0x10"}) {
      check_error(run({"round", "--format", "bf16", "--rounding", "sr", opt, bad}, "1\n"), {opt, bad});
      check_error(run({"dot", "--format", "ps4", "--rounding", "sr", opt, bad}, "1\n1\n"), {opt, bad});
      check_error(run({"verify", "--exhaustive", "--format", "bf16", "--rounding", "sr", "--limit", "16", opt, bad}),
                  {opt, bad});
    }
  for (const char* opt : {"--seed", "--stream"}) {  // the ends of the range are valid
    CHECK(run({"round", "--format", "bf16", "--rounding", "sr", opt, "18446744073709551615"}, "1\n").status == 0);
    CHECK(run({"round", "--format", "bf16", "--rounding", "sr", opt, "0"}, "1\n").status == 0);
  }
}

TEST_CASE("format names and files: huge numbers / directories / endless files", "[cli][errors]") {
  check_error(run({"round", "--format", "ps99999999999999999999"}, "1\n"), {"ps99999999999999999999", "1..23"});
  check_error(run({"round", "--format", "e99999999999m3"}, "1\n"), {"exponent_bits = 99999999999", "2..11"});
  check_error(run({"round", "--format", "e5m99999999999"}, "1\n"), {"μ = 99999999999", "0..52"});
  check_error(run({"formats", "ps99999999999999999999"}), {"1..23"});
  const std::string dir = scratch_dir().string();
  check_error(run({"round", "--format", dir}, "1\n"), {dir, "is a directory"});
  check_error(run({"round", "--format", "/dev/zero"}, "1\n"), {"/dev/zero", "is a character device, not a regular file"});
}

namespace {
// A .npy of float32 values, shape (n,), as numpy writes it (version 1.0, data at a multiple of 64).
std::string npy_f4(const std::vector<float>& v) {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(v.size()) + ",), }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::string b = std::string("\x93NUMPY") + char(1) + char(0) + char(h.size() & 0xff) + char(h.size() >> 8) + h;
  return b.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
}  // namespace

// Issue 32: `round --in /dev/zero` grew without bound, a FIFO blocked forever, `round < /dev/zero`
// spun; `--out /dev/full` replaced the device node with a regular file, exit 0.
TEST_CASE("special files: inputs are refused by name, stdin is bounded, outputs are never replaced", "[cli][errors]") {
  const fs::path d = scratch_dir() / "special";
  fs::create_directories(d);
  const std::string fifo = (d / "pipe").string();
  fs::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // no writer: a read would block forever
  const std::string x = (d / "x.npy").string(), y = (d / "y.npy").string();
  spit(x, npy_f4({1.0f, 2.5f, -3.25f, 1e-3f}));
  for (const char* cmd : {"round", "quantize"}) {
    auto args = [&](const std::string& in, const std::string& out) {
      return std::string(cmd) == "round" ? std::vector<std::string>{"round", "--format", "bf16", "--in", in, "--out", out}
                                         : std::vector<std::string>{"quantize", "--scheme", "mxfp4", "--in", in, "--out", out};
    };
    check_error(run(args("/dev/zero", y)), {"/dev/zero is a character device, not a regular file"});
    check_error(run(args(fifo, y)), {fifo + " is a FIFO (named pipe), not a regular file"});
    check_error(run(args(d.string(), y)), {d.string() + " is a directory, not a regular file"});
    CHECK(!fs::exists(y));
    // outputs: only this test's own special files are tried (a broken check would replace /dev/null)
    check_error(run(args(x, fifo)), {"--out '" + fifo + "' is a FIFO (named pipe), not a regular file"});
    check_error(run(args(x, d.string())), {"--out '" + d.string() + "' is a directory, not a regular file"});
    CHECK(fs::is_fifo(fifo));
    CHECK(fs::is_directory(d));
    CHECK(run(args(x, y)).status == 0);
    CHECK(fs::is_regular_file(y));
    fs::remove(y);
  }
  // (character devices as outputs: test_io's check_output_path case; the same rule, not tried here)
  // standard input is bounded like every text input
  check_error(run({"round", "--format", "bf16"}, "", "", "/dev/zero"), {"standard input holds more than 67108864 bytes"});
  check_error(run({"dot", "--format", "ps4"}, "", "", "/dev/zero"), {"standard input holds more than 67108864 bytes"});
  fs::remove(fifo);
}

TEST_CASE("control bytes of echoed input are escaped: the message stays whole", "[cli][errors]") {
  const auto r = run({"round", "--format", "bf16"}, std::string("1\0abc\x1b[1m\n", 10));
  check_error(r, {"'1\\x00abc\\x1b[1m'"});
  CHECK(r.err.find('\0') == std::string::npos);
  CHECK(r.err.find('\x1b') == std::string::npos);
  check_error(run({"dot", "--format", "ps4"}, std::string("1,\0\n1,2\n", 8)), {"element 2", "'\\x00'"});
  check_error(run({"detokenize", "-t", "bytes"}, std::string("65 6\0", 5)), {"token 1", "'6\\x00'"});
}

TEST_CASE("round / dot: decimals longer than 4096 characters are valid numbers", "[cli][round]") {
  // 0.111… (5000 ones) is 1/9 + O(10^-5000): 0x1.c71c7…p-4, which bf16 rounds up to 0x1.c8p-4.
  const std::string ninth = "0." + std::string(5000, '1');
  const auto r = run({"round", "--format", "bf16"}, ninth + "\n");
  INFO(flat(r.err));
  CHECK(r.status == 0);
  CHECK(r.out == "0x1.c8p-4\n");
  // 1 + 10^-5000 is 1 in binary32; 1·1 accumulated in ps4 is 1.
  const auto d = run({"dot", "--format", "ps4"}, "1." + std::string(5000, '0') + "1\n1\n");
  INFO(flat(d.err));
  CHECK(d.status == 0);
  CHECK(d.out == "0x1p+0\n");
}

TEST_CASE("mantis help and no subcommand: the list of commands", "[cli][help]") {
  const auto h = run({"help"});
  INFO(flat(h.err));
  CHECK(h.status == 0);
  CHECK(h.err.empty());
  for (const char* sub : {"formats", "round", "dot", "bench", "verify", "sweep", "tokenize", "detokenize", "shards",
                          "logits", "eval", "train", "lamp", "help"})
    CHECK(h.out.find(std::string("\n  ") + sub + " ") != std::string::npos);
  // no subcommand: still a usage error (status 2, one line), which names `mantis help` and the commands
  const auto none = run({});
  check_error(none, {"subcommand", "mantis help", "formats", "lamp"});
  check_error(run({"help", "extra"}), {"extra"});
}

TEST_CASE("progress: plain lines when stderr is not a terminal, nothing with --quiet", "[cli][progress]") {
  const auto cfg = write_config("progress.toml", "mu = [2, 8]\nlengths = [16]\ntrials = 2\n");
  const auto plain = run({"sweep", cfg.string()});
  INFO(flat(plain.err));
  REQUIRE(plain.status == 0);
  // stderr is a file here: the final line, with done/total, rate and ETA
  CHECK(plain.err.find("sweep: 2/2 cells (100.0 %), ") != std::string::npos);
  CHECK(plain.err.find("cells/s, elapsed ") != std::string::npos);
  CHECK(plain.err.find("ETA ") != std::string::npos);
  CHECK(plain.err.find('\r') == std::string::npos);  // no bar
  const auto quiet = run({"sweep", cfg.string(), "--quiet"});
  REQUIRE(quiet.status == 0);
  CHECK(quiet.err.empty());
  CHECK(lines(quiet.out)[0] == lines(plain.out)[0]);  // stdout is the same in every mode
  const auto v = run({"verify", "--exhaustive", "--format", "bf16", "--limit", "1000"});
  CHECK(v.err.find("verify: ") != std::string::npos);
  CHECK(v.err.find("patterns (100.0 %)") != std::string::npos);
  CHECK(run({"verify", "--exhaustive", "--format", "bf16", "--limit", "1000", "-q"}).err.empty());
  const auto b = run({"bench", "gemm", "--json", "--reps", "1", "--sizes", "8", "--threads", "1", "-q"});
  CHECK(b.err.empty());
}

TEST_CASE("manifests: sweep and bench record the command, commit, build, CPU, seeds and timings", "[cli][manifest]") {
  const auto cfg = write_config("manifest.toml", "mu = [4]\nlengths = [16]\ntrials = 2\nseed = 5\n");
  const fs::path out = scratch_dir() / "sweep-manifest";
  const auto r = run({"sweep", cfg.string(), "--out", out.string(), "-q"});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  const auto m = nlohmann::json::parse(slurp(out / "manifest.json"));
  check_manifest_header(m, "mantis sweep");
  CHECK(m["command"].get<std::string>().find("sweep " + cfg.string()) != std::string::npos);
  CHECK(m["seeds"]["data"] == 5);
  CHECK(m["config_file"] == cfg.string());  // the fields it had before
  CHECK(m["files"]["results.csv"].is_string());

  const auto b = run({"bench", "round", "--json", "--reps", "1", "--n", "100", "--threads", "1", "-q"});
  INFO(flat(b.err));
  REQUIRE(b.status == 0);
  const auto j = nlohmann::json::parse(b.out);
  CHECK(j["results"].size() == 18);  // 2 containers × 3 formats × (rne, sr, sr8p)
  check_manifest_header(j["manifest"], "mantis bench round");
  CHECK(j["manifest"]["settings"]["n"] == 100);
  const fs::path bout = scratch_dir() / "bench-out";
  REQUIRE(run({"bench", "gemm", "--reps", "1", "--sizes", "8", "--threads", "1", "-q", "-o", bout.string()}).status == 0);
  const auto bm = nlohmann::json::parse(slurp(bout / "manifest.json"));
  check_manifest_header(bm, "mantis bench gemm");
  CHECK(nlohmann::json::parse(slurp(bout / "results.json"))["results"][0]["shape"][0] == 8);
}

TEST_CASE("mu-sweep cells: shards and a merge give the unsharded result set; keys, partial merges", "[cli][sweep]") {
  const auto cfg = write_config("cells.toml", "mu = [3, 7, 10]\nlengths = [16, 64]\ngemm_shapes = [[4, 4, 16]]\ntrials = 3\n");
  const fs::path full = scratch_dir() / "mu-full", sh = scratch_dir() / "mu-shards";
  fs::remove_all(full), fs::remove_all(sh);
  REQUIRE(run({"mu-sweep", cfg.string(), "--out", full.string(), "-q"}).status == 0);
  const auto list = run({"mu-sweep", cfg.string(), "--cells"});
  CHECK(list.out == "0\tps3\n1\tps7\n2\tps10\n");
  for (const char* k : {"0/2", "1/2"}) {
    const auto r = run({"mu-sweep", cfg.string(), "--out", sh.string(), "--shard", k, "-q"});
    INFO(flat(r.err));
    REQUIRE(r.status == 0);
    CHECK(r.out.find("computed") != std::string::npos);
    CHECK(!fs::exists(sh / "results.csv"));
  }
  // a merge with a cell missing is refused, and marked when allowed
  fs::rename(sh / "cells" / "1.json", sh / "one.json");
  check_error(run({"mu-sweep", cfg.string(), "--out", sh.string(), "--merge", "-q"}), {"1"});
  REQUIRE(run({"mu-sweep", cfg.string(), "--out", sh.string(), "--merge", "--allow-partial", "-q"}).status == 0);
  const auto partial = nlohmann::json::parse(slurp(sh / "manifest.json"));
  CHECK(partial["partial"] == true);
  CHECK(partial["cells_missing"] == nlohmann::json::array({1}));
  CHECK(slurp(sh / "results.csv").find("\n7,") == std::string::npos);
  fs::rename(sh / "one.json", sh / "cells" / "1.json");
  REQUIRE(run({"mu-sweep", cfg.string(), "--out", sh.string(), "--merge", "-q"}).status == 0);
  CHECK(slurp(sh / "results.csv") == slurp(full / "results.csv"));
  CHECK(nlohmann::json::parse(slurp(sh / "results.json"))["results"] ==
        nlohmann::json::parse(slurp(full / "results.json"))["results"]);
  CHECK(nlohmann::json::parse(slurp(sh / "manifest.json"))["partial"] == false);
  // a stored cell of another configuration names the differing field; a choice of cells needs --out
  const auto other = write_config("cells.toml", "mu = [3, 7, 10]\nlengths = [16, 64]\ngemm_shapes = [[4, 4, 16]]\ntrials = 4\n");
  check_error(run({"mu-sweep", other.string(), "--out", sh.string(), "-q"}), {"cells/0.json", "trials", "--overwrite"});
  check_error(run({"mu-sweep", cfg.string(), "--shard", "0/2"}), {"--out"});
}

namespace {

// A safetensors file of F32 tensors {name, shape, values}, written here byte by byte.
struct StTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
void write_st(const fs::path& p, const std::vector<StTensor>& ts) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  size_t off = 0;
  for (auto& t : ts) {
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + 4 * t.data.size()}}};
    off += 4 * t.data.size();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(header.size() >> (8 * i)));
  bytes += header;
  for (auto& t : ts) bytes.append(reinterpret_cast<const char*>(t.data.data()), 4 * t.data.size());
  spit(p, bytes);
}

}  // namespace

TEST_CASE("optim replay: --json fields; bad input is one line, exit 2", "[cli][optim]") {
  const fs::path dir = scratch_dir() / "optim-replay";
  fs::create_directories(dir);
  const std::vector<float> w = {0.5f, -0.25f, 1, 2, 0.125f, -1}, b = {0.1f, 0.2f};
  write_st(dir / "p.safetensors", {{"w", {3, 2}, w}, {"b", {2}, b}});
  const std::vector<float> gw = {0.01f, -0.02f, 0.03f, 0.04f, -0.05f, 0.06f}, gb = {0.5f, -0.5f};
  write_st(dir / "g.safetensors", {{"t.0.w", {3, 2}, gw}, {"t.0.b", {2}, gb}, {"t.1.w", {3, 2}, gw},
                                   {"t.1.b", {2}, gb}});
  const std::string p = (dir / "p.safetensors").string(), g = (dir / "g.safetensors").string(),
                    out = (dir / "out.safetensors").string();
  const std::vector<std::string> base = {"optim", "replay", "--optimizer", "adamw", "--params", p, "--grads", g};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run(a);
  };
  const auto r = with({"--steps", "2", "--out", out, "--json", "--lr", "0.01", "--beta1", "0.8"});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["optimizer"] == "adamw");
  CHECK(j["steps"] == 2);
  CHECK(j["params"] == 8);
  CHECK(j["state_bytes"] == 8 * 8 + 8);  // m, v in binary32 + the step count
  CHECK(j["bytes_per_param"].get<double>() == 72.0 / 8);
  CHECK(!j.contains("codebook"));
  CHECK(fs::file_size(out) > 0);

  auto one_line_error = [&](const Result& e, const std::string& what) {
    INFO(flat(e.err));
    CHECK(e.status == 2);
    CHECK(e.out.empty());
    CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);
    CHECK(e.err.find(what) != std::string::npos);
  };
  one_line_error(with({"--steps", "3"}), "missing step tensor t.2.w");
  one_line_error(with({"--steps", "0"}), "--steps 0 must be ≥ 1");
  one_line_error(with({"--steps", "1"}), "step 1 is beyond --steps 1");
  one_line_error(run({"optim", "replay", "--optimizer", "lion", "--params", p, "--grads", g, "--steps", "2"}),
                 "unknown optimizer 'lion' (known: adamw");
  write_st(dir / "g-bad.safetensors", {{"t.0.w", {2, 3}, gw}, {"t.0.b", {2}, gb}});
  one_line_error(run({"optim", "replay", "--optimizer", "adamw", "--params", p, "--grads",
                      (dir / "g-bad.safetensors").string(), "--steps", "1"}),
                 "tensor t.0.w: shape [2,3], but parameter w has shape [3,2]");
  write_st(dir / "g-extra.safetensors", {{"t.0.w", {3, 2}, gw}, {"t.0.b", {2}, gb}, {"t.0.c", {2}, gb}});
  one_line_error(run({"optim", "replay", "--optimizer", "adamw", "--params", p, "--grads",
                      (dir / "g-extra.safetensors").string(), "--steps", "1"}),
                 "tensor t.0.c: no parameter c in");
}

TEST_CASE("bench optim: every optimizer beside AdamW at each thread count, and the codebook DP", "[cli][optim]") {
  const auto r = run({"bench", "optim", "--params", "1000", "--reps", "1", "--dp-bins", "64", "--threads", "1,2",
                      "--json", "-q"});
  INFO(flat(r.err));
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const auto& res = j["results"];
  REQUIRE(res.size() >= 3);
  CHECK(res[0]["optimizer"] == "adamw");  // measured first: the others' ratios need it
  CHECK(res[0]["threads"] == 1);
  CHECK(res[1]["optimizer"] == "adamw");
  CHECK(res[1]["threads"] == 2);
  for (size_t i = 0; i + 1 < res.size(); ++i) {
    INFO(res[i].dump());
    CHECK(res[i]["benchmark"] == "step");
    CHECK(res[i]["params"].get<uint64_t>() >= 1000);
    CHECK(res[i]["step_seconds"].get<double>() >= 0);
    CHECK(res[i]["vs_adamw"].is_number());
    CHECK(res[i]["state_bytes"].get<uint64_t>() >= 8);
  }
  CHECK(res[0]["state_bytes"] == 8 * res[0]["params"].get<uint64_t>() + 8);
  CHECK(res.back()["benchmark"] == "gefen_codebook_dp");
  CHECK(res.back()["bins"] == 64);
  CHECK(res.back()["K"] == 256);
  check_manifest_header(j["manifest"], "mantis bench optim");
  CHECK(j["manifest"]["settings"]["params"] == res[0]["params"]);
  const auto bad = run({"bench", "optim", "--params", "0"});
  CHECK(bad.status != 0);
  // --optimizers: those, after the adamw baseline; an unregistered name is a one-line error
  const auto some = run({"bench", "optim", "--params", "1000", "--reps", "1", "--dp-bins", "64", "--threads", "1",
                         "--optimizers", "sm3,gefen", "--json", "-q"});
  REQUIRE(some.status == 0);
  const auto js = nlohmann::json::parse(some.out)["results"];
  REQUIRE(js.size() == 4);
  CHECK(js[0]["optimizer"] == "adamw");
  CHECK(js[1]["optimizer"] == "gefen");  // registry order
  CHECK(js[2]["optimizer"] == "sm3");
  const auto lion = run({"bench", "optim", "--optimizers", "lion"});
  INFO(flat(lion.err));
  CHECK(lion.status == 2);
  CHECK(std::count(lion.err.begin(), lion.err.end(), '\n') == 1);
  CHECK(lion.err.find("bench optim --optimizers: [optimizer] name = 'lion'") != std::string::npos);
}

TEST_CASE("gnmr replay: decisions on a norm stream, --json, and one-line errors", "[cli][gnmr]") {
  const auto cfg = write_config("gnmr.toml", "[controller]\nname = \"gnmr\"\nwarmup = 1\nmax_recover = 1\nlock = 1\n"
                                             "alpha = 1.5\nbeta = 1.5\ndelta = 1\n");
  const auto norms = write_config("norms.csv", "step,unit,grad_norm\n1,b,1\n1,a,1\n2,a,1\n2,b,1\n3,a,4\n3,b,1\n4,b,1\n4,a,1\n");
  const std::string out = (scratch_dir() / "decisions.csv").string();
  const auto r = run({"gnmr", "replay", "--config", cfg.string(), "--norms", norms.string(), "--out", out});
  INFO(flat(r.out + r.err));
  REQUIRE(r.status == 0);
  CHECK(r.out.find("4 steps × 2 units; recovered 2 unit-steps") != std::string::npos);
  CHECK(r.out.find("holds a recovery slot") == std::string::npos);  // one exceedance and its lock: not held
  // step 3: a's norm 4 against its mean 1 exceeds (GNMR 4 > 1.5, ΔGNMR 4 > 1.5) and is locked for
  // 1 step; step 4: still a candidate through its lock (mean (1+1+4)/3 = 2, GNMR 0.5, ΔGNMR 0.5/4)
  CHECK(slurp(out) ==
        "step,unit,gnmr,dgnmr,exceeds,lock,recovered\n"
        "1,a,,,0,0,0\n1,b,,,0,0,0\n"
        "2,a,1,,0,0,0\n2,b,1,,0,0,0\n"
        "3,a,4,4,1,1,1\n3,b,1,1,0,0,0\n"
        "4,a,0.5,0.125,0,0,1\n4,b,1,1,0,0,0\n");
  const auto j = run({"gnmr", "replay", "--config", cfg.string(), "--norms", norms.string(), "--out", out, "--json"});
  REQUIRE(j.status == 0);
  const auto js = nlohmann::json::parse(j.out);
  CHECK(js.at("recovered") == 2);
  CHECK(js.at("eligible") == 6);
  check_error(run({"gnmr", "replay", "--config", cfg.string(), "--norms", cfg.string(), "--out", out}),
              {"header must be step,unit,grad_norm"});
  const auto bad = write_config("bad.toml", "[controller]\nname = \"gnmr\"\nlock = -1\n");
  check_error(run({"gnmr", "replay", "--config", bad.string(), "--norms", norms.string(), "--out", out}),
              {"lock must be a non-negative integer"});
  check_error(run({"gnmr", "replay", "--config", cfg.string(), "--out", out}), {"--norms"});
}
