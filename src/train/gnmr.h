// gnmr — the GNMR controller (gradient-norm-to-mean ratio, arXiv 2606.00539) as an exact,
// backend-agnostic algorithm: units are opaque ids, inputs are one gradient norm per unit and
// step, outputs are each unit's scores, lock and whether it is routed to the recovery path.
// The paper's text is not available (../shared/reference/papers.md §2): this is the reading the
// issue fixes, every alternative an option. For unit u at step t = 1, 2, … :
//   n_t      u's gradient norm (L2 over its parameters, before clipping; 0 is valid).
//   GNMR_t   n_t / m_t, m_t the mean of u's history before t: the binary64 sum of the history
//            norms in step order divided by their count (mean = "cumulative"), or (mean = "ema")
//            m = the first history norm, then m ← d·m + (1−d)·n after each later history step.
//            History: every step (history = "all") or only the steps where u ran the low-cost
//            path, i.e. was not selected at t − 1 (history = "low_path"). Undefined while the
//            history is empty or m_t = 0.
//   ΔGNMR_t  GNMR_t / (the binary64 sum, oldest first, of the last δ defined GNMR values of u
//            before t, divided by δ) — values from every step where GNMR was defined, whatever
//            the path, warm-up included. Undefined until there are δ of them, when that mean is 0,
//            or when GNMR_t is undefined.
//   Thresholds α_t, β_t: α, β (threshold = "fixed"), or (threshold = "quantile") the q-quantiles
//            of the defined GNMR_t (ΔGNMR_t) of all units at step t — sorted ascending, h = (n−1)q,
//            x[⌊h⌋] + (h − ⌊h⌋)(x[⌊h⌋+1] − x[⌊h⌋]) (numpy's "linear"); undefined when none is defined.
//   exceeds  never during warm-up (t ≤ W); after it GNMR_t > α_t or ΔGNMR_t > β_t (combine = "and":
//            both). A term with an undefined value or threshold never exceeds.
//   score    the largest of GNMR_t/α_t and ΔGNMR_t/β_t over the terms defined (a threshold of 0
//            gives +∞ for a positive value, 0 for zero); −∞ when none is.
//   select   candidates = exceeders ∪ units whose lock is > 0 entering t; the first max_recover of
//            them (a hard budget) in priority order: "locked_first" — locked units before unlocked
//            exceeders, each group by score descending — or "score" — all by score descending;
//            ties by unit id ascending (byte order).
//   locks    start at 0; after selection a selected unit that exceeds gets lock = T_lock, every
//            other unit with lock > 0 that does not exceed loses one; the rest are unchanged.
//   A unit selected at t runs the recovery path at t + 1 (routing.h rerun: and a re-run of t).
// Non-finite or negative norms are InputErrors naming the step and the unit. The state (below)
// is saved and restored exactly, so a resumed run decides as the uninterrupted one.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <toml++/toml.h>

namespace mantis {

// Defaults (the paper's values could not be recovered: papers.md §2.3): alpha, beta, delta and
// combine from the exceedance sweep of experiments/gnmr/README.md ("Defaults": the least strict
// point whose exceedance stays ≤ 0.2 % of eligible unit-steps on llama-bytes' static int2-per-tensor
// and 4-bit-per-token low paths, tools/gnmr_sweep.py); max_recover, lock and warmup from the
// quality sweep there ("Knobs", experiments/gnmr/knobs.toml: training runs, one knob at a time
// around max_recover 2, lock 16, warm-up 30; a value replaces the centre only where its paired
// 95 % interval excludes 0 in its favour — lock 64 did; max_recover 1 / 4 and warm-up 10 / 100 did
// not). max_recover counts units: 2 is 12.5 % of llama-bytes' 16, so scale it with the model.
struct GnmrOptions {
  double alpha = 2.0, beta = 4.0;
  int delta = 8;
  int max_recover = 2;  // maxO: units per step
  int lock = 64;        // T_lock
  uint64_t warmup = 30;
  bool combine_and = false;        // combine = "or" | "and"
  bool history_low_path = false;   // history = "all" | "low_path"
  bool mean_ema = false;           // mean = "cumulative" | "ema"
  double ema_decay = 0.99;
  bool priority_score = false;     // priority = "locked_first" | "score"
  bool threshold_quantile = false; // threshold = "fixed" | "quantile"
  double quantile = 0.99;
};

// The keys of a [controller] table that GnmrOptions reads, each with its default above.
inline constexpr const char* kGnmrKeys[] = {"alpha",   "beta",      "delta",     "max_recover", "lock",
                                            "warmup",  "combine",   "history",   "mean",        "ema_decay",
                                            "priority", "threshold", "quantile"};
// Reads those keys of `t` (others are the caller's to check); one-line InputErrors "PATH:LINE: …".
GnmrOptions gnmr_options_from_toml(const toml::table& t, const std::string& path);
// InputError unless every option is in range (alpha, beta > 0; delta ≥ 1; ema_decay in [0, 1);
// quantile in [0, 1]).
void validate(const GnmrOptions& o);

inline constexpr double kUndefined = std::numeric_limits<double>::quiet_NaN();

struct GnmrUnitStep {
  double gnmr = kUndefined, dgnmr = kUndefined;  // NaN: undefined
  bool exceeds = false;
  int lock = 0;           // after the update
  bool recovered = false; // selected at this step: the recovery path at the next
};

class Gnmr {
 public:
  // ids: distinct unit ids; norms are passed in this order.
  Gnmr(GnmrOptions o, std::vector<std::string> ids);
  // Step t = steps() + 1. norms[i] belongs to ids[i]. The result is indexed like ids.
  const std::vector<GnmrUnitStep>& step(std::span<const double> norms);
  uint64_t steps() const { return t_; }
  const std::vector<std::string>& ids() const { return ids_; }
  // Indices of ids in byte order (the order of every output table).
  const std::vector<size_t>& order() const { return order_; }
  const std::vector<GnmrUnitStep>& last() const { return last_; }
  // Units selected at every step from `since` (≥ 1) through the last one, for more than T_lock + 1
  // steps (what one exceedance and its lock give): they hold a recovery slot (e.g. a shifted unit
  // whose low_path history never moves).
  struct Held {
    size_t unit;
    uint64_t since;
  };
  std::vector<Held> held() const;
  const GnmrOptions& options() const { return o_; }

  nlohmann::json state() const;
  // InputError (naming what) unless `s` is a state of a controller with these ids.
  void load_state(const nlohmann::json& s);

 private:
  struct Unit {
    double sum = 0;      // cumulative history
    uint64_t count = 0;
    double ema = 0;      // valid when count > 0
    std::vector<double> window;  // the last ≤ δ defined GNMR values, oldest first
    int lock = 0;
    bool selected = false;       // at the previous step
    uint64_t held_since = 0;     // first step of the current run of selections (0: none)
  };
  GnmrOptions o_;
  std::vector<std::string> ids_;
  std::vector<size_t> order_;
  std::vector<Unit> u_;
  std::vector<GnmrUnitStep> last_;
  uint64_t t_ = 0;
};

// One replay row "step,unit,gnmr,dgnmr,exceeds,lock,recovered" (numbers %.17g, empty where
// undefined; no line break), and every unit's row of the last step in byte order of ids (lines).
std::string gnmr_row(uint64_t step, const std::string& id, const GnmrUnitStep& s);
std::string gnmr_rows(const Gnmr& g);
// InputError "PATH:LINE: unknown key 'K' in [controller]" unless every key of a [controller]
// table is name, seed, hold, rerun, recover or one of kGnmrKeys.
void check_controller_keys(const toml::table& t, const std::string& path);
inline constexpr const char* kGnmrHeader = "step,unit,gnmr,dgnmr,exceeds,lock,recovered";

}  // namespace mantis
