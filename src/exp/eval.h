// eval — FP32 (the native policy) and a policy under test on the same windows of real text:
// metrics.h's numbers averaged over every position of every window, per window, and the range
// health of both (forward.h). Written as one result set (study.h) with its manifest.
#pragma once

#include <string>

#include "nn/forward.h"  // ForwardFn

#include "core/progress.h"
#include "exp/study.h"

namespace mantis {

// The ranges run_eval accepts (and the CLI's and Python's options with it).
inline constexpr int kEvalMaxSeqs = 1000000, kEvalMaxCtx = 1 << 24;
struct EvalOptions {
  std::string model;                 // a checkpoint (checkpoint.h load_model)
  std::string policy = "native";     // policy.h policy_from_spec
  std::string data = "validation";   // dataset.h load_tokens
  std::string text;                  // non-empty: this UTF-8 file instead of `data` (dataset.h load_text_tokens)
  int seqs = 16, ctx = 0;            // windows (1..kEvalMaxSeqs); tokens per window (0: the model's context)
  std::string tokenizer;             // empty: the one the model's vocabulary implies (windows.h)
  std::string out;                   // non-empty: write OUT/results.csv, results.json, manifest.json
  std::string device = "cpu";        // where both passes run: recorded; `forward` runs them
  ForwardFn forward;                 // empty: the CPU (nn/forward.h); the GPU's: cuda/forward.h
  ProgressMode progress = ProgressMode::automatic;
};
struct EvalResult {
  std::string report;  // the terminal table (what `mantis eval` prints)
  ojson results;       // results.json
  ojson manifest;      // manifest.json, without "files"
};
// InputError (before any forward pass) for a bad model, policy, data or context.
EvalResult run_eval(const EvalOptions& o);

}  // namespace mantis
