#include "exp/mu_sweep.h"

#include <fmt/format.h>
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/file.h"
#include "core/gemm.h"
#include "core/oracle.h"
#include "core/threads.h"
#include "core/toml.h"
#include "exp/manifest.h"
#include "exp/study.h"
#include "mantis_config.h"

#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif

namespace mantis {

namespace {

// Bumped whenever a change of mantis alters what a cell computes from the same key.
constexpr int kMuSweepSemantics = 1;

// The Philox stream of one random vector / matrix: a hash of (kind, size, trial, which) only.
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t data_stream(int kind, uint64_t size, int trial, int which) {
  return mix(mix(mix(mix(uint64_t(kind)) ^ size) ^ uint64_t(trial)) ^ uint64_t(which));
}

struct DD {
  double hi, lo;
};

// Exact Σ x_k·y_k (binary32 products are exact in binary64; the MPFR sum is exact at this precision).
DD exact_dot(const float* x, const float* y, size_t n) {
  mpfr_t acc;
  mpfr_init2(acc, 1400);
  mpfr_set_zero(acc, 1);
  for (size_t k = 0; k < n; ++k) mpfr_add_d(acc, acc, double(x[k]) * double(y[k]), MPFR_RNDN);
  DD r;
  r.hi = mpfr_get_d(acc, MPFR_RNDN);
  mpfr_sub_d(acc, acc, r.hi, MPFR_RNDN);
  r.lo = mpfr_get_d(acc, MPFR_RNDN);
  mpfr_clear(acc);
  return r;
}

double rel_err(double v, const DD& e) {
  const double diff = (v - e.hi) - e.lo;
  if (e.hi == 0) return diff == 0 ? 0.0 : INFINITY;
  return std::fabs(diff) / std::fabs(e.hi);
}

std::string label(const MuSweepRow& r) {
  return r.gemm ? fmt::format("{}x{}x{}", r.shape[0], r.shape[1], r.shape[2]) : fmt::format("n={}", r.shape[2]);
}

const char* dist_name(Distribution d) { return d == Distribution::uniform01 ? "uniform01" : "normal"; }

// The settings every μ shares (in the results' config and in every cell's key).
ojson shared_settings(const MuSweepConfig& c) {
  return {{"lengths", c.lengths},    {"gemm_shapes", c.shapes},          {"trials", c.trials},
          {"gemm_trials", c.gemm_trials}, {"seed", c.seed},               {"rounding", to_string(c.rounding)},
          {"distribution", dist_name(c.dist)}};
}

GemmSpec spec_for(const MuSweepConfig& c, int mu) {
  GemmSpec s;
  s.acc = format_lookup(fmt::format("ps{}", mu));
  s.acc_mode = c.rounding;
  s.accumulation = Accumulation::strict;
  s.sr_bits = c.sr_bits ? *c.sr_bits : std::min(32, 51 - mu);
  s.seed = c.seed;
  try {
    validate(s);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", c.sr_where, e.what()));
  }
  return s;
}

// body(i) for i in [0, n) on nt OpenMP threads; the first exception is rethrown afterwards.
template <class F>
void parallel_for(long long n, int nt, bool parallel, F&& body) {
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (parallel)
  for (long long i = 0; i < n; ++i) errors.run([&] { body(i); });
  errors.rethrow();
}

int threads_now() {
  int nt = num_threads();
#if MANTIS_HAVE_OPENMP
  if (nt <= 0) nt = omp_get_max_threads();
#endif
  return std::max(nt, 1);
}

ojson row_json(const MuSweepRow& r) {
  return {{"mu", r.mu},
          {"kind", r.gemm ? "gemm" : "dot"},
          {"shape", {r.shape[0], r.shape[1], r.shape[2]}},
          {"trials", r.trials},
          {"median_rel_err", json_number(r.med)},
          {"min_rel_err", json_number(r.min)},
          {"max_rel_err", json_number(r.max)},
          {"gamma", json_number(r.gamma)}};
}
// .at() throughout: a cell's hash only says its bytes are the ones written, and operator[] on a
// const value is unchecked (a two-element shape or a missing key was undefined behaviour: fuzz_cell)
MuSweepRow row_of(const ojson& j) {
  const ojson& s = j.at("shape");
  if (!s.is_array() || s.size() != 3) throw InputError("a row's shape is not [M, N, K]");
  return {j.at("mu").get<int>(), j.at("kind") == "gemm", {s[0].get<uint64_t>(), s[1].get<uint64_t>(), s[2].get<uint64_t>()},
          j.at("trials").get<int>(), json_to_double(j.at("median_rel_err"), "median_rel_err"),
          json_to_double(j.at("min_rel_err"), "min_rel_err"), json_to_double(j.at("max_rel_err"), "max_rel_err"),
          json_to_double(j.at("gamma"), "gamma")};
}

MuSweepRow summarise(int mu, bool gemm, std::array<uint64_t, 3> shape, int trials, const std::vector<double>& v,
                     uint64_t n) {
  return {mu, gemm, shape, trials, median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
          std::ldexp(double(n), -(mu + 1))};
}

}  // namespace

MuSweepConfig read_mu_sweep(const std::string& path) {
  const std::string text = read_text_file(path, "sweep configuration");
  const toml::table t = parse_toml(text, path);
  auto where = [&](const toml::node& n) { return toml_where(path, n); };
  check_known_keys(t, path, {"mu", "lengths", "gemm_shapes", "trials", "gemm_trials", "seed", "rounding",
                             "distribution", "sr_bits"});
  auto integer = [&](const toml::node& n, const std::string& what, int64_t lo, int64_t hi) -> int64_t {
    if (!n.is_integer()) throw InputError(fmt::format("{}: {} must be an integer", where(n), what));
    const int64_t v = n.as_integer()->get();
    if (v < lo || v > hi) throw InputError(fmt::format("{}: {} = {} out of range {}..{}", where(n), what, v, lo, hi));
    return v;
  };
  auto array = [&](const char* key) -> const toml::array* {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    if (!n->is_array()) throw InputError(fmt::format("{}: '{}' must be an array", where(*n), key));
    return n->as_array();
  };
  auto string = [&](const char* key) -> std::optional<std::pair<std::string, const toml::node*>> {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_string()) throw InputError(fmt::format("{}: '{}' must be a string", where(*n), key));
    return std::pair{n->as_string()->get(), n};
  };

  MuSweepConfig c;
  c.path = c.sr_where = path;
  const toml::array* mu = array("mu");
  if (!mu) throw InputError(fmt::format("{}: missing 'mu' (the list of stored fraction widths, 1..23)", path));
  // each axis value once (a repeated μ would be two cells of one key; a repeated length or shape, two rows)
  auto once = [&](const char* key, const std::vector<std::string>& v) { refuse_repeats(where(*t.get(key)), key, "", v, v); };
  std::vector<std::string> listed;
  for (const auto& e : *mu) {
    c.mu.push_back(int(integer(e, "mu", 1, 23)));
    listed.push_back(std::to_string(c.mu.back()));
  }
  if (c.mu.empty()) throw InputError(fmt::format("{}: 'mu' is empty", where(*t.get("mu"))));
  once("mu", listed);
  if (const toml::array* a = array("lengths")) {
    listed.clear();
    for (const auto& e : *a) {
      c.lengths.push_back(uint64_t(integer(e, "length", 1, int64_t(1) << 26)));
      listed.push_back(std::to_string(c.lengths.back()));
    }
    once("lengths", listed);
  }
  if (const toml::array* a = array("gemm_shapes")) {
    listed.clear();
    for (const auto& e : *a) {
      if (!e.is_array() || e.as_array()->size() != 3)
        throw InputError(fmt::format("{}: each gemm shape must be an array [M, N, K]", where(e)));
      std::array<uint64_t, 3> s{};
      for (int i = 0; i < 3; ++i) s[i] = uint64_t(integer(*e.as_array()->get(size_t(i)), "gemm dimension", 1, 65536));
      if (s[0] * s[1] * s[2] > (uint64_t(1) << 32))
        throw InputError(fmt::format("{}: gemm shape {}x{}x{} too large (M·N·K ≤ 2^32)", where(e), s[0], s[1], s[2]));
      c.shapes.push_back(s);
      listed.push_back(fmt::format("[{}, {}, {}]", s[0], s[1], s[2]));
    }
    once("gemm_shapes", listed);
  }
  if (c.lengths.empty() && c.shapes.empty())
    throw InputError(fmt::format("{}: nothing to do: give 'lengths' and/or 'gemm_shapes'", path));
  if (const toml::node* n = t.get("trials")) c.trials = int(integer(*n, "trials", 1, 100000));
  c.gemm_trials = c.trials;
  if (const toml::node* n = t.get("gemm_trials")) c.gemm_trials = int(integer(*n, "gemm_trials", 1, 100000));
  if (const toml::node* n = t.get("seed")) c.seed = uint64_t(integer(*n, "seed", 0, INT64_MAX));
  if (const toml::node* n = t.get("sr_bits")) {
    c.sr_bits = int(integer(*n, "sr_bits", kSrBitsMin, kSrBitsMax));
    c.sr_where = where(*n);
  }
  if (auto s = string("rounding")) {
    try {
      c.rounding = rounding_from_string(s->first);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", where(*s->second), e.what()));
    }
  }
  if (auto s = string("distribution")) {
    if (s->first == "uniform01") c.dist = Distribution::uniform01;
    else if (s->first == "normal") c.dist = Distribution::normal;
    else
      throw InputError(fmt::format("{}: unknown distribution '{}' (known: uniform01, normal)", where(*s->second),
                                   s->first));
  }
  return c;
}

std::vector<std::string> mu_sweep_cells(const MuSweepConfig& c) {
  std::vector<std::string> names;
  for (int mu : c.mu) names.push_back(fmt::format("ps{}", mu));
  return names;
}

namespace {
// Everything a run checks before its first cell, loaded; nothing written.
struct Prepared {
  MuSweepConfig c;
  StudyOptions so;
  std::vector<GemmSpec> specs;  // per μ
};
Prepared prepare(const MuSweepOptions& o) {
  Prepared p;
  p.c = read_mu_sweep(o.config);
  if (o.out.empty() && !o.merges())
    throw InputError(fmt::format("{}: --cell, --shard and --merge need --out DIR (where the cells are kept)", o.config));
  p.so = study_options(o, p.c.mu.size(), o.out, o.progress, nullptr);
  p.so.persistent = !o.out.empty();
  for (int mu : p.c.mu) p.specs.push_back(spec_for(p.c, mu));
  return p;
}
}  // namespace

void validate_mu_sweep(const MuSweepOptions& o) { (void)prepare(o); }

MuSweepResult run_mu_sweep(const MuSweepOptions& o) {
  const Prepared prepared = prepare(o);
  const MuSweepConfig& c = prepared.c;
  const StudyOptions& so = prepared.so;
  const std::vector<GemmSpec>& specs = prepared.specs;
  namespace fs = std::filesystem;
  if (!o.out.empty()) {
    std::error_code ec;
    fs::create_directories(o.out, ec);
    if (ec || !fs::is_directory(o.out))
      throw InputError(fmt::format("cannot create output directory '{}': {}", o.out,
                                   ec ? ec.message() : "not a directory"));
  }
  Stopwatch clock;
  const int nt = threads_now();

  // The dot products' inputs and exact values, shared by every μ (made once, when a cell first needs them).
  const size_t L = c.lengths.size(), T = size_t(c.trials);
  std::vector<std::vector<float>> xs(L * T), ys(L * T);
  std::vector<DD> exact(L * T);
  bool have_data = false;
  auto make_data = [&] {
    // exact_dot only uses its own MPFR variables; MPFR's flags are global unless it is thread-safe.
    parallel_for((long long)(L * T), nt, oracle_thread_safe(), [&](long long idx) {
      const size_t li = size_t(idx) / T;
      const int t = int(size_t(idx) % T);
      const size_t n = c.lengths[li];
      xs[idx].resize(n);
      ys[idx].resize(n);
      fill_random(xs[idx].data(), n, c.dist, c.seed, data_stream(0, n, t, 0));
      fill_random(ys[idx].data(), n, c.dist, c.seed, data_stream(0, n, t, 1));
      exact[idx] = exact_dot(xs[idx].data(), ys[idx].data(), n);
    });
    have_data = true;
  };

  StudyPlan plan;
  plan.label = "sweep";
  plan.cells = c.mu.size();
  plan.unit = "cells";
  plan.name = [&](size_t mi) { return fmt::format("ps{}", c.mu[mi]); };
  plan.key = [&](size_t mi) {
    ojson k{{"semantics", kMuSweepSemantics}, {"mu", c.mu[mi]}, {"sr_bits", specs[mi].sr_bits}};
    k.update(shared_settings(c));
    return k;
  };
  plan.compute = [&](size_t mi, const std::function<void()>& tick) {
    if (!have_data) make_data();
    const int mu = c.mu[mi];
    ojson rows = ojson::array();
    std::vector<double> errs(L * T);
    parallel_for((long long)errs.size(), nt, true, [&](long long r) {
      const size_t li = size_t(r) / T;
      GemmSpec s = specs[mi];
      s.stream = data_stream(0, c.lengths[li], int(size_t(r) % T), 2);
      errs[r] = rel_err(dot(xs[r].data(), ys[r].data(), c.lengths[li], s), exact[r]);
    });
    for (size_t li = 0; li < L; ++li) {
      const std::vector<double> v(errs.begin() + long(li * T), errs.begin() + long((li + 1) * T));
      rows.push_back(row_json(summarise(mu, false, {1, 1, c.lengths[li]}, c.trials, v, c.lengths[li])));
    }
    // GEMMs: the core's gemm parallelises over outputs; the inputs and the binary64 reference
    // are made again per μ (the same Philox words), so that only one shape's are ever held
    for (const auto& shape : c.shapes) {
      const auto [M, N, K] = shape;
      const uint64_t key = mix(mix(mix(M) ^ N) ^ K);
      std::vector<double> ge;
      std::vector<float> A(M * K), B(K * N);
      std::vector<double> Cref(M * N), C(M * N);
      for (int t = 0; t < c.gemm_trials; ++t) {
        fill_random(A.data(), A.size(), c.dist, c.seed, data_stream(1, key, t, 0));
        fill_random(B.data(), B.size(), c.dist, c.seed, data_stream(1, key, t, 1));
        std::fill(Cref.begin(), Cref.end(), 0.0);
#pragma omp parallel for num_threads(nt)
        for (long long i = 0; i < (long long)M; ++i)
          for (size_t k = 0; k < K; ++k) {
            const double aik = A[size_t(i) * K + k];
            for (size_t j = 0; j < N; ++j) Cref[size_t(i) * N + j] += aik * double(B[k * N + j]);
          }
        double ref2 = 0;
        for (double v : Cref) ref2 += v * v;
        GemmSpec s = specs[mi];
        s.stream = data_stream(1, key, t, 2);
        gemm(A.data(), B.data(), C.data(), M, N, K, s);
        double d2 = 0;
        for (size_t i = 0; i < C.size(); ++i) d2 += (C[i] - Cref[i]) * (C[i] - Cref[i]);
        ge.push_back(ref2 == 0 ? (d2 == 0 ? 0.0 : INFINITY) : std::sqrt(d2 / ref2));
      }
      rows.push_back(row_json(summarise(mu, true, shape, c.gemm_trials, ge, K)));
    }
    tick();
    return ojson{{"rows", rows}};
  };
  const StudyRun run = run_study(plan, so);

  MuSweepResult res;
  res.threads = nt;
  res.cells = c.mu.size(), res.computed = run.computed.size(), res.missing = run.missing;
  res.seconds = clock.seconds();
  if (!run.merge) {
    res.report = fmt::format("computed {} of {} cells into {}/cells (merge with --merge)\n", run.computed.size(),
                             c.mu.size(), o.out);
    return res;
  }
  std::vector<size_t> present;  // the μ indices merged
  for (size_t mi = 0; mi < run.cells.size(); ++mi) {
    if (!run.cells[mi]) continue;
    present.push_back(mi);
    try {
      const ojson& rows = (*run.cells[mi]).at("rows");
      if (!rows.is_array() || rows.size() != L + c.shapes.size()) throw InputError("not one row per length and shape");
      for (const ojson& r : rows) res.rows.push_back(row_of(r));
    } catch (const std::exception& e) {
      throw InputError(fmt::format("{}: malformed rows ({}): use --overwrite to recompute", cell_path(o.out, mi),
                                   e.what()));
    }
  }
  const auto& ordered = res.rows;

  // ---- table
  const size_t cols = L + c.shapes.size();
  std::string& out = res.report;
  out = fmt::format(
      "mu sweep: {} ({}), rounding {}, distribution {}, {} trials per length, {} per GEMM shape, seed {}\n", o.config,
      "strict accumulation in ps<μ>", to_string(c.rounding), dist_name(c.dist), c.trials, c.gemm_trials, c.seed);
  auto header = [&] {
    std::string h = fmt::format("{:>3}", "μ");
    for (size_t j = 0; j < cols && j < ordered.size(); ++j) h += fmt::format(" {:>14}", label(ordered[j]));
    return h + "\n";
  };
  out += "\nmedian relative error (dot: |dot − exact| / |exact|; GEMM: ‖C − C64‖_F / ‖C64‖_F)\n" + header();
  for (size_t p = 0; p < present.size(); ++p) {
    out += fmt::format("{:>3}", c.mu[present[p]]);
    for (size_t j = 0; j < cols; ++j) out += fmt::format(" {:>14.3e}", ordered[p * cols + j].med);
    out += "\n";
  }
  out += "\nrne bound γ_n ≈ n·2^-(μ+1) (GEMM: n = K)\n" + header();
  for (size_t p = 0; p < present.size(); ++p) {
    out += fmt::format("{:>3}", c.mu[present[p]]);
    for (size_t j = 0; j < cols; ++j) out += fmt::format(" {:>14.3e}", ordered[p * cols + j].gamma);
    out += "\n";
  }
  out += fmt::format("\nelapsed {:.2f} s on {} thread{}\n", res.seconds, nt, nt == 1 ? "" : "s");

  // ---- files
  if (!o.out.empty()) {
    std::string csv = "mu,kind,M,N,K,trials,median_rel_err,min_rel_err,max_rel_err,gamma\n";
    ojson rows = ojson::array();
    for (const MuSweepRow& r : ordered) {
      csv += fmt::format("{},{},{},{},{},{},{},{},{},{}\n", r.mu, r.gemm ? "gemm" : "dot", r.shape[0], r.shape[1],
                         r.shape[2], r.trials, r.med, r.min, r.max, r.gamma);
      rows.push_back(row_json(r));
    }
    ojson cfg{{"file", o.config}, {"mu", c.mu}};
    cfg.update(shared_settings(c));
    if (c.sr_bits) cfg["sr_bits"] = *c.sr_bits;
    ojson doc{{"mantis_version", MANTIS_VERSION}, {"config", cfg}, {"elapsed_s", res.seconds}, {"results", rows}};
    ojson man = manifest_header("mantis sweep");
    man["config_file"] = o.config;
    man["config_sha256"] = sha256_file(o.config);
    man["seeds"] = {{"data", c.seed}};
    man["semantics"] = kMuSweepSemantics;
    man["cells"] = c.mu.size();
    man["partial"] = !run.missing.empty();
    man["cells_missing"] = run.missing;
    man["timings_s"] = {{"total", res.seconds}};
    write_result_set(o.out, {{"results.csv", csv}, {"results.json", doc.dump(2) + "\n"}}, man);
    out += fmt::format("wrote {0}/results.csv, {0}/results.json and {0}/manifest.json{1}\n", o.out,
                       run.missing.empty() ? ""
                                           : fmt::format(" (PARTIAL: {} of {} cells missing, marked in the manifest)",
                                                         run.missing.size(), c.mu.size()));
    res.merged = true;
  }
  return res;
}

}  // namespace mantis
