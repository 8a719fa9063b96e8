// fuzz_cell — a study's cell file (exp/study.h read_cell, the key comparison of a merge, and the
// study's reading of its numbers): cell 0 of a small μ-sweep (exp/mu_sweep.h, μ = 4 and 7), merged
// with --merge. The sweep's two cells are computed once; then each input replaces cells/0.json and
// its SHA-256 line (cells/0.json.sha256), so the parse and the rows are what is tried, not the hash.
#include "core/file.h"
#include "exp/mu_sweep.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(cell) {
  static const MuSweepOptions merge = [] {
    MuSweepOptions o;
    o.config = fuzz::put("cell-study.toml", "mu = [4, 7]\nlengths = [4]\ntrials = 2\n");
    o.out = fuzz::scratch() + "/cell-study";
    o.progress = ProgressMode::quiet;
    (void)run_mu_sweep(o);
    o.merge_only = true;
    return o;
  }();
  const std::string_view cell(reinterpret_cast<const char*>(data), size);
  fuzz::put(merge.out + "/cells/0.json.sha256", sha256_hex(cell) + "  0.json\n");
  fuzz::put(merge.out + "/cells/0.json", cell);
  fuzz::refused([&] { (void)run_mu_sweep(merge); });
  return 0;
}
