// mantis bench round|gemm|forward|train|optim — throughput of the fast paths beside a roofline in
// the same run: round_array against memcpy of the same array, strict GEMM against Eigen's float
// GEMM; optim: every registered optimizer's step beside AdamW's, and Gefen's codebook DP.
#include <fmt/format.h>

// GCC 12 warns inside its own avx512fintrin.h when Eigen's packet code is inlined here
// ("'__Y' may be used uninitialized"): a known false positive, silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#include <algorithm>
#include <functional>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "io/checkpoint.h"
#include "nn/forward.h"
#include "core/cpu.h"
#include "core/crmath.h"
#include "core/gemm.h"
#include "nn/model.h"
#include "core/philox.h"
#include "nn/policy.h"
#include "train/train.h"
#include "mantis_config.h"
#include "core/round_array.h"
#include "exp/manifest.h"
#include "exp/study.h"
#include "optim/gefen_codebook.h"
#include "optim/optimizer.h"

#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif

namespace mantis::cli {

namespace {

struct BenchArgs {
  std::string what;  // round | gemm | forward | train
  bool json = false;
  std::string out;
  int reps = 7;
  std::vector<int> threads{1, 2};
  uint64_t n = 10'000'000;          // round: elements per array
  std::vector<int> sizes{256, 512};  // gemm: square shapes
  int layers = 12, dim = 768, heads = 12, ctx = 1024;  // forward: the model (GPT-2 small)
  std::string config = "experiments/train-gpt2-bytes.toml";  // train: relative to the working directory
  std::string model;  // forward: a checkpoint instead of the random GPT-2-shaped model
  uint64_t params = 0;  // optim: 0 = GPT-2 small's parameter set, else the smallest model of ≥ this many
  int dp_bins = kGefenHistogramBins;  // optim: occupied bins of the codebook DP's histogram
  std::vector<std::string> optimizers;  // optim: these (and adamw, the baseline); empty = every registered one
};

// Copy `bytes` from src to dst in `threads` contiguous parts, one per thread.
void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto part = [&](int t) {
    const size_t b = bytes * size_t(t) / size_t(threads), e = bytes * size_t(t + 1) / size_t(threads);
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  };
#if MANTIS_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) part(t);
#else
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(part, t);
  for (auto& th : pool) th.join();
#endif
}

template <class F>
double time_once(F&& f) {
  Stopwatch w;
  f();
  return w.seconds();
}

template <class T>
void bench_round_container(const char* cname, const BenchArgs& a, ojson& results, std::string& table,
                           Progress& progress) {
  const size_t n = a.n;
  std::vector<T> in(n), out(n), copy(n);
  fill_random(in.data(), n, Distribution::normal, 12345, 0);
  struct Variant {
    const char* label;
    Rounding mode;
    int sr_bits;
    bool packed;
  };
  // sr with one 32-bit word per rounding, and with 8 random bits, four per word (philox.h sr_word)
  const Variant variants[] = {{"rne", Rounding::rne, 32, false}, {"sr", Rounding::sr, 32, false},
                              {"sr8p", Rounding::sr, 8, true}};
  for (const char* fname : {"bf16", "fp16", "ps4"}) {
    const Format f = format_lookup(fname);
    for (const Variant& var : variants) {
      for (int th : a.threads) {
        set_num_threads(th);
        RoundOptions o;
        o.mode = var.mode;
        o.sr_bits = var.sr_bits;
        o.sr_packed = var.packed;
        o.seed = 1;
        auto rnd = [&] { round_array(in.data(), out.data(), n, f, o); };
        auto cpy = [&] { parallel_memcpy(copy.data(), in.data(), n * sizeof(T), th); };
        rnd();  // warm-up (also first touch of the outputs)
        cpy();
        std::vector<double> tr, tc;
        for (int r = 0; r < a.reps; ++r) {
          tr.push_back(time_once(rnd));
          tc.push_back(time_once(cpy));
        }
        const double ns = median(tr) * 1e9 / double(n), ns_c = median(tc) * 1e9 / double(n);
        results.push_back(ojson{{"container", cname},
                                {"format", fname},
                                {"rounding", to_string(var.mode)},
                                {"sr_bits", var.sr_bits},
                                {"sr_packed", var.packed},
                                {"threads", th},
                                {"ns_per_elem", ns},
                                {"memcpy_ns_per_elem", ns_c},
                                {"ratio", ns / ns_c}});
        table += fmt::format("{:<9} {:<6} {:<8} {:>7} {:>12.3f} {:>12.3f} {:>8.2f}\n", cname, fname, var.label, th,
                             ns, ns_c, ns / ns_c);
        progress.update(results.size());
        if (!a.json) {
          progress.interrupt();
          std::fputs(table.c_str(), stdout);
          std::fflush(stdout);
          table.clear();
        }
      }
    }
  }
}

ojson bench_round(const BenchArgs& a, Progress& progress) {
  ojson results = ojson::array();
  std::string table;
  if (!a.json) {
    std::printf("round_array, out of place, %llu elements, median of %d (after one warm-up)\n",
                (unsigned long long)a.n, a.reps);
    std::printf("%-9s %-6s %-8s %7s %12s %12s %8s\n", "container", "format", "rounding", "threads", "ns/elem",
                "memcpy ns", "ratio");
    std::fflush(stdout);
  }
  bench_round_container<double>("double", a, results, table, progress);
  bench_round_container<float>("float", a, results, table, progress);
  return results;
}

// The emulated GEMM's cases, each beside Eigen's float GEMM on the same operands and threads:
// the baseline (strict ps4 rne) and the same on the portable kernel, then sr (32 random bits:
// the binary64 container; 18 bits: binary32; 8 bits packed four to a random word), unfused, blocked (k_b = 32), a bf16 accumulator,
// and e4m3 inputs (operands rounded once, rne) into strict ps4.
struct GemmCase {
  const char* name;
  GemmSpec spec;
  GemmPlan plan;  // validated once, as the model's sites are
};

std::vector<GemmCase> gemm_cases() {
  auto make = [](const char* name, const char* acc, Rounding mode, Accumulation acc_kind,
                 const char* input = nullptr, int sr_bits = 32, bool portable = false, const char* gpu = nullptr,
                 bool packed = false) {
    GemmCase c{name, {}, {}};
    c.spec.acc = format_lookup(acc);
    c.spec.acc_mode = mode;
    c.spec.accumulation = acc_kind;
    c.spec.sr_bits = sr_bits;
    c.spec.sr_packed = packed;
    if (input) c.spec.input = format_lookup(input);
    if (gpu) c.spec.tensor_core = gpu;
    c.plan = plan_gemm(c.spec);
    if (portable) c.plan.kernel = GemmKernel::portable;
    return c;
  };
  return {
      make("strict ps4 rne", "ps4", Rounding::rne, Accumulation::strict),
      make("strict ps4 portable", "ps4", Rounding::rne, Accumulation::strict, nullptr, 32, true),
      make("strict ps4 sr", "ps4", Rounding::sr, Accumulation::strict),
      make("strict ps4 sr18", "ps4", Rounding::sr, Accumulation::strict, nullptr, 18),
      make("strict ps4 sr8 packed", "ps4", Rounding::sr, Accumulation::strict, nullptr, 8, false, nullptr, true),
      make("unfused ps4 rne", "ps4", Rounding::rne, Accumulation::unfused),
      make("blocked ps4 rne", "ps4", Rounding::rne, Accumulation::blocked),
      make("strict bf16 rne", "bf16", Rounding::rne, Accumulation::strict),
      make("e4m3 in, ps4 rne", "ps4", Rounding::rne, Accumulation::strict, "e4m3"),
      make("h100 fp16 -> fp32", "fp32", Rounding::rne, Accumulation::tensor_core, "fp16", 32, false, "h100"),
      make("h100 e4m3 -> fp32", "fp32", Rounding::rne, Accumulation::tensor_core, "e4m3", 32, false, "h100"),
  };
}

ojson bench_gemm(const BenchArgs& a, Progress& progress) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::vector<GemmCase> cases = gemm_cases();
  ojson results = ojson::array();
  if (!a.json) {
    std::printf("emulated GEMM vs Eigen float GEMM on the same operands; GFLOP/s = 2MNK/time, median of %d\n",
                a.reps);
    std::printf("%-16s %7s %-20s %-16s %14s %14s %10s\n", "shape", "threads", "case", "kernel", "GFLOP/s",
                "Eigen GFLOP/s", "eigen/case");
    std::fflush(stdout);
  }
  for (int sz : a.sizes) {
    const size_t M = size_t(sz), N = M, K = M;
    Mat A(M, K), B(K, N), C(M, N);
    fill_random(A.data(), M * K, Distribution::normal, 777, 1);
    fill_random(B.data(), K * N, Distribution::normal, 777, 2);
    std::vector<float> Cs(M * N);
    const double flop = 2.0 * double(M) * double(N) * double(K);
    for (int th : a.threads) {
      set_num_threads(th);
      Eigen::setNbThreads(th);
      auto eigen = [&] { C.noalias() = A * B; };
      eigen();
      for (const GemmCase& c : cases) {
        auto emulated = [&] { gemm(c.plan, A.data(), B.data(), Cs.data(), M, N, K, c.spec.stream); };
        emulated();
        std::vector<double> ts, te;
        for (int r = 0; r < a.reps; ++r) {  // interleaved, so that both see the same machine state
          ts.push_back(time_once(emulated));
          te.push_back(time_once(eigen));
        }
        const double gs = flop / median(ts) * 1e-9, ge = flop / median(te) * 1e-9;
        results.push_back(ojson{{"shape", {M, N, K}},
                                {"threads", th},
                                {"case", c.name},
                                {"accumulator", c.spec.acc.name},
                                {"mode", to_string(c.spec.acc_mode)},
                                {"sr_bits", c.spec.sr_bits},
                                {"sr_packed", c.spec.sr_packed},
                                {"kernel", to_string(c.plan.kernel)},
                                {"accumulation", to_string(c.spec.accumulation)},
                                {"input", c.spec.input ? ojson(c.spec.input->name) : ojson(nullptr)},
                                {"gflops", gs},
                                {"eigen_gflops", ge},
                                {"slowdown", ge / gs}});
        progress.update(results.size());
        if (!a.json) {
          progress.interrupt();
          std::printf("%-16s %7d %-20s %-16s %14.3f %14.3f %10.1f\n", fmt::format("{}x{}x{}", M, N, K).c_str(), th,
                      c.name, to_string(c.plan.kernel), gs, ge, ge / gs);
          std::fflush(stdout);
        }
      }
    }
  }
  return results;
}

// Forward tokens/s of one sequence of --ctx tokens: a randomly initialised GPT-2-shaped model
// (init_model), or --model's checkpoint, under the native FP32 policy, LAMP's uniform ps4 policy
// and LAMP strict τ = 1 over ps4 (recomputing in FP32), interleaved per rep.
ojson bench_forward(const BenchArgs& a, Progress& progress) {
  Model m;
  if (!a.model.empty()) {
    m = load_model(a.model);
  } else {
    ModelConfig c;  // GPT-2 small unless overridden
    c.layers = a.layers, c.dim = a.dim, c.heads = a.heads, c.kv_heads = a.heads, c.hidden = 4 * a.dim, c.ctx = a.ctx;
    m = init_model(c, 1);
  }
  const ModelConfig& c = m.cfg;
  const int T = a.model.empty() ? c.ctx : std::min(a.ctx, c.ctx);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(random_word(3, 0, i) % uint32_t(c.vocab));
  const Policy uniform = lamp_policy(4);
  Policy lamp = uniform;
  lamp.lamp = LampSpec{};  // strict, τ = 1, FP32 recompute
  ojson results = ojson::array();
  if (!a.json) {
    std::printf("forward, %s L=%d C=%d NH=%d V=%d, T=%d tokens, %s; median of %d\n",
                c.arch == Arch::gpt2 ? "gpt2" : "llama", c.layers, c.dim, c.heads, c.vocab, T,
                a.model.empty() ? "random weights" : a.model.c_str(), a.reps);
    std::printf("%7s %12s %14s %14s %13s %13s %10s\n", "threads", "fp32 tok/s", "ps4 tok/s", "lamp tok/s",
                "ps4/fp32", "lamp/ps4", "recompute");
    std::fflush(stdout);
  }
  for (int th : a.threads) {
    set_num_threads(th);
    ForwardStats st;
    auto fp32 = [&] { forward<float>(m, tokens); };
    auto low = [&] { forward<float>(m, tokens, uniform); };
    auto lmp = [&] { forward<float>(m, tokens, lamp, &st); };
    fp32();
    low();
    lmp();
    std::vector<double> tf, tl, tp;
    for (int r = 0; r < a.reps; ++r) {
      tf.push_back(time_once(fp32));
      tl.push_back(time_once(low));
      tp.push_back(time_once(lmp));
    }
    uint64_t sel = 0, all = 0;
    for (size_t l = 0; l < st.lamp_selected.size(); ++l) sel += st.lamp_selected[l], all += st.lamp_entries[l];
    const double sf = median(tf), sl = median(tl), sp = median(tp), n = double(T);
    results.push_back(ojson{{"threads", th},
                            {"model", a.model.empty() ? "random" : a.model},
                            {"layers", c.layers},
                            {"dim", c.dim},
                            {"heads", c.heads},
                            {"ctx", T},
                            {"fp32_seconds", sf},
                            {"fp32_tokens_per_s", n / sf},
                            {"lamp_ps4_seconds", sl},
                            {"lamp_ps4_tokens_per_s", n / sl},
                            {"lamp_over_fp32", sl / sf},
                            {"lamp_strict_tau1_seconds", sp},
                            {"lamp_strict_tau1_over_uniform_ps4", sp / sl},
                            {"lamp_strict_tau1_recompute_rate", double(sel) / double(all)}});
    progress.update(results.size());
    if (!a.json) {
      progress.interrupt();
      std::printf("%7d %12.1f %14.1f %14.1f %13.2f %13.2f %10.5f\n", th, n / sf, n / sl, n / sp, sl / sf, sp / sl,
                  double(sel) / double(all));
      std::fflush(stdout);
    }
  }
  return results;
}

// Training step time (forward + backward + AdamW) of a configuration's model on its data, without
// and with 4-bit saved activations on every unit (per-token absmax, rne), and GNMR 4→8: the same
// 4-bit path with a gnmr [controller] whose thresholds every unit exceeds from the third step, so
// the budget — 2 % of the units, at least one — is spent at every step (8-bit recovery): the upper
// bound of routing's cost. Interleaved per rep. Then the controller alone: its choose + observe
// on the model's units with synthetic norms, median of 1000 steps, against the 4-bit step.
ojson bench_train(const BenchArgs& a, Progress& progress) {
  TrainConfig c = load_train_config(a.config);
  c.out.clear();
  TrainConfig q = c;
  q.act_quant = SavedQuant{4, 0, Rounding::rne, 0};
  TrainConfig g = q;
  const size_t units = size_t(c.model.layers) * kUnitCount;
  g.controller.name = "gnmr";
  g.controller.gnmr.alpha = g.controller.gnmr.beta = 1e-300;
  g.controller.gnmr.warmup = 0, g.controller.gnmr.delta = 1;
  g.controller.gnmr.max_recover = std::max(1, int(std::lround(0.02 * double(units))));
  g.controller.recover = SavedQuant{8, 0, Rounding::rne, 0};
  const double tokens = double(c.batch) * double(c.accum) * double(c.model.ctx);
  // the controller alone
  double ctl_seconds = 0;
  {
    auto ctl = make_controller(g.controller, c.model);
    std::vector<UnitStep> us(units);
    std::vector<UnitPath> paths(units);
    std::vector<double> t;
    for (uint64_t s = 0; s < 1000; ++s) {
      for (size_t i = 0; i < units; ++i) us[i].grad_norm = 1.0 + double((s * 7 + i * 13) % 17) / 16;
      t.push_back(time_once([&] {
        ctl->choose(s, paths);
        ctl->observe(s, us);
      }));
    }
    ctl_seconds = median(t);
  }
  ojson results = ojson::array();
  if (!a.json) {
    std::printf("training step (forward + backward + AdamW), %s: %s L=%d C=%d T=%d, %d x %d sequences; median of %d\n",
                a.config.c_str(), c.model.arch == Arch::gpt2 ? "gpt2" : "llama", c.model.layers, c.model.dim,
                c.model.ctx, c.batch, c.accum, a.reps);
    std::printf("GNMR 4->8: %d of %zu units recovered at every step; the controller alone %.1f us per step\n",
                g.controller.gnmr.max_recover, units, 1e6 * ctl_seconds);
    std::printf("%7s %14s %18s %12s %18s %14s %14s\n", "threads", "fp32 tok/s", "4-bit saved tok/s", "overhead",
                "gnmr 4->8 tok/s", "vs 4-bit", "controller");
    std::fflush(stdout);
  }
  for (int th : a.threads) {
    set_num_threads(th);
    Trainer plain(c), quant(q), gnmr(g);
    plain.step();  // warm-up
    quant.step();
    gnmr.step();
    gnmr.step();  // from here on the budget is spent every step
    std::vector<double> tp, tq, tg;
    for (int r = 0; r < a.reps; ++r) {
      tp.push_back(time_once([&] { plain.step(); }));
      tq.push_back(time_once([&] { quant.step(); }));
      tg.push_back(time_once([&] { gnmr.step(); }));
    }
    const double sp = median(tp), sq = median(tq), sg = median(tg);
    results.push_back(ojson{{"threads", th},
                            {"config", a.config},
                            {"tokens_per_step", tokens},
                            {"step_seconds", sp},
                            {"tokens_per_s", tokens / sp},
                            {"act4_step_seconds", sq},
                            {"act4_tokens_per_s", tokens / sq},
                            {"act4_overhead", sq / sp - 1},
                            {"gnmr_units", units},
                            {"gnmr_max_recover", g.controller.gnmr.max_recover},
                            {"gnmr_step_seconds", sg},
                            {"gnmr_over_act4", sg / sq - 1},
                            {"controller_seconds", ctl_seconds},
                            {"controller_over_act4_step", ctl_seconds / sq}});
    progress.update(results.size());
    if (!a.json) {
      progress.interrupt();
      std::printf("%7d %14.1f %18.1f %11.1f%% %18.1f %13.1f%% %13.3f%%\n", th, tokens / sp, tokens / sq,
                  100 * (sq / sp - 1), tokens / sg, 100 * (sg / sq - 1), 100 * ctl_seconds / sq);
      std::fflush(stdout);
    }
  }
  return results;
}

// The parameter set bench optim measures: GPT-2 small (ModelConfig's defaults: 124,439,808
// parameters, HF shapes), or with --params N the smallest GPT-2-shaped model of 2 layers, vocab
// 256, ctx 64 and head size 64 with at least N parameters.
ModelConfig optim_bench_model(uint64_t params) {
  ModelConfig c;
  if (params == 0) return c;
  c.vocab = 256, c.ctx = 64, c.layers = 2;
  for (c.dim = 64;; c.dim += 64) {
    c.heads = c.kv_heads = c.dim / 64, c.hidden = 4 * c.dim;
    if (uint64_t(parameter_count(c).values) >= params || c.dim >= 65536) return c;
  }
}

// Optimizer step time of each registered optimizer (its defaults) on one parameter set and one
// set of gradients (allocated once; gradient i of tensor t uniform in [−1e−3, 1e−3) from
// Philox64(7, t, i)), per thread count: one warm-up step (Gefen's first step also learns its
// periods and codebook: reported as first_step_seconds), then the median of --reps steps at lr
// 1e−4, beside AdamW's ns/parameter at the same thread count. Then Gefen's codebook DP
// (learn_gefen_codebook) on a histogram of --dp-bins occupied bins spread evenly over the 4096
// (counts 1 + Philox64(5, 0, j) mod 1000), median of --reps.
ojson bench_optim(const BenchArgs& a, Progress& progress) {
  const ModelConfig mc = optim_bench_model(a.params);
  const ParamSet set = param_set(mc);
  Model m;
  m.cfg = mc;
  GradMap<float> g;
  uint64_t n_all = 0;
  for (size_t t = 0; t < set.params.size(); ++t) {
    const ParamInfo& p = set.params[t];
    Tensor x;
    x.shape = p.shape;
    x.data.resize(size_t(x.numel()));
    std::vector<float> gv(x.data.size());
    const int64_t len = int64_t(gv.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < len; ++i) {  // each element from its own counter: any partition
      const uint64_t w = random_word64(7, t, uint64_t(i));
      gv[size_t(i)] = float(double(w >> 11) * 0x1p-53 * 2e-3 - 1e-3);
      x.data[size_t(i)] = float(double(w & 0xffff) / 65536.0 * 0.2 - 0.1);
    }
    n_all += uint64_t(len);
    m.params[p.name] = std::move(x);
    g[p.name] = std::move(gv);
  }
  ojson results = ojson::array();
  if (!a.json) {
    std::printf("optimizer step on %llu parameters (%s), median of %d steps after one warm-up\n",
                (unsigned long long)n_all, a.params == 0 ? "GPT-2 small, HF shapes" : "GPT-2-shaped", a.reps);
    std::printf("%-12s %7s %12s %12s %10s %12s %10s\n", "optimizer", "threads", "step s", "ns/param", "vs adamw",
                "first step s", "state B/p");
    std::fflush(stdout);
  }
  std::map<int, double> adamw;
  std::vector<const OptimizerEntry*> order;
  for (auto& e : optimizers())
    if (e.name == "adamw") order.insert(order.begin(), &e);  // first: the others' ratios need it
    else if (a.optimizers.empty() || std::find(a.optimizers.begin(), a.optimizers.end(), e.name) != a.optimizers.end())
      order.push_back(&e);
  for (const OptimizerEntry* e : order)
    for (int th : a.threads) {
      set_num_threads(th);
      OptimizerOptions o;
      o.name = e->name;
      o.source = "bench optim";
      std::unique_ptr<Optimizer> opt = e->make(set, o);
      if (!opt) continue;
      const uint64_t n = n_all;
      const double first = time_once([&] { opt->step(m, g, 1e-4); });
      std::vector<double> ts;
      for (int r = 0; r < a.reps; ++r) ts.push_back(time_once([&] { opt->step(m, g, 1e-4); }));
      const double med = median(ts), ns = med * 1e9 / double(n);
      if (e->name == "adamw") adamw[th] = ns;
      const double bpp = double(opt->state_bytes()) / double(n);
      const ojson ratio = adamw.count(th) ? ojson(ns / adamw[th]) : ojson(nullptr);
      results.push_back(ojson{{"benchmark", "step"},
                              {"optimizer", e->name},
                              {"threads", th},
                              {"params", n},
                              {"step_seconds", med},
                              {"ns_per_param", med * 1e9 / double(n)},
                              {"vs_adamw", ratio},
                              {"first_step_seconds", first},
                              {"state_bytes", opt->state_bytes()},
                              {"bytes_per_param", bpp}});
      progress.update(results.size());
      if (!a.json) {
        progress.interrupt();
        std::printf("%-12s %7d %12.4f %12.3f %10s %12.4f %10.4f\n", e->name.c_str(), th, med, med * 1e9 / double(n),
                    ratio.is_null() ? "-" : fmt::format("{:.3f}", ratio.get<double>()).c_str(), first, bpp);
        std::fflush(stdout);
      }
    }
  // Gefen's codebook DP
  std::vector<int64_t> counts(size_t(kGefenHistogramBins), 0);
  for (int j = 0; j < a.dp_bins; ++j)
    counts[size_t(int64_t(j) * kGefenHistogramBins / a.dp_bins)] = 1 + int64_t(random_word64(5, 0, uint64_t(j)) % 1000);
  std::vector<double> ts;
  for (int r = 0; r < a.reps; ++r) ts.push_back(time_once([&] { learn_gefen_codebook(counts); }));
  results.push_back(ojson{{"benchmark", "gefen_codebook_dp"}, {"bins", a.dp_bins}, {"K", kGefenCodebookSize},
                          {"seconds", median(ts)}});
  progress.update(results.size());
  if (!a.json) {
    progress.interrupt();
    std::printf("gefen codebook DP: %d occupied bins, K = %d: %.4f s (median of %d)\n", a.dp_bins, kGefenCodebookSize,
                median(ts), a.reps);
  }
  return results;
}

// crmath's array kernels (the one this CPU runs, and the portable loop) beside glibc's scalar expf /
// erff / tanhf, one thread, on 4096 L1-resident elements (as the activation passes feed them): exp
// of softmax-like arguments −|N(0, 4²)|, erf and tanh of GELU-like ones N(0, 2²)·√½; ns per
// element, median.
ojson bench_math(const BenchArgs& a, Progress& progress) {
  constexpr size_t n = 4096, inner = 1000;
  std::vector<float> x(n), y(n);
  ojson results = ojson::array();
  if (!a.json)
    std::printf("binary32 exp / erf / tanh on %zu elements in L1, 1 thread, median of %d\n%-5s %-22s %10s %10s\n", n, a.reps,
                "fn", "implementation", "ns/elem", "vs glibc");
  for (const char* fn : {"exp", "erf", "tanh"}) {
    const bool is_exp = fn[1] == 'x', is_erf = fn[1] == 'r';
    fill_random(x.data(), n, Distribution::normal, 4242, is_exp ? 0 : is_erf ? 1 : 2);
    for (float& v : x) v = is_exp ? -std::fabs(v) * 4.0f : v * 2.0f * 0.70710678f;
    const auto kernel = is_exp ? cr_expf_array : is_erf ? cr_erff_array : cr_tanhf_array;
    const auto portable = is_exp ? cr_expf_array_portable : is_erf ? cr_erff_array_portable : cr_tanhf_array_portable;
    auto glibc = [&] {
      for (size_t i = 0; i < n; ++i) y[i] = is_exp ? std::exp(x[i]) : is_erf ? std::erf(x[i]) : std::tanh(x[i]);
    };
    const std::vector<std::pair<std::string, std::function<void()>>> impls = {
        {"glibc", glibc},
        {std::string("crmath ") + (cpu_has_avx512() ? "avx512" : "portable"), [&] { kernel(x.data(), y.data(), n); }},
        {"crmath portable", [&] { portable(x.data(), y.data(), n); }}};
    double base = 0;
    for (const auto& [name, f] : impls) {
      f();  // warm-up
      std::vector<double> t;
      for (int r = 0; r < a.reps; ++r)
        t.push_back(time_once([&] {
          for (size_t k = 0; k < inner; ++k) f();
        }));
      const double ns = median(t) * 1e9 / double(n * inner);
      if (name == "glibc") base = ns;
      results.push_back(ojson{{"function", fn}, {"implementation", name}, {"threads", 1},
                              {"ns_per_elem", ns}, {"vs_glibc", base / ns}});
      progress.update(results.size());
      if (!a.json) {
        progress.interrupt();
        std::printf("%-5s %-22s %10.3f %10.2f\n", fn, name.c_str(), ns, base / ns);
        std::fflush(stdout);
      }
    }
  }
  return results;
}

// Measurements each benchmark makes (the progress reporter's total).
uint64_t measurements(const BenchArgs& a) {
  const uint64_t th = a.threads.size();
  if (a.what == "round") return 2 * 3 * 3 * th;  // containers × formats × (rne, sr, sr8p) × threads
  if (a.what == "math") return 9;
  if (a.what == "gemm") return a.sizes.size() * gemm_cases().size() * th;
  if (a.what == "optim")
    return (a.optimizers.empty() ? optimizers().size()
                                 : 1 + size_t(std::count_if(a.optimizers.begin(), a.optimizers.end(),
                                                            [](auto& n) { return n != "adamw"; }))) * th + 1;
  return th;
}

int run_bench(const BenchArgs& a) {
  if (a.what != "round" && a.what != "gemm" && a.what != "forward" && a.what != "train" && a.what != "optim" &&
      a.what != "math")
    throw InputError(fmt::format("unknown benchmark '{}' (known: round, gemm, forward, train, optim, math)", a.what));
  for (auto& name : a.optimizers) {  // each --optimizers name must be registered (the lookup's error lists them)
    OptimizerOptions o;
    o.name = name, o.source = "bench optim --optimizers";
    find_optimizer(o);
  }
  const Stopwatch sw;
  ojson results;
  {
    Progress progress("bench " + a.what, measurements(a), shared().progress_mode(), "measurements");
    if (a.what == "round") results = bench_round(a, progress);
    else if (a.what == "gemm") results = bench_gemm(a, progress);
    else if (a.what == "forward") results = bench_forward(a, progress);
    else if (a.what == "optim") results = bench_optim(a, progress);
    else if (a.what == "math") results = bench_math(a, progress);
    else results = bench_train(a, progress);
  }
  ojson man = manifest_header("mantis bench " + a.what);
  man["settings"] = {{"reps", a.reps}, {"threads", a.threads}};
  if (a.what == "round") man["settings"]["n"] = a.n;
  if (a.what == "gemm") man["settings"]["sizes"] = a.sizes;
  if (a.what == "forward")
    man["settings"].update({{"model", a.model.empty() ? "random" : a.model}, {"layers", a.layers}, {"dim", a.dim},
                            {"heads", a.heads}, {"ctx", a.ctx}});
  if (a.what == "optim") {
    const ModelConfig mc = optim_bench_model(a.params);
    man["settings"].update({{"params", parameter_count(mc).values}, {"layers", mc.layers}, {"dim", mc.dim},
                            {"vocab", mc.vocab}, {"ctx", mc.ctx}, {"dp_bins", a.dp_bins}, {"lr", 1e-4}});
    man["seeds"] = {{"gradients", 7}, {"histogram", 5}};
  }
  if (a.what == "forward" && !a.model.empty()) man["model_files"] = model_files_json(a.model);
  // the fixed seeds of each benchmark's data (fill_random, random_word), or the configuration's
  if (a.what == "round") man["seeds"] = {{"data", 12345}, {"rounding", 1}};
  if (a.what == "math") man["seeds"] = {{"data", 4242}};
  if (a.what == "gemm") man["seeds"] = {{"data", 777}};
  if (a.what == "forward") man["seeds"] = {{"tokens", 3}, {"init", a.model.empty() ? ojson(1) : ojson(nullptr)}};
  if (a.what == "train") {
    const TrainConfig c = load_train_config(a.config);
    man["config_file"] = a.config;
    man["config_sha256"] = c.hash();
    man["seeds"] = {{"init", c.init_seed}, {"data", c.seed}};
  }
  man["timings_s"] = {{"total", sw.seconds()}};
  // results first: readers of `--json` take "results" (the manifest is what made them)
  if (a.json) std::printf("%s\n", ojson{{"results", results}, {"manifest", man}}.dump().c_str());
  if (!a.out.empty()) {
    write_result_set(a.out, {{"results.json", ojson{{"results", results}}.dump(1) + "\n"}}, man);
    if (!a.json) std::printf("wrote %s/results.json and %s/manifest.json\n", a.out.c_str(), a.out.c_str());
    report_figures(a.out, a.json ? stderr : stdout);  // --json: stdout is the JSON
  }
  return 0;
}

}  // namespace

Runner setup_bench(CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  sub.description(
      "round: ns per element of out-of-place round_array (double and float arrays; bf16, fp16, ps4; "
      "rne, sr, and sr8p: sr with 8 random bits packed four to a word) beside memcpy of the same array. gemm: "
      "GFLOP/s of the emulated GEMM (strict ps4 rne on the fastest kernel and on the portable one, sr with 32 and "
      "18 random bits and with 8 packed four to a word, unfused, blocked, a bf16 accumulator, e4m3 inputs, the h100 "
      "matrix unit with fp16 and e4m3 inputs; the kernel each ran is named) beside Eigen's float GEMM. forward: tokens/s of a random GPT-2-shaped model (or --model), FP32, "
      "LAMP's uniform ps4 policy and LAMP strict tau = 1. train: training tokens/s of --config, without and with "
      "4-bit saved activations, and with GNMR 4->8 recovering 2 % of the units every step (the controller alone "
      "timed too). optim: step time per parameter of every registered optimizer on GPT-2 small's "
      "parameters (or --params N), beside AdamW in the same run, and Gefen's codebook DP on --dp-bins bins. "
      "math: ns per element of crmath's correctly rounded exp / erf / tanh array kernels beside glibc's (1 thread). "
      "Medians over --reps after one warm-up.");
  sub.add_option("benchmark", a->what, "round, gemm, forward, train, optim or math")
      ->required()
      ->check(CLI::IsMember({"round", "gemm", "forward", "train", "optim", "math"}));
  sub.add_option("--params", a->params, "optim: at least this many parameters (default: GPT-2 small's 124,439,808)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 34));
  sub.add_option("--optimizers", a->optimizers, "optim: only these (comma-separated; adamw, the baseline, always runs)")
      ->delimiter(',');
  sub.add_option("--dp-bins", a->dp_bins, "optim: occupied bins of the codebook DP's histogram")
      ->capture_default_str()
      ->check(CLI::Range(2, kGefenHistogramBins));
  sub.add_option("--config", a->config, "train: the training configuration")->capture_default_str()->check(kPath);
  sub.add_option("--model", a->model, "forward: measure this checkpoint (--ctx caps its context) instead")->check(kPath);
  add_json(sub, a->json, "print JSON ({\"results\": […], \"manifest\": {…}}) instead of a table");
  add_out(sub, a->out, "also write DIR/results.json and DIR/manifest.json (one result set)");
  add_figures(sub);
  sub.add_option("--reps", a->reps, "timed repetitions (median)")->capture_default_str()->check(CLI::Range(1, 100000));
  // a list here (each count is measured), unlike the shared --threads
  sub.add_option("--threads,-j", a->threads, "thread counts to measure (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub.add_option("--n", a->n, "round: elements per array")->capture_default_str()->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  sub.add_option("--sizes", a->sizes, "gemm: square shapes N (N×N×N), comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 8192));
  sub.add_option("--layers", a->layers, "forward: layers")->capture_default_str()->check(CLI::Range(1, 1000));
  sub.add_option("--dim", a->dim, "forward: width C")->capture_default_str()->check(CLI::Range(1, 65536));
  sub.add_option("--heads", a->heads, "forward: heads (must divide --dim)")->capture_default_str()->check(CLI::Range(1, 4096));
  sub.add_option("--ctx", a->ctx, "forward: tokens in the sequence")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  add_progress(sub);
  return [a] { return run_bench(*a); };
}

}  // namespace mantis::cli
