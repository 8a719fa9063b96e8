// slurm — a study as a Slurm job array: array task k runs the study's command with
// `--shard k/N` (cells i ≡ k mod N, study.h), and a merge job, submitted with an afterok
// dependency on the whole array, runs it with `--merge`. The cells' keys make the shards safe to
// rerun and the merge refuses a stale or missing cell, so the merged result set is the one an
// unsharded run writes (tests/run_slurm.sh checks it against a real Slurm, bit for bit).
#pragma once

#include <string>
#include <vector>

namespace mantis {

struct SlurmOptions {
  int shards = 0;                  // N ≥ 1 array tasks
  std::string time = "01:00:00";   // per task (sbatch --time)
  int cpus = 1;                    // per task (--cpus-per-task); the command runs with --threads cpus
  std::string mem = "4G";          // per task (--mem)
  std::string partition, account;  // empty: the cluster's defaults
  std::string job_name = "mantis";
  std::string logs = "slurm-logs";  // the tasks' output: LOGS/<job>-shard-<k>.log, LOGS/<job>-merge.log
};
// InputError naming the first bad field.
void validate(const SlurmOptions& s);

// args[0] is the program; the options that choose cells, threads or emit the script (--cell,
// --shard, --merge, --threads / -j, --emit-slurm, --slurm-*) are dropped wherever they appear.
std::vector<std::string> study_command(const std::vector<std::string>& args);

// A bash script that, run from anywhere, submits the array and the merge job (sbatch --parsable)
// for the command `args` (already through study_command), started in `workdir`.
std::string slurm_script(const SlurmOptions& s, const std::vector<std::string>& args, const std::string& workdir);

// s as one shell word (single-quoted where needed).
std::string shell_quote(const std::string& s);

}  // namespace mantis
