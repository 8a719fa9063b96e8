// test_backward — gradients: central finite differences in binary64, the PyTorch reference
// (tests/reference/torch_reference.py), determinism, backward policies and saved-activation
// quantisation.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "nn/backward.h"
#include "nn/lora.h"
#include "io/checkpoint.h"
#include "mantis_config.h"
#include "testutil.h"
#include "nn/metrics.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "nn/tape.h"

using namespace mantis;
using mantis::test::error_of;
using mantis::test::read_raw;

namespace {

const std::string kRefDir = std::string(MANTIS_SOURCE_DIR) + "/tests/data/reference/";

struct Ref {
  Model model;
  std::vector<int32_t> tokens, targets;  // [T]
  nlohmann::json index;                  // this model's entry of index.json
};

const Ref& ref(const std::string& name) {
  static std::map<std::string, Ref> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  Ref r;
  r.model = load_model(kRefDir + name);
  r.tokens = read_raw<int32_t>(kRefDir + name + "/tokens.i32");
  r.targets = read_raw<int32_t>(kRefDir + name + "/targets.i32");
  std::ifstream in(kRefDir + "index.json");
  const auto index = nlohmann::json::parse(in);
  for (auto& m : index["models"])
    if (m["name"] == name) r.index = m;
  REQUIRE(!r.index.is_null());
  return cache.emplace(name, std::move(r)).first->second;
}

// The gradients flattened in parameter_shapes order (the reference files' layout).
template <class T>
std::vector<T> flat(const Model& m, const GradMap<T>& g) {
  std::vector<T> v;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) {
    const auto& x = g.at(name);
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

template <class T>
GradMap<T> grads_of(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                    const Policy& p = {}, const BackwardOptions& o = {}, LossSum* loss = nullptr) {
  GradMap<T> g = zero_grads<T>(m);
  int64_t n = 0;
  for (int32_t y : targets) n += y >= 0;
  const LossSum l = sequence_backward<T>(m, tokens, targets, p, 1.0 / double(n), g, o);
  if (loss) *loss = l;
  return g;
}

double mean_loss(const Model& m, std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  const Matrix<double> logits = forward<double>(m, tokens);
  double s = 0;
  int n = 0;
  for (size_t t = 0; t < targets.size(); ++t)
    if (targets[t] >= 0) s += nll(std::span<const double>(logits.row(Eigen::Index(t)).data(), size_t(logits.cols())), targets[t]), ++n;
  return s / n;
}

bool same_bits(const GradMap<float>& a, const GradMap<float>& b) {
  if (a.size() != b.size()) return false;
  for (auto& [k, v] : a) {
    const auto& w = b.at(k);
    if (v.size() != w.size() || std::memcmp(v.data(), w.data(), v.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("binary64 gradients match central finite differences for every parameter tensor") {
  for (const char* name : {"gpt2_erf", "gpt2_tanh", "llama_gqa"}) {
    const Ref& r = ref(name);
    Model m = r.model;
    // a shorter sequence keeps the finite differences cheap; every target present but one
    const size_t T = 40;
    std::vector<int32_t> tokens(r.tokens.begin(), r.tokens.begin() + T), targets(r.targets.begin(), r.targets.begin() + T);
    targets[7] = -1;
    const GradMap<double> g = grads_of<double>(m, tokens, targets);
    int checked = 0;
    double worst = 0;
    for (auto& [pname, shape] : parameter_shapes(m.cfg)) {
      auto& w = m.params.at(pname).data;
      const auto& gp = g.at(pname);
      // the largest-gradient entry and two pseudo-random ones
      size_t imax = 0;
      for (size_t i = 0; i < gp.size(); ++i)
        if (std::abs(gp[i]) > std::abs(gp[imax])) imax = i;
      for (size_t i : {imax, size_t(random_word(1, 0, checked) % gp.size()), size_t(random_word(1, 1, checked) % gp.size())}) {
        const float w0 = w[i];
        const float hi = w0 + 1e-3f, lo = w0 - 1e-3f;  // binary32 weights: the actual step is hi − lo
        w[i] = hi;
        const double lhi = mean_loss(m, tokens, targets);
        w[i] = lo;
        const double llo = mean_loss(m, tokens, targets);
        w[i] = w0;
        const double fd = (lhi - llo) / (double(hi) - double(lo));
        const double err = std::abs(fd - gp[i]) / std::max(1e-3, std::abs(gp[i]));
        worst = std::max(worst, err);
        INFO(name << " " << pname << "[" << i << "]: analytic " << gp[i] << " finite difference " << fd);
        CHECK(err < 2e-4);
        ++checked;
      }
    }
    INFO(name << ": worst relative error " << worst);
    CHECK(checked >= 3 * 10);
  }
}

TEST_CASE("gradients match PyTorch: binary64 to 1e-10, binary32 to 1e-4 of the largest gradient") {
  for (const char* name : {"gpt2_erf", "gpt2_tanh", "llama_gqa"}) {
    const Ref& r = ref(name);
    INFO(name);
    LossSum l64, l32;
    const auto g64 = flat(r.model, grads_of<double>(r.model, r.tokens, r.targets, {}, {}, &l64));
    const auto g32 = flat(r.model, grads_of<float>(r.model, r.tokens, r.targets, {}, {}, &l32));
    const auto t64 = read_raw<double>(kRefDir + name + "/grads.f64");
    const auto t32 = read_raw<float>(kRefDir + name + "/grads.f32");
    REQUIRE(g64.size() == t64.size());
    REQUIRE(g32.size() == t32.size());
    double scale = 0, e64 = 0, e32 = 0;
    for (size_t i = 0; i < t64.size(); ++i) scale = std::max(scale, std::abs(t64[i]));
    for (size_t i = 0; i < t64.size(); ++i) {
      e64 = std::max(e64, std::abs(g64[i] - t64[i]));
      e32 = std::max(e32, std::abs(double(g32[i]) - double(t32[i])));
    }
    CHECK(e64 <= 1e-10 * scale);
    CHECK(e32 <= 1e-4 * scale);
    CHECK(l64.count == int64_t(r.tokens.size()));
    CHECK(l64.sum / double(l64.count) == Approx(r.index["loss_f64"].get<double>()).epsilon(1e-12));
    CHECK(l32.sum / double(l32.count) == Approx(r.index["loss_f32"].get<double>()).epsilon(1e-5));
  }
}

TEST_CASE("the training forward pass gives forward()'s logits bit for bit") {
  const Ref& r = ref("llama_gqa");
  for (const Policy& p : {Policy{}, lamp_policy(5)}) {
    detail::Tape<float> tape;
    const Matrix<float> a = detail::forward_tape<float>(r.model, r.tokens, p, tape);
    const Matrix<float> b = forward<float>(r.model, r.tokens, p);
    CHECK(std::memcmp(a.data(), b.data(), size_t(a.size()) * 4) == 0);
    CHECK(tape.layers.size() == size_t(r.model.cfg.layers));
  }
}

TEST_CASE("binary32 gradients are bit-identical for 1, 2 and 3 threads") {
  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    const Ref& r = ref(name);
    const int saved = num_threads();
    set_num_threads(1);
    const auto a = grads_of<float>(r.model, r.tokens, r.targets);
    set_num_threads(2);
    const auto b = grads_of<float>(r.model, r.tokens, r.targets);
    set_num_threads(3);
    const auto c = grads_of<float>(r.model, r.tokens, r.targets);
    set_num_threads(saved);
    CHECK(same_bits(a, b));
    CHECK(same_bits(a, c));
  }
}

TEST_CASE("backward policies: dx / dw entries parse, apply to their GEMM only, and default to native") {
  const Policy p = policy_from_toml(R"(
[site."mlp.fc"]
[site."mlp.fc".dw]
input = "bf16"
accumulation = "strict"
accumulator = "fp32"
[site."layer.1.attn.qkv".dx]
input = "e4m3"
)", "train.toml");
  CHECK(p.forward_is_native());
  CHECK_FALSE(p.is_native());
  CHECK(p.at(Site::mlp_fc, 0, Pass::dw).input->name == "bf16");
  CHECK(p.at(Site::mlp_fc, 0, Pass::dx).is_native());
  CHECK(p.at(Site::attn_qkv, 1, Pass::dx).input->name == "e4m3");
  CHECK(p.at(Site::attn_qkv, 0, Pass::dx).is_native());
  CHECK_THROWS_WITH(policy_from_toml("[site.gelu.dx]\ninput = \"bf16\"\n", "x.toml"), Catch::Contains("unknown key 'dx'"));
  CHECK_THROWS_WITH(policy_from_toml("[site.\"mlp.fc\".dx.dw]\ninput = \"bf16\"\n", "x.toml"),
                    Catch::Contains("unknown key 'dw'"));

  const Ref& r = ref("gpt2_tanh");
  const auto base = grads_of<float>(r.model, r.tokens, r.targets);
  const auto low = grads_of<float>(r.model, r.tokens, r.targets, p);
  // mlp.fc's dW in every layer changed; a layer-0 dX left untouched leaves layer-1's weights' gradients
  // as they were only above the changed GEMMs: check the exact contract — the lm_head / ln_f gradients
  // (computed before any mlp.fc backward GEMM) are equal, the mlp.fc weight gradients are not.
  // (bool variables: TAP output would print whole vectors)
  const bool lnf_same = low.at("ln_f.weight") == base.at("ln_f.weight");
  CHECK(lnf_same);
  const bool proj_same = low.at("h.1.mlp.c_proj.weight") == base.at("h.1.mlp.c_proj.weight");
  CHECK(proj_same);
  const bool fc_changed = low.at("h.1.mlp.c_fc.weight") != base.at("h.1.mlp.c_fc.weight");
  CHECK(fc_changed);
  const bool bias_same = low.at("h.1.mlp.c_fc.bias") == base.at("h.1.mlp.c_fc.bias");  // db is not a GEMM
  CHECK(bias_same);
  // and the bf16-input gradients stay close to the binary32 ones
  double err = 0, scale = 0;
  for (size_t i = 0; i < base.at("h.1.mlp.c_fc.weight").size(); ++i) {
    err = std::max(err, double(std::abs(low.at("h.1.mlp.c_fc.weight")[i] - base.at("h.1.mlp.c_fc.weight")[i])));
    scale = std::max(scale, double(std::abs(base.at("h.1.mlp.c_fc.weight")[i])));
  }
  CHECK(err < 2e-2 * scale);
}

TEST_CASE("saved-activation quantisation: the definition, and its effect on the unit's dW only") {
  // quantize_saved against a scalar reference of the header's definition
  std::vector<float> x(6 * 40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 1.7) * (1 + double(i % 7)));
  for (int j = 40; j < 80; ++j) x[size_t(j)] = 0;  // an all-zero row
  for (int bits : {2, 4, 8})
    for (int block : {0, 16})
      for (Rounding rd : {Rounding::rne, Rounding::sr}) {
        const SavedQuant q{bits, block, rd, 11};
        std::vector<float> out(x.size());
        quantize_saved<float>(x.data(), out.data(), 6, 40, q, 5);
        const double Q = (1 << (bits - 1)) - 1;
        bool ok = true;
        for (size_t r = 0; r < 6; ++r) {
          const size_t g = block ? size_t(block) : 40;
          for (size_t g0 = 0; g0 < 40; g0 += g) {
            float amax = 0;
            for (size_t i = g0; i < std::min<size_t>(40, g0 + g); ++i) amax = std::max(amax, std::abs(x[r * 40 + i]));
            const float s = float(amax / Q);
            for (size_t i = g0; i < std::min<size_t>(40, g0 + g); ++i) {
              const size_t idx = r * 40 + i;
              double want = 0;
              if (s != 0) {
                const double v = double(x[idx]) / s;
                double k = rd == Rounding::sr ? std::floor(v + random_word(11, 5, idx) / 4294967296.0) : std::nearbyint(v);
                k = std::min(Q, std::max(-Q, k));
                want = double(float(k) * s);
                ok &= std::abs(double(out[idx]) - double(x[idx])) <= double(s) * (rd == Rounding::sr ? 1.0 : 0.5) + 1e-7;
              }
              ok &= double(out[idx]) == want;
            }
          }
        }
        INFO("bits " << bits << " block " << block << " " << to_string(rd));
        CHECK(ok);
      }
  // a scheme: quantize_scheme with the block transposed (blocks along the tokens)
  for (const char* name : {"mxfp8_e4m3", "deepseek_act", "nvfp4"}) {
    SavedQuant q;
    q.scheme = scheme_lookup(name);
    q.rounding = Rounding::sr;
    q.seed = 11;
    std::vector<float> out(x.size()), want(x.size());
    quantize_saved<float>(x.data(), out.data(), 6, 40, q, 5);
    Scheme t = *q.scheme;
    std::swap(t.block_rows, t.block_cols);
    quantize_scheme<float>(t, x.data(), want.data(), 6, 40, Rounding::sr, 32, 11, 5, 0);
    INFO(name);
    CHECK(mantis::test::same_bits(out, want));
    CHECK(q.active());
    CHECK(q.label() == name);
  }
  SavedQuant both{4, 0, Rounding::rne, 0};
  both.scheme = scheme_lookup("mxfp4");
  CHECK_THROWS_AS(validate(both), InputError);
  CHECK_THROWS_AS(validate(SavedQuant{1, 0, Rounding::rne, 0}), InputError);
  CHECK_THROWS_AS(validate(SavedQuant{4, 0, Rounding::rz, 0}), InputError);

  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    const Ref& r = ref(name);
    const ModelConfig& c = r.model.cfg;
    const auto base = grads_of<float>(r.model, r.tokens, r.targets);
    BackwardOptions exact;
    exact.saved = [](int, Unit) { return SavedQuant{}; };  // the recovery path everywhere = unquantised
    CHECK(same_bits(grads_of<float>(r.model, r.tokens, r.targets, {}, exact), base));
    for (Unit u : {Unit::qkv, Unit::proj, Unit::fc, Unit::down}) {
      BackwardOptions o;
      o.saved = [u](int l, Unit v) { return l == 1 && v == u ? SavedQuant{4, 0, Rounding::rne, 0} : SavedQuant{}; };
      std::vector<UnitActivation> acts;
      o.activations = &acts;
      const auto q = grads_of<float>(r.model, r.tokens, r.targets, {}, o);
      const auto mine = unit_parameters(c, 1, u);
      for (auto& [pname, v] : base) {
        const bool weight_of_unit = std::find(mine.begin(), mine.end(), pname) != mine.end() && !pname.ends_with(".bias");
        INFO(name << " " << to_string(u) << " " << pname);
        const bool same = q.at(pname) == v;
        CHECK(same != weight_of_unit);  // only the unit's weights move: dx uses the exact path
      }
      const UnitActivation& a = acts[size_t(1 * kUnitCount + int(u))];
      CHECK(a.count > 0);
      CHECK(a.err_sq > 0);
      CHECK(acts[size_t(0 * kUnitCount + int(u))].err_sq == 0);
      CHECK(a.low_err_sq == a.err_sq);  // no `low`: the path run is the low one

      // The oracle's measurement: a unit on the 8-bit path with its 4-bit low path measured has the
      // 4-bit run's error as low_err_sq bit for bit (the same stream), and its gradients stay the 8-bit run's.
      BackwardOptions eight, probed;
      eight.saved = probed.saved = [u](int l, Unit v) {
        return l == 1 && v == u ? SavedQuant{8, 0, Rounding::sr, 3} : SavedQuant{4, 0, Rounding::sr, 3};
      };
      probed.low = [u](int l, Unit v) {
        return l == 1 && v == u ? std::optional<SavedQuant>(SavedQuant{4, 0, Rounding::sr, 3}) : std::nullopt;
      };
      BackwardOptions four;
      four.saved = [](int, Unit) { return SavedQuant{4, 0, Rounding::sr, 3}; };
      std::vector<UnitActivation> a8, ap, a4;
      eight.activations = &a8, probed.activations = &ap, four.activations = &a4;
      const auto g8 = grads_of<float>(r.model, r.tokens, r.targets, {}, eight);
      CHECK(same_bits(grads_of<float>(r.model, r.tokens, r.targets, {}, probed), g8));
      grads_of<float>(r.model, r.tokens, r.targets, {}, four);
      const size_t k = size_t(1 * kUnitCount + int(u));
      CHECK(ap[k].low_err_sq == a4[k].err_sq);
      CHECK(ap[k].err_sq == a8[k].err_sq);
      CHECK(ap[k].low_err_sq > ap[k].err_sq);
    }
  }
}

TEST_CASE("column blocks: a recovered block's dW columns are the recovery path's run, every other bit the low path's") {
  const SavedQuant low{4, 0, Rounding::sr, 3};
  for (const char* name : {"gpt2_erf", "llama_gqa"})
    for (const SavedQuant& rec : {SavedQuant{8, 0, Rounding::sr, 3}, SavedQuant{}})
      for (int w : {8, 12})  // 12: the last block is narrower (32 = 2·12 + 8, hidden 128 = 10·12 + 8, 88 = 7·12 + 4)
        for (Unit u : {Unit::qkv, Unit::proj, Unit::fc, Unit::down}) {
          const Ref& r = ref(name);
          const ModelConfig& c = r.model.cfg;
          const size_t cols = size_t(saved_cols(c, u));
          SavedBlocks sb{w, {}, rec};
          sb.recovered.assign(sb.count(cols), 0);
          REQUIRE(sb.recovered.size() >= 3);
          sb.recovered.front() = sb.recovered.back() = 1;  // the first and the (narrower) last
          auto at = [u](int l, Unit v) { return l == 1 && v == u; };
          BackwardOptions lo, whole, blocks;
          std::vector<UnitActivation> al, ab;
          lo.saved = blocks.saved = [&](int, Unit) { return low; };
          whole.saved = [&](int l, Unit v) { return at(l, v) ? rec : low; };
          blocks.blocks = [&](int l, Unit v) { return at(l, v) ? &sb : nullptr; };
          lo.activations = &al, blocks.activations = &ab;
          const auto gl = grads_of<float>(r.model, r.tokens, r.targets, {}, lo);
          const auto gw = grads_of<float>(r.model, r.tokens, r.targets, {}, whole);
          const auto gb = grads_of<float>(r.model, r.tokens, r.targets, {}, blocks);
          INFO(name << " " << to_string(u) << " block " << w << " recovery bits " << rec.bits);
          size_t from_recovery = 0, from_low = 0, mismatches = 0;
          for (const ParamInfo& p : parameter_infos(c)) {
            const auto &b = gb.at(p.name), &l = gl.at(p.name), &v = gw.at(p.name);
            const bool mine = p.layer == 1 && unit_of(p.role) == u && p.shape.size() == 2;
            for (size_t i = 0; i < b.size(); ++i) {
              const bool recovered = mine && sb.recovered[(i % size_t(p.shape[1])) / size_t(w)];
              mismatches += std::memcmp(&b[i], recovered ? &v[i] : &l[i], sizeof(float)) != 0;
              (recovered ? from_recovery : from_low) += b[i] != l[i];
            }
          }
          CHECK(mismatches == 0);
          CHECK(from_recovery > 0);  // the recovery path changed those columns
          CHECK(from_low == 0);
          // per-block measurements: the low path's, before recovery; sums match the whole unit's
          const UnitActivation &a = ab[size_t(1 * kUnitCount + int(u))], &ref_a = al[size_t(1 * kUnitCount + int(u))];
          REQUIRE(a.block_sum_sq.size() == sb.recovered.size());
          CHECK(a.low_err_sq == ref_a.err_sq);
          CHECK(a.sum_sq == ref_a.sum_sq);
          CHECK(a.err_sq < ref_a.err_sq);  // two blocks at 8 bits or exact
          double ss = 0, se = 0;
          for (size_t k = 0; k < a.block_sum_sq.size(); ++k) ss += a.block_sum_sq[k], se += a.block_low_err_sq[k];
          CHECK(ss == Approx(ref_a.sum_sq).epsilon(1e-12));
          CHECK(se == Approx(ref_a.err_sq).epsilon(1e-12));
          CHECK(ab[size_t(0 * kUnitCount + int(u))].block_sum_sq.empty());  // other units: no blocks
        }
}

namespace {

// r's model with rank-2 adapters on every unit, B filled with small nonzero values (a fresh B = 0
// would hide A's gradient and the adapter's share of dx).
Model with_adapters(const Ref& r) {
  Model m = r.model;
  m.lora = init_lora(m.cfg, LoraSpec{2, 3.0, {Unit::qkv, Unit::proj, Unit::fc, Unit::down}}, 7);
  uint64_t k = 0;
  for (auto& [name, t] : m.lora.params)
    if (name.ends_with(".lora_B"))
      for (float& v : t.data) v = float(0.05 * (double(random_word(8, 0, k++) >> 8) * 0x1p-24 - 0.5));
  return m;
}

}  // namespace

TEST_CASE("LoRA: binary64 adapter gradients match central finite differences") {
  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    const Ref& r = ref(name);
    Model m = with_adapters(r);
    const size_t T = 40;
    std::vector<int32_t> tokens(r.tokens.begin(), r.tokens.begin() + T), targets(r.targets.begin(), r.targets.begin() + T);
    const GradMap<double> g = grads_of<double>(m, tokens, targets);
    CHECK(g.size() == parameter_shapes(m.cfg).size() + m.lora.params.size());
    int checked = 0;
    for (auto& [pname, t] : m.lora.params) {
      auto& w = t.data;
      const auto& gp = g.at(pname);
      size_t imax = 0;
      for (size_t i = 0; i < gp.size(); ++i)
        if (std::abs(gp[i]) > std::abs(gp[imax])) imax = i;
      for (size_t i : {imax, size_t(random_word(2, 0, checked) % gp.size())}) {
        const float w0 = w[i], hi = w0 + 1e-3f, lo = w0 - 1e-3f;
        w[i] = hi;
        const double lhi = mean_loss(m, tokens, targets);
        w[i] = lo;
        const double llo = mean_loss(m, tokens, targets);
        w[i] = w0;
        const double fd = (lhi - llo) / (double(hi) - double(lo));
        INFO(name << " " << pname << "[" << i << "]: analytic " << gp[i] << " finite difference " << fd);
        CHECK(std::abs(fd - gp[i]) / std::max(1e-3, std::abs(gp[i])) < 2e-4);
        ++checked;
      }
    }
    CHECK(checked == 2 * int(m.lora.params.size()));
    CHECK(m.lora.params.size() == size_t(m.cfg.layers) * (m.cfg.arch == Arch::llama ? 14 : 8));
  }
}

TEST_CASE("LoRA: merged weights give the unmerged forward; fresh adapters change nothing, bit for bit") {
  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    const Ref& r = ref(name);
    INFO(name);
    const Model m = with_adapters(r);
    const Matrix<double> unmerged = forward<double>(m, r.tokens), merged = forward<double>(merge_lora(m), r.tokens),
                         base = forward<double>(r.model, r.tokens);
    // the merge rounds W + s·B·A to binary32 once per weight: the logits agree to that rounding,
    // and the adapters' effect is far larger than it
    const double diff = (unmerged - merged).cwiseAbs().maxCoeff(), effect = (unmerged - base).cwiseAbs().maxCoeff();
    INFO("merged vs unmerged " << diff << ", adapters' effect " << effect);
    CHECK(diff < 1e-5 * unmerged.cwiseAbs().maxCoeff());
    CHECK(effect > 1e3 * diff);
    // B = 0: the logits and every base gradient are the base model's, bit for bit (binary32)
    Model fresh = r.model;
    fresh.lora = init_lora(fresh.cfg, LoraSpec{4, 0, {Unit::qkv, Unit::proj, Unit::fc, Unit::down}}, 3);
    CHECK(fresh.lora.alpha == 4);
    const Matrix<float> lf = forward<float>(fresh, r.tokens), lb = forward<float>(r.model, r.tokens);
    CHECK(std::memcmp(lf.data(), lb.data(), size_t(lf.size()) * sizeof(float)) == 0);
    GradMap<float> gf = grads_of<float>(fresh, r.tokens, r.targets);
    const GradMap<float> gb = grads_of<float>(r.model, r.tokens, r.targets);
    for (auto& [n, t] : fresh.lora.params) {
      CHECK(gf.count(n) == 1);
      gf.erase(n);
    }
    CHECK(same_bits(gf, gb));
  }
}

TEST_CASE("LoRA: gradients bit-identical for 1 and 2 threads; a unit's saved path changes its own gradients only") {
  const Ref& r = ref("llama_gqa");
  const Model m = with_adapters(r);
  const int saved = num_threads();
  set_num_threads(1);
  const auto a = grads_of<float>(m, r.tokens, r.targets);
  set_num_threads(2);
  const auto b = grads_of<float>(m, r.tokens, r.targets);
  set_num_threads(saved);
  CHECK(same_bits(a, b));
  // quantising layer 1's mlp.proj saved activation: its weight's and its adapter's gradients move,
  // nothing else does (dx never reads the saved activation)
  BackwardOptions o;
  o.saved = [](int l, Unit u) { return l == 1 && u == Unit::down ? SavedQuant{4, 0, Rounding::rne, 0} : SavedQuant{}; };
  const auto q = grads_of<float>(m, r.tokens, r.targets, {}, o);
  const std::set<std::string> own = {"layers.1.feed_forward.w2", "layers.1.feed_forward.w2.lora_A",
                                     "layers.1.feed_forward.w2.lora_B"};
  for (auto& [n, v] : a) {
    INFO(n);
    const bool same = std::memcmp(v.data(), q.at(n).data(), v.size() * sizeof(float)) == 0;
    CHECK(same == !own.count(n));
  }
}

TEST_CASE("LoRA: a frozen base's GEMM weight gradients are skipped; every other gradient bit for bit") {
  for (const char* name : {"gpt2_erf", "llama_gqa"}) {
    const Ref& r = ref(name);
    const Model m = with_adapters(r);
    for (const Policy& p : {Policy{}, policy_from_spec(std::string(MANTIS_SOURCE_DIR) + "/experiments/policies/bf16-gemms.toml")}) {
      BackwardOptions all, frozen;
      frozen.base_weight_grads = false;
      all.saved = frozen.saved = [](int, Unit) { return SavedQuant{4, 0, Rounding::sr, 5}; };
      LossSum la, lf;
      const auto a = grads_of<float>(m, r.tokens, r.targets, p, all, &la);
      const auto f = grads_of<float>(m, r.tokens, r.targets, p, frozen, &lf);
      CHECK(la.sum == lf.sum);
      std::set<std::string> gemm;  // projection and output weights and biases
      for (const ParamInfo& pi : parameter_infos(m.cfg))
        if (unit_of(pi.role) || pi.role == Role::lm_head) gemm.insert(pi.name);
      size_t skipped = 0;
      for (auto& [n, v] : a) {
        INFO(name << " " << n);
        const auto& w = f.at(n);
        if (gemm.count(n)) {
          CHECK(std::all_of(w.begin(), w.end(), [](float x) { return x == 0; }));
          CHECK(std::any_of(v.begin(), v.end(), [](float x) { return x != 0; }));
          ++skipped;
        } else if (m.cfg.tied && n == "wte") {
          CHECK(std::memcmp(v.data(), w.data(), v.size() * sizeof(float)) != 0);  // the tied output's dW is skipped
        } else {
          CHECK(std::memcmp(v.data(), w.data(), v.size() * sizeof(float)) == 0);  // adapters, norms, embeddings
        }
      }
      CHECK(skipped > 0);
    }
  }
}

TEST_CASE("LoRA: malformed adapters and LAMP's recomputations are one-line errors") {
  const Ref& r = ref("llama_gqa");
  Model m = with_adapters(r);
  CHECK_THAT(error_of([&] { init_lora(m.cfg, LoraSpec{0, 0, {Unit::qkv}}, 1); }), Catch::Contains("rank = 0"));
  CHECK_THAT(error_of([&] { init_lora(m.cfg, LoraSpec{2, 0, {}}, 1); }), Catch::Contains("no units"));
  CHECK_THAT(error_of([&] { unit_from_name("mlp.gate"); }), Catch::Contains("unit 'mlp.gate'"));
  Model bad = m;
  bad.lora.params.erase("layers.0.attention.wq.lora_B");
  CHECK_THAT(error_of([&] { forward<float>(bad, r.tokens); }), Catch::Contains("partner layers.0.attention.wq.lora_B"));
  bad = m;
  bad.lora.params.at("layers.0.attention.wo.lora_A").shape = {3, int64_t(m.cfg.dim)};
  CHECK_THAT(error_of([&] { validate(bad); }), Catch::Contains("LoRA tensor layers.0.attention.wo.lora_A: shape [3,"));
  bad = m;
  bad.lora.params.emplace("norm.lora_A", Tensor{{2, 2}, {0, 0, 0, 0}});
  CHECK_THAT(error_of([&] { validate(bad); }), Catch::Contains("LoRA tensor norm.lora_A"));
  bad = m;
  bad.lora.params.at("layers.1.feed_forward.w1.lora_B").data[0] = std::nanf("");
  CHECK_THAT(error_of([&] { validate(bad); }), Catch::Contains("non-finite"));
  Policy p;
  p.lamp_layernorm = LampSiteSpec{};
  CHECK_THAT(error_of([&] { forward<float>(m, r.tokens, p); }), Catch::Contains("lamp_layernorm"));
}
