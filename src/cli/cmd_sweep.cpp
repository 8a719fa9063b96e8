// mantis sweep CONFIG.toml — mantissa-width sweep of strictly accumulated dot products and GEMMs.
//
// For each μ in the config and each vector length n: `trials` pairs of random binary32 vectors,
// the strictly accumulated dot product in ps<μ> (gemm.h), and its relative error against the exact
// dot product (summed exactly with MPFR, kept as a double-double). For each GEMM shape M×N×K: the
// relative Frobenius-norm error of the strict ps<μ> GEMM against a binary64 GEMM of the same data.
// The data of (n, trial) and of (shape, trial) do not depend on μ, so every μ sees the same inputs.
#include <fmt/format.h>
#include <mpfr.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <toml++/toml.h>
#include <vector>

#include "common.h"
#include "core/gemm.h"
#include "mantis_config.h"
#include "mantis_git.h"
#include "core/oracle.h"
#include "core/round_array.h"
#include "exp/study.h"

#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif

namespace mantis::cli {

namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kKnownKeys[] = {"mu",   "lengths",  "gemm_shapes",  "trials", "gemm_trials",
                                      "seed", "rounding", "distribution", "sr_bits"};

struct Config {
  std::vector<int> mu;
  std::vector<uint64_t> lengths;
  std::vector<std::array<uint64_t, 3>> shapes;
  int trials = 20;
  int gemm_trials = -1;  // default: trials
  uint64_t seed = 1;
  Rounding rounding = Rounding::rne;
  Distribution dist = Distribution::uniform01;
  std::optional<int> sr_bits;
  std::string path, sr_where;  // the config file; "file:line" of sr_bits (or the file)
};

Config parse_config(const std::string& path) {
  const std::string text = read_text_file(path, "sweep configuration");
  toml::table t;
  try {
    t = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}: malformed TOML: {}", path, e.source().begin.line, e.description()));
  }
  auto where = [&](const toml::node& n) { return fmt::format("{}:{}", path, n.source().begin.line); };
  for (auto&& [k, v] : t) {
    if (std::none_of(std::begin(kKnownKeys), std::end(kKnownKeys), [&](const char* s) { return k.str() == s; }))
      throw InputError(fmt::format("{}: unknown key '{}' (known: mu, lengths, gemm_shapes, trials, gemm_trials, "
                                   "seed, rounding, distribution, sr_bits)",
                                   where(v), k.str()));
  }
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

  Config c;
  c.path = c.sr_where = path;
  const toml::array* mu = array("mu");
  if (!mu) throw InputError(fmt::format("{}: missing 'mu' (the list of stored fraction widths, 1..23)", path));
  for (const auto& e : *mu) c.mu.push_back(int(integer(e, "mu", 1, 23)));
  if (c.mu.empty()) throw InputError(fmt::format("{}: 'mu' is empty", where(*t.get("mu"))));
  if (const toml::array* a = array("lengths"))
    for (const auto& e : *a) c.lengths.push_back(uint64_t(integer(e, "length", 1, int64_t(1) << 26)));
  if (const toml::array* a = array("gemm_shapes")) {
    for (const auto& e : *a) {
      if (!e.is_array() || e.as_array()->size() != 3)
        throw InputError(fmt::format("{}: each gemm shape must be an array [M, N, K]", where(e)));
      std::array<uint64_t, 3> s{};
      for (int i = 0; i < 3; ++i) s[i] = uint64_t(integer(*e.as_array()->get(size_t(i)), "gemm dimension", 1, 65536));
      if (s[0] * s[1] * s[2] > (uint64_t(1) << 32))
        throw InputError(fmt::format("{}: gemm shape {}x{}x{} too large (M·N·K ≤ 2^32)", where(e), s[0], s[1], s[2]));
      c.shapes.push_back(s);
    }
  }
  if (c.lengths.empty() && c.shapes.empty())
    throw InputError(fmt::format("{}: nothing to do: give 'lengths' and/or 'gemm_shapes'", path));
  if (const toml::node* n = t.get("trials")) c.trials = int(integer(*n, "trials", 1, 100000));
  c.gemm_trials = c.trials;
  if (const toml::node* n = t.get("gemm_trials")) c.gemm_trials = int(integer(*n, "gemm_trials", 1, 100000));
  if (const toml::node* n = t.get("seed")) c.seed = uint64_t(integer(*n, "seed", 0, INT64_MAX));
  if (const toml::node* n = t.get("sr_bits")) {
    c.sr_bits = int(integer(*n, "sr_bits", 1, 32));
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

struct Row {
  int mu;
  bool gemm;
  std::array<uint64_t, 3> shape;  // dot: {1, 1, n}
  int trials;
  double med, min, max, gamma;
};

std::string label(const Row& r) {
  return r.gemm ? fmt::format("{}x{}x{}", r.shape[0], r.shape[1], r.shape[2]) : fmt::format("n={}", r.shape[2]);
}

const char* dist_name(Distribution d) { return d == Distribution::uniform01 ? "uniform01" : "normal"; }

GemmSpec spec_for(const Config& c, int mu) {
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

// Runs body(i) for i in [0, n) on nt OpenMP threads; rethrows the first exception afterwards.
template <class F>
void parallel_for(long long n, int nt, bool parallel, F&& body) {
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic) num_threads(nt) if (parallel)
  for (long long i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (...) {
#pragma omp critical(mantis_sweep_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

int threads_now() {
  int nt = num_threads();
#if MANTIS_HAVE_OPENMP
  if (nt <= 0) nt = omp_get_max_threads();
#endif
  return std::max(nt, 1);
}

}  // namespace

int run_sweep(const SweepArgs& a) {
  const Config c = parse_config(a.config);
  apply_threads(a.threads);
  namespace fs = std::filesystem;
  if (!a.out.empty()) {
    std::error_code ec;
    fs::create_directories(a.out, ec);
    if (ec || !fs::is_directory(a.out))
      throw InputError(fmt::format("cannot create output directory '{}': {}", a.out,
                                   ec ? ec.message() : "not a directory"));
  }
  std::vector<GemmSpec> specs;  // validated before anything is computed
  for (int mu : c.mu) specs.push_back(spec_for(c, mu));
  Stopwatch clock;
  const int nt = threads_now();
  std::vector<Row> rows;

  // ---- dot products
  const size_t L = c.lengths.size(), T = size_t(c.trials);
  std::vector<std::vector<float>> xs(L * T), ys(L * T);
  std::vector<DD> exact(L * T);
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
  std::vector<double> errs(c.mu.size() * L * T);
  parallel_for((long long)errs.size(), nt, true, [&](long long idx) {
    const size_t mi = size_t(idx) / (L * T), r = size_t(idx) % (L * T);
    const size_t li = r / T;
    const int t = int(r % T);
    GemmSpec s = specs[mi];
    s.stream = data_stream(0, c.lengths[li], t, 2);
    errs[idx] = rel_err(dot(xs[r].data(), ys[r].data(), c.lengths[li], s), exact[r]);
  });
  for (size_t mi = 0; mi < c.mu.size(); ++mi)
    for (size_t li = 0; li < L; ++li) {
      std::vector<double> v(errs.begin() + long(mi * L * T + li * T), errs.begin() + long(mi * L * T + (li + 1) * T));
      const int mu = c.mu[mi];
      rows.push_back({mu, false, {1, 1, c.lengths[li]}, c.trials, median(v), *std::min_element(v.begin(), v.end()),
                      *std::max_element(v.begin(), v.end()), std::ldexp(double(c.lengths[li]), -(mu + 1))});
    }
  xs.clear();
  ys.clear();

  // ---- GEMMs: the core's gemm parallelises over outputs
  std::vector<std::vector<Row>> gemm_rows(c.mu.size());
  for (size_t si = 0; si < c.shapes.size(); ++si) {
    const auto [M, N, K] = c.shapes[si];
    const uint64_t key = mix(mix(mix(M) ^ N) ^ K);
    std::vector<std::vector<double>> ge(c.mu.size());
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
      for (size_t mi = 0; mi < c.mu.size(); ++mi) {
        GemmSpec s = specs[mi];
        s.stream = data_stream(1, key, t, 2);
        gemm(A.data(), B.data(), C.data(), M, N, K, s);
        double d2 = 0;
        for (size_t i = 0; i < C.size(); ++i) d2 += (C[i] - Cref[i]) * (C[i] - Cref[i]);
        ge[mi].push_back(ref2 == 0 ? (d2 == 0 ? 0.0 : INFINITY) : std::sqrt(d2 / ref2));
      }
    }
    for (size_t mi = 0; mi < c.mu.size(); ++mi) {
      const auto& v = ge[mi];
      const int mu = c.mu[mi];
      gemm_rows[mi].push_back({mu, true, c.shapes[si], c.gemm_trials, median(v), *std::min_element(v.begin(), v.end()),
                               *std::max_element(v.begin(), v.end()), std::ldexp(double(K), -(mu + 1))});
    }
  }
  // Order: per μ, the dot rows then the GEMM rows.
  std::vector<Row> ordered;
  for (size_t mi = 0; mi < c.mu.size(); ++mi) {
    for (size_t li = 0; li < L; ++li) ordered.push_back(rows[mi * L + li]);
    for (const Row& r : gemm_rows[mi]) ordered.push_back(r);
  }
  const double elapsed = clock.seconds();

  // ---- table
  const size_t cols = L + c.shapes.size();
  std::string out = fmt::format(
      "mu sweep: {} ({}), rounding {}, distribution {}, {} trials per length, {} per GEMM shape, seed {}\n", a.config,
      "strict accumulation in ps<μ>", to_string(c.rounding), dist_name(c.dist), c.trials, c.gemm_trials, c.seed);
  auto header = [&] {
    std::string h = fmt::format("{:>3}", "μ");
    for (size_t j = 0; j < cols; ++j) h += fmt::format(" {:>14}", label(ordered[j]));
    return h + "\n";
  };
  out += "\nmedian relative error (dot: |dot − exact| / |exact|; GEMM: ‖C − C64‖_F / ‖C64‖_F)\n" + header();
  for (size_t mi = 0; mi < c.mu.size(); ++mi) {
    out += fmt::format("{:>3}", c.mu[mi]);
    for (size_t j = 0; j < cols; ++j) out += fmt::format(" {:>14.3e}", ordered[mi * cols + j].med);
    out += "\n";
  }
  out += "\nrne bound γ_n ≈ n·2^-(μ+1) (GEMM: n = K)\n" + header();
  for (size_t mi = 0; mi < c.mu.size(); ++mi) {
    out += fmt::format("{:>3}", c.mu[mi]);
    for (size_t j = 0; j < cols; ++j) out += fmt::format(" {:>14.3e}", ordered[mi * cols + j].gamma);
    out += "\n";
  }
  out += fmt::format("\nelapsed {:.2f} s on {} thread{}\n", elapsed, nt, nt == 1 ? "" : "s");

  // ---- files
  if (!a.out.empty()) {
    std::string csv = "mu,kind,M,N,K,trials,median_rel_err,min_rel_err,max_rel_err,gamma\n";
    ojson res = ojson::array();
    for (const Row& r : ordered) {
      csv += fmt::format("{},{},{},{},{},{},{},{},{},{}\n", r.mu, r.gemm ? "gemm" : "dot", r.shape[0], r.shape[1],
                         r.shape[2], r.trials, r.med, r.min, r.max, r.gamma);
      res.push_back(ojson{{"mu", r.mu},
                          {"kind", r.gemm ? "gemm" : "dot"},
                          {"shape", {r.shape[0], r.shape[1], r.shape[2]}},
                          {"trials", r.trials},
                          {"median_rel_err", r.med},
                          {"min_rel_err", r.min},
                          {"max_rel_err", r.max},
                          {"gamma", r.gamma}});
    }
    ojson cfg{{"file", a.config},
              {"mu", c.mu},
              {"lengths", c.lengths},
              {"gemm_shapes", c.shapes},
              {"trials", c.trials},
              {"gemm_trials", c.gemm_trials},
              {"seed", c.seed},
              {"rounding", to_string(c.rounding)},
              {"distribution", dist_name(c.dist)}};
    if (c.sr_bits) cfg["sr_bits"] = *c.sr_bits;
    ojson doc{{"mantis_version", MANTIS_VERSION}, {"config", cfg}, {"elapsed_s", elapsed}, {"results", res}};
    const std::string dir = a.out;
    ojson man{{"generator", "mantis sweep"},
              {"mantis_version", MANTIS_VERSION},
              {"git_commit", MANTIS_GIT_COMMIT},
              {"config_file", a.config},
              {"config_sha256", sha256_file(a.config)}};
    write_result_set(dir, {{"results.csv", csv}, {"results.json", doc.dump(2) + "\n"}}, man);
    out += fmt::format("wrote {0}/results.csv, {0}/results.json and {0}/manifest.json\n", dir);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace mantis::cli
