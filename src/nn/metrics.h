// metrics — how far a simulated run's logits are from a binary32 reference run on the same tokens.
//
// Per position t (one row of logits [T,V]), with p = softmax(reference row), q = softmax(test
// row), both as log-softmax in binary64 (log p_i = x_i − max − log Σ_j e^(x_j − max)):
//   KL(p ‖ q) = Σ_i p_i (log p_i − log q_i), in nats; terms with p_i = 0 contribute 0. This is
//               LAMP's F.kl_div(log_softmax(test), log_softmax(ref), log_target=True) per row.
//               Identical rows give exactly 0; rounding can make a tiny value negative (kept).
//   flip      : argmax p ≠ argmax q (the first index wins ties).
//   NLL       : −log p_target and −log q_target, when the next token is given.
//   max error : max_i |ref_i − test_i|.
// Non-finite logits (a NaN or ±inf anywhere in the reference or the test row, e.g. a site
// format that overflowed): that position's KL, NLL and max error are +inf — the distribution is
// undefined or degenerate, and no finite number may stand for it. The accumulator counts such
// positions (nonfinite_positions), and its means are then +inf too; the CLI says so in one
// line and writes "inf" (JSON: the string "inf", CSV: inf).
// MetricsAccumulator averages over ALL positions of ALL sequences added (LAMP averages over the
// positions of a sequence, then over sequences: the same number for equal-length sequences),
// and reports perplexity = exp(mean NLL) over the positions that have a target.
#pragma once

#include <Eigen/Dense>

#include <cstdint>
#include <span>
#include <vector>

namespace mantis {

using LogitsF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;   // [T,V]
using LogitsD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;  // [T,V]

// One row each (V logits): KL(softmax(ref) ‖ softmax(test)) in nats.
double kl_divergence(std::span<const float> ref, std::span<const float> test);
double kl_divergence(std::span<const double> ref, std::span<const double> test);
// −log softmax(x)[target], in binary64.
double nll(std::span<const float> x, int32_t target);
double nll(std::span<const double> x, int32_t target);
// The first index of the largest value.
int64_t argmax(std::span<const float> x);
int64_t argmax(std::span<const double> x);

// KL of every position (row); InputError when the shapes differ.
std::vector<double> kl_per_position(const LogitsF& ref, const LogitsF& test);
std::vector<double> kl_per_position(const LogitsD& ref, const LogitsD& test);

class MetricsAccumulator {
 public:
  // Adds one sequence: reference and test logits [T,V]; targets: empty, or T next-token ids
  // (−1: none at that position). InputError on mismatched shapes or a target outside [0, V).
  void add(const LogitsF& ref, const LogitsF& test, std::span<const int32_t> targets = {});
  void add(const LogitsD& ref, const LogitsD& test, std::span<const int32_t> targets = {});

  size_t sequences() const { return sequences_; }
  size_t positions() const { return positions_; }
  size_t targets() const { return targets_; }
  double mean_kl() const;          // nats, over all positions
  double flip_rate() const;        // fraction of positions whose top-1 token changed
  size_t flips() const { return flips_; }
  size_t nonfinite_positions() const { return nonfinite_; }  // rows with a NaN or ±inf logit
  double max_abs_error() const { return max_abs_; }
  double ppl_ref() const;          // exp(mean NLL of the reference); NaN without targets
  double ppl_test() const;

 private:
  template <class T>
  void add_impl(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>& ref,
                const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>& test,
                std::span<const int32_t> targets);
  size_t sequences_ = 0, positions_ = 0, targets_ = 0, flips_ = 0, nonfinite_ = 0;
  double kl_sum_ = 0, nll_ref_sum_ = 0, nll_test_sum_ = 0, max_abs_ = 0;
};

}  // namespace mantis
