// fuzz_gnmr_norms — the GNMR replay's norm stream (exp/gnmr_replay.h gnmr_replay: the CSV
// step,unit,grad_norm, every unit at every step), replayed under the default controller options
// and under a second set that recovers from the first step (no warm-up, short locks, the EMA
// mean, quantile threshold, score priority, "and").
#include "exp/gnmr_replay.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(gnmr_norms) {
  static const GnmrOptions options[] = {GnmrOptions{}, [] {
                                          GnmrOptions o;
                                          o.warmup = 0, o.lock = 2, o.delta = 1, o.max_recover = 1;
                                          o.combine_and = o.history_low_path = o.mean_ema = true;
                                          o.priority_score = o.threshold_quantile = true, o.quantile = 0.5;
                                          return o;
                                        }()};
  const std::string norms = fuzz::put("norms.csv", data, size);
  for (const GnmrOptions& o : options)
    fuzz::refused([&] { (void)gnmr_replay(o, norms, fuzz::scratch() + "/gnmr.csv"); });
  return 0;
}
