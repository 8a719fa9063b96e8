// The GNMR controller (train/gnmr.h) against a plain reference written from the rule as stated:
// whole histories kept and every mean recomputed from them, candidates gathered and sorted
// afresh. Every output field is compared exactly (the undefined ones as undefined), over norm
// streams that hit the corners (zero norms, a zero history mean, ties, spikes, plateaus) and
// every combination of the choices; then budget, locks, warm-up, the state round trip and the
// replay's CSV contract.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "core/file.h"
#include "core/philox.h"
#include "exp/gnmr_replay.h"
#include "exp/gnmr_study.h"
#include "exp/study.h"
#include "nn/policy.h"
#include "testutil.h"
#include "train/config.h"
#include "train/gnmr.h"
#include "train/routing.h"
#include "mantis_config.h"

using namespace mantis;
using mantis::test::error_of;
using mantis::test::scratch_dir;

namespace {

using Rows = std::vector<std::vector<GnmrUnitStep>>;  // [step][unit]

bool undefined(double x) { return std::isnan(x); }

// The reference: one pass per step over whole histories.
Rows reference(const GnmrOptions& o, const std::vector<std::string>& ids, const std::vector<std::vector<double>>& norms) {
  const size_t U = ids.size();
  std::vector<std::vector<double>> history(U), defined_gnmr(U);
  std::vector<int> lock(U, 0);
  std::vector<bool> prev_selected(U, false);
  Rows out;
  for (size_t step = 1; step <= norms.size(); ++step) {
    const std::vector<double>& n = norms[step - 1];
    std::vector<GnmrUnitStep> r(U);
    for (size_t u = 0; u < U; ++u) {
      const auto& h = history[u];
      double m = NAN;
      if (!h.empty()) {
        if (!o.mean_ema) {
          double s = 0;
          for (double x : h) s += x;
          m = s / double(h.size());
        } else {
          m = h[0];
          for (size_t i = 1; i < h.size(); ++i) m = o.ema_decay * m + (1 - o.ema_decay) * h[i];
        }
      }
      r[u].gnmr = (!h.empty() && m != 0) ? n[u] / m : NAN;
      const auto& w = defined_gnmr[u];
      if (!undefined(r[u].gnmr) && w.size() >= size_t(o.delta)) {
        double s = 0;
        for (size_t i = w.size() - size_t(o.delta); i < w.size(); ++i) s += w[i];
        const double mean = s / double(o.delta);
        if (mean != 0) r[u].dgnmr = r[u].gnmr / mean;
      }
    }
    // thresholds
    double a = o.alpha, b = o.beta;
    if (o.threshold_quantile) {
      auto q = [&](bool d) {
        std::vector<double> x;
        for (auto& s : r)
          if (!undefined(d ? s.dgnmr : s.gnmr)) x.push_back(d ? s.dgnmr : s.gnmr);
        if (x.empty()) return double(NAN);
        std::sort(x.begin(), x.end());
        const double hh = double(x.size() - 1) * o.quantile;
        const size_t lo = size_t(std::floor(hh)), hi = std::min(lo + 1, x.size() - 1);
        return hi == lo ? x[lo] : x[lo] + (hh - double(lo)) * (x[hi] - x[lo]);
      };
      a = q(false), b = q(true);
    }
    auto term = [](double v, double th) {
      if (undefined(v) || undefined(th)) return double(NAN);
      return th == 0 ? (v > 0 ? INFINITY : 0.0) : v / th;
    };
    std::vector<double> score(U, -INFINITY);
    std::vector<bool> exceeds(U, false);
    for (size_t u = 0; u < U; ++u) {
      const double ta = term(r[u].gnmr, a), tb = term(r[u].dgnmr, b);
      if (!undefined(ta)) score[u] = std::max(score[u], ta);
      if (!undefined(tb)) score[u] = std::max(score[u], tb);
      const bool ea = !undefined(ta) && r[u].gnmr > a, eb = !undefined(tb) && r[u].dgnmr > b;
      exceeds[u] = step > o.warmup && (o.combine_and ? (ea && eb) : (ea || eb));
    }
    // selection
    std::vector<size_t> cand;
    for (size_t u = 0; u < U; ++u)
      if (exceeds[u] || lock[u] > 0) cand.push_back(u);
    std::sort(cand.begin(), cand.end(), [&](size_t x, size_t y) {
      const int gx = (!o.priority_score && lock[x] > 0) ? 0 : 1, gy = (!o.priority_score && lock[y] > 0) ? 0 : 1;
      if (gx != gy) return gx < gy;
      if (score[x] != score[y]) return score[x] > score[y];
      return ids[x] < ids[y];
    });
    std::vector<bool> sel(U, false);
    for (size_t i = 0; i < cand.size() && i < size_t(o.max_recover); ++i) sel[cand[i]] = true;
    for (size_t u = 0; u < U; ++u) {
      if (sel[u] && exceeds[u]) lock[u] = o.lock;
      else if (lock[u] > 0 && !exceeds[u]) lock[u] -= 1;
      r[u].exceeds = exceeds[u], r[u].lock = lock[u], r[u].recovered = sel[u];
      if (!undefined(r[u].gnmr)) defined_gnmr[u].push_back(r[u].gnmr);
      if (!o.history_low_path || !prev_selected[u]) history[u].push_back(n[u]);
      prev_selected[u] = sel[u];
    }
    out.push_back(r);
  }
  return out;
}

Rows run(Gnmr& g, const std::vector<std::vector<double>>& norms, size_t from = 0) {
  Rows out;
  for (size_t s = from; s < norms.size(); ++s) out.push_back(g.step(norms[s]));
  return out;
}

bool same(double a, double b) { return (undefined(a) && undefined(b)) || a == b; }

void check_equal(const Rows& got, const Rows& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); ++s)
    for (size_t u = 0; u < got[s].size(); ++u) {
      const auto &x = got[s][u], &y = want[s][u];
      INFO(what << " step " << s + 1 << " unit " << u << ": gnmr " << x.gnmr << " / " << y.gnmr << ", dgnmr " << x.dgnmr
                << " / " << y.dgnmr << ", exceeds " << x.exceeds << " / " << y.exceeds << ", lock " << x.lock << " / "
                << y.lock << ", recovered " << x.recovered << " / " << y.recovered);
      REQUIRE(same(x.gnmr, y.gnmr));
      REQUIRE(same(x.dgnmr, y.dgnmr));
      REQUIRE(x.exceeds == y.exceeds);
      REQUIRE(x.lock == y.lock);
      REQUIRE(x.recovered == y.recovered);
    }
}

// A norm stream with the corners: units that start at zero (a zero mean), plateaus (ties between
// units and ΔGNMR windows of equal values), spikes and slow drifts. Deterministic in `seed`.
std::vector<std::vector<double>> stream(uint64_t seed, size_t steps, size_t units) {
  std::vector<std::vector<double>> n(steps, std::vector<double>(units));
  for (size_t u = 0; u < units; ++u)
    for (size_t s = 0; s < steps; ++s) {
      const uint64_t w = random_word64(seed, u, s);
      const double r = double(w >> 11) * 0x1p-53;
      double x;
      switch (u % 5) {
        case 0: x = s < 3 ? 0.0 : 1.0 + 0.1 * r; break;                    // zero history first
        case 1: x = 1.0; break;                                             // a plateau: ties
        case 2: x = (w & 15) == 0 ? 20.0 * (1 + r) : 1.0 + 0.05 * r; break; // spikes
        case 3: x = 0.5 + 0.01 * double(s) + 0.1 * r; break;                // a drift
        default: x = (w & 7) == 0 ? 0.0 : r; break;                         // zeros anywhere
      }
      n[s][u] = x;
    }
  return n;
}

std::vector<std::string> ids_of(size_t units) {
  std::vector<std::string> ids;
  for (size_t u = 0; u < units; ++u) ids.push_back(fmt::format("layer.{}.u{}", u % 11, u));  // not in byte order
  return ids;
}

}  // namespace

TEST_CASE("GNMR equals the plain reference under every combination of choices") {
  const size_t U = 17, T = 160;
  const auto ids = ids_of(U);
  int combos = 0;
  for (int bits = 0; bits < 32; ++bits)
    for (int variant = 0; variant < 3; ++variant) {
      GnmrOptions o;
      o.combine_and = bits & 1, o.history_low_path = bits & 2, o.mean_ema = bits & 4, o.priority_score = bits & 8;
      o.threshold_quantile = bits & 16;
      o.warmup = variant == 0 ? 0 : variant == 1 ? 10 : 200;  // 200 > T: never exceeds
      o.delta = variant == 2 ? 1 : 4;
      o.max_recover = variant == 0 ? 2 : variant == 1 ? 5 : 0;
      o.lock = variant == 0 ? 3 : variant == 1 ? 0 : 16;
      o.alpha = variant == 1 ? 1.2 : 2.0;
      o.beta = 1.5, o.ema_decay = 0.9, o.quantile = variant == 0 ? 0.9 : 0.75;
      const auto n = stream(uint64_t(bits * 3 + variant + 1), T, U);
      Gnmr g(o, ids);
      check_equal(run(g, n), reference(o, ids, n), fmt::format("choices {} variant {}", bits, variant));
      ++combos;
    }
  CHECK(combos == 96);
}

TEST_CASE("GNMR: the budget is never exceeded, and warm-up, lock and ties follow the rule") {
  const size_t U = 23;
  const auto ids = ids_of(U);
  GnmrOptions o;
  o.warmup = 5, o.max_recover = 3, o.lock = 4, o.delta = 2;
  const auto n = stream(7, 120, U);
  Gnmr g(o, ids);
  const Rows r = run(g, n);
  size_t recovered_total = 0, exceeded = 0;
  for (size_t s = 0; s < r.size(); ++s) {
    size_t sel = 0;
    for (auto& u : r[s]) {
      sel += u.recovered, exceeded += u.exceeds;
      CHECK(u.lock >= 0);
      CHECK(u.lock <= o.lock);
      if (s < o.warmup) CHECK_FALSE(u.exceeds);
    }
    CHECK(sel <= size_t(o.max_recover));
    recovered_total += sel;
  }
  CHECK(exceeded > 0);        // the spikes exceed: the test exercises selection
  CHECK(recovered_total > 0);

  // Hand-worked: two units with equal spikes at step 3 and budget 1 — the lower id wins the tie.
  GnmrOptions h;
  h.alpha = 2, h.beta = 100, h.delta = 1, h.max_recover = 1, h.lock = 2, h.warmup = 0;
  Gnmr t(h, {"b", "a"});
  const std::vector<std::vector<double>> steps = {{1, 1}, {1, 1}, {5, 5}, {1, 1}, {1, 1}, {1, 1}};
  const Rows x = run(t, steps);
  // step 1: no history. step 2: GNMR 1. step 3: both 5 > 2, tie → "a" (index 1) selected, lock 2.
  CHECK(undefined(x[0][0].gnmr));
  CHECK(x[1][0].gnmr == 1.0);
  CHECK(x[2][0].exceeds);
  CHECK(x[2][1].exceeds);
  CHECK(x[2][1].recovered);
  CHECK_FALSE(x[2][0].recovered);
  CHECK(x[2][1].lock == 2);
  CHECK(x[2][0].lock == 0);  // exceeded but not selected: unchanged
  // step 4: mean of (1, 1, 5) = 7/3, GNMR 3/7; "a" still locked: a candidate, selected; lock → 1.
  CHECK(x[3][1].gnmr == 1.0 / (7.0 / 3.0));
  CHECK(x[3][1].recovered);
  CHECK(x[3][1].lock == 1);
  CHECK(x[4][1].recovered);  // lock 1 entering: selected, lock → 0
  CHECK(x[4][1].lock == 0);
  CHECK_FALSE(x[5][1].recovered);
  // ΔGNMR with δ = 1: GNMR_3 / GNMR_2 = 5 / 1.
  CHECK(x[2][0].dgnmr == 5.0);
}

TEST_CASE("GNMR: a saved state resumes bit for bit; a unit pinned to the recovery path is reported") {
  const size_t U = 13;
  const auto ids = ids_of(U);
  GnmrOptions o;
  o.warmup = 3, o.max_recover = 2, o.lock = 2, o.history_low_path = true, o.delta = 3;
  const auto n = stream(11, 90, U);
  Gnmr whole(o, ids);
  const Rows all = run(whole, n);
  Gnmr first(o, ids);
  for (size_t s = 0; s < 41; ++s) first.step(n[s]);
  const std::string saved = first.state().dump();
  Gnmr second(o, ids);
  second.load_state(nlohmann::json::parse(saved));
  CHECK(second.steps() == 41);
  const Rows rest = run(second, n, 41);
  check_equal(rest, Rows(all.begin() + 41, all.end()), "resumed");

  auto bad = nlohmann::json::parse(saved);
  bad["units"][0]["id"] = "other";
  CHECK_THAT(error_of([&] { Gnmr(o, ids).load_state(bad); }), Catch::Contains("GNMR state: unit 0 is 'other'"));
  bad = nlohmann::json::parse(saved);
  bad["units"][2]["lock"] = 99;
  CHECK_THAT(error_of([&] { Gnmr(o, ids).load_state(bad); }), Catch::Contains("out of range"));

  // history = low_path: a unit whose norm jumps for good and is recovered never updates its mean,
  // so it stays selected to the end — held() names it.
  GnmrOptions p;
  p.warmup = 0, p.max_recover = 1, p.lock = 2, p.history_low_path = true;
  Gnmr pinned(p, {"x", "y"});
  for (int s = 0; s < 40; ++s) pinned.step(std::vector<double>{s < 5 ? 1.0 : 10.0, 1.0});
  const auto held = pinned.held();
  REQUIRE(held.size() == 1);
  CHECK(pinned.ids()[held[0].unit] == "x");
  CHECK(held[0].since == 6);
  // with history = all the mean catches up and the slot is released
  p.history_low_path = false;
  Gnmr moving(p, {"x", "y"});
  for (int s = 0; s < 40; ++s) moving.step(std::vector<double>{s < 5 ? 1.0 : 10.0, 1.0});
  CHECK(moving.held().empty());
}

TEST_CASE("GNMR: bad norms, ids and options are one-line errors") {
  GnmrOptions o;
  Gnmr g(o, {"a", "b"});
  CHECK_THAT(error_of([&] { g.step(std::vector<double>{1.0, NAN}); }),
             Catch::Contains("GNMR step 1: unit b: gradient norm nan is not a finite"));
  CHECK_THAT(error_of([&] { g.step(std::vector<double>{1.0}); }), Catch::Contains("1 norms for 2 units"));
  CHECK_THAT(error_of([&] { Gnmr(o, {"a", "a"}); }), Catch::Contains("not distinct"));
  for (auto f : std::vector<std::function<void(GnmrOptions&)>>{
           [](GnmrOptions& x) { x.alpha = 0; }, [](GnmrOptions& x) { x.delta = 0; },
           [](GnmrOptions& x) { x.ema_decay = 1; }, [](GnmrOptions& x) { x.quantile = 1.5; }}) {
    GnmrOptions b;
    f(b);
    CHECK_FALSE(error_of([&] { validate(b); }).empty());
  }
}

TEST_CASE("gnmr replay: the CSV contract, equal to the library, and its errors") {
  const auto dir = scratch_dir();
  const std::string cfg = (dir / "c.toml").string(), norms = (dir / "n.csv").string(), out = (dir / "d.csv").string();
  write_file_atomic(cfg, "[controller]\nname = \"gnmr\"\nalpha = 1.5\nbeta = 1.2\ndelta = 3\nmax_recover = 2\n"
                         "lock = 3\nwarmup = 4\ncombine = \"or\"\nhistory = \"low_path\"\nseed = 5\n"
                         "[controller.recover]\nbits = 8\n[train]\nsteps = 3\n");
  const GnmrOptions o = gnmr_replay_config(cfg);
  CHECK(o.alpha == 1.5);
  CHECK(o.history_low_path);
  const std::vector<std::string> ids = {"layer.1.fc", "layer.0.qkv", "layer.10.fc", "emb"};
  const auto n = stream(3, 30, ids.size());
  // rows written in a shuffled order
  std::vector<std::string> lines;
  for (size_t s = 0; s < n.size(); ++s)
    for (size_t u = 0; u < ids.size(); ++u) lines.push_back(fmt::format("{},{},{:.17g}", s + 1, ids[u], n[s][u]));
  std::mt19937 rng(1);
  std::shuffle(lines.begin(), lines.end(), rng);
  std::string text = "step,unit,grad_norm\n";
  for (auto& l : lines) text += l + "\n";
  write_file_atomic(norms, text);
  const GnmrReplayResult r = gnmr_replay(o, norms, out);
  CHECK(r.steps == 30);
  CHECK(r.units == 4);
  // expected: the reference over ids sorted by bytes
  std::vector<std::string> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<double>> ns(n.size(), std::vector<double>(4));
  for (size_t u = 0; u < 4; ++u) {
    const size_t src = size_t(std::find(ids.begin(), ids.end(), sorted[u]) - ids.begin());
    for (size_t s = 0; s < n.size(); ++s) ns[s][u] = n[s][src];
  }
  const Rows want = reference(o, sorted, ns);
  std::string expect = "step,unit,gnmr,dgnmr,exceeds,lock,recovered\n";
  uint64_t rec = 0;
  auto num = [](double x) { return undefined(x) ? std::string() : fmt::format("{:.17g}", x); };
  for (size_t s = 0; s < want.size(); ++s)
    for (size_t u = 0; u < 4; ++u) {
      const auto& w = want[s][u];
      rec += w.recovered;
      expect += fmt::format("{},{},{},{},{},{},{}\n", s + 1, sorted[u], num(w.gnmr), num(w.dgnmr), int(w.exceeds), w.lock,
                            int(w.recovered));
    }
  CHECK(read_text_file(out, "out") == expect);
  CHECK(r.recovered == rec);
  CHECK(r.eligible == (30 - 4) * 4);

  auto err = [&](const std::string& csv) {
    write_file_atomic(norms, csv);
    return error_of([&] { gnmr_replay(o, norms, out); });
  };
  CHECK_THAT(err("step,unit,norm\n1,a,1\n"), Catch::Contains("the header must be step,unit,grad_norm"));
  CHECK_THAT(err("step,unit,grad_norm\n1,a,1\n1,a,2\n"), Catch::Contains(":3: unit a at step 1 appears twice"));
  CHECK_THAT(err("step,unit,grad_norm\n1,a,1\n1,b,1\n2,a,1\n"), Catch::Contains("unit b has no norm at step 2"));
  CHECK_THAT(err("step,unit,grad_norm\n1,a,nan\n"), Catch::Contains("grad_norm 'nan' is not a finite number"));
  CHECK_THAT(err("step,unit,grad_norm\n0,a,1\n"), Catch::Contains("step '0' is not an integer ≥ 1"));
  CHECK_THAT(err("step,unit,grad_norm\n1,a,1,2\n"), Catch::Contains("4 fields"));
  CHECK_THAT(err("step,unit,grad_norm\n"), Catch::Contains("no rows"));

  auto cfg_err = [&](const std::string& toml) {
    write_file_atomic(cfg, toml);
    return error_of([&] { gnmr_replay_config(cfg); });
  };
  CHECK_THAT(cfg_err("[controller]\nname = \"gnmr\"\nalfa = 2\n"), Catch::Contains("unknown key 'alfa' in [controller]"));
  CHECK_THAT(cfg_err("[controller]\nname = \"random\"\n"), Catch::Contains("name must be \"gnmr\""));
  CHECK_THAT(cfg_err("[controller]\nname = \"gnmr\"\ncombine = \"xor\"\n"), Catch::Contains("combine must be \"or\" or \"and\""));
  CHECK_THAT(cfg_err("[controller]\nname = \"gnmr\"\ndelta = 0\n"), Catch::Contains("delta must be ≥ 1"));
  CHECK_THAT(cfg_err("[train]\nsteps = 1\n"), Catch::Contains("no [controller] table"));
}

TEST_CASE("gnmr study: arms as cells, merged with intervals and recovery rates; resume and stale cells") {
  const auto dir = scratch_dir();
  const std::string model = (dir / "train-tiny.toml").string(), study = (dir / "study.toml").string();
  write_file_atomic(model, "[model]\narch = \"llama\"\nlayers = 2\nheads = 2\nkv_heads = 1\ndim = 16\nctx = 24\n"
                           "[data]\ntokenizer = \"bytes\"\ntrain = \"kjv/test\"\nvalidation = \"kjv/validation\"\n"
                           "[train]\nsteps = 5\nbatch = 2\nlr = 3e-3\nwarmup = 1\nval_every = 2\nval_seqs = 2\n");
  auto write_study = [&](const std::string& extra) {
    write_file_atomic(study, fmt::format(R"(out = "{}"
models = ["{}"]
seeds = [1, 2]
[train]
steps = 6
[[arm]]
name = "static4"
config = "[activation_quant]\nbits = 4\n"
[[arm]]
name = "random4to8"
config = """
[activation_quant]
bits = 4
[controller]
name = "random"
max_recover = 2
[controller.recover]
bits = 8
"""
[[arm]]
name = "gnmr4to8"
seeds = [1]
config = """
[activation_quant]
bits = 4
[controller]
name = "gnmr"
warmup = 1
delta = 1
alpha = 1.01
beta = 1.01
max_recover = 1
lock = 1
[controller.recover]
bits = 8{}
"""
)",
                                         (dir / "res").string(), model, extra));
  };
  write_study("");
  const auto cells = gnmr_study_cells(read_gnmr_study(study));
  REQUIRE(cells.size() == 5);
  CHECK(cells[4].name() == "tiny gnmr4to8 seed=1");
  GnmrStudyOptions o;
  o.config = study, o.log = nullptr, o.progress = ProgressMode::quiet;
  o.cell = 4;
  auto r = run_gnmr_study(o);
  CHECK(r.computed == 1);
  CHECK_FALSE(r.merged);
  o.cell = -1;
  r = run_gnmr_study(o);
  CHECK(r.computed == 4);
  REQUIRE(r.merged);
  const std::string res = (dir / "res").string();
  verify_result_set(res);
  const std::string summary = read_text_file(res + "/summary.csv", "summary");
  // losses in nats, named so (study.h: the unit is the column name's last suffix)
  CHECK(summary.starts_with("model,arm,seeds,mean_final_val_loss_nats,t_lo_nats,t_hi_nats,boot_lo_nats,boot_hi_nats,"
                            "ppl,ppl_lo,ppl_hi,"));
  CHECK(read_text_file(res + "/curves.csv", "curves").starts_with("model,arm,seed,step,val_loss_nats\n"));
  CHECK(summary.find("tiny,static4,2,") != std::string::npos);
  CHECK(summary.find("tiny,gnmr4to8,1,") != std::string::npos);
  // random: 2 of the 8 units every step → recovery rate 0.25 exactly
  CHECK(summary.find("tiny,random4to8,2,") != std::string::npos);
  const std::string results = read_text_file(res + "/results.csv", "results");
  CHECK(results.starts_with("model,arm,seed,steps,final_val_loss_nats,final_val_ppl,median_step_seconds,"));
  CHECK(results.find(",random,8,12,0,0,0.25,") != std::string::npos);
  CHECK(results.find(",static4,") != std::string::npos);
  const std::string recs = read_text_file(res + "/recoveries.csv", "recoveries");
  CHECK(std::count(recs.begin(), recs.end(), '\n') >= 1 + 2 * 12);  // random's 12 unit-steps per seed
  // resumed: nothing to compute
  CHECK(run_gnmr_study(o).computed == 0);
  // an arm's configuration changed: its stored cells are refused, naming the difference
  write_study("\nseed = 3");
  CHECK_THAT(error_of([&] { run_gnmr_study(o); }), Catch::Contains("config.sha256"));
  // a bad arm is refused before any cell runs
  write_study("\nbitz = 3");
  CHECK_THAT(error_of([&] { run_gnmr_study(o); }), Catch::Contains("arm 'gnmr4to8'"));
  CHECK_THAT(error_of([&] { gnmr_study_from_toml("models = [\"x\"]\n", "s.toml"); }), Catch::Contains("[[arm]]"));
}

TEST_CASE("gnmr study: also_validate measures the final model on other data, keyed and summarised") {
  const auto dir = scratch_dir() / "also";
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "train-tiny.toml").string(), study = (dir / "study.toml").string();
  write_file_atomic(model, "[model]\narch = \"llama\"\nlayers = 1\nheads = 2\nkv_heads = 1\ndim = 16\nctx = 24\n"
                           "[data]\ntokenizer = \"bytes\"\ntrain = \"kjv/test\"\nvalidation = \"kjv/validation\"\n"
                           "[train]\nsteps = 3\nbatch = 2\nlr = 3e-3\nwarmup = 1\nval_seqs = 2\n");
  // the run's own validation data among them: its number must be the final validation loss exactly
  write_file_atomic(study, fmt::format("out = \"{}\"\nmodels = [\"{}\"]\nseeds = [1, 2]\n"
                                       "also_validate = [\"kjv/validation\", \"jargon/validation\"]\n"
                                       "[[arm]]\nname = \"fp32\"\n",
                                       (dir / "res").string(), model));
  GnmrStudyOptions o;
  o.config = study, o.log = nullptr, o.progress = ProgressMode::quiet;
  REQUIRE(run_gnmr_study(o).merged);
  const auto res = nlohmann::json::parse(read_text_file((dir / "res" / "results.json").string(), "results"));
  REQUIRE(res["cells"].size() == 2);
  for (auto& cell : res["cells"]) {
    CHECK(cell["also_val"]["kjv/validation"].get<double>() == cell["final_val_loss"].get<double>());
    CHECK(cell["also_val"]["jargon/validation"].get<double>() > 0);
    CHECK(cell["also_val"]["jargon/validation"].get<double>() != cell["final_val_loss"].get<double>());
  }
  const std::string summary = read_text_file((dir / "res" / "summary.csv").string(), "summary");
  CHECK(summary.find(",interval,val_loss_nats[kjv/validation],t_lo_nats[kjv/validation],t_hi_nats[kjv/validation],"
                     "val_loss_nats[jargon/validation],") != std::string::npos);
  const std::string results = read_text_file((dir / "res" / "results.csv").string(), "results");
  CHECK(results.find("loss_spikes,val_loss_nats[kjv/validation],val_loss_nats[jargon/validation]\n") !=
        std::string::npos);
  // the stored cells carry the extra data in their keys: a changed list refuses them
  write_file_atomic(study, fmt::format("out = \"{}\"\nmodels = [\"{}\"]\nseeds = [1, 2]\n"
                                       "also_validate = [\"kjv/validation\"]\n[[arm]]\nname = \"fp32\"\n",
                                       (dir / "res").string(), model));
  CHECK_THAT(error_of([&] { run_gnmr_study(o); }), Catch::Contains("also_validate"));
  write_file_atomic(study, fmt::format("out = \"{}\"\nmodels = [\"{}\"]\nalso_validate = [\"a b\"]\n[[arm]]\nname = \"x\"\n",
                                       (dir / "res").string(), model));
  CHECK_THAT(error_of([&] { run_gnmr_study(o); }), Catch::Contains("'also_validate' holds data specs"));
}

TEST_CASE("the shipped GNMR studies parse: every arm's configuration on every model, controllers built") {
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(MANTIS_SOURCE_DIR);  // their paths are relative to the repository root
  for (const char* f : {"experiments/gnmr/stress.toml", "experiments/gnmr/finetune.toml", "experiments/gnmr/deepseek.toml",
                        "experiments/gnmr/blocks.toml", "experiments/gnmr/knobs.toml", "tests/data/gnmr-small.toml"}) {
    INFO(f);
    const GnmrStudyConfig c = read_gnmr_study(f);
    CHECK(!gnmr_study_cells(c).empty());
    for (const std::string& m : c.models)
      for (const GnmrStudyArm& a : c.arms) {
        INFO(m << " " << a.name);
        const TrainConfig t = train_config_from_toml(read_text_file(m, "model") + "\n" + a.config, m);
        if (!t.controller.name.empty()) CHECK(make_controller(t.controller, t.model) != nullptr);
        // A cell's key hashes the configuration text, not the options it resolves to: a routing arm
        // spells out the knobs whose defaults a sweep may change, so a new default cannot alter a
        // shipped cell under its old key.
        if (t.controller.name == "gnmr" && t.controller.gnmr.max_recover > 0)
          for (const char* k : {"max_recover", "lock", "warmup"}) CHECK(a.config.find(k) != std::string::npos);
        if (std::string(f).find("blocks") != std::string::npos && a.name != "static2-tensor") {
          CHECK(t.controller.unit_block == 32);  // 8 + 8 + 8 + 22 blocks a layer; 23 = 12.5 % of them
          CHECK(unit_ids(t.model, 32).size() == 184);
          CHECK(t.controller.gnmr.max_recover == 23);
        }
        policy_from_spec(t.policy).check(t.model);  // the arm's GEMM policy loads and fits the model
        if (std::string(f).find("finetune") != std::string::npos) {
          CHECK(t.lora.has_value());
          CHECK(t.init_model != nullptr);
          CHECK(t.train_data == "jargon/train");
        }
      }
  }
  std::filesystem::current_path(cwd);
}
