// mantis verify --exhaustive — fast path vs MPFR oracle on every binary32 bit pattern: the
// rounding of a format (--format), or crmath's correctly rounded exp / erf / tanh (--function).
//
// Input number j (j = 0, 1, …) is the pattern j·k (k = 1, or an odd stride with --limit) and uses
// the random word (seed, stream, j): round_array is called on chunks with index0 = chunk start.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "core/crmath.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "core/round.h"
#include "core/round_array.h"
#include "core/cpu.h"

namespace mantis::cli {

namespace {

struct VerifyArgs : RoundingArgs {
  bool exhaustive = false;
  std::string function;  // exp | erf: crmath instead of a format's rounding
  bool exceptions = false;
  std::string container = "float";
  uint64_t limit = 0;
  int show = 10;
};

struct Mismatch {
  uint64_t index;
  uint32_t input;
  double fast, oracle;
};

bool same(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return to_bits(a) == to_bits(b);
}

// The patterns to check: all 2^32, or every k-th (k = 2^32/limit made odd).
uint64_t pattern_stride(uint64_t limit) {
  constexpr uint64_t kAll = uint64_t(1) << 32;
  uint64_t stride = 1;
  if (limit > 0 && limit < kAll) {
    stride = kAll / limit;
    if (stride > 1) stride |= 1;  // odd: the low (rounding) bits of the patterns vary
  }
  return stride;
}

int verify_threads() {
  int threads = shared().threads > 0 ? shared().threads : int(std::max(1u, std::thread::hardware_concurrency()));
  if (!oracle_thread_safe() && threads > 1) {
    if (shared().threads > 1) std::fprintf(stderr, "mantis: note: MPFR is not thread-safe; verifying on 1 thread\n");
    threads = 1;
  }
  return threads;
}

// --function: cr_expf / cr_erff on every pattern, through the array kernel the CPU runs and the
// scalar definition, both against MPFR (oracle_expf / oracle_erff). --exceptions prints the
// exception table (crmath_exceptions.h) that makes the binary64 value's mismatches right.
int run_verify_function(const VerifyArgs& a) {
  const bool is_exp = a.function == "exp", is_erf = a.function == "erf";
  if (!is_exp && !is_erf && a.function != "tanh")
    throw InputError(fmt::format("unknown function '{}' (known: exp, erf, tanh)", a.function));
  const auto vec = is_exp ? cr_expf_array : is_erf ? cr_erff_array : cr_tanhf_array;
  const auto scalar = is_exp ? cr_expf : is_erf ? cr_erff : cr_tanhf;
  const auto oracle = is_exp ? oracle_expf : is_erf ? oracle_erff : oracle_tanhf;
  const float top = is_erf ? 4.0f : 9.5f;  // the odd functions' evaluation domain |x| < top
  const auto eval = [is_exp, is_erf, top](float x) {  // the binary64 value before the exception lookup
    if (is_exp) return crmath::exp_eval(x < -110.0f ? -110.0 : x > 90.0f ? 90.0 : double(x));
    const double ax = std::fabs(double(x));
    if (ax >= top) return 1.0;
    return is_erf ? crmath::erf_eval(ax) : crmath::tanh_eval(ax);
  };
  constexpr uint64_t kAll = uint64_t(1) << 32;
  const uint64_t stride = pattern_stride(a.limit), count = (kAll - 1) / stride + 1;
  const int threads = verify_threads();
  constexpr uint64_t chunk = 8192;
  const uint64_t nchunks = (count + chunk - 1) / chunk;
  std::printf("verify: cr_%sf (%s kernel) and its scalar definition against MPFR, %llu of %llu binary32 patterns "
              "(stride %llu), %d thread%s\n",
              a.function.c_str(), cpu_has_avx512() ? "AVX-512" : "portable", (unsigned long long)count,
              (unsigned long long)kAll, (unsigned long long)stride, threads, threads == 1 ? "" : "s");
  std::fflush(stdout);

  struct Bad {
    uint32_t input, got, scalar, want;
    bool hard;
  };
  std::atomic<uint64_t> next{0}, done{0}, nmis{0}, nhard{0};
  std::mutex mu;
  std::vector<Bad> bad;  // every mismatch (few: they become the exception table)
  auto worker = [&] {
    std::vector<float> in(chunk), out(chunk);
    for (;;) {
      const uint64_t c = next.fetch_add(1);
      if (c >= nchunks) break;
      const uint64_t j0 = c * chunk, n = std::min(chunk, count - j0);
      for (uint64_t i = 0; i < n; ++i) in[i] = float_from_bits(uint32_t((j0 + i) * stride));
      vec(in.data(), out.data(), n);
      uint64_t h = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const float x = in[i], want = oracle(x), s1 = scalar(x);
        bool hard = false;
        if (x == x && !(!is_exp && std::fabs(x) >= top)) crmath::round_checked(eval(x), hard);
        h += hard;
        if (to_bits(out[i]) != to_bits(want) || to_bits(s1) != to_bits(want)) {
          std::lock_guard<std::mutex> lk(mu);
          bad.push_back({to_bits(x), to_bits(out[i]), to_bits(s1), to_bits(want), hard});
          ++nmis;
        }
      }
      nhard += h;
      done += n;
    }
    oracle_thread_done();
  };
  Stopwatch clock;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  {
    Progress progress("verify", count, shared().progress_mode(), "patterns");
    while (done.load() < count) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      progress.update(done.load(), fmt::format("{} mismatches", nmis.load()));
    }
    for (auto& th : pool) th.join();
    progress.update(done.load(), fmt::format("{} mismatches", nmis.load()));
  }
  std::sort(bad.begin(), bad.end(), [](const Bad& x, const Bad& y) { return x.input < y.input; });
  const double elapsed = clock.seconds();
  std::printf("near a rounding boundary (looked up): %llu\nmismatches: %llu\n", (unsigned long long)nhard.load(),
              (unsigned long long)nmis.load());
  for (size_t i = 0; i < bad.size() && i < size_t(std::max(a.show, 0)); ++i) {
    const Bad& b = bad[i];
    std::printf("  input 0x%08x (%s): kernel %s, scalar %s, MPFR %s%s\n", b.input,
                hex(double(float_from_bits(b.input))).c_str(), hex(double(float_from_bits(b.got))).c_str(),
                hex(double(float_from_bits(b.scalar))).c_str(), hex(double(float_from_bits(b.want))).c_str(),
                b.hard ? "" : " (not flagged near a boundary)");
  }
  if (a.exceptions) {
    // erf's and tanh's tables are keyed by |x| (the result's sign is copied back): one line per |x|.
    std::vector<std::pair<uint32_t, uint32_t>> rows;
    for (const Bad& b : bad) {
      const uint32_t key = is_exp ? b.input : b.input & 0x7fffffffu;
      const uint32_t res = is_exp ? b.want : b.want & 0x7fffffffu;
      if (!b.hard) throw InputError(fmt::format("input 0x{:08x} is wrong but not flagged near a boundary: crmath's error "
                                                "bound (kHardWidth) does not cover it", b.input));
      if (rows.empty() || rows.back().first != key) rows.push_back({key, res});
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    std::printf("#define MANTIS_CRMATH_%s_EXCEPTIONS \\\n  { ", is_exp ? "EXP" : is_erf ? "ERF" : "TANH");
    for (const auto& [k, r] : rows) std::printf("{0x%08xu, 0x%08xu}, ", k, r);
    std::printf("{0xffffffffu, 0} }\n");
  }
  std::printf("elapsed: %.2f s (%.1f ns per input per thread)\n", elapsed, elapsed * 1e9 * threads / double(count));
  return nmis.load() ? 1 : 0;
}

int run_verify(const VerifyArgs& a) {
  if (!a.exhaustive) throw InputError("verify needs --exhaustive (the only mode so far)");
  if (!a.function.empty() && !a.format.empty()) throw InputError("verify: give --format or --function, not both");
  if (!a.function.empty()) return run_verify_function(a);
  if (a.format.empty()) throw InputError("verify: --format (a rounding) or --function (exp, erf, tanh) is required");
  const Format f = format_lookup(a.format);
  const Rounding mode = rounding_from_string(a.rounding);
  validate_sr_bits(a.sr_bits);
  validate_sr_packed(a.sr_packed, a.sr_bits, is_stochastic(mode));
  const bool use_float = a.container == "float";
  if (!use_float && a.container != "double")
    throw InputError(fmt::format("unknown container '{}' (known: float, double)", a.container));
  if (use_float && !fits_float(f))
    throw InputError(fmt::format("format {} does not fit the float container (use --container double)", f.name));

  constexpr uint64_t kAll = uint64_t(1) << 32;
  const uint64_t stride = pattern_stride(a.limit), count = (kAll - 1) / stride + 1;
  const int threads = verify_threads();
  // Chunks stay below round_array's parallel threshold: each worker thread rounds its own chunk.
  const uint64_t chunk = std::min<uint64_t>(8192, kParallelThreshold / 2);
  const uint64_t nchunks = (count + chunk - 1) / chunk;

  RoundOptions o;
  o.mode = mode;
  o.sr_bits = a.sr_bits;
  o.sr_packed = a.sr_packed;
  o.seed = a.seed;
  o.stream = a.stream;
  const int per_word = 1 << sr_pack(a.sr_bits, a.sr_packed);

  std::printf("verify: format %s, rounding %s, %s container, %llu of %llu binary32 patterns (stride %llu), %d thread%s\n",
              f.name.c_str(), to_string(mode), a.container.c_str(), (unsigned long long)count,
              (unsigned long long)kAll, (unsigned long long)stride, threads, threads == 1 ? "" : "s");
  std::fflush(stdout);

  std::atomic<uint64_t> next{0}, done{0}, nmis{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::vector<Mismatch> first;
  std::exception_ptr error;
  const size_t keep = size_t(std::max(a.show, 0));

  auto worker = [&] {
    std::vector<float> in(chunk), outf(chunk);
    std::vector<double> ind(chunk), outd(chunk);
    std::vector<Mismatch> local;
    try {
      for (;;) {
        const uint64_t c = next.fetch_add(1);
        if (c >= nchunks || failed.load()) break;
        const uint64_t j0 = c * chunk, n = std::min(chunk, count - j0);
        for (uint64_t i = 0; i < n; ++i) in[i] = float_from_bits(uint32_t((j0 + i) * stride));
        RoundOptions oc = o;
        oc.index0 = j0;
        if (use_float) {
          round_array(in.data(), outf.data(), n, f, oc);
          for (uint64_t i = 0; i < n; ++i) outd[i] = double(outf[i]);
        } else {
          for (uint64_t i = 0; i < n; ++i) ind[i] = double(in[i]);
          round_array(ind.data(), outd.data(), n, f, oc);
        }
        local.clear();
        uint64_t bad = 0;
        for (uint64_t i = 0; i < n; ++i) {
          const double ref =
              oracle_round(double(in[i]), f, mode, oracle_sr_word(o.seed, o.stream, j0 + i, per_word), o.sr_bits);
          if (!same(outd[i], ref)) {
            ++bad;
            if (local.size() < keep) local.push_back({j0 + i, to_bits(in[i]), outd[i], ref});
          }
        }
        if (bad) {
          nmis += bad;
          std::lock_guard<std::mutex> lk(mu);
          first.insert(first.end(), local.begin(), local.end());
          std::sort(first.begin(), first.end(), [](auto& x, auto& y) { return x.index < y.index; });
          if (first.size() > keep) first.resize(keep);
        }
        done += n;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
    oracle_thread_done();
  };

  Stopwatch clock;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);

  {
    Progress progress("verify", count, shared().progress_mode(), "patterns");
    while (done.load() < count && !failed.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      progress.update(done.load(), fmt::format("{} mismatches", nmis.load()));
    }
    for (auto& th : pool) th.join();
    if (error) progress.abandon();
    else progress.update(done.load(), fmt::format("{} mismatches", nmis.load()));
  }
  if (error) std::rethrow_exception(error);

  const double elapsed = clock.seconds();
  std::printf("mismatches: %llu\n", (unsigned long long)nmis.load());
  for (const auto& m : first)
    std::printf("  input 0x%08x (%s): fast %s, oracle %s\n", m.input, hex(double(float_from_bits(m.input))).c_str(),
                hex(m.fast).c_str(), hex(m.oracle).c_str());
  if (nmis.load() > first.size() && !first.empty())
    std::printf("  … and %llu more\n", (unsigned long long)(nmis.load() - first.size()));
  std::printf("elapsed: %.2f s (%.1f ns per input per thread)\n", elapsed,
              elapsed * 1e9 * threads / double(count));
  return nmis.load() ? 1 : 0;
}

}  // namespace

Runner setup_verify(CLI::App& sub) {
  auto a = std::make_shared<VerifyArgs>();
  sub.description(
      "compare a fast path with the MPFR oracle bit for bit: a format's rounding (--format), or the correctly "
      "rounded binary32 exp / erf / tanh (--function: the array kernel and the scalar definition). --exhaustive: every "
      "binary32 bit pattern (2^32 inputs, NaNs and infinities included); input number j uses the random word "
      "(seed, stream, j). Exit status 1 on any mismatch.");
  sub.add_flag("--exhaustive", a->exhaustive, "all 2^32 binary32 patterns (required: the only mode so far)");
  add_rounding(sub, *a);
  sub.get_option("--format")->required(false);
  sub.add_option("--function", a->function, "exp, erf or tanh: crmath's correctly rounded binary32 function (no --format)");
  sub.add_flag("--exceptions", a->exceptions, "--function: print the exception table for crmath_exceptions.h");
  sub.add_option("--container", a->container, "float (round binary32 arrays) or double (round (double)x)")
      ->capture_default_str();
  add_threads(sub, "threads (default: all; 1 if MPFR is not thread-safe)");
  sub.add_option("--limit", a->limit, "check only about N patterns: every k-th with k = 2^32/N made odd (for quick runs)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  sub.add_option("--show", a->show, "mismatches to print")->capture_default_str()->check(CLI::Range(0, 1000000));
  add_progress(sub, "no progress indicator");
  return [a] { return run_verify(*a); };
}

}  // namespace mantis::cli
