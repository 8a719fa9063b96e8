// test_optim_study — the optimizer study (exp/optim_study.h): its TOML and its errors, cells
// keyed and resumed, --cell shards merged equal to a one-shot run, intervals over seeds, and the
// Gefen analyses on a test-registered optimizer that exposes Gefen-named state (gefen itself is
// written elsewhere; the probe reads only the state's names, dtypes and shapes).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/file.h"
#include "core/threads.h"
#include "exp/optim_study.h"
#include "exp/study.h"
#include "optim/gefen_codebook.h"
#include "mantis_config.h"
#include "testutil.h"

using namespace mantis;
namespace fs = std::filesystem;
using mantis::test::error_of;
using mantis::test::scratch;

namespace {

// Gefen-named state with a fixed linear codebook: m ← fma(1 − β1, g − m, m) in binary32 (kept
// exactly, unlike Gefen), stored as codes of m / absmax over Q-blocks (Q the largest divisor of
// n ≤ 256), period 1 for every tensor; θ ← θ − lr·deq(m).
class FakeGefen : public Optimizer {
 public:
  FakeGefen(const ParamSet& p, double beta1) : p_(p), w_(float(1.0 - beta1)) {
    for (int j = 0; j < kGefenCodebookSize; ++j) codes_.push_back(float(-1.0 + 2.0 * j / 255.0));
    for (auto& q : p_.params) {
      size_t n = 1;
      for (int64_t d : q.shape) n *= size_t(d);
      size_t Q = 1;
      for (size_t d = 1; d <= std::min<size_t>(n, 256); ++d)
        if (n % d == 0) Q = d;
      m_[q.name].assign(n, 0.f), idx_[q.name].assign(n, 0), mag_[q.name].assign(n / Q, 0.f), q_[q.name] = Q;
    }
  }
  std::string name() const override { return "test-fake-gefen"; }
  void step(Model& model, const GradMap<float>& g, double lr) override {
    for (auto& q : p_.params) {
      auto& m = m_[q.name];
      const auto& gp = g.at(q.name);
      const size_t Q = q_[q.name];
      for (size_t i = 0; i < m.size(); ++i) m[i] = std::fma(w_, gp[i] - m[i], m[i]);
      for (size_t b = 0; b * Q < m.size(); ++b) {
        float a = 0;
        for (size_t i = b * Q; i < (b + 1) * Q; ++i) a = std::max(a, std::abs(m[i]));
        mag_[q.name][b] = a;
        for (size_t i = b * Q; i < (b + 1) * Q; ++i) {
          const float x = a > 0 ? m[i] / a : 0.f;
          idx_[q.name][i] = uint8_t(std::lround((x + 1) * 127.5f));
        }
      }
      auto& th = model.params.at(q.name).data;
      for (size_t i = 0; i < m.size(); ++i)
        th[i] -= float(lr) * (codes_[idx_[q.name][i]] * mag_[q.name][i / Q]);
    }
    ++t_;
  }
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> s;
    s.push_back(StateTensor::of<float>("codebook", {256}, codes_));
    for (auto& q : p_.params) {
      std::vector<uint64_t> shape(q.shape.begin(), q.shape.end());
      s.push_back(StateTensor::of<uint8_t>(q.name + ".idx", shape, idx_.at(q.name)));
      s.push_back(StateTensor::of<float>(q.name + ".mag", {mag_.at(q.name).size()}, mag_.at(q.name)));
      const uint64_t one = 1;
      s.push_back(StateTensor::of<uint64_t>(q.name + ".period", {}, std::span<const uint64_t>(&one, 1)));
    }
    return s;
  }
  uint64_t state_bytes() const override {
    uint64_t b = 8;
    for (auto& t : state()) b += t.bytes.size();
    return b;
  }
  uint64_t steps() const override { return t_; }
  void load_state(const std::vector<StateTensor>&, uint64_t) override { throw InputError("not for checkpoints"); }

  ParamSet p_;
  float w_;
  std::vector<float> codes_;
  std::map<std::string, std::vector<float>> m_, mag_;
  std::map<std::string, std::vector<uint8_t>> idx_;
  std::map<std::string, size_t> q_;
  uint64_t t_ = 0;
};

void register_fake() {
  static const bool done = [] {
    static const std::vector<std::string> keys{"beta1", "relearn_every"};
    register_optimizer({"test-fake-gefen", "Gefen-named state for test_optim_study", keys,
                        [](const OptimizerOptions& o) { OptionReader(o, keys); },
                        [](const ParamSet& p, const OptimizerOptions& o) -> std::unique_ptr<Optimizer> {
                          double b1 = 0.9;
                          OptionReader(o, keys).get("beta1", b1);
                          return std::make_unique<FakeGefen>(p, b1);
                        }});
    return true;
  }();
  (void)done;
}

const char* kModel = R"(
[model]
arch = "gpt2"
layers = 1
heads = 2
dim = 16
ctx = 64

[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"

[train]
steps = 100
batch = 2
lr = 3e-3
warmup = 1
val_every = 50
val_seqs = 2

[optimizer]
name = "adamw"
)";

const char* kStudy = R"(
models = ["MODEL"]
optimizers = ["adamw", "test-fake-gefen"]
seeds = [1, 2]

[train]
steps = 4
ctx = 24
val_every = 2

[hyper]
beta1 = 0.8
beta2 = 0.95
eps = 1e-8
weight_decay = 0.1

[analysis]
optimizers = ["test-fake-gefen"]
every = 2

[[variant]]
name = "fake-relearn"
optimizer = "test-fake-gefen"
options = { relearn_every = 2 }

[seeds_for]
fake-relearn = [1]
)";

// dir/model.toml and dir/study.toml (with `extra` appended); the study's path.
std::string write_study(const fs::path& dir, const std::string& extra = "") {
  write_file_atomic((dir / "train-tiny.toml").string(), kModel);
  std::string s = kStudy;
  s.replace(s.find("MODEL"), 5, (dir / "train-tiny.toml").string());
  write_file_atomic((dir / "study.toml").string(), s + extra);
  return (dir / "study.toml").string();
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// results.csv without its time and memory columns (median_step_seconds, peak_rss_bytes, rss_scope)
std::string deterministic_results(const fs::path& p) {
  std::string out, line;
  std::istringstream in(slurp(p));
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    for (size_t i = 0; i < f.size(); ++i)
      if (i != 10 && i != 11 && i != 12) out += f[i] + ",";
    out += "\n";
  }
  return out;
}

OptimStudyOptions opts(const std::string& config, const fs::path& out) {
  OptimStudyOptions o;
  o.config = config, o.out = out.string(), o.isolate = false, o.progress = ProgressMode::quiet, o.log = nullptr;
  return o;
}

}  // namespace

TEST_CASE("student_t_975 matches the closed forms of 1 and 2 degrees of freedom") {
  // ν = 1 (Cauchy): tan(π(p − ½)); ν = 2: (2p − 1)/√(2p(1 − p)); p = 0.975
  CHECK(std::abs(student_t_975(1) - std::tan(M_PI * 0.475)) < 1e-6);
  CHECK(std::abs(student_t_975(2) - 0.95 / std::sqrt(2 * 0.975 * 0.025)) < 1e-7);
  CHECK(student_t_975(30) > 1.96);
  CHECK(student_t_975(30) < student_t_975(29));
  const std::vector<double> v{2.0, 2.5, 3.5};
  const SeedInterval s = seed_interval(v);
  const double mean = 8.0 / 3, sd = std::sqrt(((2 - mean) * (2 - mean) + (2.5 - mean) * (2.5 - mean) +
                                               (3.5 - mean) * (3.5 - mean)) / 2);
  CHECK(s.mean == Approx(mean).epsilon(1e-15));
  CHECK(s.t_hi - s.mean == Approx(student_t_975(2) * sd / std::sqrt(3.0)).epsilon(1e-12));
  CHECK(s.boot_lo >= 2.0);
  CHECK(s.boot_hi <= 3.5);
  const SeedInterval one = seed_interval(std::vector<double>{2.0});
  CHECK(one.mean == 2.0);
  CHECK(std::isnan(one.t_lo));
}

TEST_CASE("codebook_distortion is the weighted squared distance to the nearest code (brute force)") {
  std::vector<int64_t> counts(kGefenHistogramBins, 0);
  counts[0] = 3, counts[100] = 1, counts[2047] = 5, counts[2048] = 2, counts[4095] = 7, counts[3000] = 4;
  const std::vector<float> codes{-1.f, -0.5f, 0.f, 0.25f, 1.f};
  double num = 0, den = 0;
  for (int j = 0; j < kGefenHistogramBins; ++j) {
    if (!counts[size_t(j)]) continue;
    const double x = -1 + (2.0 * j + 1) / 4096;
    double best = 1e9;
    for (float c : codes) best = std::min(best, (x - c) * (x - c));
    num += double(counts[size_t(j)]) * best, den += double(counts[size_t(j)]);
  }
  CHECK(codebook_distortion(counts, codes) == Approx(num / den).epsilon(1e-14));
}

TEST_CASE("GefenProbe: relative error per role against an FP32 shadow, periods, P = 1 bytes (double restatement)") {
  register_fake();
  ParamSet ps;
  ps.params = {{"a", {4, 6}, 0, Role::wq}, {"b", {5}, 0, Role::norm1}, {"c", {3, 4}, 0, Role::wq}};
  OptimizerOptions oo;
  oo.name = "test-fake-gefen";
  oo.values["beta1"] = {0.7, "test"};
  auto opt = make_optimizer(ps, oo);
  Model model;
  for (auto& p : ps.params) {
    Tensor t;
    t.shape = p.shape;
    size_t n = 1;
    for (int64_t d : p.shape) n *= size_t(d);
    t.data.assign(n, 0.5f);
    model.params[p.name] = t;
  }
  GefenProbe probe(ps, 0.7, 2);
  std::map<std::string, std::vector<double>> shadow;  // binary64 restatement of the shadow
  std::map<std::string, std::vector<float>> shadow32;
  for (uint64_t s = 0; s < 5; ++s) {
    GradMap<float> g;
    for (auto& p : ps.params) {
      const size_t n = model.params[p.name].data.size();
      auto& v = g[p.name];
      for (size_t i = 0; i < n; ++i) v.push_back(float(std::sin(double(i * 7 + s * 3 + p.name[0]))) * 1e-2f);
      auto& m = shadow32[p.name];
      m.resize(n, 0.f);
      for (size_t i = 0; i < n; ++i) m[i] = std::fma(float(1 - 0.7), v[i] - m[i], m[i]);
    }
    opt->step(model, g, 1e-3);
    probe.observe(s, g, *opt);
    if (s % 2) continue;
    // restate (a) from the state tensors, in binary64
    const auto st = opt->state();
    auto tensor = [&](const std::string& n) -> const StateTensor& {
      for (auto& t : st)
        if (t.name == n) return t;
      FAIL("no " << n);
      return st[0];
    };
    std::vector<float> codes(256);
    tensor("codebook").copy_to(std::span<float>(codes));
    double dq = 0, rq = 0, dn = 0, rn = 0;
    for (auto& p : ps.params) {
      const auto& idx = tensor(p.name + ".idx");
      const auto& mag = tensor(p.name + ".mag");
      const size_t n = idx.numel(), Q = n / mag.numel();
      for (size_t i = 0; i < n; ++i) {
        const double deq = double(codes[uint8_t(idx.bytes[i])] *
                                  reinterpret_cast<const float*>(mag.bytes.data())[i / Q]);
        const double d = deq - shadow32[p.name][i], r = shadow32[p.name][i];
        (p.role == Role::wq ? dq : dn) += d * d;
        (p.role == Role::wq ? rq : rn) += r * r;
      }
    }
    std::map<std::string, double> got;
    for (auto& e : probe.errors)
      if (e.step == s) got[e.role] = e.rel_error;
    REQUIRE(got.size() == 2);
    CHECK(got["wq"] == Approx(std::sqrt(dq) / std::sqrt(rq)).epsilon(1e-12));
    CHECK(got["norm1"] == Approx(std::sqrt(dn) / std::sqrt(rn)).epsilon(1e-12));
    CHECK(got["wq"] > 0);
    CHECK(got["wq"] < 0.05);  // 8-bit codes of a block-normalised m
  }
  // (b) at steps 2 and 4: the fake's codebook never changes, so step 0's is the current one
  REQUIRE(probe.distortions.size() == 2);
  CHECK(probe.distortions[0].step == 2);
  CHECK(probe.distortions[1].step == 4);
  for (auto& d : probe.distortions) {
    CHECK(d.relearned <= d.step0);
    CHECK(d.bins >= 1);
  }
  // (c) periods (all 1 here) and the P = 1 tensors' bytes: idx n + mag 4·n/Q + period 8
  REQUIRE(probe.periods.size() == 3);
  for (auto& [n, p] : probe.periods) CHECK(p == 1);
  CHECK(probe.p1_params == 24 + 5 + 12);
  CHECK(probe.p1_bytes == (24 + 4 * 1 + 8) + (5 + 4 * 1 + 8) + (12 + 4 * 1 + 8));
  const auto j = probe.json();
  CHECK(j["tensors"].size() == 3);
  CHECK(j["p1_state_bytes"] == probe.p1_bytes);
}

TEST_CASE("optimizer study configuration: cells, and bad keys as one-line InputErrors") {
  register_fake();
  const fs::path dir = scratch("optim-study-config");
  const std::string path = write_study(dir);
  const OptimStudyConfig c = read_optim_study(path);
  const auto cells = optim_study_cells(c);
  REQUIRE(cells.size() == 5);  // adamw ×2, fake ×2, the variant ×1
  CHECK(cells[0].name() == "tiny adamw seed=1");
  CHECK(cells[3].name() == "tiny test-fake-gefen seed=2");
  CHECK(cells[4].name() == "tiny fake-relearn seed=1");
  CHECK(cells[4].optimizer == "test-fake-gefen");
  auto err = [&](const std::string& extra, const std::string& replace_from = "", const std::string& replace_to = "") {
    std::string s = slurp(path);
    if (!replace_from.empty()) s.replace(s.find(replace_from), replace_from.size(), replace_to);
    write_file_atomic((dir / "bad.toml").string(), extra + s);
    return error_of([&] { read_optim_study((dir / "bad.toml").string()); });
  };
  CHECK_THAT(err("colour = 1\n"), Catch::Contains("unknown key 'colour'"));
  CHECK_THAT(err("", "val_every = 2", "val_evry = 2"), Catch::Contains("unknown key 'val_evry'"));
  CHECK_THAT(err("", "beta2 = 0.95", "beta3 = 0.95"), Catch::Contains("unknown key 'beta3'"));
  CHECK_THAT(err("", "\"adamw\", \"test", "\"adamx\", \"test"), Catch::Contains("adamx"));
  CHECK_THAT(err("", "relearn_every = 2", "relearn_evry = 2"), Catch::Contains("has no key 'relearn_evry'"));
  CHECK_THAT(err("", "steps = 4", "steps = 0"), Catch::Contains("'steps' in [train] must be an integer"));
  CHECK_THAT(err("", "fake-relearn = [1]", "nobody = [1]"), Catch::Contains("'nobody' is neither"));
  CHECK_THAT(err("", "seeds = [1, 2]", "seeds = [1, 1]"), Catch::Contains("twice"));
  CHECK_THAT(err("", "\nevery = 2", "\nevery = 0"), Catch::Contains("'every' in [analysis]"));
  CHECK_THAT(err("", "beta1 = 0.8", "beta1 = 1.5"), Catch::Contains("bad.toml: adamw with the study's settings: adamw: betas (1.5"));
  for (const std::string e : {err("colour = 1\n"), err("", "beta1 = 0.8", "beta1 = 1.5")})
    CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("optimizer study: keyed cells, resume, --cell shards + merge equal to one run, intervals, Gefen analyses") {
  register_fake();
  const fs::path dir = scratch("optim-study-run");
  const std::string path = write_study(dir);
  const fs::path one = dir / "one", shards = dir / "shards";
  OptimStudyResult r = run_optim_study(opts(path, one));
  CHECK(r.cells == 5);
  CHECK(r.computed == 5);
  CHECK(r.merged);
  verify_result_set(one.string());
  // resume: nothing recomputed
  r = run_optim_study(opts(path, one));
  CHECK(r.computed == 0);
  CHECK(r.merged);
  // shards, then the merge
  for (int i = 0; i < 5; ++i) {
    OptimStudyOptions o = opts(path, shards);
    o.cell = i;
    const OptimStudyResult s = run_optim_study(o);
    CHECK(s.computed == 1);
    CHECK_FALSE(s.merged);
    if (i == 2) {  // a merge with cells missing is refused unless partial
      OptimStudyOptions m = opts(path, shards);
      m.merge_only = true;
      CHECK_THAT(error_of([&] { run_optim_study(m); }), Catch::Contains("missing"));
    }
  }
  OptimStudyOptions m = opts(path, shards);
  m.merge_only = true;
  CHECK(run_optim_study(m).merged);
  verify_result_set(shards.string());
  for (const char* f : {"curves.csv", "gefen_error.csv", "gefen_distortion.csv", "gefen_periods.csv"})
    CHECK(slurp(one / f) == slurp(shards / f));
  CHECK(deterministic_results(one / "results.csv") == deterministic_results(shards / "results.csv"));
  // column names carry their unit as the last suffix (study.h): losses in nats, periods in elements
  auto header = [&](const char* f) { return slurp(one / f).substr(0, slurp(one / f).find('\n')); };
  CHECK(header("results.csv").starts_with("model,optimizer,variant,seed,steps,final_val_loss_nats,final_val_ppl,"));
  CHECK(header("curves.csv") == "model,optimizer,variant,seed,step,val_loss_nats");
  CHECK(header("summary.csv").starts_with("model,optimizer,seeds,mean_final_val_loss_nats,t_lo_nats,t_hi_nats,"
                                          "boot_lo_nats,boot_hi_nats,ppl,ppl_lo,ppl_hi,"));
  CHECK(header("gefen_periods.csv") == "model,optimizer,variant,seed,tensor,period_elements,state_bytes");

  // the cells: curves, applied keys, bytes per parameter
  const ojson c0 = read_cell(cell_path(one.string(), 0)), c2 = read_cell(cell_path(one.string(), 2));
  CHECK(c0["applied"] == ojson({"beta1", "beta2", "eps", "weight_decay"}));
  CHECK(c2["applied"] == ojson({"beta1"}));
  {  // results.csv: one field per header column, the applied keys last
    std::istringstream csv(slurp(one / "results.csv"));
    std::string header, row;
    std::getline(csv, header);
    std::getline(csv, row);
    CHECK(std::count(row.begin(), row.end(), ',') == std::count(header.begin(), header.end(), ','));
    CHECK(row.ends_with(",beta1 beta2 eps weight_decay"));
  }
  CHECK(c0["val_curve"].size() == 2);  // after steps 2 and 4
  CHECK(c0["val_curve"][1][0] == 4);
  CHECK(c0["final_val_loss"] == c0["val_curve"][1][1]);
  CHECK(json_to_double(c0["final_val_ppl"], "") == Approx(std::exp(json_to_double(c0["final_val_loss"], ""))));
  CHECK(json_to_double(c0["bytes_per_param"], "") == Approx((8.0 * c0["params"].get<double>() + 8) / c0["params"].get<double>()));
  CHECK_FALSE(c0.contains("gefen"));
  REQUIRE(c2.contains("gefen"));
  CHECK(c2["gefen"]["distortion"].size() == 1);  // step 2 (step 4 is past the last, 0-based 3)
  CHECK(c2["gefen"]["rel_error"].size() > 0);
  CHECK(c2["rss_scope"] == "whole process so far");
  // the same seed trains from the same initialisation and data: the two optimizers' first step
  // sees the same loss
  CHECK(c0["train_loss"][0] == c2["train_loss"][0]);

  // summary: mean over the two seeds with the t interval, the variant single-seed
  const ojson res = ojson::parse(slurp(one / "results.json"));
  REQUIRE(res["summary"].size() == 3);
  const ojson& s0 = res["summary"][0];
  CHECK(s0["optimizer"] == "adamw");
  CHECK(s0["interval"] == "t95");
  const double l1 = json_to_double(c0["final_val_loss"], ""),
               l2 = json_to_double(read_cell(cell_path(one.string(), 1))["final_val_loss"], "");
  const double mean = (l1 + l2) / 2, half = std::tan(M_PI * 0.475) * std::abs(l1 - l2) / std::sqrt(2.0) / std::sqrt(2.0);
  CHECK(json_to_double(s0["mean_final_val_loss"], "") == Approx(mean).epsilon(1e-14));
  CHECK(json_to_double(s0["t95"][1], "") == Approx(mean + half).epsilon(1e-6));
  CHECK(res["summary"][2]["interval"] == "single-seed");

  // another configuration: the stored cells are refused, naming the field
  const std::string changed = write_study(dir);
  {
    std::string s = slurp(changed);
    s.replace(s.find("beta2 = 0.95"), 12, "beta2 = 0.99");
    write_file_atomic(changed, s);
  }
  CHECK_THAT(error_of([&] { run_optim_study(opts(changed, one)); }), Catch::Contains("beta2"));
}

TEST_CASE("optimizer study: each cell as a child process of the mantis binary (MANTIS_BIN) equals the in-process cell") {
  const char* bin = std::getenv("MANTIS_BIN");
  if (!bin) {
    WARN("MANTIS_BIN is not set (run through meson test): the child-process path is not exercised");
    return;
  }
  register_fake();
  const fs::path dir = scratch("optim-study-spawn");
  std::string s = slurp(write_study(dir));
  s.replace(s.find("\"adamw\", \"test-fake-gefen\""), 26, "\"adamw\"");
  s = s.substr(0, s.find("[analysis]"));  // adamw only: the child binary has no test optimizer
  write_file_atomic((dir / "study.toml").string(), s);
  OptimStudyOptions o = opts((dir / "study.toml").string(), dir / "spawned");
  o.isolate = true, o.exe = bin, o.threads = 1;
  const OptimStudyResult r = run_optim_study(o);
  CHECK(r.computed == 2);
  CHECK(r.merged);
  const OptimStudyResult here = run_optim_study(opts((dir / "study.toml").string(), dir / "here"));
  CHECK(here.computed == 2);
  CHECK(slurp(dir / "spawned" / "curves.csv") == slurp(dir / "here" / "curves.csv"));
  CHECK(read_cell(cell_path((dir / "spawned").string(), 1))["rss_scope"] == "cell process");
  CHECK(read_cell(cell_path((dir / "spawned").string(), 1))["peak_rss_bytes"].get<uint64_t>() > 0);
  // a child that fails (a config it cannot read: the study file moved away) is one InputError
  OptimStudyOptions bad = o;
  bad.out = (dir / "bad").string();
  bad.exe = "/nonexistent/mantis";
  CHECK_THAT(error_of([&] { run_optim_study(bad); }), Catch::Contains("cell 0:"));
}

// Hidden (run by name): writes tests/data/optim-small from tests/data/optim-small.toml (see there).
TEST_CASE("generate the notebook's small result set", "[.generate]") {
  register_fake();
  const char* out = std::getenv("OPTIM_SMALL_OUT");
  REQUIRE(out);
  OptimStudyOptions o;
  o.config = "tests/data/optim-small.toml", o.out = out, o.isolate = false, o.overwrite = true;
  o.progress = ProgressMode::quiet;
  CHECK(run_optim_study(o).merged);
}

TEST_CASE("the shipped study configurations read (optimizers not yet registered in this build are stood in for)") {
  for (const char* name : {"gefen", "adam8bit", "adam4bit", "adam-mini", "adafactor", "sm3"}) {
    const bool known = std::any_of(optimizers().begin(), optimizers().end(), [&](auto& e) { return e.name == name; });
    if (known) continue;
    static const std::vector<std::string> keys{"beta1", "beta2", "eps", "weight_decay", "relearn_every"};
    register_optimizer({name, "test_optim_study's stand-in", keys, [](const OptimizerOptions& o) { OptionReader(o, keys); },
                        [](const ParamSet&, const OptimizerOptions&) -> std::unique_ptr<Optimizer> {
                          throw InputError("a stand-in");
                        }});
  }
  const std::string root = MANTIS_SOURCE_DIR;
  const fs::path cwd = fs::current_path();
  fs::current_path(root);  // the configurations name the model TOMLs from the repository root
  const OptimStudyConfig study = read_optim_study("experiments/optim/study.toml");
  const OptimStudyConfig smoke = read_optim_study("experiments/optim/smoke.toml");
  fs::current_path(cwd);
  // per model: adamw and gefen × 3 seeds, five peers × 1, the re-learning and GefenMuon variants × 1
  CHECK(optim_study_cells(study).size() == 2 * (2 * 3 + 5 + 2));
  CHECK(optim_study_cells(smoke).size() == 2);
  CHECK(study.analysis_every == 25);
}

TEST_CASE("optimizer study: a cell's curves and Gefen analyses are bit-identical for 1 and 2 threads") {
  register_fake();
  const fs::path dir = scratch("optim-study-threads");
  const std::string path = write_study(dir);
  ojson got[2];
  for (int t : {1, 2}) {
    set_num_threads(t);
    OptimStudyOptions o = opts(path, dir / fmt::format("t{}", t));
    o.cell = 2;  // test-fake-gefen seed 1, analysed
    run_optim_study(o);
    got[t - 1] = read_cell(cell_path(o.out, 2));
  }
  set_num_threads(0);
  for (const char* k : {"val_curve", "train_loss", "gefen", "final_val_loss", "state_bytes"}) CHECK(got[0][k] == got[1][k]);
}
