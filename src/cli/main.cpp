// mantis — command-line front end: a registry of commands (formats, round, dot, bench, verify,
// sweep, tokenize, detokenize, shards, logits, export, eval, train, lamp, optim, optim-study, gnmr, validate-gpu, bench-gpu; `mantis help` lists them), each
// declared in its own cmd_*.cpp.
//
// Exit status: 0 success; 1 a check failed (verify found mismatches); 2 a usage or input error
// (exactly one line "mantis: error: …" on stderr); 3 an internal error.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <optional>
#include <string>

#include "common.h"
#include "core/threads.h"
#include "exp/manifest.h"
#include "mantis_config.h"

namespace mantis::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> list{
      {"formats", "table of the named formats and family examples", setup_formats},
      {"round", "round numbers read from stdin (or a .npy) to a format", setup_round},
      {"quantize", "a .npy through a scaled format: OCP MX, NVFP4, DeepSeek tiles, INT8", setup_quantize},
      {"dot", "dot product of two vectors from stdin with a rounded accumulator", setup_dot},
      {"gemm", "D = C + A·B of .npy matrices with a rounded accumulator or a GPU's matrix unit", setup_gemm},
      {"bench", "throughput: round, gemm, forward or train", setup_bench},
      {"verify", "fast path against the MPFR oracle, every binary32 pattern", setup_verify},
      {"sweep", "policy sweep (template × site × format × rounding × accumulation × scheme), or the μ-sweep", setup_sweep},
      {"mu-sweep", "μ-sweep: error of strict dot products and GEMMs in ps<μ>", setup_mu_sweep},
      {"tokenize", "UTF-8 text on stdin to token ids", setup_tokenize},
      {"detokenize", "token ids on stdin to bytes", setup_detokenize},
      {"shards", "tokenize the committed corpora into token shards", setup_shards},
      {"logits", "the logits of one token sequence as a .npy", setup_logits},
      {"export", "a model in Hugging Face's layout (--hf): config.json + model.safetensors", setup_export},
      {"merge", "result sets of any studies joined into one long-format CSV (units, provenance)", setup_merge},
      {"eval", "FP32 against a policy on windows of real text: KL, flips, perplexity", setup_eval},
      {"train", "train a model on the corpora", setup_train},
      {"lamp", "the LAMP study: resumable sweep of cells, merged into one result set", setup_lamp},
      {"optim", "optimizers on recorded gradients: replay, synth, list", setup_optim},
      {"optim-study", "the optimizer study: every optimizer on the shipped models, resumable cells", setup_optim_study},
      {"gnmr", "the GNMR controller on a recorded norm stream: replay", setup_gnmr},
      {"validate-gpu", "the GPU contracts: every CUDA operation against the CPU reference", setup_validate_gpu},
      {"bench-gpu", "GPU throughput: rounding vs device memcpy, strict ps4 GEMM vs cuBLAS", setup_bench_gpu},
      {"probe-tensor-cores", "measured test vectors through this GPU's tensor cores, against every matrix-unit preset",
       setup_probe_tensor_cores},
  };
  return list;
}

}  // namespace mantis::cli

namespace {

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

std::string command_list() {
  std::string s = fmt::format("mantis {} — floating-point format simulator\n\nusage: mantis <command> [options] "
                              "(mantis <command> --help: its options)\n\ncommands:\n", MANTIS_VERSION);
  for (const auto& c : mantis::cli::commands()) s += fmt::format("  {:<11} {}\n", c.name, c.summary);
  s += fmt::format("  {:<11} {}\n", "help", "this list");
  return s;
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

  std::vector<std::pair<CLI::App*, Runner>> subs;
  for (const Command& c : commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.summary);
    subs.emplace_back(sub, c.setup(*sub));
  }
  CLI::App* help = app.add_subcommand("help", "print the list of commands");

  // No command: an error (status 2, one line) that points to the list.
  auto names = [] {
    std::string known;
    for (const Command& c : commands()) known += (known.empty() ? "" : ", ") + std::string(c.name);
    return known + ", help";
  };
  if (argc < 2) return fail(fmt::format("no subcommand given (run `mantis help` for the list: {})", names()));
  // An unknown first word is an unknown subcommand, not "an unexpected argument".
  if (argv[1][0] != '-' && std::strcmp(argv[1], "help") != 0 &&
      std::none_of(commands().begin(), commands().end(), [&](const Command& c) { return std::strcmp(c.name, argv[1]) == 0; }))
    return fail(fmt::format("unknown subcommand '{}' (known: {})", argv[1], names()));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all, --version: stdout, status 0
    // CLI11 reports a missing required option before an unknown one; the unknown one is the
    // more fundamental problem, so name it first.
    if (auto unknown = unknown_option(app, argc, argv)) return fail(*unknown);
    return fail(e.what());
  }
  if (*help) {
    const std::string list = command_list();
    std::fwrite(list.data(), 1, list.size(), stdout);
    return 0;
  }
  mantis::set_command_line(argc, argv);
  if (shared().threads > 0) mantis::set_num_threads(shared().threads);
  for (auto& [sub, runner] : subs)
    if (*sub) return runner();
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
