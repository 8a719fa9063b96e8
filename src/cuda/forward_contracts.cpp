// forward_contracts — the GPU forward (cuda/forward.h) against forward<float> (nn/forward.h) on
// small random models of both families.
#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "core/philox.h"
#include "cuda/contracts.h"
#include "cuda/forward.h"
#include "nn/linear.h"
#include "cuda/site.h"
#include "core/sample.h"
#include "nn/forward.h"

namespace mantis {

namespace {

ModelConfig small(Arch arch, bool gelu_tanh) {
  ModelConfig c;
  c.arch = arch, c.vocab = 97, c.ctx = 80, c.layers = 2, c.heads = 4, c.dim = 64, c.hidden = 160;
  c.kv_heads = arch == Arch::gpt2 ? 4 : 2;  // llama: grouped-query
  c.gelu_tanh = gelu_tanh;
  c.tied = arch == Arch::gpt2;
  return c;
}

std::vector<int32_t> tokens(size_t n, int vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t(random_word(seed, 31, i) % uint32_t(vocab));
  return t;
}

// Every GEMM site emulated (so that no cuBLAS product enters), the roundings of LAMP's study
// around the scores, LAMP recomputing in a format (strict in it), the nonlinearity sites rounded.
const char* kEmulatedPolicy = R"(
[site."attn.qkv"]
accumulation = "strict"
accumulator = "ps13"
output = "bf16"
[site."attn.qk"]
accumulation = "strict"
accumulator = "ps4"
output = "ps4"
[site."attn.pv"]
accumulation = "blocked"
accumulator = "ps10"
block = 16
[site."attn.proj"]
accumulation = "unfused"
accumulator = "ps13"
input = "e4m3"
[site."mlp.fc"]
accumulation = "strict"
accumulator = "ps10"
rounding = "sr"
seed = 5
sr_bits = 16
[site."mlp.proj"]
accumulation = "promoted"
accumulator = "ps7"
block = 32
[site."lm_head"]
accumulation = "strict"
accumulator = "ps23"
[site."ln"]
input = "bf16"
output = "fp16"
[lamp]
rule = "strict"
tau = 0.1
recompute = "ps13"
)";

// Which site health counts a case compares: none; every site at every layer (the values are the
// CPU's bits); or only those upstream of the flash kernel's output (layer 0's attn.qkv, attn.qk and
// softmax, whose values are the CPU's bits) and not the logits: downstream, the narrow formats'
// roundings turn the flash output's summation-order differences into whole-ulp flips.
enum class HealthCheck : uint8_t { none, all, before_flash };

void compare_health(ContractTally& tl, const std::string& w, const ForwardStats& cs, const ForwardStats& gs,
                    int layers, HealthCheck hc) {
  for (int s = 0; s < kSiteCount; ++s)
    for (int l = -1; l < layers; ++l) {
      if (hc == HealthCheck::before_flash &&
          !(l == 0 && (Site(s) == Site::attn_qkv || Site(s) == Site::attn_qk || Site(s) == Site::softmax)))
        continue;
      const SiteHealth &c = cs.health_at(Site(s), l), &g = gs.health_at(Site(s), l);
      const std::string at = fmt::format("{} {} layer {}", w, to_string(Site(s)), l);
      tl.compare_count(at + " overflow", c.overflow, g.overflow);
      tl.compare_count(at + " nan", c.nan, g.nan);
      tl.compare_count(at + " inf", c.inf, g.inf);
    }
}

// model: the case's model (init_model's when null).
void forward_case(ContractTally& tl, const ModelConfig& cfg, const Policy& pol, size_t T, uint64_t seed, Agreement a,
                  double tol, AttentionKernel kernel, const std::string& what, HealthCheck hc,
                  const Model* model = nullptr) {
  if (!tl.take()) return;
  const PolicyPlan plan(pol, cfg);
  const auto tok = tokens(T, cfg.vocab, seed);
  if (tl.check_only) {
    gpu::check_forward(cfg, false, tok, plan, kernel);
    return;
  }
  const Model m = model ? *model : init_model(cfg, seed);
  ForwardStats cs, gs;
  const Matrix<float> cpu = forward<float>(m, tok, plan, &cs);
  const gpu::DeviceModel dm(m);
  const Matrix<float> g = gpu::forward(dm, tok, plan, &gs, kernel);
  const std::string w = fmt::format("{} T={} seed={}", what, T, seed);
  if (hc != HealthCheck::before_flash) tl.compare(w + " logits", cpu.data(), g.data(), size_t(cpu.size()), a, tol);
  if (a == Agreement::bit_exact)
    for (size_t l = 0; l < cs.lamp_selected.size(); ++l)
      tl.compare_count(fmt::format("{} layer {} LAMP count", w, l), cs.lamp_selected[l], gs.lamp_selected[l]);
  if (hc != HealthCheck::none) compare_health(tl, w, cs, gs, cfg.layers, hc);
}

// The activation site of each family, rounded.
const char* kGelu = "[site.\"gelu\"]\noutput = \"bf16\"\n";
const char* kSilu = "[site.\"silu\"]\ninput = \"bf16\"\n";

Policy contract_policy(Arch arch, bool emulated) {
  if (!emulated) return Policy{};
  return policy_from_toml(std::string(kEmulatedPolicy) + (arch == Arch::gpt2 ? kGelu : kSilu), "forward contract");
}

void forward_contract(ContractTally& tl, double scale, bool emulated) {
  const std::vector<size_t> lengths = scale >= 0.5 ? std::vector<size_t>{1, 33, 80} : std::vector<size_t>{1, 33};
  for (Arch arch : {Arch::gpt2, Arch::llama})
    for (bool tanh : arch == Arch::gpt2 ? std::vector<bool>{false, true} : std::vector<bool>{false})
      for (size_t T : lengths)
        for (uint64_t seed : {1, 2})
          forward_case(tl, small(arch, tanh), contract_policy(arch, emulated), T, seed,
                       emulated ? Agreement::bit_exact : Agreement::tolerance, emulated ? 0 : 1e-4, AttentionKernel::materialised,
                       fmt::format("{}{}", arch == Arch::gpt2 ? "gpt2" : "llama", tanh ? " gelu_tanh" : ""),
                       emulated ? HealthCheck::all : HealthCheck::none);
}

// The site health contract: emulated sites rounding to narrow formats on a model whose weights are
// scaled up, so that values leave the formats' ranges at most sites. `saturating`: formats that
// clip (fp6_e3m2, int4, mxfp4's blocks) or overflow to inf only at the lm_head, so the values stay
// finite through the layers; otherwise e4m3b11fnuz scores (NaN beyond 30) and an e3m2 softmax
// input (inf beyond 14): NaN rows, which then spread through the later layers.
// flash: attn.pv native and no softmax output rounding (the flash kernel's settings).
Policy health_policy(Arch arch, bool saturating, bool flash) {
  std::string t = R"(
[site."attn.qkv"]
accumulation = "strict"
accumulator = "ps10"
output = "fp6_e3m2"
[site."attn.proj"]
accumulation = "unfused"
accumulator = "ps10"
input_a = "int4"
[site."mlp.fc"]
accumulation = "strict"
accumulator = "ps10"
input_b = "mxfp4"
output = "fp6_e3m2"
[site."mlp.proj"]
accumulation = "blocked"
accumulator = "ps7"
block = 16
output = "fp6_e3m2"
[site."lm_head"]
accumulation = "strict"
accumulator = "ps10"
output = "e3m2"
[site."ln"]
input = "fp6_e3m2"
output = "fp4_e2m1"
)";
  t += saturating ? "[site.\"attn.qk\"]\naccumulation = \"strict\"\naccumulator = \"ps10\"\noutput = \"fp6_e3m2\"\n"
                  : "[site.\"attn.qk\"]\naccumulation = \"strict\"\naccumulator = \"ps10\"\noutput = \"e4m3b11fnuz\"\n"
                    "[site.\"softmax\"]\ninput = \"e3m2\"\n";
  if (!flash) t += "[site.\"attn.pv\"]\naccumulation = \"strict\"\naccumulator = \"ps10\"\noutput = \"fp6_e3m2\"\n";
  t += arch == Arch::gpt2 ? "[site.\"gelu\"]\ninput = \"fp6_e3m2\"\noutput = \"int4\"\n"
                          : "[site.\"silu\"]\ninput = \"fp6_e3m2\"\noutput = \"int4\"\n";
  return policy_from_toml(t, "health contract");
}

// init_model's weights × 40 (norms and biases kept), so that activations reach the formats' limits.
Model health_model(const ModelConfig& cfg, uint64_t seed) {
  Model m = init_model(cfg, seed);
  for (const ParamInfo& info : parameter_infos(cfg))
    if (!info.bias && info.role != Role::norm1 && info.role != Role::norm2 && info.role != Role::norm_f)
      for (float& x : m.params.at(info.name).data) x *= 40.0f;
  return m;
}

// How many (site, layer) pairs of a forward pass saw each kind of event.
struct EventSpread {
  int overflow = 0, nan = 0, inf = 0;
};
EventSpread event_spread(const ForwardStats& st) {
  EventSpread e;
  for (const SiteHealth& h : st.health) e.overflow += h.overflow > 0, e.nan += h.nan > 0, e.inf += h.inf > 0;
  return e;
}

void health_contract(ContractTally& tl, double scale, bool flash) {
  const std::vector<size_t> lengths = scale >= 0.5 ? std::vector<size_t>{33, 80} : std::vector<size_t>{33};
  for (Arch arch : {Arch::gpt2, Arch::llama})
    for (bool saturating : {true, false})
      for (size_t T : lengths) {
        const ModelConfig cfg = small(arch, false);
        const uint64_t seed = 3;
        const Policy pol = health_policy(arch, saturating, flash);
        const Model m = health_model(cfg, seed);
        const std::string what = fmt::format("{} {} {}", arch == Arch::gpt2 ? "gpt2" : "llama",
                                             saturating ? "saturating" : "nan", flash ? "flash" : "materialised");
        if (tl.check_only && !flash) {  // the case must provoke what it counts (a CPU pass)
          ForwardStats st;
          forward<float>(m, tokens(T, cfg.vocab, seed), PolicyPlan(pol, cfg), &st);
          const EventSpread e = event_spread(st);
          if (e.overflow < (saturating ? 6 : 4) || (saturating ? e.inf < 1 : e.nan < 3))
            throw std::logic_error(fmt::format("health contract {} T={}: too few events to test (overflow at {} "
                                               "sites, NaN at {}, inf at {})", what, T, e.overflow, e.nan, e.inf));
        }
        forward_case(tl, cfg, pol, T, seed, Agreement::bit_exact, 0,
                     flash ? AttentionKernel::flash : AttentionKernel::materialised, what,
                     flash ? HealthCheck::before_flash : HealthCheck::all, &m);
      }
}

// One GEMM site (cuda/site.h) against site_gemm (nn/linear.h): operand roundings (formats and
// scaled schemes), every emulated accumulation, ÷ divisor, + bias, output rounding, B given
// transposed or not.
const char* kSitePolicies[] = {
    "accumulation = \"strict\"\naccumulator = \"ps7\"\ninput_a = \"e4m3\"\ninput_b = \"mxfp8_e4m3\"\noutput = \"bf16\"\n",
    "accumulation = \"blocked\"\naccumulator = \"ps10\"\nblock = 8\ninput = \"bf16\"\noutput = \"ps7\"\n"
    "rounding = \"sr\"\nseed = 9\nsr_bits = 16\n",
    "accumulation = \"unfused\"\naccumulator = \"ps13\"\ninput_a = \"nvfp4\"\ninput_b = \"int8_channel\"\n",
    "accumulation = \"promoted\"\naccumulator = \"ps4\"\nblock = 16\ninput_a = \"mxfp4\"\nrounding = \"rz\"\n",
    "accumulation = \"tensor_core\"\ntensor_core = \"v100_fp16\"\noutput = \"fp16\"\n",
};
const char* kSiteNative[] = {"", "input = \"bf16\"\noutput = \"fp16\"\n", "input_a = \"mxfp8_e5m2\"\n"};

void site_case(ContractTally& tl, const std::string& entry, size_t M, size_t N, size_t K, bool bt, float divisor,
               bool bias, uint64_t seed, Agreement a, double tol) {
  if (!tl.take()) return;
  const Policy pol = policy_from_toml("[site.\"mlp.fc\"]\n" + entry, "site contract");
  const SitePolicy& sp = pol.at(Site::mlp_fc, 0);
  const SitePlan plan = plan_site(sp);
  if (tl.check_only) return;  // plan_site was the validation
  Matrix<float> A(static_cast<Eigen::Index>(M), static_cast<Eigen::Index>(K));
  Matrix<float> B(static_cast<Eigen::Index>(bt ? N : K), static_cast<Eigen::Index>(bt ? K : N));
  std::vector<float> b(N);
  fill_random(A.data(), size_t(A.size()), Distribution::normal, seed, 1);
  fill_random(B.data(), size_t(B.size()), Distribution::normal, seed, 2);
  fill_random(b.data(), N, Distribution::normal, seed, 3);
  Matrix<float> cpu(static_cast<Eigen::Index>(M), static_cast<Eigen::Index>(N));
  SiteHealth ch;
  site_gemm<float>(plan, A, B, bt, cpu, 40, divisor, bias ? b.data() : nullptr, &ch);
  const std::vector<float> hA(A.data(), A.data() + A.size()), hB(B.data(), B.data() + B.size());
  gpu::Array<float> dA(hA), dB(hB), db(b), dout(M * N);
  gpu::Array<SiteHealth> dh(std::vector<SiteHealth>(1));
  gpu::site_gemm(plan, dA.get(), dB.get(), bt, dout.get(), M, N, K, 40, divisor, bias ? db.get() : nullptr,
                 gpu::Stream(), dh.get());
  const std::vector<float> g = dout.to_vector();
  const std::string w = fmt::format("{}x{}x{} bt={} divisor={} bias={} seed={} [{}]", M, N, K, bt, divisor, bias, seed, entry);
  tl.compare(w, cpu.data(), g.data(), g.size(), a, tol);
  if (a == Agreement::bit_exact) {  // the values are the CPU's bits: so are their health counts
    const SiteHealth gh = dh.to_vector()[0];
    tl.compare_count(w + " overflow", ch.overflow, gh.overflow);
    tl.compare_count(w + " nan", ch.nan, gh.nan);
    tl.compare_count(w + " inf", ch.inf, gh.inf);
  }
}

void site_contract(ContractTally& tl, double scale, bool emulated) {
  struct Shape { size_t M, N, K; };
  std::vector<Shape> shapes = {{1, 1, 1}, {7, 33, 65}, {3, 40, 256}};
  if (scale >= 0.5) shapes.push_back({70, 100, 300});
  const auto& entries = emulated ? std::vector<const char*>(std::begin(kSitePolicies), std::end(kSitePolicies))
                                 : std::vector<const char*>(std::begin(kSiteNative), std::end(kSiteNative));
  for (const char* e : entries)
    for (const Shape& sh : shapes)
      for (bool bt : {false, true})
        for (uint64_t seed : {1, 2})
          site_case(tl, e, sh.M, sh.N, sh.K, bt, seed == 1 ? 1.0f : 8.0f, seed == 2, seed,
                    emulated ? Agreement::bit_exact : Agreement::tolerance, emulated ? 0 : 1e-5);
}

}  // namespace

void add_forward_contracts(std::vector<Contract>& t) {
  t.push_back({"site/emulated", Agreement::bit_exact, 0, "",
               "one GEMM site: strict / blocked / unfused / promoted / tensor_core with operand formats and schemes "
               "(e4m3, mxfp8_e4m3, bf16 sr, nvfp4, int8_channel, mxfp4), output rounding × M×N×K {1×1×1, 7×33×65, "
               "3×40×256, 70×100×300} × B as [K,N] and transposed × divisor 1 / 8 × bias × 2 seeds: outputs and "
               "the site's health counts",
               [](ContractTally& tl, double scale) { site_contract(tl, scale, true); }, true});
  t.push_back({"site/native", Agreement::tolerance, 1e-5,
               "native sites: cuBLAS SGEMM against Eigen's binary32 product (other summation orders; no TF32)",
               "native, native with bf16 inputs and fp16 output, native with an mxfp8_e5m2 A; the same shapes",
               [](ContractTally& tl, double scale) { site_contract(tl, scale, false); }, true});
  t.push_back({"forward/emulated", Agreement::bit_exact, 0, "",
               "gpt2 (erf and tanh GELU) and llama (grouped-query, RoPE), L=2 C=64 NH=4 V=97, T ∈ {1, 33, 80} × 2 "
               "seeds; every GEMM site emulated (strict, unfused, blocked, promoted; sr at mlp.fc), ln / gelu / silu "
               "rounded, LAMP strict τ=0.1 recomputing in ps13: logits, LAMP counts and site health per layer",
               [](ContractTally& tl, double scale) { forward_contract(tl, scale, true); }, true});
  t.push_back({"forward/health", Agreement::bit_exact, 0, "",
               "site health (overflow / NaN / inf per site and layer) on gpt2 and llama with weights ×40, every GEMM "
               "site emulated into narrow formats (fp6_e3m2, int4, mxfp4, e3m2; saturating, or e4m3b11fnuz scores and "
               "an e3m2 softmax input whose NaN rows spread), T ∈ {33, 80}, materialised attention: every count and "
               "the logits",
               [](ContractTally& tl, double scale) { health_contract(tl, scale, false); }, true});
  t.push_back({"forward/health-flash", Agreement::bit_exact, 0, "",
               "the same models and policies with native attn.pv and the flash kernel: layer 0's attn.qkv, attn.qk "
               "and softmax counts (upstream of the flash output, whose summation order differs from the CPU's)",
               [](ContractTally& tl, double scale) { health_contract(tl, scale, true); }, true});
  t.push_back({"forward/native", Agreement::tolerance, 1e-4,
               "native sites: cuBLAS SGEMM against Eigen's binary32 product (other summation orders; no TF32), "
               "through two layers and the lm_head",
               "the same models and lengths, the native policy: logits",
               [](ContractTally& tl, double scale) { forward_contract(tl, scale, false); }, true});
}

}  // namespace mantis
