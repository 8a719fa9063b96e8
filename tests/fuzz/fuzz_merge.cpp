// fuzz_merge — a result set's results.csv as `mantis merge` reads it (exp/merge.h
// merge_result_sets): the set's manifest.json lists the input's SHA-256, so the CSV itself
// (quoting, field counts, metric and design columns, units) is what is tried.
#include "core/file.h"
#include "exp/merge.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(merge) {
  const std::string_view csv(reinterpret_cast<const char*>(data), size);
  fuzz::put("merge/results.csv", csv);
  const std::string files = "{\"results.csv\": \"" + sha256_hex(csv) + "\"}";
  fuzz::put("merge/manifest.json",
            "{\"generator\": \"mantis fuzz\", \"git_commit\": \"0\", \"model\": \"m\", \"files\": " + files + "}\n");
  fuzz::refused([&] { (void)merge_result_sets({fuzz::scratch() + "/merge"}); });
  return 0;
}
