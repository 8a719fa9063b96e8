// mantis merge DIR… — result sets joined into one long-format CSV (exp/merge.h).
#include <fmt/format.h>

#include "common.h"
#include "core/file.h"
#include "exp/merge.h"

namespace mantis::cli {

Runner setup_merge(CLI::App& sub) {
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  sub.description(
      "join result directories (eval, lamp sweep, sweep, optim-study, gnmr study: each verified against its "
      "manifest) into one long-format CSV: source, generator, git_commit, row, model, policy, mu, site, design "
      "(the row's other identifying columns, k=v;…), metric, value, unit — one line per number of each results.csv");
  sub.add_option("dirs", *dirs, "result directories")->required()->check(kPath);
  add_out(sub, *out, "the merged CSV (written atomically; default: stdout)");
  return [dirs, out] {
    if (!out->empty()) check_output_path(*out, "--out");
    const std::string csv = merge_result_sets(*dirs);
    if (out->empty()) {
      std::fwrite(csv.data(), 1, csv.size(), stdout);
    } else {
      write_file_atomic(*out, csv);
      fmt::print(stderr, "wrote {}\n", *out);
    }
    return 0;
  };
}

}  // namespace mantis::cli
