// mantis bench round|gemm — throughput of the fast paths beside a roofline in the same run:
// round_array against memcpy of the same array, strict GEMM against Eigen's float GEMM.
#include <fmt/format.h>

// GCC 12 warns inside its own avx512fintrin.h when Eigen's packet code is inlined here
// ("'__Y' may be used uninitialized"): a known false positive, silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#include <algorithm>
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
#include "core/gemm.h"
#include "nn/model.h"
#include "core/philox.h"
#include "nn/policy.h"
#include "train/train.h"
#include "mantis_config.h"
#include "core/round_array.h"
#include "exp/manifest.h"
#include "exp/study.h"

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
  std::string config = std::string(MANTIS_SOURCE_DIR) + "/experiments/train-gpt2-bytes.toml";  // train
  std::string model;  // forward: a checkpoint instead of the random GPT-2-shaped model
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
  for (const char* fname : {"bf16", "fp16", "ps4"}) {
    const Format f = format_lookup(fname);
    for (Rounding m : {Rounding::rne, Rounding::sr}) {
      for (int th : a.threads) {
        set_num_threads(th);
        RoundOptions o;
        o.mode = m;
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
                                {"rounding", to_string(m)},
                                {"threads", th},
                                {"ns_per_elem", ns},
                                {"memcpy_ns_per_elem", ns_c},
                                {"ratio", ns / ns_c}});
        table += fmt::format("{:<9} {:<6} {:<8} {:>7} {:>12.3f} {:>12.3f} {:>8.2f}\n", cname, fname, to_string(m), th,
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

ojson bench_gemm(const BenchArgs& a, Progress& progress) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  ojson results = ojson::array();
  if (!a.json) {
    std::printf("strict GEMM, ps4 accumulator (rne), vs Eigen float GEMM; GFLOP/s = 2MNK/time, median of %d\n",
                a.reps);
    std::printf("%-16s %7s %14s %14s %10s\n", "shape", "threads", "strict GFLOP/s", "Eigen GFLOP/s", "eigen/strict");
    std::fflush(stdout);
  }
  GemmSpec s;
  s.acc = format_lookup("ps4");
  s.acc_mode = Rounding::rne;
  s.accumulation = Accumulation::strict;
  validate(s);
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
      auto strict = [&] { gemm(A.data(), B.data(), Cs.data(), M, N, K, s); };
      auto eigen = [&] { C.noalias() = A * B; };
      strict();
      eigen();
      std::vector<double> ts, te;
      for (int r = 0; r < a.reps; ++r) {
        ts.push_back(time_once(strict));
        te.push_back(time_once(eigen));
      }
      const double gs = flop / median(ts) * 1e-9, ge = flop / median(te) * 1e-9;
      results.push_back(ojson{{"shape", {M, N, K}},
                              {"threads", th},
                              {"strict_gflops", gs},
                              {"eigen_gflops", ge},
                              {"slowdown", ge / gs}});
      progress.update(results.size());
      if (!a.json) {
        progress.interrupt();
        std::printf("%-16s %7d %14.3f %14.3f %10.1f\n", fmt::format("{}x{}x{}", M, N, K).c_str(), th, gs, ge, ge / gs);
        std::fflush(stdout);
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
// and with 4-bit saved activations on every unit (per-token absmax, rne), interleaved per rep.
ojson bench_train(const BenchArgs& a, Progress& progress) {
  TrainConfig c = load_train_config(a.config);
  c.out.clear();
  TrainConfig q = c;
  q.act_quant = SavedQuant{4, 0, Rounding::rne, 0};
  const double tokens = double(c.batch) * double(c.accum) * double(c.model.ctx);
  ojson results = ojson::array();
  if (!a.json) {
    std::printf("training step (forward + backward + AdamW), %s: %s L=%d C=%d T=%d, %d x %d sequences; median of %d\n",
                a.config.c_str(), c.model.arch == Arch::gpt2 ? "gpt2" : "llama", c.model.layers, c.model.dim,
                c.model.ctx, c.batch, c.accum, a.reps);
    std::printf("%7s %14s %18s %12s\n", "threads", "fp32 tok/s", "4-bit saved tok/s", "overhead");
    std::fflush(stdout);
  }
  for (int th : a.threads) {
    set_num_threads(th);
    Trainer plain(c), quant(q);
    plain.step();  // warm-up
    quant.step();
    std::vector<double> tp, tq;
    for (int r = 0; r < a.reps; ++r) {
      tp.push_back(time_once([&] { plain.step(); }));
      tq.push_back(time_once([&] { quant.step(); }));
    }
    const double sp = median(tp), sq = median(tq);
    results.push_back(ojson{{"threads", th},
                            {"config", a.config},
                            {"tokens_per_step", tokens},
                            {"step_seconds", sp},
                            {"tokens_per_s", tokens / sp},
                            {"act4_step_seconds", sq},
                            {"act4_tokens_per_s", tokens / sq},
                            {"act4_overhead", sq / sp - 1}});
    progress.update(results.size());
    if (!a.json) {
      progress.interrupt();
      std::printf("%7d %14.1f %18.1f %11.1f%%\n", th, tokens / sp, tokens / sq, 100 * (sq / sp - 1));
      std::fflush(stdout);
    }
  }
  return results;
}

// Measurements each benchmark makes (the progress reporter's total).
uint64_t measurements(const BenchArgs& a) {
  const uint64_t th = a.threads.size();
  if (a.what == "round") return 2 * 3 * 2 * th;  // containers × formats × modes × threads
  if (a.what == "gemm") return a.sizes.size() * th;
  return th;
}

int run_bench(const BenchArgs& a) {
  if (a.what != "round" && a.what != "gemm" && a.what != "forward" && a.what != "train")
    throw InputError(fmt::format("unknown benchmark '{}' (known: round, gemm, forward, train)", a.what));
  const Stopwatch sw;
  ojson results;
  {
    Progress progress("bench " + a.what, measurements(a), shared().progress_mode(), "measurements");
    if (a.what == "round") results = bench_round(a, progress);
    else if (a.what == "gemm") results = bench_gemm(a, progress);
    else if (a.what == "forward") results = bench_forward(a, progress);
    else results = bench_train(a, progress);
  }
  ojson man = manifest_header("mantis bench " + a.what);
  man["settings"] = {{"reps", a.reps}, {"threads", a.threads}};
  if (a.what == "round") man["settings"]["n"] = a.n;
  if (a.what == "gemm") man["settings"]["sizes"] = a.sizes;
  if (a.what == "forward")
    man["settings"].update({{"model", a.model.empty() ? "random" : a.model}, {"layers", a.layers}, {"dim", a.dim},
                            {"heads", a.heads}, {"ctx", a.ctx}});
  if (a.what == "forward" && !a.model.empty()) man["model_files"] = model_files_json(a.model);
  // the fixed seeds of each benchmark's data (fill_random, random_word), or the configuration's
  if (a.what == "round") man["seeds"] = {{"data", 12345}, {"rounding", 1}};
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
  }
  return 0;
}

}  // namespace

Runner setup_bench(CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  sub.description(
      "round: ns per element of out-of-place round_array (double and float arrays; bf16, fp16, ps4; "
      "rne, sr) beside memcpy of the same array. gemm: GFLOP/s of strict GEMM with a ps4 "
      "accumulator beside Eigen's float GEMM. forward: tokens/s of a random GPT-2-shaped model (or --model), FP32, "
      "LAMP's uniform ps4 policy and LAMP strict tau = 1. train: training tokens/s of --config, without and with "
      "4-bit saved activations. Medians over --reps after one warm-up.");
  sub.add_option("benchmark", a->what, "round, gemm, forward or train")
      ->required()
      ->check(CLI::IsMember({"round", "gemm", "forward", "train"}));
  sub.add_option("--config", a->config, "train: the training configuration")->capture_default_str()->check(kPath);
  sub.add_option("--model", a->model, "forward: measure this checkpoint (--ctx caps its context) instead")->check(kPath);
  add_json(sub, a->json, "print JSON ({\"results\": […], \"manifest\": {…}}) instead of a table");
  add_out(sub, a->out, "also write DIR/results.json and DIR/manifest.json (one result set)");
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
