// test_lamp — LAMP's selection rules against brute-force binary64 definitions, and the forward
// pass with LAMP: τ = 0 is the FP32 reference bit for bit, τ = ∞ is uniform ps<μ> bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "io/checkpoint.h"
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/attention_row.h"
#include "nn/forward.h"
#include "nn/lamp.h"
#include "mantis_config.h"
#include "core/philox.h"
#include "nn/policy.h"

using namespace mantis;

namespace {

// Row r of a family of test rows: random scales from 1e-6 to 1e6, ties, zeros, huge values.
std::vector<float> test_row(int r, size_t n) {
  std::vector<float> y(n);
  const double scale = std::pow(10.0, double(int(r % 13) - 6));
  for (size_t j = 0; j < n; ++j) {
    const double u = double(random_word(7, uint64_t(r), j)) / 4294967296.0;
    y[j] = float((2 * u - 1) * scale);
  }
  if (r % 5 == 1 && n > 3) y[1] = y[2] = y[0];          // ties
  if (r % 7 == 2) y[n / 2] = 0;                         // an exact zero
  if (r % 11 == 3) y[0] = 3e38f, y[n - 1] = -3e38f;     // huge
  if (r % 17 == 4) y[n - 1] = 88.0f, y[0] = 89.0f;      // e^y near binary32 overflow
  return y;
}

// The definitions, evaluated directly in long double.
std::vector<uint8_t> brute_strict(const std::vector<float>& y, double tau) {
  long double mx = -INFINITY, sum = 0;
  for (float v : y) mx = std::max(mx, (long double)v);
  for (float v : y) sum += std::exp((long double)v - mx);
  std::vector<uint8_t> m(y.size());
  for (size_t j = 0; j < y.size(); ++j) {
    const long double z = std::exp((long double)y[j] - mx) / sum;
    m[j] = tau <= 0 || 2 * z * (1 - z) * std::fabs((long double)y[j]) > (long double)tau;
  }
  return m;
}
std::vector<uint8_t> brute_relaxed(const std::vector<float>& y, double tau) {
  // |y|·e^y compared after scaling both sides by e^(−max y): no overflow in long double either
  long double my = -INFINITY;
  for (float v : y) my = std::max(my, (long double)v);
  long double best = 0;
  std::vector<long double> a(y.size());
  for (size_t j = 0; j < y.size(); ++j) best = std::max(best, a[j] = std::fabs((long double)y[j]) * std::exp((long double)y[j] - my));
  std::vector<uint8_t> m(y.size());
  for (size_t j = 0; j < y.size(); ++j) m[j] = tau <= 0 || a[j] > (long double)tau * best;
  return m;
}

size_t count(const std::vector<uint8_t>& m) { return size_t(std::count(m.begin(), m.end(), uint8_t(1))); }

}  // namespace

TEST_CASE("strict and relaxed rules equal their definitions on random rows (ties, zeros, huge, tiny)") {
  int agree = 0, rows = 0;
  for (int r = 0; r < 400; ++r) {
    const size_t n = 1 + size_t(random_word(9, 0, uint64_t(r)) % 300);
    const auto y = test_row(r, n);
    for (double tau : {1e-3, 5e-2, 1.0, 20.0}) {
      LampSpec s;
      s.tau = tau;
      std::vector<uint8_t> m(n);
      const size_t c = lamp_select_row(s, y, int64_t(n - 1), m, 0);
      const auto want = brute_strict(y, tau);
      agree += m == want && c == count(want);
      ++rows;
    }
    for (double tau : {0.9, 0.09, 9e-3, 9e-5}) {
      LampSpec s;
      s.rule = LampRule::relaxed;
      s.tau = tau;
      std::vector<uint8_t> m(n);
      const size_t c = lamp_select_row(s, y, int64_t(n - 1), m, 0);
      const auto want = brute_relaxed(y, tau);
      agree += m == want && c == count(want);
      ++rows;
    }
  }
  CHECK(agree == rows);
}

TEST_CASE("τ = 0 selects every entry, τ = ∞ none; length scaling; masked keys never enter a row") {
  const auto y = test_row(3, 50);
  for (LampRule rule : {LampRule::strict, LampRule::relaxed}) {
    LampSpec s;
    s.rule = rule;
    std::vector<uint8_t> m(50);
    s.tau = 0;
    CHECK(lamp_select_row(s, y, 49, m, 0) == 50);
    s.tau = std::numeric_limits<double>::infinity();
    CHECK(lamp_select_row(s, y, 49, m, 0) == 0);
  }
  LampSpec s;
  s.tau = 0.01;
  s.length_scaled = true;
  CHECK(lamp_tau(s, 0) == Approx(0.32));
  CHECK(lamp_tau(s, 1023) == Approx(0.01));
  s.tau = 50;
  CHECK(lamp_tau(s, 100) == 1.0);  // min(1, ·)
  // a row's selection depends only on its causal prefix: −inf (masked) scores are not part of it
  std::vector<uint8_t> a(20), b(30);
  std::vector<float> longer = test_row(4, 30);
  std::vector<float> prefix(longer.begin(), longer.begin() + 20);
  LampSpec t;
  t.tau = 0.05;
  CHECK(lamp_select_row(t, prefix, 19, a, 0) == lamp_select_row(t, std::span<const float>(longer.data(), 20), 19, b, 0));
}

TEST_CASE("ties: '>' as the paper — the relaxed row maximum is never selected at τ ≥ 1, exact ties are not") {
  // relaxed: the row maximum of |y|·e^y ties with itself, so at τ = 1 nothing is selected (with
  // '≥' every row recomputed its maximum), and below 1 the maximum and its exact ties are
  std::vector<float> y{0.5f, 2.0f, 2.0f, -1.0f, 0.0f};
  LampSpec r;
  r.rule = LampRule::relaxed;
  std::vector<uint8_t> m(y.size());
  r.tau = 1.0;
  CHECK(lamp_select_row(r, y, 4, m, 0) == 0);
  r.tau = 2.0;
  CHECK(lamp_select_row(r, y, 4, m, 0) == 0);
  r.tau = 0.999;
  CHECK(lamp_select_row(r, y, 4, m, 0) == 2);
  CHECK((m[1] == 1 && m[2] == 1 && m[0] == 0));
  // length scaling caps τ_i at 1: on short rows the relaxed rule then selects nothing either
  r.tau = 0.5;
  r.length_scaled = true;
  CHECK(lamp_select_row(r, y, 4, m, 0) == 0);  // τ_4 = min(1, 0.5·√(1024/5)) = 1
  // strict: an entry whose κ equals τ exactly is not selected. Two equal scores a, a with
  // z = ½ each: κ = 2·½·½·|a| = |a|/2 — exact in binary64 for a = 3.
  std::vector<float> t{3.0f, 3.0f};
  LampSpec s;
  s.tau = 1.5;
  CHECK(lamp_select_row(s, t, 1, m, 0) == 0);
  s.tau = std::nextafter(1.5, 0.0);
  CHECK(lamp_select_row(s, t, 1, m, 0) == 2);
  // activation: κ = |σ'|·|y| = τ exactly is not selected
  std::vector<double> ya{2.0, -4.0}, da{0.5, 0.25};
  std::vector<uint8_t> ma(2);
  CHECK(lamp_select_activation(ya, da, 1.0, ma) == 0);
  CHECK(lamp_select_activation(ya, da, 0.0, ma) == 2);
}

TEST_CASE("random control: exactly the rule's count per row, among the causal positions, reproducible") {
  for (int r = 0; r < 100; ++r) {
    const size_t n = 2 + size_t(r);
    const auto y = test_row(r, n);
    LampSpec s;
    s.tau = 0.05;
    std::vector<uint8_t> rule(n), rnd(n), again(n), other(n);
    const size_t c = lamp_select_row(s, y, int64_t(n - 1), rule, 0);
    s.random_control = true;
    s.seed = 5;
    CHECK(lamp_select_row(s, y, int64_t(n - 1), rnd, uint64_t(r)) == c);
    CHECK(count(rnd) == c);
    lamp_select_row(s, y, int64_t(n - 1), again, uint64_t(r));
    const bool reproducible = rnd == again;
    CHECK(reproducible);
    s.seed = 6;
    lamp_select_row(s, y, int64_t(n - 1), other, uint64_t(r));
    const bool differs = other != rnd;
    if (c > 0 && c < n && n > 8) CHECK(differs);
  }
}

TEST_CASE("activation and LayerNorm rules equal their definitions") {
  for (int r = 0; r < 50; ++r) {
    const size_t n = 10 + size_t(r);
    std::vector<double> y(n), d(n), g(n);
    for (size_t j = 0; j < n; ++j) {
      y[j] = double(test_row(r, n)[j]) / std::pow(10.0, double(int(r % 13) - 6)) * 3;
      d[j] = 1 / (1 + std::exp(-y[j]));  // σ' of SiLU-ish: any positive derivative
      g[j] = 0.5 + double(j % 3);
    }
    std::vector<uint8_t> m(n);
    const double tau = 0.3;
    size_t want = 0;
    for (size_t j = 0; j < n; ++j) want += std::abs(d[j]) * std::abs(y[j]) > tau;
    CHECK(lamp_select_activation(y, d, tau, m) == want);
    // LayerNorm: the selected set is the largest κ, and what is left sums to ≤ τ (and would not
    // if the smallest selected one were dropped)
    double mean = 0, var = 0;
    for (double v : y) mean += v;
    mean /= double(n);
    for (double v : y) var += (v - mean) * (v - mean);
    const double sigma = std::sqrt(var / double(n) + 1e-5);
    std::vector<double> k(n);
    for (size_t j = 0; j < n; ++j) k[j] = std::abs(y[j]) * std::abs(g[j]) / sigma;
    const double budget = 0.2 * std::accumulate(k.begin(), k.end(), 0.0);
    const size_t c = lamp_select_layernorm(y, g, 1e-5, budget, m);
    double rest = 0, min_sel = INFINITY, max_rest = 0;
    for (size_t j = 0; j < n; ++j) {
      if (m[j]) min_sel = std::min(min_sel, k[j]);
      else rest += k[j], max_rest = std::max(max_rest, k[j]);
    }
    CHECK(rest <= budget * (1 + 1e-12));
    CHECK(max_rest <= min_sel);
    if (c > 0) CHECK(rest + min_sel > budget);
  }
}

TEST_CASE("forward with LAMP: τ = 0 is the FP32 reference, τ = ∞ is uniform ps<μ>, bit for bit") {
  const std::string dir = std::string(MANTIS_SOURCE_DIR) + "/tests/data/reference/";
  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    const Model m = load_model(dir + name);
    std::vector<int32_t> tokens(130);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(random_word(2, 0, i) % uint32_t(m.cfg.vocab));
    const Matrix<float> fp32 = forward<float>(m, tokens);
    for (int mu : {4, 10}) {
      for (LampRule rule : {LampRule::strict, LampRule::relaxed}) {
        INFO(name << " mu " << mu << " " << to_string(rule));
        Policy p = lamp_policy(mu);
        const Matrix<float> uniform = forward<float>(m, tokens, p);
        p.lamp = LampSpec{};
        p.lamp->rule = rule;
        p.lamp->tau = 0;
        ForwardStats st;
        const Matrix<float> all = forward<float>(m, tokens, p, &st);
        CHECK(std::memcmp(all.data(), fp32.data(), size_t(all.size()) * 4) == 0);
        REQUIRE(st.lamp_selected.size() == size_t(m.cfg.layers));
        const bool all_selected = st.lamp_selected == st.lamp_entries;
        CHECK(all_selected);
        CHECK(st.lamp_entries[0] == uint64_t(m.cfg.heads) * 130 * 131 / 2);
        p.lamp->tau = std::numeric_limits<double>::infinity();
        const Matrix<float> none = forward<float>(m, tokens, p, &st);
        CHECK(std::memcmp(none.data(), uniform.data(), size_t(none.size()) * 4) == 0);
        CHECK(st.lamp_selected[0] == 0);
        // in between: some recomputed, and closer to FP32 than uniform
        p.lamp->tau = rule == LampRule::strict ? 0.05 : 0.03;
        const Matrix<float> mid = forward<float>(m, tokens, p, &st);
        const uint64_t sel = std::accumulate(st.lamp_selected.begin(), st.lamp_selected.end(), uint64_t(0));
        CHECK(sel > 0);
        CHECK(sel < std::accumulate(st.lamp_entries.begin(), st.lamp_entries.end(), uint64_t(0)));
        CHECK((mid - fp32).cwiseAbs().maxCoeff() <= (uniform - fp32).cwiseAbs().maxCoeff());
        // random control: the same count per row, so the same total in the first layer
        p.lamp->random_control = true;
        ForwardStats sr;
        forward<float>(m, tokens, p, &sr);
        CHECK(sr.lamp_selected[0] == st.lamp_selected[0]);  // later layers see other inputs
      }
    }
  }
}

TEST_CASE("the [lamp] policy table: parsing and errors") {
  const Policy p = policy_from_toml(R"(
[site."attn.qk"]
accumulation = "strict"
accumulator = "ps7"
output = "ps7"
[lamp]
rule = "relaxed"
tau = 0.03
length_scaling = true
random = true
seed = 4
recompute = "bf16"
)", "lamp.toml");
  REQUIRE(p.lamp);
  CHECK(p.lamp->rule == LampRule::relaxed);
  CHECK(p.lamp->tau == 0.03);
  CHECK(p.lamp->length_scaled);
  CHECK(p.lamp->random_control);
  CHECK(p.lamp->recompute->name == "bf16");
  CHECK_FALSE(p.forward_is_native());
  CHECK_THAT(describe(p), Catch::Contains("lamp: relaxed tau 0.03"));
  auto err = [](const std::string& t) {
    try {
      policy_from_toml(t, "l.toml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(none)");
  };
  CHECK_THAT(err("[lamp]\nrule = \"greedy\"\n"), Catch::Contains("unknown LAMP rule 'greedy'"));
  CHECK_THAT(err("[lamp]\ntau = -1\n"), Catch::Contains("must be ≥ 0"));
  CHECK_THAT(err("[lamp]\ntaus = 1\n"), Catch::Contains("unknown key 'taus' in [lamp]"));
  CHECK_THAT(err("[lamp]\nrecompute = \"fp64\"\n"), Catch::Contains("does not fit binary32"));
}

TEST_CASE("LAMP at the activation and at the norm inputs: τ = 0 recomputes, τ = ∞ leaves the low precision") {
  const std::string dir = std::string(MANTIS_SOURCE_DIR) + "/tests/data/reference/";
  const char* low_fc = "[site.\"mlp.fc\"]\naccumulation = \"strict\"\naccumulator = \"ps4\"\noutput = \"ps4\"\n";
  const char* low_proj =
      "[site.\"attn.proj\"]\naccumulation = \"strict\"\naccumulator = \"ps4\"\noutput = \"ps4\"\n"
      "[site.\"mlp.proj\"]\naccumulation = \"strict\"\naccumulator = \"ps4\"\noutput = \"ps4\"\n";
  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    INFO(name);
    const Model m = load_model(dir + name);
    std::vector<int32_t> tokens(70);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(random_word(4, 0, i) % uint32_t(m.cfg.vocab));
    const Matrix<float> fp32 = forward<float>(m, tokens);
    auto same = [](const Matrix<float>& a, const Matrix<float>& b) {
      return std::memcmp(a.data(), b.data(), size_t(a.size()) * 4) == 0;
    };
    // activation
    Policy act = policy_from_toml(low_fc, "act.toml");
    const Matrix<float> uniform_act = forward<float>(m, tokens, act);
    act.lamp_activation = LampSiteSpec{std::numeric_limits<double>::infinity(), std::nullopt};
    ForwardStats st;
    CHECK(same(forward<float>(m, tokens, act, &st), uniform_act));
    CHECK(st.act_selected[0] == 0);
    CHECK(st.act_entries[0] == uint64_t(70) * uint64_t(m.cfg.hidden));
    act.lamp_activation->tau = 0;
    const Matrix<float> all_act = forward<float>(m, tokens, act, &st);
    const bool all_act_selected = st.act_selected == st.act_entries;
    CHECK(all_act_selected);
    if (m.cfg.arch == Arch::gpt2) CHECK(same(all_act, fp32));  // llama: w3 (up) stays in ps4
    CHECK((all_act - fp32).cwiseAbs().maxCoeff() < (uniform_act - fp32).cwiseAbs().maxCoeff());
    act.lamp_activation->tau = 0.05;
    forward<float>(m, tokens, act, &st);
    CHECK(st.act_selected[0] > 0);
    CHECK(st.act_selected[0] < st.act_entries[0]);
    // norm inputs
    Policy ln = policy_from_toml(low_proj, "ln.toml");
    const Matrix<float> uniform_ln = forward<float>(m, tokens, ln);
    ln.lamp_layernorm = LampSiteSpec{std::numeric_limits<double>::infinity(), std::nullopt};
    CHECK(same(forward<float>(m, tokens, ln, &st), uniform_ln));
    CHECK(st.ln_selected[1] == 0);
    ln.lamp_layernorm->tau = 0;
    CHECK(same(forward<float>(m, tokens, ln, &st), fp32));
    CHECK(st.ln_entries[0] == 2 * uint64_t(70) * uint64_t(m.cfg.dim));  // attn.proj and mlp.proj
    const bool all_ln_selected = st.ln_selected == st.ln_entries;
    CHECK(all_ln_selected);
    ln.lamp_layernorm->tau = 1.0;
    const Matrix<float> mid = forward<float>(m, tokens, ln, &st);
    CHECK(st.ln_selected[0] > 0);
    CHECK(st.ln_selected[0] < st.ln_entries[0]);
    CHECK((mid - fp32).cwiseAbs().maxCoeff() <= (uniform_ln - fp32).cwiseAbs().maxCoeff());
  }
  const Policy p = policy_from_toml("[lamp_activation]\ntau = 0.5\n[lamp_layernorm]\nrecompute = \"bf16\"\n", "x.toml");
  CHECK(p.lamp_activation->tau == 0.5);
  CHECK(p.lamp_layernorm->recompute->name == "bf16");
  CHECK_THROWS_WITH(policy_from_toml("[lamp_activation]\nrule = \"strict\"\n", "x.toml"),
                    Catch::Contains("unknown key 'rule' in [lamp_activation]"));
}

// ---------------------------------------------------------------- attention_row.h: the GPU's row steps
// (src/cuda/attention.cu runs these MANTIS_HD functions; here they are driven as its kernels do).

TEST_CASE("the relaxed rule tile by tile with a running max (flash) equals lamp_select_row", "[attention_row]") {
  size_t rows = 0, selected = 0, dropped = 0;
  for (int r = 0; r < 300; ++r)
    for (size_t n : {size_t(1), size_t(2), size_t(5), size_t(64), size_t(200)})
      for (double tau : {1e-9, 1e-3, 0.03, 0.5, 0.999999})
        for (bool scaled : {false, true}) {
          std::vector<float> y = test_row(r, n);
          if (r % 3 == 0) std::sort(y.begin(), y.end());  // rising: the max moves every tile
          LampSpec s;
          s.rule = LampRule::relaxed, s.tau = tau, s.length_scaled = scaled;
          const int64_t row = int64_t(n) - 1;
          std::vector<uint8_t> want(n);
          const size_t count = lamp_select_row(s, y, row, want, 0);
          const double t = lamp_tau(s, row);
          INFO("row " << r << " n " << n << " tau " << t);
          std::vector<uint8_t> seen(n, 0), got(n, 0);
          size_t c = 0;
          if (lamp_relaxed_trivial(t) != 2) {
            c = lamp_relaxed_trivial(t) == 1 ? n : 0;
            std::fill(got.begin(), got.end(), uint8_t(c == n));
            std::fill(seen.begin(), seen.end(), uint8_t(1));
          } else {
            for (size_t tile : {size_t(1), size_t(7), size_t(64)}) {
              std::vector<uint32_t> cj(n);
              std::vector<float> cy(n);
              RelaxedScan scan;
              std::fill(seen.begin(), seen.end(), uint8_t(0));
              for (size_t t0 = 0; t0 < n; t0 += tile) {
                for (size_t j = t0; j < std::min(n, t0 + tile); ++j)
                  relaxed_scan_add(scan, cj.data(), cy.data(), uint32_t(j), y[j]);
                relaxed_scan_prune(scan, cj.data(), cy.data(), t, [&](uint32_t j, float v) {
                  CHECK(v == y[j]);
                  ++seen[j], ++dropped;
                });
              }
              std::fill(got.begin(), got.end(), uint8_t(0));
              c = relaxed_scan_finish(scan, cj.data(), cy.data(), t, [&](uint32_t j, float, bool sel) {
                ++seen[j];
                got[j] = sel;
              });
              CHECK(c == count);
              CHECK(got == want);
            }
          }
          CHECK(c == count);
          CHECK(got == want);
          CHECK(std::count(seen.begin(), seen.end(), uint8_t(1)) == std::ptrdiff_t(n));  // each key once
          ++rows, selected += count;
        }
  CHECK(selected > 0);
  CHECK(dropped > rows);  // the running bound prunes before the end
}

TEST_CASE("lamp_row_select is lamp_select_row; the random control's draws", "[attention_row]") {
  for (int r = 0; r < 100; ++r)
    for (LampRule rule : {LampRule::strict, LampRule::relaxed}) {
      const size_t n = size_t(1 + r % 70);
      const std::vector<float> y = test_row(r, n);
      LampSpec s;
      s.rule = rule, s.tau = 0.01, s.random_control = r % 2 == 0, s.seed = 5;
      std::vector<uint8_t> a(n), b(n);
      std::vector<uint32_t> idx(n);
      const size_t ca = lamp_select_row(s, y, int64_t(n) - 1, a, 77);
      const size_t cb = lamp_row_select(rule == LampRule::strict, lamp_tau(s, int64_t(n) - 1), s.random_control, s.seed,
                                        y.data(), n, b.data(), idx.data(), 77);
      CHECK(ca == cb);
      CHECK(a == b);
      CHECK(size_t(std::count(b.begin(), b.end(), uint8_t(1))) == cb);
    }
}

TEST_CASE("softmax_row equals the CPU attention's softmax (vectorised numerators), bit for bit", "[attention_row]") {
  for (int r = 0; r < 200; ++r) {
    const size_t n = size_t(1 + (r * 37) % 300);
    std::vector<float> x(n);
    for (size_t j = 0; j < n; ++j) x[j] = float((double(random_word(3, uint64_t(r), j)) / 4294967296.0 - 0.5) * (r % 40));
    if (r % 9 == 4 && n > 2) x[1] = -0.0f, x[0] = 0.0f;  // zeros of both signs
    std::vector<float> cpu = x, hd = x;
    float mx;
    softmax_divide(cpu.data(), int64_t(n), detail::softmax_numerators(cpu.data(), cpu.data(), int64_t(n), mx));
    softmax_row(hd.data(), int64_t(n));
    CHECK(std::memcmp(cpu.data(), hd.data(), n * 4) == 0);
  }
}

TEST_CASE("online_softmax_nan says when softmax_row gives NaNs (and it never gives ±inf)", "[attention_row]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {inf, -inf, nan, 3e38f, -3e38f, 0.0f};
  uint64_t nan_rows = 0, finite_rows = 0;
  for (int r = 0; r < 2000; ++r) {
    const size_t n = size_t(1 + (r * 7) % 23);
    std::vector<float> x(n);
    for (size_t j = 0; j < n; ++j) {
      const uint32_t w = random_word(8, uint64_t(r), j);
      // one row in eight all −inf; otherwise specials at a rate that varies by row
      x[j] = r % 8 == 0 ? -inf
             : w % 16 < uint32_t(r % 5)  ? specials[(w >> 8) % 6]
                                          : float((double(w >> 4) / 268435456.0 - 0.5) * 40);
    }
    std::vector<float> p = x;
    softmax_row(p.data(), int64_t(n));
    SiteHealth want;
    for (float v : p) health_count_nonfinite(want, v);
    OnlineSoftmax<float> s;
    float scale, add;
    for (float v : x) online_softmax_step(s, v, scale, add);
    INFO("row " << r);
    CHECK(want.inf == 0);
    CHECK(want.nan == (online_softmax_nan(s) ? n : 0));
    (want.nan ? nan_rows : finite_rows) += 1;
  }
  CHECK(nan_rows > 100);  // both outcomes are exercised
  CHECK(finite_rows > 100);
}

TEST_CASE("the online softmax (flash) equals softmax·V up to the summation order", "[attention_row]") {
  const int64_t d = 8;
  for (int r = 0; r < 100; ++r) {
    const size_t n = size_t(1 + (r * 13) % 150);
    std::vector<float> x(n), v(n * size_t(d));
    for (size_t j = 0; j < n; ++j) x[j] = float((double(random_word(4, uint64_t(r), j)) / 4294967296.0 - 0.5) * 20);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f + float(double(random_word(6, uint64_t(r), i)) / 4294967296.0);
    std::vector<float> p = x;
    softmax_row(p.data(), int64_t(n));
    OnlineSoftmax<float> s;
    std::vector<float> acc(static_cast<size_t>(d), 0.0f), out(static_cast<size_t>(d));
    for (size_t j = 0; j < n; ++j) online_softmax_add(s, acc.data(), x[j], v.data() + j * size_t(d), d);
    online_softmax_finish(s, acc.data(), out.data(), d);
    for (int64_t c = 0; c < d; ++c) {
      double want = 0;
      for (size_t j = 0; j < n; ++j) want += double(p[j]) * double(v[j * size_t(d) + size_t(c)]);
      CHECK(std::abs(double(out[size_t(c)]) - want) <= 1e-5 * want);
    }
  }
}

namespace {

// The attention sites of the GPU contracts (src/cuda/attention_contracts.cpp): attn.qk strict ps<μ>
// with ps<μ> scores in `mode`, attn.pv strict fp32 (or native), the softmax's output bf16 (or not).
Policy kernel_policy(int mu, Rounding mode, bool pv_emulated, bool sm_round, uint64_t seed) {
  Policy p = lamp_policy(mu);
  p.all[int(Site::attn_qk)].rounding = mode, p.all[int(Site::attn_qk)].seed = seed;
  if (pv_emulated) {
    SitePolicy& pv = p.all[int(Site::attn_pv)];
    pv.accumulation = Accumulation::strict, pv.accumulator = format_lookup("fp32"), pv.rounding = mode;
    pv.seed = seed, pv.sr_bits = 24;
  }
  if (sm_round) {
    SitePolicy& sm = p.all[int(Site::softmax)];
    sm.output = format_lookup("bf16"), sm.rounding = mode, sm.seed = seed + 1;
  }
  return p;
}

Matrix<float> kernel_input(Eigen::Index rows, Eigen::Index cols, float lo, float hi, uint64_t stream) {
  Matrix<float> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    m.data()[i] = lo + (hi - lo) * float(double(random_word(9, stream, uint64_t(i))) / 4294967296.0);
  return m;
}

// A policy whose attention sites leave their range on provoking(…) data: scores
// saturating at fp6_e3m2's 28, the softmax's e3m2 input overflowing to inf (NaN rows), and (with an
// emulated attn.pv) outputs beyond e4m3b11fnuz's 30 becoming NaN.
void provoke_overflow(Policy& p, bool pv_emulated) {
  p.all[int(Site::attn_qk)].output = format_lookup("fp6_e3m2");
  p.all[int(Site::softmax)].input = format_lookup("e3m2");
  if (pv_emulated) p.all[int(Site::attn_pv)].output = format_lookup("e4m3b11fnuz");
}

// provoke: every seventh query row ×30, so that its scores leave those ranges and the others' stay.
Matrix<float> provoking(Matrix<float> q, bool provoke) {
  if (provoke)
    for (Eigen::Index i = 3; i < q.rows(); i += 7) q.row(i) *= 30.0f;
  return q;
}

// The kernel's counts (attn.qk, softmax, attn.pv) equal the CPU's; provoked: the case must have
// provoked the events it is meant to count (pv_overflow: attn.pv's too).
void check_health(const SiteHealth (&cpu)[3], const SiteHealth (&kernel)[3], bool provoked, bool pv_overflow) {
  const char* sites[] = {"attn.qk", "softmax", "attn.pv"};
  for (int s = 0; s < 3; ++s) {
    INFO(sites[s] << ": cpu " << cpu[s].overflow << "/" << cpu[s].nan << "/" << cpu[s].inf << " kernel "
                  << kernel[s].overflow << "/" << kernel[s].nan << "/" << kernel[s].inf);
    CHECK(cpu[s].overflow == kernel[s].overflow);
    CHECK(cpu[s].nan == kernel[s].nan);
    CHECK(cpu[s].inf == kernel[s].inf);
  }
  if (provoked) {
    CHECK(cpu[0].overflow > 0);
    CHECK(cpu[1].overflow > 0);
    CHECK(cpu[1].nan > 0);
    if (pv_overflow) CHECK(cpu[2].overflow > 0);
  }
}

}  // namespace

TEST_CASE("the GPU kernels' steps run serially equal the CPU attention (materialised: bit for bit)",
          "[attention_row]") {
  struct Shape { Eigen::Index T, NH, NKV, HS; };
  for (const Shape sh : {Shape{1, 1, 1, 8}, Shape{17, 2, 2, 8}, Shape{70, 4, 1, 8}, Shape{130, 1, 1, 16}})
    for (int mu : {4, 10})
      for (Rounding mode : {Rounding::rne, Rounding::sr})
        for (int variant = 0; variant < 8; ++variant) {
          const bool provoke = variant >= 4;  // the site health's events, and their counts
          Policy p = kernel_policy(mu, mode, true, variant % 2 == 1, 3);
          if (provoke) provoke_overflow(p, true);
          if (variant % 4 >= 1) {
            p.lamp = LampSpec{};
            p.lamp->rule = variant % 4 == 2 ? LampRule::relaxed : LampRule::strict;
            p.lamp->tau = variant % 4 == 2 ? 0.03 : 0.01;
            p.lamp->length_scaled = variant % 4 == 3, p.lamp->random_control = variant % 4 == 3, p.lamp->seed = 4;
            p.lamp->recompute = format_lookup("fp32");
          }
          INFO("T " << sh.T << " NH " << sh.NH << " NKV " << sh.NKV << " mu " << mu << " mode " << int(mode)
                    << " variant " << variant);
          ModelConfig c;
          c.arch = Arch::llama, c.layers = 1, c.heads = int(sh.NH), c.kv_heads = int(sh.NKV), c.dim = int(sh.NH * sh.HS);
          const PolicyPlan pol(p, c);
          const Matrix<float> q = provoking(kernel_input(sh.T, sh.NH * sh.HS, -2, 2, 1), provoke);
          const Matrix<float> k = kernel_input(sh.T, sh.NKV * sh.HS, -2, 2, 2);
          Matrix<float> v = provoke ? kernel_input(sh.T, sh.NKV * sh.HS, 10, 40, 3)
                                    : kernel_input(sh.T, sh.NKV * sh.HS, 0.5f, 1.5f, 3);
          if (provoke) v(sh.T / 2, 0) = std::numeric_limits<float>::quiet_NaN();  // its block goes row by row
          Matrix<float> out(sh.T, sh.NH * sh.HS);
          std::vector<Matrix<float>> probs;
          SiteHealth cpu_health[3];  // attn.qk, softmax, attn.pv
          const uint64_t want = detail::attention_forward<float>(pol, 0, q, k, v, sh.NH, sh.NKV, sh.HS, out, &probs,
                                                                 {&cpu_health[0], &cpu_health[1], &cpu_health[2]});
          // the materialised kernel, one (head, row) block at a time, after its pass over the values
          AttentionArgs A = attention_args(pol, 0, q.data(), k.data(), v.data(), sh.T, sh.NH, sh.NKV, sh.HS);
          const int64_t nb = (sh.T + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
          std::vector<uint8_t> v_nonfinite(size_t(sh.NKV * nb));
          for (int64_t g = 0; g < sh.NKV; ++g)
            for (int64_t b = 0; b < nb; ++b)
              v_nonfinite[size_t(g * nb + b)] = !attention_values_finite(
                  v.data(), sh.NKV * sh.HS, g * sh.HS, sh.HS, b * kAttentionQueryBlock,
                  std::min<int64_t>(sh.T, (b + 1) * kAttentionQueryBlock));
          A.v_nonfinite = v_nonfinite.data();
          Matrix<float> got(sh.T, sh.NH * sh.HS);
          uint64_t count = 0;
          bool probs_equal = true;
          SiteHealth kernel_health[3];  // the kernel's counts, from the same element functions
          SiteHealth &kq = kernel_health[0], &ks = kernel_health[1], &kp = kernel_health[2];
          for (int64_t h = 0; h < sh.NH; ++h)
            for (int64_t i = 0; i < sh.T; ++i) {
              const int64_t n = i + 1;
              std::vector<float> S(size_t(sh.T), 0.0f);
              for (int64_t j = 0; j < n; ++j) S[size_t(j)] = attention_score(A, h, i, j, &kq);
              if (A.lamp) {
                std::vector<uint8_t> mark(static_cast<size_t>(n));
                std::vector<uint32_t> idx(static_cast<size_t>(n));
                count += lamp_row_select(A.strict_rule, lamp_row_tau(A.tau, A.length_scaled, i), A.random_control,
                                         A.lamp_seed, S.data(), size_t(n), mark.data(), idx.data(), lamp_stream(0, h, i));
                for (int64_t j = 0; j < n; ++j)
                  if (mark[size_t(j)]) S[size_t(j)] = attention_recomputed(A, h, i, j);
              }
              const uint64_t sms = softmax_stream(0, h, i);
              if (A.sm_in.on)
                for (int64_t j = 0; j < n; ++j)
                  S[size_t(j)] = round_element(A.sm_in, S[size_t(j)], sms + kStreamA, uint64_t(j), &ks);
              softmax_row(S.data(), n);
              if (A.sm_out.on)
                for (int64_t j = 0; j < n; ++j)
                  S[size_t(j)] = round_element(A.sm_out, S[size_t(j)], sms + kStreamOutput, uint64_t(j), &ks);
              for (int64_t j = 0; j < n; ++j) health_count_nonfinite(ks, S[size_t(j)]);
              probs_equal &= std::memcmp(S.data(), probs[size_t(h)].row(i).data(), size_t(sh.T) * 4) == 0;
              for (int64_t cc = 0; cc < sh.HS; ++cc) got(i, h * sh.HS + cc) = attention_pv(A, S.data(), h, i, cc, &kp);
            }
          CHECK(probs_equal);
          CHECK(count == want);
          CHECK(std::memcmp(got.data(), out.data(), size_t(out.size()) * 4) == 0);
          check_health(cpu_health, kernel_health, provoke && sh.T >= 17, true);
        }
}

TEST_CASE("a non-finite value reaches the attention rows at and after its key only", "[attention_row]") {
  const Eigen::Index T = 100, NH = 2, HS = 8;
  for (bool random : {false, true})
    for (bool emulated : {false, true}) {
      Policy p = kernel_policy(7, random ? Rounding::sr : Rounding::rne, emulated, false, 5);
      ModelConfig c;
      c.arch = Arch::llama, c.layers = 1, c.heads = int(NH), c.kv_heads = int(NH), c.dim = int(NH * HS);
      const PolicyPlan pol(p, c);
      const Matrix<float> q = kernel_input(T, NH * HS, -2, 2, 1), k = kernel_input(T, NH * HS, -2, 2, 2);
      const Matrix<float> v = kernel_input(T, NH * HS, 0.5f, 1.5f, 3);
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
        for (Eigen::Index j : {Eigen::Index(0), Eigen::Index(40), Eigen::Index(63), Eigen::Index(64), Eigen::Index(99)}) {
          INFO("random " << random << " emulated " << emulated << " value " << bad << " at key " << j);
          Matrix<float> vb = v;
          vb(j, 3) = bad;  // head 0's value column 3
          Matrix<float> clean(T, NH * HS), got(T, NH * HS);
          detail::attention_forward<float>(pol, 0, q, k, v, NH, NH, HS, clean, nullptr, {});
          detail::attention_forward<float>(pol, 0, q, k, vb, NH, NH, HS, got, nullptr, {});
          // rows before j: the clean run's values (emulated: its bits; native: Eigen's product of one
          // row, another summation order than the block's); rows from j: column 3 of head 0
          // non-finite (its weight p_ij > 0); head 1 untouched
          double worst = 0;
          for (Eigen::Index i = 0; i < j * NH * HS; ++i)
            worst = std::max(worst, std::abs(double(got.data()[i]) - clean.data()[i]) / std::abs(clean.data()[i]));
          if (emulated || random) CHECK(std::memcmp(got.data(), clean.data(), size_t(j * NH * HS) * 4) == 0);
          else CHECK(worst <= 1e-6);
          bool reached = true;
          for (Eigen::Index i = j; i < T; ++i) reached &= !std::isfinite(got(i, 3));
          CHECK(reached);
          CHECK(std::memcmp(got.col(HS).eval().data(), clean.col(HS).eval().data(), size_t(T) * 4) == 0);
        }
    }
}

TEST_CASE("the flash kernel's steps run serially: the CPU's LAMP counts, its output to rounding", "[attention_row]") {
  struct Shape { Eigen::Index T, NH, NKV, HS; };
  const int64_t tile = 16;
  for (const Shape sh : {Shape{1, 1, 1, 8}, Shape{17, 2, 2, 8}, Shape{70, 4, 1, 8}, Shape{130, 1, 1, 16}})
    for (int mu : {4, 10})
      for (Rounding mode : {Rounding::rne, Rounding::sr})
        for (double tau : {-1.0, 0.0, 1e-4, 0.03, 0.5, 2.0})
          for (bool provoke : {false, true}) {
          Policy p = kernel_policy(mu, mode, false, false, 3);
          if (provoke) provoke_overflow(p, false);
          if (tau >= 0) {
            p.lamp = LampSpec{};
            p.lamp->rule = LampRule::relaxed, p.lamp->tau = tau, p.lamp->length_scaled = tau == 1e-4;
            p.lamp->recompute = format_lookup("fp32");
          }
          INFO("T " << sh.T << " NH " << sh.NH << " mu " << mu << " mode " << int(mode) << " tau " << tau << " provoke "
                    << provoke);
          ModelConfig c;
          c.arch = Arch::llama, c.layers = 1, c.heads = int(sh.NH), c.kv_heads = int(sh.NKV), c.dim = int(sh.NH * sh.HS);
          const PolicyPlan pol(p, c);
          const Matrix<float> q = provoking(kernel_input(sh.T, sh.NH * sh.HS, -2, 2, 1), provoke);
          const Matrix<float> k = kernel_input(sh.T, sh.NKV * sh.HS, -2, 2, 2);
          const Matrix<float> v = kernel_input(sh.T, sh.NKV * sh.HS, 0.5f, 1.5f, 3);
          Matrix<float> out(sh.T, sh.NH * sh.HS);
          SiteHealth cpu_health[3];  // attn.qk, softmax, attn.pv
          const uint64_t want = detail::attention_forward<float>(pol, 0, q, k, v, sh.NH, sh.NKV, sh.HS, out, nullptr,
                                                                 {&cpu_health[0], &cpu_health[1], &cpu_health[2]});
          const AttentionArgs A = attention_args(pol, 0, q.data(), k.data(), v.data(), sh.T, sh.NH, sh.NKV, sh.HS);
          uint64_t count = 0;
          double worst = 0;
          SiteHealth kernel_health[3];  // the kernel's counts
          SiteHealth &kq = kernel_health[0], &ks = kernel_health[1], &kp = kernel_health[2];
          for (int64_t h = 0; h < sh.NH; ++h)
            for (int64_t i = 0; i < sh.T; ++i) {
              const int64_t n = i + 1, g = h / (sh.NH / sh.NKV);
              const double t = A.lamp ? lamp_row_tau(A.tau, A.length_scaled, i) : 0.0;
              const int rule = A.lamp ? lamp_relaxed_trivial(t) : 0;
              OnlineSoftmax<float> sm;
              std::vector<float> acc(size_t(sh.HS), 0.0f), o(static_cast<size_t>(sh.HS)), cy(static_cast<size_t>(n));
              std::vector<uint32_t> cj(static_cast<size_t>(n));
              auto feed = [&](uint32_t j, float x) {
                if (A.sm_in.on) x = round_element(A.sm_in, x, softmax_stream(0, h, i) + kStreamA, j, &ks);
                online_softmax_add(sm, acc.data(), x, v.data() + int64_t(j) * sh.NKV * sh.HS + g * sh.HS, sh.HS);
              };
              RelaxedScan scan;
              for (int64_t t0 = 0; t0 < n; t0 += tile) {
                for (int64_t j = t0; j < std::min(n, t0 + tile); ++j) {
                  const float y = attention_score(A, h, i, j, &kq);  // counted even where recomputed (rule 1)
                  if (rule == 2) relaxed_scan_add(scan, cj.data(), cy.data(), uint32_t(j), y);
                  else feed(uint32_t(j), rule == 1 ? attention_recomputed(A, h, i, j) : y);
                }
                if (rule == 2) relaxed_scan_prune(scan, cj.data(), cy.data(), t, feed);
              }
              if (rule == 1) count += uint64_t(n);
              if (rule == 2)
                count += relaxed_scan_finish(scan, cj.data(), cy.data(), t, [&](uint32_t j, float y, bool sel) {
                  feed(j, sel ? attention_recomputed(A, h, i, j) : y);
                });
              online_softmax_finish(sm, acc.data(), o.data(), sh.HS);
              if (online_softmax_nan(sm)) ks.nan += uint64_t(n);
              for (int64_t cc = 0; cc < sh.HS; ++cc) {
                health_count_nonfinite(kp, o[size_t(cc)]);
                const double w = out(i, h * sh.HS + cc);
                if (std::isnan(w)) CHECK(std::isnan(o[size_t(cc)]));
                else worst = std::max(worst, std::abs(double(o[size_t(cc)]) - w) / std::abs(w));
              }
            }
          CHECK(count == want);
          CHECK(worst <= 1e-5);
          check_health(cpu_health, kernel_health, provoke && sh.T >= 17, false);
        }
}
