// The metrics (nn/metrics.h): hand-computed cases, and non-finite logits.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nn/forward.h"
#include "nn/metrics.h"
#include "testutil.h"

using namespace mantis;
using mantis::test::error_of;
using Catch::Contains;

// ------------------------------------------------------------------------------------------------
// metrics by hand

TEST_CASE("metrics: hand-computed cases") {
  // Identical distributions: KL exactly 0.
  const std::vector<float> a{1.5f, -2.0f, 0.25f, 3.0f};
  CHECK(kl_divergence(std::span<const float>(a), std::span<const float>(a)) == 0.0);
  // A shifted copy is the same distribution (log-softmax removes the shift; exact for +1).
  std::vector<float> shifted = a;
  for (float& x : shifted) x += 1.0f;
  CHECK(kl_divergence(std::span<const float>(a), std::span<const float>(shifted)) == Approx(0.0).margin(1e-15));

  // Two tokens: ref logits (0, 0) → p = (1/2, 1/2); test logits (ln 3, 0) → q = (3/4, 1/4).
  // KL(p‖q) = ½ ln(½ / ¾) + ½ ln(½ / ¼) = ½ ln(4/3) = 0.14384103622589045
  // KL(q‖p) = ¾ ln(3/2) + ¼ ln(1/2)                 = 0.13081203594113694
  const std::vector<double> p{0.0, 0.0}, q{std::log(3.0), 0.0};
  CHECK(kl_divergence(std::span<const double>(p), std::span<const double>(q)) == Approx(0.5 * std::log(4.0 / 3.0)).epsilon(1e-14));
  CHECK(kl_divergence(std::span<const double>(q), std::span<const double>(p)) == Approx(0.13081203594113694).epsilon(1e-14));
  CHECK(nll(std::span<const double>(q), 0) == Approx(-std::log(0.75)).epsilon(1e-14));
  CHECK(nll(std::span<const double>(q), 1) == Approx(std::log(4.0)).epsilon(1e-14));
  CHECK(argmax(std::span<const double>(p)) == 0);  // ties: the first index
  CHECK(argmax(std::span<const double>(q)) == 0);
  CHECK_THAT(error_of([&] { nll(std::span<const double>(q), 2); }), Contains("outside the vocabulary [0, 2)"));

  // Accumulator: two sequences, 3 positions. Sequence 1 = the rows above (targets 0, then none);
  // sequence 2 = one position where the test flips the top-1 token: ref (0, ln 3), test (ln 3, 0).
  LogitsD r1(2, 2), t1(2, 2), r2(1, 2), t2(1, 2);
  r1 << 0, 0, 1, 2;
  t1 << std::log(3.0), 0, 1, 2;
  r2 << 0, std::log(3.0);
  t2 << std::log(3.0), 0;
  MetricsAccumulator m;
  m.add(r1, t1, std::vector<int32_t>{0, -1});
  m.add(r2, t2, std::vector<int32_t>{1});
  CHECK(m.sequences() == 2);
  CHECK(m.positions() == 3);
  CHECK(m.targets() == 2);
  CHECK(m.flips() == 1);
  CHECK(m.flip_rate() == Approx(1.0 / 3.0));
  // KL of (¼, ¾) ‖ (¾, ¼) = ¼ ln(1/3) + ¾ ln 3 = ½ ln 3
  CHECK(m.mean_kl() == Approx((0.5 * std::log(4.0 / 3.0) + 0.0 + 0.5 * std::log(3.0)) / 3.0).epsilon(1e-14));
  CHECK(m.max_abs_error() == Approx(std::log(3.0)).epsilon(1e-15));
  // NLL ref: −ln ½ (position 0, target 0), −ln ¾ (sequence 2, target 1); test: −ln ¾, −ln ¼
  CHECK(m.ppl_ref() == Approx(std::exp((std::log(2.0) - std::log(0.75)) / 2)).epsilon(1e-14));
  CHECK(m.ppl_test() == Approx(std::exp((-std::log(0.75) + std::log(4.0)) / 2)).epsilon(1e-14));

  const auto per = kl_per_position(r1, t1);
  REQUIRE(per.size() == 2);
  CHECK(per[0] == Approx(0.5 * std::log(4.0 / 3.0)).epsilon(1e-14));
  CHECK(per[1] == 0.0);

  MetricsAccumulator none;
  CHECK(std::isnan(none.mean_kl()));
  CHECK(std::isnan(none.ppl_ref()));
  CHECK_THAT(error_of([&] { none.add(r1, r2); }), Contains("differ in shape"));
  CHECK_THAT(error_of([&] { none.add(r1, t1, std::vector<int32_t>{0}); }), Contains("1 targets for 2 positions"));
  CHECK_THAT(error_of([&] { none.add(r1, t1, std::vector<int32_t>{0, 7}); }), Contains("target token 7"));
  CHECK(none.positions() == 0);  // a failed add leaves the totals alone
}

TEST_CASE("metrics: non-finite logits give inf KL, NLL and error, and are counted") {
  LogitsF ref(3, 4), test(3, 4);
  ref << 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4;
  test = ref;
  test(1, 2) = std::numeric_limits<float>::quiet_NaN();
  test(2, 0) = std::numeric_limits<float>::infinity();
  MetricsAccumulator m;
  std::vector<int32_t> tgt{1, 2, 3};
  m.add(ref, test, tgt);
  CHECK(m.nonfinite_positions() == 2);
  CHECK(std::isinf(m.mean_kl()));
  CHECK(std::isinf(m.ppl_test()));
  CHECK(std::isfinite(m.ppl_ref()));
  CHECK(std::isinf(m.max_abs_error()));
  CHECK(std::isinf(kl_divergence(std::span<const float>(ref.data(), 4), std::span<const float>(test.data() + 4, 4))));
  MetricsAccumulator clean;
  clean.add(ref, ref, tgt);
  CHECK(clean.nonfinite_positions() == 0);
  CHECK(clean.mean_kl() == 0.0);
}
