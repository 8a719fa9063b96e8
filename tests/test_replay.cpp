// test_replay — exp/replay.h: a replay equals stepping the optimizer directly, bit for bit (names
// and shapes only, and with a model configuration's roles); every refused input is a one-line
// error raised before any step; Gefen-style state (codebook, <p>.period) is reported; the
// safetensors reader and writer (io/safetensors.h) round-trip and refuse non-F32 tensors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/philox.h"
#include "exp/replay.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "optim/adamw.h"
#include "testutil.h"

using namespace mantis;
namespace fs = std::filesystem;
using mantis::test::error_of;

namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Deterministic values in [−scale, scale).
std::vector<float> values(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (float(random_word64(seed, 7, i) >> 40) / float(1 << 24) * 2 - 1);
  return v;
}

size_t numel(const std::vector<int64_t>& s) {
  size_t n = 1;
  for (auto d : s) n *= size_t(d);
  return n;
}

// P from `shapes`, G for `steps` steps; returns P's tensors and G's, by step.
struct Files {
  std::string p, g;
  std::vector<NamedTensor> params;
  std::vector<std::vector<NamedTensor>> grads;
};
Files write_files(const fs::path& dir, const Shapes& shapes, int steps, uint64_t seed = 1) {
  Files f{(dir / "p.safetensors").string(), (dir / "g.safetensors").string(), {}, {}};
  for (size_t i = 0; i < shapes.size(); ++i)
    f.params.push_back({shapes[i].first, shapes[i].second, values(numel(shapes[i].second), seed * 100 + i, 0.5f)});
  std::vector<TensorView> pv, gv;
  for (auto& t : f.params) pv.push_back({t.name, t.shape, t.data});
  for (int s = 0; s < steps; ++s) {
    f.grads.emplace_back();
    for (size_t i = 0; i < shapes.size(); ++i)
      f.grads.back().push_back({fmt::format("t.{}.{}", s, shapes[i].first), shapes[i].second,
                                values(numel(shapes[i].second), seed * 1000 + uint64_t(s) * 50 + i, 0.01f)});
  }
  for (auto& st : f.grads)
    for (auto& t : st) gv.push_back({t.name, t.shape, t.data});
  write_f32_tensors(f.p, pv);
  write_f32_tensors(f.g, gv);
  return f;
}

// The same steps, the optimizer called directly.
std::map<std::string, std::vector<float>> direct(const ParamSet& set, const Files& f, const AdamWConfig& c, double lr) {
  auto opt = make_adamw(set, c);
  Model m;
  for (auto& t : f.params) m.params[t.name] = Tensor{t.shape, t.data};
  for (auto& st : f.grads) {
    GradMap<float> g;
    for (size_t i = 0; i < st.size(); ++i) g[f.params[i].name] = st[i].data;
    opt->step(m, g, lr);
  }
  std::map<std::string, std::vector<float>> out;
  for (auto& [k, t] : m.params) out[k] = t.data;
  return out;
}

const Shapes kShapes = {{"w", {6, 5}}, {"b", {5}}, {"e", {3, 2, 4}}};

}  // namespace

TEST_CASE("replay of AdamW equals stepping AdamW directly, bit for bit; OUT holds the final parameters") {
  const fs::path dir = mantis::test::scratch("replay-adamw");
  const Files f = write_files(dir, kShapes, 4);
  ReplayOptions o;
  o.optimizer = "adamw", o.params = f.p, o.grads = f.g, o.steps = 4, o.lr = 3e-2;
  o.out = (dir / "out.safetensors").string();
  o.values = {{"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}, {"weight_decay", 0.05}};
  const ReplayResult r = replay(o);
  const AdamWConfig c{0.8, 0.99, 1e-6, 0.05};
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(kShapes.begin(), kShapes.end());
  const auto want = direct(param_set(shapes), f, c, 3e-2);
  const auto out = read_f32_tensors(o.out);
  REQUIRE(out.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    INFO(out[i].name);
    CHECK(out[i].name == kShapes[i].first);  // P's order
    CHECK(out[i].shape == kShapes[i].second);
    CHECK(mantis::test::same_bits(out[i].data, want.at(out[i].name)));
    CHECK(mantis::test::same_bits(r.final_params[i].data, want.at(out[i].name)));
    CHECK(out[i].data != f.params[i].data);  // it moved
  }
  CHECK(r.optimizer == "adamw");
  CHECK(r.steps == 4);
  CHECK(r.params == 30 + 5 + 24);
  CHECK(r.state_bytes == 8 * r.params + 8);  // m and v in binary32, and the step count
  CHECK(r.bytes_per_param == double(r.state_bytes) / double(r.params));
  CHECK(r.codebook.empty());
  CHECK(r.periods.empty());

  // the defaults are AdamW's own; weight decay is AdamW's (only on ≥ 2-D tensors, by decays())
  o.values.clear();
  const ReplayResult d = replay(o);
  const auto want_d = direct(param_set(shapes), f, AdamWConfig{}, 3e-2);
  for (auto& t : d.final_params) CHECK(mantis::test::same_bits(t.data, want_d.at(t.name)));
}

TEST_CASE("replay with a model configuration: the set is parameter_infos(config), roles known") {
  const fs::path dir = mantis::test::scratch("replay-config");
  ModelConfig mc;
  mc.arch = Arch::gpt2, mc.vocab = 40, mc.ctx = 8, mc.layers = 1, mc.heads = 2, mc.kv_heads = 2, mc.dim = 8;
  mc.hidden = 16;
  const Model init = init_model(mc, 3);
  save_model(init, (dir / "model").string());
  Shapes shapes;
  for (auto& [n, s] : parameter_shapes(mc)) shapes.push_back({n, s});
  const Files f = write_files(dir, shapes, 2, 5);
  ReplayOptions o;
  o.params = f.p, o.grads = f.g, o.steps = 2, o.config = (dir / "model" / "config.json").string();
  const ReplayResult r = replay(o);
  const auto want = direct(param_set(mc), f, AdamWConfig{}, 1e-3);
  for (auto& t : r.final_params) CHECK(mantis::test::same_bits(t.data, want.at(t.name)));

  // P must hold exactly the model's parameters
  Shapes fewer(shapes.begin() + 1, shapes.end());
  const Files g = write_files(dir, fewer, 1);
  o.params = g.p, o.grads = g.g, o.steps = 1;
  CHECK_THAT(error_of([&] { replay(o); }), Catch::Contains("tensor " + shapes[0].first + " missing (the model"));
  Shapes bent = shapes;
  bent[0].second[0] += 1;
  const Files h = write_files(dir, bent, 1);
  o.params = h.p, o.grads = h.g;
  CHECK_THAT(error_of([&] { replay(o); }), Catch::Contains("tensor " + shapes[0].first + ": shape ["));
  Shapes more = shapes;
  more.push_back({"extra", {2}});
  const Files k = write_files(dir, more, 1);
  o.params = k.p, o.grads = k.g;
  CHECK_THAT(error_of([&] { replay(o); }), Catch::Contains("tensor extra is not a parameter of the model"));
}

TEST_CASE("replay refuses bad input with one line, before any step") {
  const fs::path dir = mantis::test::scratch("replay-errors");
  const Files f = write_files(dir, kShapes, 2);
  ReplayOptions o;
  o.params = f.p, o.grads = f.g, o.steps = 2, o.out = (dir / "out.safetensors").string();
  auto err = [&](ReplayOptions x) {
    const std::string e = error_of([&] { replay(x); });
    CHECK(e.find('\n') == std::string::npos);
    CHECK(!fs::exists(x.out));  // nothing ran, nothing written
    return e;
  };
  {
    ReplayOptions x = o;
    x.optimizer = "lion";
    CHECK_THAT(err(x), Catch::Contains("unknown optimizer 'lion' (known: adamw"));
  }
  for (int64_t n : {0, -3}) {
    ReplayOptions x = o;
    x.steps = n;
    CHECK_THAT(err(x), Catch::Contains(fmt::format("--steps {} must be ≥ 1", n)));
  }
  {
    ReplayOptions x = o;
    x.values = {{"momentum", 0.9}};
    CHECK(err(x) == "optim replay: optimizer 'adamw' has no setting 'momentum' (its keys: beta1, beta2, eps, weight_decay)");
    x.values = {{"beta1", 1.5}};
    CHECK_THAT(err(x), Catch::Contains("betas (1.5, 0.95)"));
  }
  {
    ReplayOptions x = o;
    x.steps = 3;  // G holds two
    CHECK(err(x) == f.g + ": missing step tensor t.2.w");
    // steps far beyond G's were an allocation of N step tables first (exit 3, "out of memory"; issue 32)
    for (int64_t n : {int64_t(1) << 31, int64_t(1) << 62, std::numeric_limits<int64_t>::max()}) {
      x.steps = n;
      CHECK(err(x) == f.g + ": missing step tensor t.2.w");
    }
    x.steps = 1;  // G holds one more than asked for
    CHECK(err(x) == f.g + ": tensor t.1.w: step 1 is beyond --steps 1 (steps 0..0)");
  }
  auto with_grads = [&](std::vector<TensorView> extra, bool drop_first = false) {
    std::vector<TensorView> gv;
    for (auto& st : f.grads)
      for (auto& t : st) gv.push_back({t.name, t.shape, t.data});
    if (drop_first) gv.erase(gv.begin());
    for (auto& e : extra) gv.push_back(e);
    const std::string path = (dir / "g2.safetensors").string();
    write_f32_tensors(path, gv);
    ReplayOptions x = o;
    x.grads = path;
    return err(x);
  };
  const std::vector<float> five(5, 0.f), four(4, 0.f);
  CHECK(with_grads({}, true) == (dir / "g2.safetensors").string() + ": missing step tensor t.0.w");
  CHECK_THAT(with_grads({{"t.0.zz", {5}, five}}), Catch::Contains("tensor t.0.zz: no parameter zz in"));
  CHECK_THAT(with_grads({{"grad.b", {5}, five}}), Catch::Contains("tensor grad.b: not a step tensor t.<step>.<param>"));
  CHECK_THAT(with_grads({{"t.01.b", {5}, five}}), Catch::Contains("tensor t.01.b: not a step tensor"));
  {
    std::vector<TensorView> gv;
    for (auto& st : f.grads)
      for (auto& t : st)
        if (t.name != "t.1.b") gv.push_back({t.name, t.shape, t.data});
    gv.push_back({"t.1.b", {1, 5}, five});
    const std::string path = (dir / "g3.safetensors").string();
    write_f32_tensors(path, gv);
    ReplayOptions x = o;
    x.grads = path;
    CHECK(err(x) == path + ": tensor t.1.b: shape [1,5], but parameter b has shape [5]");
  }
  {
    std::vector<float> bad = f.grads[1][1].data;
    bad[3] = std::nanf("");
    std::vector<TensorView> gv;
    for (auto& st : f.grads)
      for (auto& t : st) gv.push_back({t.name, t.shape, t.name == "t.1.b" ? std::span<const float>(bad) : t.data});
    const std::string path = (dir / "g4.safetensors").string();
    write_f32_tensors(path, gv);
    ReplayOptions x = o;
    x.grads = path;
    CHECK(err(x) == path + ": tensor t.1.b: value nan at index 3 is not finite");
    std::vector<float> inf = f.params[0].data;
    inf[0] = INFINITY;
    const std::string pp = (dir / "p4.safetensors").string();
    write_f32_tensors(pp, {{"w", {6, 5}, inf}, {"b", {5}, f.params[1].data}, {"e", {3, 2, 4}, f.params[2].data}});
    x = o;
    x.params = pp;
    CHECK(err(x) == pp + ": tensor w: value inf at index 0 is not finite");
  }
  {
    // a non-F32 tensor is named
    const std::string path = (dir / "bf16.safetensors").string();
    std::string header = R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(header.size() >> (8 * i)));
    bytes += header + std::string(4, '\0');
    mantis::test::spit(path, bytes);
    ReplayOptions x = o;
    x.params = path;
    CHECK(err(x) == path + ": tensor w: dtype BF16, expected F32 (binary32)");
  }
}

namespace {

// A stand-in with Gefen's state naming: a u32 `<p>.period` per parameter and an f32 `codebook`.
class Named : public Optimizer {
 public:
  explicit Named(const ParamSet& p) : p_(p) {}
  std::string name() const override { return "test-named"; }
  void step(Model&, const GradMap<float>&, double) override { ++steps_; }
  uint64_t state_bytes() const override {
    uint64_t b = 8;
    for (auto& t : state()) b += t.bytes.size();
    return b;
  }
  uint64_t steps() const override { return steps_; }
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> s;
    for (size_t i = 0; i < p_.params.size(); ++i) {
      const uint32_t period = uint32_t(i + 2);
      s.push_back(StateTensor::of<uint32_t>(p_.params[i].name + ".period", {}, std::span(&period, 1)));
    }
    std::vector<float> cb(256);
    for (int i = 0; i < 256; ++i) cb[size_t(i)] = float(i) / 255 * 2 - 1;
    s.push_back(StateTensor::of<float>("codebook", {256}, cb));
    return s;
  }
  void load_state(const std::vector<StateTensor>&, uint64_t s) override { steps_ = s; }

 private:
  ParamSet p_;
  uint64_t steps_ = 0;
};

}  // namespace

TEST_CASE("a diverged update is an error naming the step and tensor, and nothing is written") {
  const fs::path dir = mantis::test::scratch("replay-diverged");
  const Files f = write_files(dir, kShapes, 2);
  ReplayOptions o;
  o.params = f.p, o.grads = f.g, o.steps = 2, o.out = (dir / "out.safetensors").string();
  for (const char* opt : {"adamw", "gefen", "adam8bit"}) {
    o.optimizer = opt;
    o.lr = 1e39;  // an update of ~1e39 overflows binary32 (issue 32: written as inf, exit 0)
    const std::string e = error_of([&] { replay(o); });
    INFO(opt << ": " << e);
    CHECK_THAT(e, Catch::StartsWith("optim replay: step 0: the update (lr 1e+39) made tensor ") &&
                      Catch::Contains(" non-finite (value ") && Catch::EndsWith("nothing was written"));
    CHECK(e.find('\n') == std::string::npos);
    CHECK(!fs::exists(o.out));
  }
  o.optimizer = "adamw", o.lr = 1e-3;  // the same run at an ordinary lr writes finite parameters
  CHECK_NOTHROW(replay(o));
  CHECK(fs::exists(o.out));
}

TEST_CASE("replay reports Gefen-style state: every <p>.period and the 256-entry codebook") {
  register_optimizer({"test-named", "state named as Gefen's", {}, [](const OptimizerOptions& o) { OptionReader(o, {}); },
                      [](const ParamSet& p, const OptimizerOptions& o) -> std::unique_ptr<Optimizer> {
                        OptionReader(o, {});
                        return std::make_unique<Named>(p);
                      }});
  const fs::path dir = mantis::test::scratch("replay-named");
  const Files f = write_files(dir, kShapes, 1);
  ReplayOptions o;
  o.optimizer = "test-named", o.params = f.p, o.grads = f.g, o.steps = 1;
  const ReplayResult r = replay(o);
  CHECK(r.periods == std::map<std::string, uint64_t>{{"w", 2}, {"b", 3}, {"e", 4}});
  REQUIRE(r.codebook.size() == 256);
  CHECK(r.codebook.front() == -1.0);
  CHECK(r.codebook.back() == 1.0);
  CHECK(r.state_bytes == 8 + 3 * 4 + 256 * 4);
  o.values = {{"beta1", 0.9}};
  CHECK(error_of([&] { replay(o); }) == "optim replay: optimizer 'test-named' has no setting 'beta1' (its keys: none)");
}

TEST_CASE("safetensors: F32 tensors round-trip in the order written; an empty set is a valid file") {
  const fs::path dir = mantis::test::scratch("st");
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-0.f, 7};
  const std::string path = (dir / "x.safetensors").string();
  write_f32_tensors(path, {{"zeta", {2, 3}, a}, {"alpha", {2}, b}, {"scalar", {}, std::span(a.data(), 1)}});
  const auto t = read_f32_tensors(path);
  REQUIRE(t.size() == 3);
  CHECK(t[0].name == "zeta");
  CHECK(t[0].shape == std::vector<int64_t>{2, 3});
  CHECK(mantis::test::same_bits(t[0].data, a));
  CHECK(t[1].name == "alpha");
  CHECK(mantis::test::same_bits(t[1].data, b));
  CHECK(t[2].shape.empty());
  CHECK(t[2].data == std::vector<float>{1});
  CHECK(uint8_t(mantis::test::slurp(path)[0]) % 8 == 0);  // the header padded to 8 bytes
  write_f32_tensors(path, {});
  CHECK(read_f32_tensors(path).empty());
  CHECK_THAT(error_of([&] { write_f32_tensors(path, {{"a", {4}, b}}); }), Catch::Contains("shape [4] holds 4 values, given 2"));
}

TEST_CASE("synth_replay_inputs: the documented values, rows of different scale, replayable") {
  const fs::path dir = mantis::test::scratch("synth");
  SynthOptions s;
  s.model.vocab = 40, s.model.ctx = 8, s.model.layers = 1, s.model.heads = s.model.kv_heads = 2, s.model.dim = 8;
  s.model.hidden = 16;
  s.steps = 2, s.seed = 9;
  s.params = (dir / "p.safetensors").string(), s.grads = (dir / "g.safetensors").string();
  s.config_out = (dir / "config.json").string();
  synth_replay_inputs(s);
  const auto p = read_f32_tensors(s.params), g = read_f32_tensors(s.grads);
  const auto infos = parameter_infos(s.model);
  REQUIRE(p.size() == infos.size());
  REQUIRE(g.size() == 2 * infos.size());
  for (size_t k = 0; k < infos.size(); ++k) {
    INFO(infos[k].name);
    CHECK(p[k].name == infos[k].name);
    CHECK(g[infos.size() + k].name == "t.1." + infos[k].name);
    const size_t cols = infos[k].shape.size() >= 2 ? size_t(infos[k].shape.back()) : p[k].data.size();
    for (size_t i = 0; i < p[k].data.size(); i += 7) {  // the header's formulas, restated in binary64
      const double u = double(random_word64(9, k, i) >> 40) / double(1 << 23) - 1;
      CHECK(p[k].data[i] == float(0.02 * u));
      const double ug = double(random_word64(9, (uint64_t(2) << 32) | k, i) >> 40) / double(1 << 23) - 1;
      const double sc = std::pow(2.0, double(random_word64(9, (uint64_t(1) << 62) | k, i / cols) % 9) - 4);
      CHECK(g[infos.size() + k].data[i] == float(sc * 1e-3 * ug));
    }
  }
  CHECK(load_model_config(s.config_out) == s.model);
  ReplayOptions o;
  o.params = s.params, o.grads = s.grads, o.steps = 2, o.config = s.config_out;
  CHECK(replay(o).params == uint64_t(parameter_count(s.model).values));
}
