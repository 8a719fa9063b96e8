#include "exp/study_windows.h"

#include <fmt/format.h>

#include "core/file.h"
#include "exp/manifest.h"
#include "io/checkpoint.h"
#include "io/windows.h"

namespace mantis {

const Matrix<float>& StudyWindows::reference(size_t w) {
  auto it = ref_.find(w);
  if (it != ref_.end()) return it->second;
  return ref_.emplace(w, forward_on(forward, model, window_at(data.tokens, starts[w], ctx).inputs, Policy{}))
      .first->second;
}

ojson StudyWindows::manifest_data(const std::string& spec) const {
  return {{"spec", spec}, {"tokenizer", tok->id()}, {"sources", sources}, {"windows", starts.size()}, {"ctx", ctx},
          {"window_starts", starts}};
}

StudyWindows open_study_windows(const std::string& model, int ctx, const std::string& tokenizer, const std::string& data,
                                int seqs, const std::string& where, ForwardFn forward) {
  StudyWindows s;
  s.model = load_model(model);
  s.ctx = ctx == 0 ? s.model.cfg.ctx : ctx;
  if (s.ctx < 1 || s.ctx > s.model.cfg.ctx)
    throw InputError(fmt::format("ctx {} is outside 1..{}", s.ctx, s.model.cfg.ctx));
  s.tok = tokenizer_for_model(tokenizer, s.model.cfg.vocab, where, model);
  s.data = load_tokens(data, *s.tok);
  s.starts = window_starts(s.data.tokens.size(), size_t(seqs), size_t(s.ctx) + 1);
  s.sources = data_sources_json(s.data);
  for (auto& src : s.sources) src.erase("file");
  s.model_key = model_files_json(model, true);
  s.data_key = {{"tokenizer", s.tok->id()}, {"sources", s.sources}, {"ctx", s.ctx}, {"window_starts", s.starts}};
  s.forward = std::move(forward);
  return s;
}

}  // namespace mantis
