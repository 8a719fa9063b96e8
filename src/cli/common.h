// cli/common — what the `mantis` subcommands share: the command registry, the shared option
// groups, input parsing, output formatting. Every user-facing problem is an InputError
// (format.h): main() prints it on one line and exits with status 2.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/format.h"
#include "core/file.h"
#include "core/progress.h"
#include "core/sample.h"
#include "exp/slurm.h"
#include "exp/study.h"
#include "mantis_config.h"
#include "nn/forward.h"  // ForwardFn

namespace mantis::cli {

// ---------------------------------------------------------------- the command registry
// A command declares its options on its CLI11 subcommand and returns what runs it (main.cpp holds
// the list; `mantis help` prints it).
using Runner = std::function<int()>;
struct Command {
  const char* name;
  const char* summary;             // one line, for `mantis help` (setup gives --help its full text)
  Runner (*setup)(CLI::App& sub);  // options and description
};
const std::vector<Command>& commands();  // main.cpp

Runner setup_formats(CLI::App& sub);
Runner setup_round(CLI::App& sub);
Runner setup_quantize(CLI::App& sub);
Runner setup_dot(CLI::App& sub);
Runner setup_gemm(CLI::App& sub);
Runner setup_bench(CLI::App& sub);
Runner setup_verify(CLI::App& sub);
Runner setup_sweep(CLI::App& sub);
Runner setup_mu_sweep(CLI::App& sub);
Runner setup_tokenize(CLI::App& sub);
Runner setup_detokenize(CLI::App& sub);
Runner setup_shards(CLI::App& sub);
Runner setup_logits(CLI::App& sub);
Runner setup_export(CLI::App& sub);
Runner setup_merge(CLI::App& sub);
Runner setup_eval(CLI::App& sub);
Runner setup_train(CLI::App& sub);
Runner setup_lamp(CLI::App& sub);
Runner setup_optim(CLI::App& sub);
Runner setup_gnmr(CLI::App& sub);
Runner setup_optim_study(CLI::App& sub);
Runner setup_validate_gpu(CLI::App& sub);
// --device cpu|cuda (and --attention materialised|flash for cuda) on a command that runs forward
// passes; device_forward turns them into the ForwardFn (nn/forward.h) to run them with: empty for
// the CPU; InputError for cuda in a build without CUDA or on a machine without a device (cmd_gpu.cpp).
struct DeviceArgs {
  std::string device = "cpu";
  std::string attention = "materialised";
};
void add_device(CLI::App& sub, DeviceArgs& d);
ForwardFn device_forward(const DeviceArgs& d);
Runner setup_bench_gpu(CLI::App& sub);
Runner setup_probe_tensor_cores(CLI::App& sub);

// ---------------------------------------------------------------- shared option groups
// Only one subcommand runs, so the options every command means the same way by live once here;
// main applies --threads before the command runs.
struct SharedOptions {
  int threads = 0;     // 0: OpenMP's default
  bool quiet = false;  // no progress
  bool progress = false;  // the progress bar even when stderr is not a terminal
  bool no_figures = false;  // --no-figures (exp/figures.h)
  ProgressMode progress_mode() const { return mantis::progress_mode(quiet, progress); }
};
SharedOptions& shared();
void add_threads(CLI::App& sub, const std::string& help = "CPU threads (default: OpenMP's)");
void add_quiet(CLI::App& sub, const std::string& help = "no progress");
// --quiet and --progress: the progress reporter's (core/progress.h) two switches.
void add_progress(CLI::App& sub, const std::string& quiet_help = "no progress");
// --no-figures; and after a command has written the result set in `dir`, its PNG(s) (exp/figures.h):
// "figures: PATH …" on stdout, or one line on stderr saying why none were drawn (the results stand).
void add_figures(CLI::App& sub);
void report_figures(const std::string& dir, std::FILE* to = stdout);
// --format, --rounding, --seed, --stream, --sr-bits, --sr-packed: rounding to a format (round,
// dot, gemm, verify). `what` prefixes the format's and the mode's help ("accumulator ").
struct RoundingArgs {
  std::string format, rounding = "rne";
  uint64_t seed = 0, stream = 0;
  int sr_bits = 32;
  bool sr_packed = false;
};
void add_rounding(CLI::App& sub, RoundingArgs& r, const std::string& what = "",
                  const std::string& sr_help = "random bits used by sr (1..32)");
CLI::Option* add_out(CLI::App& sub, std::string& out, const std::string& help);
// A study's cell options: --cell, --shard k/N, --merge, --overwrite, --allow-partial (study.h).
void add_cell_choice(CLI::App& sub, CellChoice& c, const std::string& prefix = "");
// --emit-slurm FILE and its resources (exp/slurm.h): the study becomes a job-array script.
struct SlurmArgs {
  std::string emit;
  SlurmOptions s;
};
void add_slurm(CLI::App& sub, SlurmArgs& a);
// Writes the script (executable, atomically) for this process's command line; prints how to submit.
// Before anything is written: the Slurm options, the cell choice (the script runs the whole study),
// then `validate_study`, the study's validate_* (what its run checks before its first cell, by the
// same code), so that a script that would fail when it runs is never written.
int emit_slurm(const SlurmArgs& a, const CellChoice& c, const std::function<void()>& validate_study);
CLI::Option* add_json(CLI::App& sub, bool& json, const std::string& help);

// Validators: a decimal integer in [0, 2^64) (CLI11's conversion would wrap -1 and 2^64); a
// non-empty path (an empty one would otherwise surface as a cryptic file-system error).
extern const CLI::Validator kUint64;
extern const CLI::Validator kPath;

// Help texts several commands share.
std::string format_help();
std::string rounding_help();
extern const char* const kModelHelp;
extern const char* const kPolicyHelp;
extern const char* const kTokenizerHelp;

// ---------------------------------------------------------------- text input
// All of standard input; more than kTextInputMaxBytes is an InputError (an endless source is not read
// without bound).
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



}  // namespace mantis::cli
