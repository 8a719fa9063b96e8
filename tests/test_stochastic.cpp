// Stochastic rounding: Philox known answers, unbiasedness, reproducibility, thread invariance.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "core/oracle.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "testutil.h"

using namespace mantis;

TEST_CASE("Philox4x32-10 known-answer vectors (Random123 kat_vectors)") {
  struct Kat { uint32_t c[4], k[2], out[4]; };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}};
  for (auto& k : kats) {
    const Philox4 r = philox4x32_10(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
    for (int i = 0; i < 4; ++i) CHECK(r.v[i] == k.out[i]);
  }
}

namespace {
std::vector<float> run(const char* fmtname, Rounding m, std::vector<float> x, uint64_t seed, int threads,
                       uint64_t stream = 0) {
  const int saved = num_threads();
  set_num_threads(threads);
  RoundOptions o{.mode = m, .seed = seed, .stream = stream};
  round_array(x.data(), x.data(), x.size(), format_lookup(fmtname), o);
  set_num_threads(saved);
  return x;
}
}  // namespace

TEST_CASE("sr is unbiased and sre goes up half the time") {
  // x sits at fraction 0.3 of a bf16 quantum above 1: E[sr(x)] = x, P(up) = 0.3.
  const double q = std::ldexp(1.0, -7), x = 1 + 0.3 * q;
  const size_t n = 1 << 20;
  std::vector<float> v(n, float(x));
  for (Rounding m : {Rounding::sr, Rounding::sre}) {
    const auto r = run("bf16", m, v, 42, 2);
    size_t ups = 0, other = 0;
    for (float y : r) {
      other += !(y == 1.0f || double(y) == 1 + q);  // only the two neighbours may appear
      ups += y != 1.0f;
    }
    CHECK(other == 0);
    const double p = m == Rounding::sr ? 0.3 : 0.5;
    const double sigma = std::sqrt(p * (1 - p) / double(n));
    const double freq = double(ups) / double(n);
    INFO(to_string(m) << " frequency " << freq);
    CHECK(std::fabs(freq - p) < 5 * sigma);
  }
  // Mean error over many distinct values is ~0 for sr (unbiased), in units of the quantum.
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = float(1 + std::ldexp(double(i % 997) / 997.0, -7) + std::ldexp(1.0, -20));
  const auto r = run("bf16", Rounding::sr, w, 7, 2);
  double err = 0;
  for (size_t i = 0; i < n; ++i) err += (double(r[i]) - double(w[i])) / q;
  CHECK(std::fabs(err / double(n)) < 5 * 0.5 / std::sqrt(double(n)));
}

TEST_CASE("same seed same bits; 1 thread == 2 threads; seeds and streams differ") {
  const auto xs = mantis::test::stratified_floats(format_lookup("ps4"), 200'000, 5);
  for (Rounding m : {Rounding::sr, Rounding::sre}) {
    const auto a = run("ps4", m, xs, 1, 1);
    const auto b = run("ps4", m, xs, 1, 2);
    const auto c = run("ps4", m, xs, 1, 2);
    const auto d = run("ps4", m, xs, 2, 2);
    const auto e = run("ps4", m, xs, 1, 2, 9);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    CHECK(std::memcmp(b.data(), c.data(), a.size() * 4) == 0);
    CHECK(std::memcmp(a.data(), d.data(), a.size() * 4) != 0);
    CHECK(std::memcmp(a.data(), e.data(), a.size() * 4) != 0);
  }
}

TEST_CASE("a slice rounded with index0 equals the same elements of the whole array") {
  const auto xs = mantis::test::stratified_doubles(format_lookup("bf16"), 10'001, 8);
  std::vector<double> whole(xs.size()), part(xs.size() - 1237);
  RoundOptions o{.mode = Rounding::sr, .seed = 3};
  round_array(xs.data(), whole.data(), xs.size(), format_lookup("bf16"), o);
  o.index0 = 1237;
  round_array(xs.data() + 1237, part.data(), part.size(), format_lookup("bf16"), o);
  CHECK(std::memcmp(whole.data() + 1237, part.data(), part.size() * 8) == 0);
}

// Random-word indices wrap by definition (round_array.h): element i uses word (index0 + i) mod 2^64.
// A range that passes 2^64 − 1 once overran a stack buffer (issue 32: index0 = 2^64 − 1 segfaulted).
TEST_CASE("an index range that passes 2^64 wraps: element i uses word (index0 + i) mod 2^64, every container") {
  const Format f = format_lookup("bf16");
  const auto xd = mantis::test::stratified_doubles(f, 3'001, 11);
  const std::vector<float> xf(xd.begin(), xd.end());
  const uint64_t top = ~uint64_t(0);
  for (uint64_t back : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(5), uint64_t(1023), uint64_t(1500),
                        uint64_t(2999)})
    for (Rounding m : {Rounding::sr, Rounding::sre}) {
      const RoundOptions o{.mode = m, .sr_bits = m == Rounding::sr ? 9 : 32, .seed = 77, .stream = 5,
                           .index0 = top - back};
      std::vector<double> dd(xd.size()), fd(xf.size());
      std::vector<float> ff(xf.size());
      round_array(xd.data(), dd.data(), xd.size(), f, o);
      round_array(xf.data(), fd.data(), xf.size(), f, o);
      round_array(xf.data(), ff.data(), xf.size(), f, o);
      size_t bad = 0;
      for (size_t i = 0; i < xd.size(); ++i) {
        const uint32_t w = random_word(77, 5, o.index0 + i);
        const double want_d = oracle_round(xd[i], f, m, w, o.sr_bits), want_f = oracle_round(xf[i], f, m, w, o.sr_bits);
        bad += !mantis::test::same(dd[i], want_d) + !mantis::test::same(fd[i], want_f) +
               !mantis::test::same(double(ff[i]), want_f);
      }
      INFO("index0 = 2^64 - 1 - " << back << ", " << to_string(m));
      CHECK(bad == 0);
    }
  // Above the parallel threshold, split over two threads, the wrap falls inside one thread's part.
  const auto big = mantis::test::stratified_floats(f, 200'003, 12);
  const RoundOptions o{.mode = Rounding::sr, .seed = 78, .index0 = top - 150'000};
  std::vector<float> one(big.size()), two(big.size());
  const int saved = num_threads();
  set_num_threads(1);
  round_array(big.data(), one.data(), big.size(), f, o);
  set_num_threads(2);
  round_array(big.data(), two.data(), big.size(), f, o);
  set_num_threads(saved);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * 4) == 0);
  size_t bad = 0;
  for (size_t i = 0; i < big.size(); i += 97)
    bad += !mantis::test::same(double(two[i]), oracle_round(big[i], f, Rounding::sr, random_word(78, 0, o.index0 + i), 32));
  CHECK(bad == 0);
}

TEST_CASE("float and double containers give the same stochastic bits") {
  const auto xf = mantis::test::stratified_floats(format_lookup("fp16"), 50'000, 9);
  std::vector<double> xd(xf.begin(), xf.end()), od(xd.size());
  std::vector<float> of(xf.size());
  RoundOptions o{.mode = Rounding::sr, .seed = 4};
  round_array(xf.data(), of.data(), xf.size(), format_lookup("fp16"), o);
  round_array(xd.data(), od.data(), xd.size(), format_lookup("fp16"), o);
  size_t bad = 0;
  for (size_t i = 0; i < xf.size(); ++i) bad += !mantis::test::same(double(of[i]), od[i]);
  CHECK(bad == 0);
}

TEST_CASE("a RoundPlan gives the bits of round_array with options, every container pair") {
  const Rounding modes[] = {Rounding::rne, Rounding::rna, Rounding::rd, Rounding::ro, Rounding::sr, Rounding::sre};
  for (const char* fname : {"ps4", "bf16", "e4m3", "fp16", "e11m20"})
    for (Rounding m : modes) {
      const Format f = format_lookup(fname);
      const RoundOptions o{.mode = m, .sr_bits = m == Rounding::sr ? 13 : 32, .seed = 21, .stream = 4,
                           .index0 = 4099};
      const RoundPlan p = plan_round(f, o.mode, o.sr_bits, o.seed);
      CHECK(p.fits_float == fits_float(f));
      const auto xd = mantis::test::stratified_doubles(f, 5'003, 2);
      std::vector<double> dd_o(xd.size()), dd_p(xd.size());
      round_array(xd.data(), dd_o.data(), xd.size(), f, o);
      round_array(p, xd.data(), dd_p.data(), xd.size(), o.stream, o.index0);
      INFO(fname << " " << to_string(m));
      CHECK(std::memcmp(dd_o.data(), dd_p.data(), dd_o.size() * 8) == 0);
      const auto xf = mantis::test::stratified_floats(f, 5'003, 3);
      std::vector<double> fd_o(xf.size()), fd_p(xf.size());
      round_array(xf.data(), fd_o.data(), xf.size(), f, o);
      round_array(p, xf.data(), fd_p.data(), xf.size(), o.stream, o.index0);
      CHECK(std::memcmp(fd_o.data(), fd_p.data(), fd_o.size() * 8) == 0);
      if (p.fits_float) {
        std::vector<float> ff_o(xf.size()), ff_p(xf.size()), df_o(xd.size()), df_p(xd.size());
        round_array(xf.data(), ff_o.data(), xf.size(), f, o);
        round_array(p, xf.data(), ff_p.data(), xf.size(), o.stream, o.index0);
        CHECK(std::memcmp(ff_o.data(), ff_p.data(), ff_o.size() * 4) == 0);
        round_array(xd.data(), df_o.data(), xd.size(), f, o);
        round_array(p, xd.data(), df_p.data(), xd.size(), o.stream, o.index0);
        CHECK(std::memcmp(df_o.data(), df_p.data(), df_o.size() * 4) == 0);
      }
    }
}

TEST_CASE("plan_round rejects what round_array rejects, with the same message") {
  Format broken = format_lookup("bf16");
  broken.mu = 60;
  const double x = 1;
  double y;
  for (int bits : {0, 33}) {
    const RoundOptions o{.mode = Rounding::sr, .sr_bits = bits};
    try {
      round_array(&x, &y, 1, format_lookup("bf16"), o);
      FAIL("round_array accepted sr_bits " << bits);
    } catch (const InputError& e) {
      CHECK_THROWS_WITH(plan_round(format_lookup("bf16"), Rounding::sr, bits), Catch::Equals(e.what()));
    }
  }
  try {
    round_array(&x, &y, 1, broken, RoundOptions{});
    FAIL("round_array accepted μ = 60");
  } catch (const InputError& e) {
    CHECK_THROWS_WITH(plan_round(broken, Rounding::rne), Catch::Equals(e.what()));
  }
  const float xf = 1;
  float yf;
  try {
    round_array(&xf, &yf, 1, format_lookup("fp64"), RoundOptions{});
    FAIL("round_array rounded to fp64 in a float container");
  } catch (const InputError& e) {
    CHECK_THROWS_WITH(require_fits_float(format_lookup("fp64")), Catch::Equals(e.what()));
  }
}

// Packed random bits (philox.h sr_word, as Blackwell's cvt.rs): rounding i takes slot i mod P of
// word ⌊i / P⌋, P = 4 for sr_bits ≤ 8 and 2 for ≤ 16, against the oracle's own restatement.
TEST_CASE("packed random bits: element i uses slot i mod P of word i / P, every container, any index0") {
  for (uint64_t i : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(4), uint64_t(7), uint64_t(1) << 40,
                     ~uint64_t(0), ~uint64_t(0) - 5})
    for (int pack : {0, 1, 2}) {
      // the slot's 32/P bits at the top decide (sr reads its top sr_bits ≤ 32/P); below them
      // sr_word leaves the next slots' bits, which no rounding reads
      const int lane = 32 >> pack;
      INFO("index " << i << " pack " << pack);
      CHECK(uint64_t(sr_word(9, 4, i, pack)) >> (32 - lane) == uint64_t(oracle_sr_word(9, 4, i, 1 << pack)) >> (32 - lane));
    }
  CHECK(sr_word(9, 4, 5, 0) == random_word(9, 4, 5));
  CHECK(sr_word(9, 4, 6, 2) >> 24 == ((random_word(9, 4, 1) >> 8) & 0xFF));  // slot 2 of word 1: its third byte
  const Format f = format_lookup("bf16");
  const auto xd = mantis::test::stratified_doubles(f, 5'003, 21);
  const std::vector<float> xf(xd.begin(), xd.end());
  const uint64_t top = ~uint64_t(0);
  for (int bits : {1, 5, 8, 9, 16})
    for (Rounding m : {Rounding::sr, Rounding::sre})
      for (uint64_t index0 : {uint64_t(0), uint64_t(3), uint64_t(1021), top - 2, top - 3000})
        for (int threads : {1, 2}) {
          const RoundOptions o{.mode = m, .sr_bits = bits, .seed = 5, .stream = 2, .index0 = index0, .sr_packed = true};
          const int per_word = bits <= 8 ? 4 : 2;
          const int saved = num_threads();
          set_num_threads(threads);
          std::vector<double> dd(xd.size()), fd(xf.size());
          std::vector<float> ff(xf.size());
          round_array(xd.data(), dd.data(), xd.size(), f, o);
          round_array(xf.data(), fd.data(), xf.size(), f, o);
          round_array(xf.data(), ff.data(), xf.size(), f, o);
          set_num_threads(saved);
          size_t bad = 0;
          for (size_t i = 0; i < xd.size(); ++i) {
            const uint32_t w = oracle_sr_word(5, 2, index0 + i, per_word);
            const double want_d = oracle_round(xd[i], f, m, w, bits), want_f = oracle_round(xf[i], f, m, w, bits);
            bad += !mantis::test::same(dd[i], want_d) + !mantis::test::same(fd[i], want_f) +
                   !mantis::test::same(double(ff[i]), want_f);
          }
          INFO("sr_bits " << bits << " " << to_string(m) << " index0 " << index0 << " threads " << threads);
          CHECK(bad == 0);
          CHECK(round_scalar(xd[7], f, o, 7) == dd[7]);
        }
  // Above the parallel threshold: 1 thread == 2 threads, and a slice equals the whole.
  const auto big = mantis::test::stratified_floats(f, 200'003, 22);
  const RoundOptions o{.mode = Rounding::sr, .sr_bits = 8, .seed = 6, .sr_packed = true};
  std::vector<float> one(big.size()), two(big.size()), part(big.size() - 1237);
  set_num_threads(1);
  round_array(big.data(), one.data(), big.size(), f, o);
  set_num_threads(2);
  round_array(big.data(), two.data(), big.size(), f, o);
  RoundOptions os = o;
  os.index0 = 1237;
  round_array(big.data() + 1237, part.data(), part.size(), f, os);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * 4) == 0);
  CHECK(std::memcmp(one.data() + 1237, part.data(), part.size() * 4) == 0);
  // Unpacked is the default and differs from packed (the words are shared differently).
  RoundOptions u = o;
  u.sr_packed = false;
  round_array(big.data(), two.data(), big.size(), f, u);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * 4) != 0);
}

TEST_CASE("packed random bits: sr with 8 bits rounds up with probability ⌊256·frac⌋ / 256") {
  // x at fraction 0.3 of a bf16 quantum: P(up) = ⌊0.3·256⌋ / 256 with 8 random bits.
  const double q = std::ldexp(1.0, -7), x = 1 + 0.3 * q;
  const size_t n = 1 << 20;
  std::vector<float> v(n, float(x));
  const RoundOptions o{.mode = Rounding::sr, .sr_bits = 8, .seed = 42, .sr_packed = true};
  round_array(v.data(), v.data(), n, format_lookup("bf16"), o);
  size_t ups = 0;
  for (float y : v) ups += y != 1.0f;
  const double p = std::floor((double(float(x)) - 1) / q * 256) / 256, sigma = std::sqrt(p * (1 - p) / double(n));
  INFO("frequency " << double(ups) / double(n) << " want " << p);
  CHECK(std::fabs(double(ups) / double(n) - p) < 5 * sigma);
}

TEST_CASE("packed random bits: refused above 16 bits and without a stochastic rounding") {
  const double x = 1;
  double y;
  const RoundOptions wide{.mode = Rounding::sr, .sr_bits = 17, .sr_packed = true};
  CHECK_THROWS_WITH(round_array(&x, &y, 1, format_lookup("bf16"), wide), Catch::Contains("sr_bits = 17 does not fit"));
  const RoundOptions rne{.mode = Rounding::rne, .sr_bits = 8, .sr_packed = true};
  CHECK_THROWS_WITH(round_array(&x, &y, 1, format_lookup("bf16"), rne), Catch::Contains("stochastic rounding"));
  CHECK_THROWS_WITH(plan_round(format_lookup("bf16"), Rounding::sr, 17, 0, true), Catch::Contains("sr_packed"));
  CHECK(plan_round(format_lookup("bf16"), Rounding::sr, 16, 0, true).sr_pack == 1);
  CHECK(plan_round(format_lookup("bf16"), Rounding::sr, 8, 0, true).sr_pack == 2);
  CHECK(plan_round(format_lookup("bf16"), Rounding::sr, 8, 0, false).sr_pack == 0);
}
