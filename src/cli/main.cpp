// mantis — command-line front end: formats, round, dot, bench, verify, sweep, tokenize, detokenize,
// shards, logits, eval, train, lamp.
//
// Exit status: 0 success; 1 a check failed (verify found mismatches); 2 a usage or input error
// (exactly one line "mantis: error: …" on stderr); 3 an internal error.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <optional>
#include <cctype>
#include <string>

#include "common.h"
#include "mantis_config.h"

namespace {

constexpr const char* kSubcommands[] = {"formats", "round",     "dot",        "bench",  "verify", "sweep",
                                        "tokenize", "detokenize", "shards", "logits", "eval",  "train", "lamp"};

// One line: line breaks become spaces, other control bytes (an escape sequence would reach the
// terminal) \xNN.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return mantis::escape_control(s);
}

int fail(const std::string& msg, int status = 2) {
  std::fflush(stdout);
  const std::string line = "mantis: error: " + one_line(msg) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  return status;
}

// Whatever a command printed must have reached standard output (a full disk, a closed descriptor):
// otherwise status 0 would vouch for truncated output.
int check_stdout(int status) {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return status;
  return fail(fmt::format("cannot write standard output{}", err ? std::string(": ") + std::strerror(err) : ""));
}

// --seed / --stream: a decimal integer in [0, 2^64), which CLI11's conversion would wrap (-1, 2^64).
const CLI::Validator kUint64([](std::string& s) -> std::string {
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || s[0] == '+' || ec != std::errc() || p != s.data() + s.size())
    return fmt::format("'{}' is not an integer in 0..18446744073709551615", s);
  return "";
}, "UINT64");
// Paths: an empty one would otherwise surface as a cryptic file-system error.
const CLI::Validator kPath([](std::string& s) -> std::string { return s.empty() ? "the path is empty" : ""; }, "PATH");

// The first option word (--name or -x) that neither the subcommand nor the app knows, if any.
std::optional<std::string> unknown_option(CLI::App& app, int argc, char** argv) {
  CLI::App* sub = nullptr;
  if (argc > 1) {
    try {
      sub = app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      sub = nullptr;
    }
  }
  for (int i = sub ? 2 : 1; i < argc; ++i) {
    const std::string w = argv[i];
    if (w == "--") break;
    const bool long_opt = w.size() > 2 && w.compare(0, 2, "--") == 0;
    const bool short_opt = w.size() == 2 && w[0] == '-' && std::isalpha(static_cast<unsigned char>(w[1]));
    if (!long_opt && !short_opt) continue;
    const std::string name = w.substr(0, w.find('='));
    const bool known = (sub && sub->get_option_no_throw(name) != nullptr) || app.get_option_no_throw(name) != nullptr;
    if (!known)
      return sub ? fmt::format("unknown option '{}' for 'mantis {}' (see mantis {} --help)", name, argv[1], argv[1])
                 : fmt::format("unknown option '{}' (see mantis --help)", name);
  }
  return std::nullopt;
}

int run(int argc, char** argv) {
  using namespace mantis::cli;
  CLI::App app{fmt::format(
      "mantis {} — floating-point format simulator (formats of μ stored fraction bits; "
      "CPFloat/chop t = μ+1)",
      MANTIS_VERSION)};
  app.name("mantis");
  app.set_version_flag("--version", std::string("mantis ") + MANTIS_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 ok, 1 verify found mismatches, 2 usage or input error (one line on stderr), "
      "3 internal error.");

  const std::string fmt_help =
      "target format: a named format (see `mantis formats`), a family name (" + mantis::family_help() +
      "), or a path to a .toml format file";
  std::string modes;
  for (auto& m : mantis::rounding_names()) modes += (modes.empty() ? "" : ", ") + m;
  const std::string mode_help = "rounding mode: " + modes;

  // formats
  FormatsArgs fa;
  auto* formats = app.add_subcommand("formats", "table of the named formats and family examples");
  formats->add_option("names", fa.names, "show only these formats (names, family names or .toml paths)");

  // round
  RoundArgs ra;
  auto* round = app.add_subcommand(
      "round",
      "round numbers read from stdin (one per line: decimal or C99 hex float, inf, -inf, nan; "
      "each first converted to binary64 by strtod; blank lines at the end are ignored) and print each result "
      "as %a of a double. "
      "Element i (0-based line number) uses the random word (seed, stream, i).");
  round->add_option("--format,-f", ra.format, fmt_help)->required();
  round->add_option("--rounding,-r", ra.rounding, mode_help)->capture_default_str();
  round->add_option("--seed", ra.seed, "Philox seed for sr/sre")->capture_default_str()->check(kUint64);
  round->add_option("--stream", ra.stream, "Philox stream for sr/sre")->capture_default_str()->check(kUint64);
  round->add_option("--sr-bits", ra.sr_bits, "random bits used by sr (1..32)")->capture_default_str();
  round->add_flag("--reference", ra.reference, "use the MPFR oracle instead of the fast path (same results)");
  round->add_option("--threads,-j", ra.threads, "CPU threads (default: OpenMP's)")->check(CLI::Range(1, 4096));

  // dot
  DotArgs da;
  auto* dot = app.add_subcommand(
      "dot",
      "dot product with a rounded accumulator. Reads two lines from stdin, each a comma-separated "
      "vector (decimal or hex floats) of equal length; the operands are binary32: every element is "
      "converted with strtof (correctly rounded decimal -> binary32). Prints the accumulated result "
      "as %a of a double. Accumulation step k uses the random word (seed, stream, k).");
  dot->add_option("--format,-f", da.format, "accumulator format (μ ≤ 50): " + fmt_help)->required();
  dot->add_option("--rounding,-r", da.rounding, "accumulator " + mode_help)->capture_default_str();
  dot->add_option("--accumulation", da.accumulation, "strict (fused a·b+acc), unfused or blocked")
      ->capture_default_str();
  dot->add_option("--block", da.block, "chunk length for --accumulation blocked")->capture_default_str();
  dot->add_option("--seed", da.seed, "Philox seed for sr/sre")->capture_default_str()->check(kUint64);
  dot->add_option("--stream", da.stream, "Philox stream for sr/sre")->capture_default_str()->check(kUint64);
  dot->add_option("--sr-bits", da.sr_bits, "random bits used by sr (strict needs ≤ 52 − (μ+1))")
      ->capture_default_str();
  dot->add_flag("--reference", da.reference, "use the MPFR reference GEMM (M = N = 1) instead of the fast path");

  // bench
  BenchArgs ba;
  auto* bench = app.add_subcommand(
      "bench",
      "round: ns per element of out-of-place round_array (double and float arrays; bf16, fp16, ps4; "
      "rne, sr) beside memcpy of the same array. gemm: GFLOP/s of strict GEMM with a ps4 "
      "accumulator beside Eigen's float GEMM. forward: tokens/s of a random GPT-2-shaped model (or --model), FP32, "
      "LAMP's uniform ps4 policy and LAMP strict tau = 1. train: training tokens/s of --config, without and with 4-bit saved activations. Medians over "
      "--reps after one warm-up.");
  bench->add_option("benchmark", ba.what, "round, gemm, forward or train")
      ->required()
      ->check(CLI::IsMember({"round", "gemm", "forward", "train"}));
  bench->add_option("--config", ba.config, "train: the training configuration")->capture_default_str()->check(kPath);
  bench->add_option("--model", ba.model, "forward: measure this checkpoint (--ctx caps its context) instead")->check(kPath);
  bench->add_flag("--json", ba.json, "print JSON instead of a table");
  bench->add_option("--reps", ba.reps, "timed repetitions (median)")->capture_default_str()->check(CLI::Range(1, 100000));
  bench->add_option("--threads,-j", ba.threads, "thread counts to measure (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  bench->add_option("--n", ba.n, "round: elements per array")->capture_default_str()->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  bench->add_option("--sizes", ba.sizes, "gemm: square shapes N (N×N×N), comma-separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 8192));
  bench->add_option("--layers", ba.layers, "forward: layers")->capture_default_str()->check(CLI::Range(1, 1000));
  bench->add_option("--dim", ba.dim, "forward: width C")->capture_default_str()->check(CLI::Range(1, 65536));
  bench->add_option("--heads", ba.heads, "forward: heads (must divide --dim)")->capture_default_str()->check(CLI::Range(1, 4096));
  bench->add_option("--ctx", ba.ctx, "forward: tokens in the sequence")->capture_default_str()->check(CLI::Range(1, 1 << 20));

  // verify
  VerifyArgs va;
  auto* verify = app.add_subcommand(
      "verify",
      "compare the fast path with the MPFR oracle bit for bit. --exhaustive: every binary32 bit pattern "
      "(2^32 inputs, NaNs and infinities included); input number j uses the random word (seed, stream, j). "
      "Exit status 1 on any mismatch.");
  verify->add_flag("--exhaustive", va.exhaustive, "all 2^32 binary32 patterns (required: the only mode so far)");
  verify->add_option("--format,-f", va.format, fmt_help)->required();
  verify->add_option("--rounding,-r", va.rounding, mode_help)->capture_default_str();
  verify->add_option("--container", va.container, "float (round binary32 arrays) or double (round (double)x)")
      ->capture_default_str();
  verify->add_option("--threads,-j", va.threads, "threads (default: all; 1 if MPFR is not thread-safe)")
      ->check(CLI::Range(1, 4096));
  verify->add_option("--limit", va.limit,
                     "check only about N patterns: every k-th with k = 2^32/N made odd (for quick runs)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 32));
  verify->add_option("--seed", va.seed, "Philox seed for sr/sre")->capture_default_str()->check(kUint64);
  verify->add_option("--stream", va.stream, "Philox stream for sr/sre")->capture_default_str()->check(kUint64);
  verify->add_option("--sr-bits", va.sr_bits, "random bits used by sr (1..32)")->capture_default_str();
  verify->add_option("--show", va.show, "mismatches to print")->capture_default_str()->check(CLI::Range(0, 1000000));
  verify->add_flag("--progress", va.progress, "progress on stderr even when it is not a terminal");
  verify->add_flag("--quiet,-q", va.quiet, "no progress indicator");

  // sweep
  SweepArgs sa;
  auto* sweep = app.add_subcommand(
      "sweep",
      "mantissa-width sweep: relative error of strictly accumulated dot products and GEMMs in ps<μ> "
      "against exact / binary64 references (see experiments/mu-sweep.toml)");
  sweep->add_option("config", sa.config, "TOML configuration")->required()->check(kPath);
  sweep->add_option("--out,-o", sa.out, "write DIR/results.csv, results.json and manifest.json (one result set)")->check(kPath);
  sweep->add_option("--threads,-j", sa.threads, "CPU threads (default: OpenMP's)")->check(CLI::Range(1, 4096));

  // tokenize / detokenize
  TokenizeArgs ta, da2;
  const std::string tok_help = "tokenizer: gpt2 (OpenAI's byte-level BPE, data/gpt2) or bytes (vocabulary 256)";
  auto* tokenize = app.add_subcommand(
      "tokenize", "read UTF-8 text (any bytes) on stdin; print its token ids on one line, separated by single spaces");
  tokenize->add_option("--tokenizer,-t", ta.tokenizer, tok_help)->capture_default_str();
  auto* detokenize = app.add_subcommand(
      "detokenize", "read token ids (whitespace-separated) on stdin; write the bytes they stand for to stdout");
  detokenize->add_option("--tokenizer,-t", da2.tokenizer, tok_help)->capture_default_str();

  // shards
  ShardsArgs sha;
  auto* shards = app.add_subcommand(
      "shards",
      "tokenize the committed corpora (DATA/corpora/*/{train,validation,test}.txt.gz) into token shards "
      "DATA/shards/<tokenizer>/<corpus>/<split>.tok with a manifest (SHA-256 of every shard)");
  shards->add_option("--tokenizer,-t", sha.tokenizer, tok_help)->capture_default_str();
  shards->add_option("--data-dir", sha.data_dir, "data root (default: $MANTIS_DATA_DIR or the source tree's data/)")->check(kPath);
  shards->add_option("--out,-o", sha.out, "output directory (default: DATA/shards/<tokenizer>)")->check(kPath);
  shards->add_flag("--quiet,-q", sha.quiet, "no per-shard lines on stderr");

  // logits
  LogitsArgs la;
  const std::string model_help =
      "checkpoint: a file (llm.c .bin, llama2.c .bin, .safetensors beside config.json) or a directory holding "
      "model.safetensors + config.json (Hugging Face GPT-2 or this project's)";
  const std::string policy_help = "precision policy: native, lamp:<μ> (attn.qk strict ps<μ>), or a TOML file";
  auto* logits = app.add_subcommand("logits", "the logits of one token sequence as a float32 .npy of shape [T, vocab]");
  logits->add_option("--model,-m", la.model, model_help)->required()->check(kPath);
  logits->add_option("--policy,-p", la.policy, policy_help)->capture_default_str();
  logits->add_option("--tokens", la.tokens, "token ids, space-separated (\"ID ID ...\")");
  logits->add_option("--tokens-file", la.tokens_file, "a file of whitespace-separated token ids")->check(kPath);
  logits->add_option("--out,-o", la.out, "the .npy file to write (atomically)")->required()->check(kPath);
  logits->add_option("--threads,-j", la.threads, "CPU threads (default: OpenMP's)")->check(CLI::Range(1, 4096));

  // eval
  EvalArgs ea;
  auto* eval = app.add_subcommand(
      "eval",
      "run FP32 (native) and a policy on the same windows of real text; print KL, top-1 flips, perplexities and "
      "the largest logit error, averaged over every position of every window");
  eval->add_option("--model,-m", ea.model, model_help)->required()->check(kPath);
  eval->add_option("--policy,-p", ea.policy, policy_help)->capture_default_str();
  eval->add_option("--data,-d", ea.data,
                   "train|validation|test (all corpora), <corpus>/<split> (austen, kjv, web, brown), or a .tok shard")
      ->capture_default_str();
  eval->add_option("--seqs,-n", ea.seqs, "windows, spread evenly over the data")->capture_default_str()->check(CLI::Range(1, 1000000));
  eval->add_option("--ctx,-T", ea.ctx, "tokens per window (default: the model's context)")->check(CLI::Range(1, 1 << 24));
  eval->add_option("--tokenizer,-t", ea.tokenizer, "tokenizer of the data (default: bytes for V = 256, gpt2 for V = 50257)");
  eval->add_option("--out,-o", ea.out, "write DIR/results.csv, DIR/results.json, DIR/manifest.json (atomically)")->check(kPath);
  eval->add_option("--threads,-j", ea.threads, "CPU threads (default: OpenMP's)")->check(CLI::Range(1, 4096));
  eval->add_flag("--quiet,-q", ea.quiet, "no progress line");
  for (int i = 0; i < argc; ++i) ea.command += (i ? " " : "") + std::string(argv[i]);

  // train
  TrainArgs tra;
  auto* train = app.add_subcommand(
      "train",
      "train a model on the corpora (src/train.h): AdamW, warm-up + cosine, clipping, validation, atomic "
      "checkpoints, log.csv / units.csv; see experiments/train-*.toml");
  train->add_option("config", tra.config, "training configuration (TOML)")->required()->check(kPath);
  train->add_option("--resume", tra.resume, "continue the run in DIR from its latest checkpoint (bit-identical)")->check(kPath);
  train->add_option("--out,-o", tra.out, "output directory (overrides the config's out)")->check(kPath);
  train->add_option("--threads,-j", tra.threads, "CPU threads (default: OpenMP's)")->check(CLI::Range(1, 4096));
  train->add_flag("--progress", tra.progress, "progress bar on stderr even when it is not a terminal");
  train->add_flag("--quiet,-q", tra.quiet, "no progress bar");

  // lamp
  LampArgs lpa;
  auto* lamp = app.add_subcommand(
      "lamp",
      "LAMP study: `mantis lamp sweep CONFIG.toml` runs FP32, uniform ps<μ> and LAMP (strict / relaxed τ, with and "
      "without the random control) on the same held-out windows; resumable cells, CSV + JSON + manifest "
      "(experiments/lamp/)");
  lamp->add_option("action", lpa.action, "sweep")->required()->check(CLI::IsMember({"sweep"}));
  lamp->add_option("config", lpa.config, "sweep configuration (TOML)")->required()->check(kPath);
  lamp->add_flag("--cells", lpa.list, "list the cells (index, name) and exit");
  lamp->add_option("--cell", lpa.cell, "run only this cell (results merge later)")->check(CLI::Range(0, 1 << 30));
  lamp->add_flag("--merge", lpa.merge, "only merge the cell results already in the output directory");
  lamp->add_flag("--overwrite", lpa.overwrite, "recompute cells stored under another configuration (or malformed)");
  lamp->add_flag("--allow-partial", lpa.allow_partial, "merge even with cells missing (the manifest says partial)");
  lamp->add_option("--out,-o", lpa.out, "output directory (overrides the config's out)")->check(kPath);
  lamp->add_option("--threads,-j", lpa.threads, "CPU threads (default: OpenMP's)")->check(CLI::Range(1, 4096));
  lamp->add_flag("--quiet,-q", lpa.quiet, "no progress");

  // An unknown first word is an unknown subcommand, not "an unexpected argument".
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kSubcommands), std::end(kSubcommands),
                   [&](const char* s) { return std::strcmp(s, argv[1]) == 0; }))
  {
    std::string known;
    for (const char* k : kSubcommands) known += (known.empty() ? "" : ", ") + std::string(k);
    return fail(fmt::format("unknown subcommand '{}' (known: {})", argv[1], known));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all, --version: stdout, status 0
    // CLI11 reports a missing required option before an unknown one; the unknown one is the
    // more fundamental problem, so name it first.
    if (auto unknown = unknown_option(app, argc, argv)) return fail(*unknown);
    return fail(e.what());
  }

  if (*formats) return run_formats(fa);
  if (*round) return run_round(ra);
  if (*dot) return run_dot(da);
  if (*bench) return run_bench(ba);
  if (*verify) return run_verify(va);
  if (*sweep) return run_sweep(sa);
  if (*tokenize) return run_tokenize(ta);
  if (*detokenize) return run_detokenize(da2);
  if (*shards) return run_shards(sha);
  if (*logits) return run_logits(la);
  if (*eval) return run_eval(ea);
  if (*train) return run_train(tra);
  if (*lamp) return run_lamp(lpa);
  return fail("no subcommand given");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return check_stdout(run(argc, argv));
  } catch (const mantis::InputError& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory", 3);
  } catch (const std::exception& e) {
    return fail(fmt::format("internal: {}", e.what()), 3);
  }
}
