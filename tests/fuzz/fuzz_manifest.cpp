// fuzz_manifest — a result set's manifest.json (exp/study.h verify_result_set, exp/merge.h
// merge_result_sets: `mantis merge`), in a directory holding a small results.csv and results.json
// (tests/fuzz/seeds/manifest/ has the manifest that lists their SHA-256s).
#include "exp/merge.h"
#include "exp/study.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(manifest) {
  static const std::string dir = [] {
    // (seeds/make_seeds.py writes the manifest that lists these two files: keep them in step)
    fuzz::put("set/results.csv", "model,mu,kl_nats,flips,seconds\nm,4,0.5,3,1.25\nm,7,,0,nan\n");
    fuzz::put("set/results.json", "{\"results\": []}\n");
    return fuzz::scratch() + "/set";
  }();
  fuzz::put("set/manifest.json", data, size);
  fuzz::refused([&] { verify_result_set(dir); });
  fuzz::refused([&] { (void)merge_result_sets({dir}); });
  return 0;
}
