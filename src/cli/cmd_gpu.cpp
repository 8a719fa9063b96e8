// mantis validate-gpu — the GPU contracts (cuda/contracts.h) run and reported; mantis bench-gpu —
// the GPU benchmarks (rounding vs device memcpy, strict ps4 GEMM vs cuBLAS SGEMM).
// Both need a build with CUDA (nvcc at configure time) and a CUDA device; without either they say
// which is missing and exit 2 (validate-gpu --list prints the table anyway).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "core/gemm.h"
#include "core/matrix_unit.h"
#include "core/progress.h"
#include "core/round_array.h"
#include "core/sample.h"
#include "core/threads.h"
#include "nn/forward.h"
#include "core/philox.h"
#include "exp/manifest.h"
#include "exp/study.h"
#include "mantis_config.h"
#if MANTIS_HAVE_CUDA
#include "cuda/contracts.h"
#include "cuda/cuda.h"
#include "cuda/device.h"
#include "cuda/forward.h"
#endif

namespace mantis::cli {

namespace {

// The GPU backend this build has: "cuda" (nvcc) or "cuda-emu" (the kernels on the CPU emulation).
constexpr const char* kBackend = MANTIS_CUDA_EMU ? "cuda-emu" : "cuda";

// --device names a GPU backend this build lacks: a one-line error naming the one it has.
void require_backend(const std::string& device) {
  if (device == "cuda" && MANTIS_CUDA_EMU)
    throw InputError("this mantis was built without nvcc: its CUDA kernels run on the CPU emulation, --device cuda-emu "
                     "(a GPU needs a build with nvcc on PATH)");
  if (device == "cuda-emu" && !MANTIS_CUDA_EMU)
    throw InputError(MANTIS_HAVE_CUDA ? "this mantis was built with nvcc: its CUDA kernels run on the GPU, --device cuda "
                                        "(cuda-emu is the build configured with -Dcuda=disabled)"
                                      : "this mantis was built without the CUDA backend (-Demulate_cuda=disabled)");
}

struct ValidateArgs {
  std::string device = kBackend;
  std::vector<std::string> only;  // contract-name prefixes
  double scale = 1;
  bool list = false;
  std::string out;  // a result set: results.json + manifest.json
};

struct GpuBenchArgs {
  uint64_t n = uint64_t(1) << 28;    // rounding: elements (1 GiB of binary32)
  std::vector<int> sizes{1024, 4096};  // GEMM: square shapes
  int layers = 48, dim = 1600, heads = 25, ctx = 1024;  // forward: GPT-2-XL-shaped, random weights
  int forward_reps = 3;                                 // 0: no forward benchmark
  bool cpu = true;                                      // forward: the CPU beside it (one run each)
  int reps = 9;
  bool json = false;
  std::string out;
};

struct ProbeArgs {
  std::string data;  // the measured sets (tests/data/tensor_core)
  bool json = false;
};

#if MANTIS_HAVE_CUDA
void require_device() {
  if (!cuda_device_available())
    throw InputError("no CUDA device is visible (cudaGetDeviceCount found none, or no driver): run this on a GPU machine");
}

bool selected(const Contract& c, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const auto& p : only)
    if (c.name.rfind(p, 0) == 0) return true;
  return false;
}

int run_validate(const ValidateArgs& a) {
  const auto& table = gpu_contracts();
  std::vector<const Contract*> chosen;
  for (const Contract& c : table)
    if (selected(c, a.only)) chosen.push_back(&c);
  if (chosen.empty()) throw InputError("--only matches no contract (mantis validate-gpu --list names them)");
  if (a.list) {
    for (const Contract* c : chosen)
      std::printf("%-22s %-10s %s%s\n", c->name.c_str(), c->agreement == Agreement::bit_exact ? "bit-exact" : "tolerance",
                  c->covers.c_str(),
                  c->agreement == Agreement::tolerance ? fmt::format(" [tol {:g}: {}]", c->tol, c->why).c_str() : "");
    return 0;
  }
  require_backend(a.device);
  require_device();
  const std::string device = cuda_device_name();
  std::printf("validate-gpu on %s, scale %g\n%-22s %-10s %8s %12s %10s %10s %8s\n", device.c_str(), a.scale, "contract",
              "agreement", "cases", "values", "mismatch", "worst", "seconds");
  ojson results = ojson::array();
  int failed = 0;
  const Stopwatch total;
  for (const Contract* c : chosen) {
    ContractTally t;
    const Stopwatch sw;
    std::string error;
    try {
      c->run(t, a.scale);
    } catch (const std::exception& e) {  // a CUDA runtime failure fails this contract, not the run
      error = e.what();
    }
    const double s = sw.seconds();
    const bool ok = error.empty() && t.mismatches == 0 && t.cases > 0;
    failed += !ok;
    std::printf("%-22s %-10s %8llu %12llu %10llu %10.3g %8.2f %s\n", c->name.c_str(),
                c->agreement == Agreement::bit_exact ? "bit-exact" : "tolerance", (unsigned long long)t.cases,
                (unsigned long long)t.values, (unsigned long long)t.mismatches, t.worst, s, ok ? "ok" : "FAILED");
    if (!ok) std::printf("  %s\n", error.empty() ? t.first.c_str() : error.c_str());
    std::fflush(stdout);
    results.push_back(ojson{{"contract", c->name},
                            {"agreement", c->agreement == Agreement::bit_exact ? "bit_exact" : "tolerance"},
                            {"tolerance", c->tol}, {"covers", c->covers}, {"cases", t.cases}, {"values", t.values},
                            {"mismatches", t.mismatches}, {"worst_relative", std::isinf(t.worst) ? ojson("inf") : ojson(t.worst)},
                            {"seconds", s}, {"ok", ok}, {"first_mismatches", error.empty() ? t.first : error}});
  }
  std::printf("%zu contracts, %d failed, %.1f s\n", chosen.size(), failed, total.seconds());
  if (!a.out.empty()) {
    ojson man = manifest_header("mantis validate-gpu");
    man["settings"] = {{"scale", a.scale}, {"only", a.only}, {"device", device}};
    man["timings_s"] = {{"total", total.seconds()}};
    write_result_set(a.out, {{"results.json", ojson{{"results", results}}.dump(1) + "\n"}}, man);
  }
  return failed ? 1 : 0;
}

template <class F>
double median_seconds(int reps, const gpu::Stream& s, F&& f) {
  f();  // warm-up
  s.synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const Stopwatch w;
    f();
    s.synchronize();
    t.push_back(w.seconds());
  }
  return median(t);
}

// The forward of a random GPT-2-shaped model (GPT-2-XL by default): FP32 (native sites: cuBLAS),
// LAMP's uniform ps4 policy with LAMP strict τ = 1 (materialised attention) and with LAMP relaxed
// τ = 0.05 (flash attention), in tokens/s; the CPU's (all its threads, one run) beside them.
template <class Row>
void bench_forward_gpu(const GpuBenchArgs& a, Row&& row) {
  ModelConfig c;
  c.layers = a.layers, c.dim = a.dim, c.heads = a.heads, c.kv_heads = a.heads, c.hidden = 4 * a.dim, c.ctx = a.ctx;
  const Model m = init_model(c, 1);
  std::vector<int32_t> tokens(size_t(c.ctx));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(random_word(3, 0, i) % uint32_t(c.vocab));
  Policy strict = lamp_policy(4), relaxed = lamp_policy(4);
  strict.lamp = LampSpec{};  // strict, τ = 1, FP32 recompute
  relaxed.lamp = LampSpec{.rule = LampRule::relaxed, .tau = 0.05};
  const gpu::DeviceModel dm(m);
  const double T = double(c.ctx);
  struct Arm {
    const char* name;
    const Policy* policy;
    AttentionKernel kernel;
  };
  const Policy fp32{};
  for (const Arm& arm : {Arm{"fp32", &fp32, AttentionKernel::materialised},
                         Arm{"lamp_strict_tau1", &strict, AttentionKernel::materialised},
                         Arm{"lamp_relaxed_tau0.05_flash", &relaxed, AttentionKernel::flash}}) {
    const PolicyPlan plan(*arm.policy, c);
    ForwardStats st;
    std::vector<double> t;
    gpu::forward(dm, tokens, plan, &st, arm.kernel);  // warm-up
    for (int r = 0; r < a.forward_reps; ++r) {
      const Stopwatch w;
      gpu::forward(dm, tokens, plan, &st, arm.kernel);
      t.push_back(w.seconds());
    }
    const double g = median(t);
    uint64_t sel = 0, all = 0;
    for (size_t l = 0; l < st.lamp_selected.size(); ++l) sel += st.lamp_selected[l], all += st.lamp_entries[l];
    ojson r{{"benchmark", "forward"}, {"arm", arm.name}, {"layers", c.layers}, {"dim", c.dim}, {"ctx", c.ctx},
            {"gpu_seconds", g}, {"gpu_tokens_per_s", T / g},
            {"recompute_rate", all ? ojson(double(sel) / double(all)) : ojson(nullptr)}};
    std::string line = fmt::format("forward L={} C={} T={} {:<27} GPU {:10.1f} tok/s", c.layers, c.dim, c.ctx, arm.name,
                                   T / g);
    if (a.cpu && arm.kernel == AttentionKernel::materialised) {  // the CPU has no flash variant
      ForwardStats cst;  // the same counts as the GPU's (LAMP's, the site health)
      const Stopwatch w;
      forward<float>(m, tokens, plan, &cst);
      const double cs = w.seconds();
      r["cpu_seconds"] = cs, r["cpu_tokens_per_s"] = T / cs, r["gpu_over_cpu"] = cs / g;
      line += fmt::format("   CPU ({} threads) {:8.1f} tok/s   GPU/CPU {:6.1f}×", num_threads(), T / cs, cs / g);
    }
    row(std::move(r), line);
  }
}

int run_gpu_bench(const GpuBenchArgs& a) {
  if (MANTIS_CUDA_EMU)
    throw InputError("bench-gpu measures a GPU's speed: this build runs the kernels on cuda-emu, which has none to "
                     "measure (mantis bench measures the CPU)");
  require_device();
  const std::string device = cuda_device_name();
  const gpu::Stream s = gpu::Stream::create();
  ojson results = ojson::array();
  auto row = [&](ojson r, const std::string& line) {
    results.push_back(std::move(r));
    if (!a.json) std::printf("%s\n", line.c_str()), std::fflush(stdout);
  };
  if (!a.json) std::printf("bench-gpu on %s, median of %d after a warm-up\n", device.c_str(), a.reps);
  // Rounding in place (reads and writes n values) against a device copy of the same bytes.
  {
    std::vector<float> host(a.n);
    fill_random(host.data(), a.n, Distribution::normal, 12345, 0);
    gpu::Array<float> x(host), y(a.n);
    const double bytes = 2.0 * double(a.n) * sizeof(float);
    const double t_copy = median_seconds(a.reps, s, [&] { gpu::copy_device(y.get(), x.get(), a.n * sizeof(float), s); });
    row(ojson{{"benchmark", "memcpy"}, {"n", a.n}, {"seconds", t_copy}, {"GB_per_s", bytes / t_copy * 1e-9}},
        fmt::format("device memcpy        n={:<11} {:8.3f} ms {:8.1f} GB/s", a.n, t_copy * 1e3, bytes / t_copy * 1e-9));
    for (const char* fn : {"bf16", "ps4"})
      for (Rounding m : {Rounding::rne, Rounding::sr}) {
        const RoundPlan p = plan_round(format_lookup(fn), m, 32, 1);
        const double t = median_seconds(a.reps, s, [&] { gpu::round(x.get(), a.n, p, 0, 0, s); });
        row(ojson{{"benchmark", "round"}, {"format", fn}, {"mode", to_string(m)}, {"n", a.n}, {"seconds", t},
                  {"GB_per_s", bytes / t * 1e-9}, {"vs_memcpy", t_copy / t}},
            fmt::format("round {:<5} {:<4}       n={:<11} {:8.3f} ms {:8.1f} GB/s  {:5.1f} % of memcpy", fn, to_string(m),
                        a.n, t * 1e3, bytes / t * 1e-9, 100 * t_copy / t));
      }
  }
  // Strict ps4 (rne, sr) beside cuBLAS SGEMM of the same shape.
  for (int n : a.sizes) {
    const size_t N = size_t(n);
    std::vector<float> hA(N * N), hB(N * N);
    fill_random(hA.data(), hA.size(), Distribution::normal, 777, 0);
    fill_random(hB.data(), hB.size(), Distribution::normal, 777, 1);
    gpu::Array<float> A(hA), B(hB), Cf(N * N);
    gpu::Array<double> C(N * N);
    const double flops = 2.0 * double(N) * double(N) * double(N);
    const double t_blas = median_seconds(a.reps, s, [&] { gpu::sgemm(A.get(), B.get(), Cf.get(), N, N, N, s); });
    row(ojson{{"benchmark", "gemm"}, {"kernel", "cublas_sgemm"}, {"shape", {N, N, N}}, {"seconds", t_blas},
              {"GFLOP_per_s", flops / t_blas * 1e-9}},
        fmt::format("gemm {:>5}³ cuBLAS SGEMM       {:10.3f} ms {:10.1f} GFLOP/s", N, t_blas * 1e3, flops / t_blas * 1e-9));
    for (Rounding m : {Rounding::rne, Rounding::sr}) {
      const GemmPlan p = plan_gemm(GemmSpec{.acc = format_lookup("ps4"), .acc_mode = m, .seed = 1});
      const double t = median_seconds(a.reps, s, [&] { gpu::gemm(p, A.get(), B.get(), C.get(), N, N, N, 0, s); });
      row(ojson{{"benchmark", "gemm"}, {"kernel", fmt::format("strict_ps4_{}", to_string(m))}, {"shape", {N, N, N}},
                {"seconds", t}, {"GFLOP_per_s", flops / t * 1e-9}, {"vs_cublas", t_blas / t}},
          fmt::format("gemm {:>5}³ strict ps4 {:<4}     {:10.3f} ms {:10.1f} GFLOP/s  1/{:.1f} of cuBLAS", N, to_string(m),
                      t * 1e3, flops / t * 1e-9, t / t_blas));
    }
  }
  if (a.forward_reps > 0) bench_forward_gpu(a, row);
  ojson man = manifest_header("mantis bench-gpu");
  man["settings"] = {{"reps", a.reps}, {"n", a.n}, {"sizes", a.sizes}, {"device", device},
                     {"forward", {{"layers", a.layers}, {"dim", a.dim}, {"heads", a.heads}, {"ctx", a.ctx},
                                  {"reps", a.forward_reps}, {"cpu", a.cpu}, {"cpu_threads", num_threads()}}}};
  man["seeds"] = {{"data", ojson::array({12345, 777})}, {"rounding", 1}};
  if (a.json) std::printf("%s\n", ojson{{"results", results}, {"manifest", man}}.dump().c_str());
  if (!a.out.empty()) write_result_set(a.out, {{"results.json", ojson{{"results", results}}.dump(1) + "\n"}}, man);
  return 0;
}
int run_probe(const ProbeArgs& a) {
  // validated before the device is touched
  const std::vector<ProbeGroup> groups = probe_groups(read_measured_sets(a.data));
  if (groups.empty()) throw InputError(fmt::format("{}: no measured sets (*.txt) to probe with", a.data));
  require_device();
  const std::string device = cuda_device_name();
  ojson results = ojson::array();
  if (!a.json) std::printf("tensor-core probe on %s: measured test vectors through this GPU, against every preset\n"
                           "%-6s %-6s %3s %6s  %-12s %s\n", device.c_str(), "input", "output", "K", "tests", "preset",
                           "reproduced");
  for (const ProbeGroup& g : groups) {
    const std::vector<float> d = cuda_tensor_core_probe(g.input, g.output, g.a, g.b, g.c, g.K);
    if (d.empty()) {
      results.push_back(ojson{{"input", g.input}, {"output", g.output}, {"K", g.K}, {"tests", g.c.size()},
                              {"available", false}});
      if (!a.json) std::printf("%-6s %-6s %3d %6zu  (no such instruction on this GPU)\n", g.input.c_str(),
                               g.output.c_str(), g.K, g.c.size());
      continue;
    }
    for (const MatrixUnitPreset& p : matrix_unit_presets()) {
      if (p.input != g.input || p.output != g.output) continue;
      const size_t ok = probe_matches(p, g, d);
      const std::string name = p.gpu + ":" + p.path;
      results.push_back(ojson{{"input", g.input}, {"output", g.output}, {"K", g.K}, {"tests", d.size()},
                              {"available", true}, {"preset", name}, {"reproduced", ok},
                              {"share", double(ok) / double(d.size())}});
      if (!a.json) std::printf("%-6s %-6s %3d %6zu  %-12s %zu (%.1f %%)\n", g.input.c_str(), g.output.c_str(), g.K,
                               d.size(), name.c_str(), ok, 100.0 * double(ok) / double(d.size()));
    }
  }
  if (a.json) std::printf("%s\n", ojson{{"device", device}, {"results", results}}.dump().c_str());
  return 0;
}

#else
[[noreturn]] void no_cuda() {
  throw InputError("this mantis was built without CUDA (meson found no nvcc): put nvcc on PATH and reconfigure");
}
int run_validate(const ValidateArgs&) { no_cuda(); }
int run_probe(const ProbeArgs&) { no_cuda(); }
int run_gpu_bench(const GpuBenchArgs&) { no_cuda(); }
#endif

}  // namespace

void add_device(CLI::App& sub, DeviceArgs& d) {
  sub.add_option("--device", d.device,
                 "where the forward passes run: cpu, or cuda (the GPU backend: emulated sites bit-identical to the "
                 "CPU, native sites through cuBLAS), or cuda-emu (the same kernels on the CPU emulation of CUDA, in a "
                 "build without nvcc; results labelled so)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emu"}));
  sub.add_option("--attention", d.attention,
                 "cuda: the attention kernel, materialised (the CPU's bits) or flash (single pass, relaxed LAMP rule "
                 "only; within a tolerance)")
      ->capture_default_str()
      ->check(CLI::IsMember({"materialised", "flash"}));
}

ForwardFn device_forward(const DeviceArgs& d) {
  if (d.device == "cpu") {
    if (d.attention != "materialised") throw InputError("--attention flash needs --device cuda");
    return {};
  }
  require_backend(d.device);
#if MANTIS_HAVE_CUDA
  // The device is needed at the first forward pass, not before (a --merge of cells computed on a
  // GPU runs anywhere: the device only names the cells' keys).
  ForwardFn f = gpu::forward_fn(d.attention == "flash" ? AttentionKernel::flash : AttentionKernel::materialised);
  return [f](const Model& m, std::span<const int32_t> t, const PolicyPlan& p, ForwardStats* st) {
    require_device();
    return f(m, t, p, st);
  };
#else
  // As above, the missing CUDA is an error at the first forward pass (a --merge needs none).
  return [](const Model&, std::span<const int32_t>, const PolicyPlan&, ForwardStats*) -> Matrix<float> { no_cuda(); };
#endif
}

Runner setup_validate_gpu(CLI::App& sub) {
  auto a = std::make_shared<ValidateArgs>();
  sub.description(
      "Runs the GPU contracts: every operation of the CUDA backend on the same inputs as the CPU reference "
      "(operation × shapes × formats × modes × seeds), each bit-exact or within a stated tolerance. Prints per "
      "contract the cases run, values compared, mismatches, worst relative difference and seconds; exit 1 on any "
      "failure, 2 without a CUDA build or device.");
  sub.add_option("--device", a->device,
                 "cuda (a GPU: a build with nvcc) or cuda-emu (the same kernels on the CPU emulation of CUDA: a build "
                 "without nvcc); the build's own by default")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cuda-emu"}));
  sub.add_option("--only", a->only, "contracts whose names start with these (comma-separated)")->delimiter(',');
  sub.add_option("--scale", a->scale, "sample sizes × this (0 < s ≤ 1)")->capture_default_str()->check(CLI::Range(1e-6, 1.0));
  sub.add_flag("--list", a->list, "print the table (name, agreement, cases) without running it");
  add_out(sub, a->out, "also write DIR/results.json and DIR/manifest.json (one result set)");
  return [a] { return run_validate(*a); };
}

Runner setup_probe_tensor_cores(CLI::App& sub) {
  auto a = std::make_shared<ProbeArgs>();
  sub.description(
      "The measured tensor-core test vectors (tests/data/tensor_core: A, B, C of 48 sets from eight GPUs) through "
      "this GPU's own tensor cores, as the measurements were taken (wmma for fp16 / bf16 / tf32, mma.sync m16n8k32 "
      "for e4m3 / e5m2), and the share of them that each matrix-unit preset (core/matrix_unit.h) reproduces bit for "
      "bit: the presets checked on real silicon, and the data to fit a new GPU's parameters. Exit 2 without a CUDA "
      "build or device.");
  sub.add_option("--data", a->data, "the directory of measured sets (tests/data/tensor_core)")->required()->check(kPath);
  add_json(sub, a->json, "print JSON ({\"device\": …, \"results\": […]}) instead of a table");
  return [a] { return run_probe(*a); };
}

Runner setup_bench_gpu(CLI::App& sub) {
  auto a = std::make_shared<GpuBenchArgs>();
  sub.description(
      "GPU throughput: in-place rounding (bf16, ps4; rne, sr) of --n binary32 values beside a device memcpy of the "
      "same bytes; the strict ps4 GEMM (rne, sr) beside cuBLAS SGEMM of the same square shapes; the forward of a "
      "random GPT-2-XL-shaped model (48 layers, C = 1600, T = 1024) in tokens/s: FP32, LAMP strict τ = 1 "
      "(materialised attention), LAMP relaxed τ = 0.05 (flash attention), beside the CPU's (all threads, one run). "
      "Medians over --reps (--forward-reps) after one warm-up.");
  sub.add_option("--n", a->n, "rounding: elements")->capture_default_str()->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  sub.add_option("--sizes", a->sizes, "GEMM: square shapes N (N×N×N), comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  sub.add_option("--reps", a->reps, "timed repetitions (median)")->capture_default_str()->check(CLI::Range(1, 100000));
  sub.add_option("--layers", a->layers, "forward: layers")->capture_default_str()->check(CLI::Range(1, 1000));
  sub.add_option("--dim", a->dim, "forward: model width")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  sub.add_option("--heads", a->heads, "forward: attention heads")->capture_default_str()->check(CLI::Range(1, 1 << 12));
  sub.add_option("--ctx", a->ctx, "forward: tokens")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  sub.add_option("--forward-reps", a->forward_reps, "forward: timed repetitions on the GPU (0: skip the forward)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  sub.add_flag("!--no-cpu", a->cpu, "forward: do not run the CPU beside the GPU");
  add_json(sub, a->json, "print JSON ({\"results\": […], \"manifest\": {…}}) instead of a table");
  add_out(sub, a->out, "also write DIR/results.json and DIR/manifest.json (one result set)");
  add_threads(sub);
  return [a] { return run_gpu_bench(*a); };
}

}  // namespace mantis::cli
