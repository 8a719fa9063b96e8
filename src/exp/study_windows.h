// study_windows — what the studies that evaluate a model on real text share (the LAMP sweep, the
// policy sweep): the model, the windows every cell is evaluated on, the key fields they contribute,
// and the FP32 logits of each window, computed once per process and shared by every cell.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "exp/study.h"  // ojson
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "nn/forward.h"

namespace mantis {

struct StudyWindows {
  Model model;
  int ctx = 0;  // tokens per window
  std::unique_ptr<Tokenizer> tok;
  TokenData data;
  std::vector<size_t> starts;  // window starts in data.tokens
  ojson sources;               // data_sources_json without "file" (a key must not depend on the checkout)
  ojson model_key;             // the model's files by base name and SHA-256
  ojson data_key;              // tokenizer, sources, ctx, window starts
  ForwardFn forward;           // where the passes run (empty: the CPU)

  // The FP32 (native) logits [T, V] of window w.
  const Matrix<float>& reference(size_t w);
  // The manifest's "data" for the configuration's data spec.
  ojson manifest_data(const std::string& spec) const;

 private:
  std::map<size_t, Matrix<float>> ref_;
};

// InputError (before anything runs) for a bad model, context, tokenizer or data. ctx 0: the
// model's; `where` names the tokenizer's setting in errors.
StudyWindows open_study_windows(const std::string& model, int ctx, const std::string& tokenizer, const std::string& data,
                                int seqs, const std::string& where, ForwardFn forward);

}  // namespace mantis
