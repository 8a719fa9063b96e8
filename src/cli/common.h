// cli/common — helpers shared by the `mantis` subcommands: input parsing, output formatting,
// random test data, timing, atomic file output. Every user-facing problem is an InputError
// (format.h): main() prints it on one line and exits with status 2.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/format.h"
#include "core/file.h"
#include "mantis_config.h"

namespace mantis::cli {

// ---------------------------------------------------------------- the subcommands
struct RoundArgs {
  std::string format, rounding = "rne";
  uint64_t seed = 0, stream = 0;
  int sr_bits = 32;
  bool reference = false;
  int threads = 0;  // 0: OpenMP's default
};
struct DotArgs {
  std::string format, rounding = "rne", accumulation = "strict";
  int block = 32;
  uint64_t seed = 0, stream = 0;
  int sr_bits = 32;
  bool reference = false;
};
struct BenchArgs {
  std::string what;  // round | gemm
  bool json = false;
  int reps = 7;
  std::vector<int> threads{1, 2};
  uint64_t n = 10'000'000;          // round: elements per array
  std::vector<int> sizes{256, 512};  // gemm: square shapes
  int layers = 12, dim = 768, heads = 12, ctx = 1024;  // forward: the model (GPT-2 small)
  std::string config = std::string(MANTIS_SOURCE_DIR) + "/experiments/train-gpt2-bytes.toml";  // train
  std::string model;  // forward: a checkpoint instead of the random GPT-2-shaped model
};
struct VerifyArgs {
  bool exhaustive = false;
  std::string format, rounding = "rne", container = "float";
  int threads = 0;  // 0: all hardware threads
  uint64_t limit = 0;
  uint64_t seed = 0, stream = 0;
  int sr_bits = 32;
  int show = 10;
  bool progress = false, quiet = false;
};
struct SweepArgs {
  std::string config, out;
  int threads = 0;
};
struct FormatsArgs {
  std::vector<std::string> names;
};
struct TrainArgs {
  std::string config, resume, out;
  int threads = 0;
  bool progress = false, quiet = false;
};
struct LampArgs {
  std::string action, config, out;
  int cell = -1;
  bool list = false, merge = false, quiet = false, overwrite = false, allow_partial = false;
  int threads = 0;
};
struct TokenizeArgs {
  std::string tokenizer = "gpt2";
};
struct ShardsArgs {
  std::string tokenizer = "gpt2", data_dir, out;
  bool quiet = false;
};
struct LogitsArgs {
  std::string model, policy = "native", tokens, tokens_file, out;
  int threads = 0;
};
struct EvalArgs {
  std::string model, policy = "native", data = "validation", out, tokenizer;
  int seqs = 16, ctx = 0;  // ctx 0: the model's context
  int threads = 0;
  bool quiet = false;
  std::string command;  // the command line, for the manifest
};

int run_formats(const FormatsArgs& a);
int run_round(const RoundArgs& a);
int run_dot(const DotArgs& a);
int run_bench(const BenchArgs& a);
int run_verify(const VerifyArgs& a);
int run_sweep(const SweepArgs& a);
int run_tokenize(const TokenizeArgs& a);
int run_detokenize(const TokenizeArgs& a);
int run_shards(const ShardsArgs& a);
int run_logits(const LogitsArgs& a);
int run_eval(const EvalArgs& a);
int run_train(const TrainArgs& a);
int run_lamp(const LampArgs& a);

// ---------------------------------------------------------------- text input
std::string read_all_stdin();
// Lines of `text` split at '\n'; a final line without content after the last '\n' is not a line.
std::vector<std::string_view> split_lines(std::string_view text);
std::string_view trim(std::string_view s);
// Whole-string parses (C99 hex floats, decimal, inf, nan; correctly rounded by strtod/strtof).
// Return false unless the entire (already trimmed, non-empty) string is consumed.
bool parse_double(std::string_view s, double& out);
bool parse_float(std::string_view s, float& out);
// Whitespace-separated non-negative decimal integers (< 2^31); InputError naming `what`, the
// position and the offending word otherwise.
std::vector<int64_t> parse_token_ids(std::string_view text, const std::string& what);

// ---------------------------------------------------------------- output
std::string hex(double x);   // printf "%a"
bool stderr_is_tty();

// ---------------------------------------------------------------- numbers
double median(std::vector<double> v);
void apply_threads(int threads);  // set_num_threads when threads > 0

// Deterministic test data from Philox words of (seed, stream): uniform in [0,1) or N(0,1),
// rounded to binary32 (the uniform values are exact multiples of 2^-24).
enum class Distribution { uniform01, normal };
void fill_random(float* x, size_t n, Distribution d, uint64_t seed, uint64_t stream);
void fill_random(double* x, size_t n, Distribution d, uint64_t seed, uint64_t stream);

struct Stopwatch {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace mantis::cli
