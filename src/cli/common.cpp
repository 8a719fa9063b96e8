#include "common.h"

#include "exp/figures.h"
#include "exp/manifest.h"  // command_args

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <charconv>
#include <climits>

namespace mantis::cli {

std::string read_all_stdin() {
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const size_t k = std::fread(buf, 1, sizeof buf, stdin);
    // Bounded like every text input: `< /dev/zero` or an endless pipe ends here, not in memory.
    if (s.size() + k > kTextInputMaxBytes)
      throw InputError(fmt::format("standard input holds more than {} bytes (give larger inputs as files: .npy, "
                                   "token shards)", kTextInputMaxBytes));
    s.append(buf, k);
    if (k < sizeof buf) {
      if (std::ferror(stdin)) throw InputError("cannot read standard input");
      break;
    }
  }
  return s;
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) {
      lines.push_back(text.substr(pos));
      break;
    }
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  const std::string z(s);
  char* end = nullptr;
  errno = 0;
  out = std::strtod(z.c_str(), &end);  // overflow gives ±inf, underflow ±0/subnormal: IEEE conversion
  return end == z.c_str() + z.size();
}

bool parse_float(std::string_view s, float& out) {
  if (s.empty()) return false;
  const std::string z(s);
  char* end = nullptr;
  errno = 0;
  out = std::strtof(z.c_str(), &end);
  return end == z.c_str() + z.size();
}

std::vector<int64_t> parse_token_ids(std::string_view text, const std::string& what) {
  constexpr std::string_view ws = " \t\r\n\f\v";
  std::vector<int64_t> ids;
  size_t pos = text.find_first_not_of(ws);
  while (pos != std::string_view::npos) {
    const size_t end = std::min(text.find_first_of(ws, pos), text.size());
    const std::string_view w = text.substr(pos, end - pos);
    int64_t v = 0;
    const bool digits = w.size() <= 10 && std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits)
      for (char c : w) v = v * 10 + (c - '0');
    if (!digits || v > INT32_MAX)
      throw InputError(fmt::format("{}: token {} ('{}') is not a token id (a non-negative integer)", what, ids.size(),
                                   escape_control(w.substr(0, 40))));
    ids.push_back(v);
    pos = text.find_first_not_of(ws, end);
  }
  return ids;
}

std::string hex(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

SharedOptions& shared() {
  static SharedOptions o;
  return o;
}

void add_threads(CLI::App& sub, const std::string& help) {
  sub.add_option("--threads,-j", shared().threads, help)->check(CLI::Range(1, kMaxThreads));
}
void add_quiet(CLI::App& sub, const std::string& help) { sub.add_flag("--quiet,-q", shared().quiet, help); }
void add_progress(CLI::App& sub, const std::string& quiet_help) {
  add_quiet(sub, quiet_help);
  sub.add_flag("--progress", shared().progress, "progress bar on stderr even when it is not a terminal");
}
void add_figures(CLI::App& sub) {
  sub.add_flag("--no-figures", shared().no_figures,
               "do not draw the results' PNG(s) (tools/figures.py; also MANTIS_NO_FIGURES=1)");
}
void report_figures(const std::string& dir, std::FILE* to) {
  if (dir.empty() || !figures_wanted(shared().no_figures)) return;
  const Figures f = draw_figures(dir);
  if (!f.written.empty()) fmt::print(to, "figures: {}\n", fmt::join(f.written, " "));
  if (!f.problem.empty()) fmt::print(stderr, "figures not drawn: {} (--no-figures: do not try)\n", f.problem);
}
void add_rounding(CLI::App& sub, RoundingArgs& r, const std::string& what, const std::string& sr_help) {
  sub.add_option("--format,-f", r.format, what + format_help())->required();
  sub.add_option("--rounding,-r", r.rounding, what + rounding_help())->capture_default_str();
  sub.add_option("--seed", r.seed, "Philox seed for sr/sre")->capture_default_str()->check(kUint64);
  sub.add_option("--stream", r.stream, "Philox stream for sr/sre")->capture_default_str()->check(kUint64);
  sub.add_option("--sr-bits", r.sr_bits, sr_help)->capture_default_str();
  sub.add_flag("--sr-packed", r.sr_packed,
               "2 (sr-bits <= 16) or 4 (<= 8) stochastic roundings per 32-bit random word, as Blackwell's cvt.rs "
               "(slot i mod P of word i / P, from the top)");
}
CLI::Option* add_out(CLI::App& sub, std::string& out, const std::string& help) {
  return sub.add_option("--out,-o", out, help)->check(kPath);
}
void add_cell_choice(CLI::App& sub, CellChoice& c, const std::string& prefix) {
  sub.add_option("--cell", c.cell, prefix + "run only this cell (results merge later)")->check(CLI::Range(0, 1 << 30));
  sub.add_option_function<std::string>(
         "--shard", [&c](const std::string& s) { parse_shard(s, c); },
         prefix + "run the cells i ≡ k (mod N), k/N (a cluster's array task; results merge later)")
      ->type_name("k/N");
  sub.add_flag("--merge", c.merge_only, prefix + "only merge the cell results already in the output directory");
  sub.add_flag("--overwrite", c.overwrite, prefix + "recompute cells stored under another configuration (or malformed)");
  sub.add_flag("--allow-partial", c.allow_partial, prefix + "merge even with cells missing (the manifest says partial)");
}

void add_slurm(CLI::App& sub, SlurmArgs& a) {
  sub.add_option("--emit-slurm", a.emit, "write a Slurm submit script (array of --slurm-shards tasks, then the merge) "
                                         "instead of running")->check(kPath);
  sub.add_option("--slurm-shards", a.s.shards, "array tasks (--shard k/N each)");
  sub.add_option("--slurm-time", a.s.time, "time limit per task")->capture_default_str();
  sub.add_option("--slurm-cpus", a.s.cpus, "CPUs per task (the command's --threads)")->capture_default_str();
  sub.add_option("--slurm-mem", a.s.mem, "memory per task")->capture_default_str();
  sub.add_option("--slurm-partition", a.s.partition, "partition (default: the cluster's)");
  sub.add_option("--slurm-account", a.s.account, "account (default: the user's)");
  sub.add_option("--slurm-job-name", a.s.job_name, "job name")->capture_default_str();
  sub.add_option("--slurm-logs", a.s.logs, "directory of the tasks' output, relative to this directory")
      ->capture_default_str();
}

int emit_slurm(const SlurmArgs& a, const CellChoice& c, const std::function<void()>& validate_study) {
  namespace fs = std::filesystem;
  if (a.s.shards == 0) throw InputError("--emit-slurm needs --slurm-shards N");
  if (c.cell >= 0 || c.shards > 0 || c.merge_only)
    throw InputError("--emit-slurm writes the whole study: drop --cell, --shard and --merge");
  validate(a.s);
  validate_study();
  const std::string script = slurm_script(a.s, study_command(command_args()), fs::current_path().string());
  write_file_atomic(a.emit, script);
  fs::permissions(a.emit, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  fmt::print("wrote {} ({} array tasks, then the merge); submit with: bash {}\n", a.emit, a.s.shards, a.emit);
  return 0;
}

CLI::Option* add_json(CLI::App& sub, bool& json, const std::string& help) { return sub.add_flag("--json", json, help); }

const CLI::Validator kUint64([](std::string& s) -> std::string {
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || s[0] == '+' || ec != std::errc() || p != s.data() + s.size())
    return fmt::format("'{}' is not an integer in 0..18446744073709551615", s);
  return "";
}, "UINT64");
const CLI::Validator kPath([](std::string& s) -> std::string { return s.empty() ? "the path is empty" : ""; }, "PATH");

std::string format_help() {
  return "target format: a named format (see `mantis formats`), a family name (" + family_help() +
         "), or a path to a .toml format file";
}
std::string rounding_help() {
  std::string modes;
  for (auto& m : rounding_names()) modes += (modes.empty() ? "" : ", ") + m;
  return "rounding mode: " + modes;
}
const char* const kModelHelp =
    "checkpoint: a file (llm.c .bin, llama2.c .bin, .safetensors beside config.json) or a directory holding "
    "config.json + model.safetensors or its shards (Hugging Face GPT-2, LLaMA, Mistral, or this project's)";
const char* const kPolicyHelp = "precision policy: native, lamp:<μ> (attn.qk strict ps<μ>), or a TOML file";
const char* const kTokenizerHelp = "tokenizer: gpt2 (OpenAI's byte-level BPE, data/gpt2), bytes (vocabulary 256), "
                                     "a Hugging Face tokenizer.json, or a directory holding one";

}  // namespace mantis::cli
