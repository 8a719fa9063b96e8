#include "exp/slurm.h"

#include <fmt/format.h>

#include <filesystem>
#include <regex>

#include "core/error.h"
#include "core/threads.h"
#include "mantis_config.h"

namespace mantis {

namespace fs = std::filesystem;

void validate(const SlurmOptions& s) {
  if (s.shards < 1 || s.shards > 100000) throw InputError(fmt::format("--slurm-shards {}: expected 1..100000", s.shards));
  // the tasks' --threads
  if (s.cpus < 1 || s.cpus > kMaxThreads)
    throw InputError(fmt::format("--slurm-cpus {}: expected 1..{}", s.cpus, kMaxThreads));
  // sbatch's own syntax: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
  if (!std::regex_match(s.time, std::regex(R"(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})")))
    throw InputError(fmt::format("--slurm-time '{}': expected minutes, HH:MM:SS or D-HH:MM:SS", escape_control(s.time)));
  if (!std::regex_match(s.mem, std::regex(R"(\d+[KMGT]?)")))
    throw InputError(fmt::format("--slurm-mem '{}': expected a size such as 4G or 500M", escape_control(s.mem)));
  for (const auto& [what, v] : {std::pair{"--slurm-partition", &s.partition}, std::pair{"--slurm-account", &s.account},
                                std::pair{"--slurm-job-name", &s.job_name}})
    if (!std::regex_match(*v, std::regex(R"([A-Za-z0-9_.+-]*)")))
      throw InputError(fmt::format("{} '{}': letters, digits and _ . + - only", what, escape_control(*v)));
  if (s.job_name.empty()) throw InputError("--slurm-job-name is empty");
  if (s.logs.empty()) throw InputError("--slurm-logs is empty");
}

std::vector<std::string> study_command(const std::vector<std::string>& args) {
  static const char* with_value[] = {"--cell", "--shard", "--threads", "-j", "--emit-slurm"};
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i > 0) {
      if (a == "--merge") continue;
      bool drop = false;
      for (const char* o : with_value) {
        const std::string opt = o;
        if (a == opt) {
          ++i;  // its value
          drop = true;
        } else if (a.rfind(opt + "=", 0) == 0 || (opt == "-j" && a.size() > 2 && a.rfind("-j", 0) == 0)) {
          drop = true;
        }
        if (drop) break;
      }
      if (!drop && a.rfind("--slurm-", 0) == 0) {
        if (a.find('=') == std::string::npos) ++i;
        drop = true;
      }
      if (drop) continue;
    }
    out.push_back(a);
  }
  if (!out.empty() && out[0].find('/') != std::string::npos) out[0] = fs::absolute(out[0]).lexically_normal().string();
  return out;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && std::regex_match(s, std::regex(R"([A-Za-z0-9_./:=+,@%-]+)"))) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurm_script(const SlurmOptions& s, const std::vector<std::string>& args, const std::string& workdir) {
  validate(s);
  std::string cmd;
  for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
  cmd += fmt::format(" --threads {}", s.cpus);
  const std::string task = cmd + fmt::format(" --shard \"$SLURM_ARRAY_TASK_ID\"/{}", s.shards);
  const std::string merge = cmd + " --merge";
  std::string common = fmt::format("--job-name={} --cpus-per-task={} --mem={} --time={}", s.job_name, s.cpus, s.mem, s.time);
  if (!s.partition.empty()) common += " --partition=" + s.partition;
  if (!s.account.empty()) common += " --account=" + s.account;
  const std::string logs = shell_quote(s.logs);
  return fmt::format(
      "#!/usr/bin/env bash\n"
      "# Written by mantis {version} (--emit-slurm): {n} Slurm array task(s) of\n"
      "#   {shown}\n"
      "# task k adds --shard k/{n} (cells i = k mod {n}); once every task has succeeded, one merge job\n"
      "# adds --merge and writes the result set. Cells already computed under the same key are reused,\n"
      "# so rerunning this script after a failure computes only what is missing.\n"
      "# Submit: bash THIS_FILE   (prints the two job ids)\n"
      "set -euo pipefail\n"
      "cd {workdir}\n"
      "mkdir -p {logs}\n"
      "array=$(sbatch --parsable {common} --array=0-{last} --output={logs}/{job}-shard-%a.log --wrap={task})\n"
      "array=${{array%%;*}}\n"
      "merge=$(sbatch --parsable {common} --dependency=afterok:\"$array\" --output={logs}/{job}-merge.log --wrap={merge})\n"
      "merge=${{merge%%;*}}\n"
      "echo \"submitted: array job $array ({n} shards), merge job $merge\"\n",
      fmt::arg("version", MANTIS_VERSION), fmt::arg("n", s.shards), fmt::arg("shown", escape_control(cmd)),
      fmt::arg("workdir", shell_quote(workdir)), fmt::arg("logs", logs), fmt::arg("common", common),
      fmt::arg("last", s.shards - 1), fmt::arg("job", s.job_name), fmt::arg("task", shell_quote(task)),
      fmt::arg("merge", shell_quote(merge)));
}

}  // namespace mantis
