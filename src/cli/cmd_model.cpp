// mantis logits | eval — run a model on tokens under a precision policy (eval: exp/eval.h).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "common.h"
#include "exp/eval.h"
#include "io/checkpoint.h"
#include "nn/forward.h"
#include "nn/policy.h"

namespace mantis::cli {

namespace {

struct LogitsArgs {
  std::string model, policy = "native", tokens, tokens_file, out;
};

int run_logits(const LogitsArgs& a) {
  if (a.tokens.empty() == a.tokens_file.empty()) throw InputError("give exactly one of --tokens and --tokens-file");
  check_output_path(a.out, "--out");
  const std::vector<int64_t> ids = a.tokens.empty() ? parse_token_ids(read_text_file(a.tokens_file, "token file"), a.tokens_file)
                                                    : parse_token_ids(a.tokens, "--tokens");
  std::vector<int32_t> tokens;
  for (int64_t id : ids) tokens.push_back(int32_t(id));  // < 2^31 (parse_token_ids); forward checks V
  const Policy policy = policy_from_spec(a.policy);
  const Model model = load_model(a.model);
  const Matrix<float> logits = forward<float>(model, tokens, policy);  // [T, V]
  const int64_t shape[2] = {logits.rows(), logits.cols()};
  write_npy(a.out, std::span<const float>(logits.data(), size_t(logits.size())), shape);
  return 0;
}

}  // namespace

Runner setup_logits(CLI::App& sub) {
  auto a = std::make_shared<LogitsArgs>();
  sub.description("the logits of one token sequence as a float32 .npy of shape [T, vocab]");
  sub.add_option("--model,-m", a->model, kModelHelp)->required()->check(kPath);
  sub.add_option("--policy,-p", a->policy, kPolicyHelp)->capture_default_str();
  sub.add_option("--tokens", a->tokens, "token ids, space-separated (\"ID ID ...\")");
  sub.add_option("--tokens-file", a->tokens_file, "a file of whitespace-separated token ids")->check(kPath);
  add_out(sub, a->out, "the .npy file to write (atomically)")->required();
  add_threads(sub);
  return [a] { return run_logits(*a); };
}

Runner setup_eval(CLI::App& sub) {
  auto o = std::make_shared<EvalOptions>();
  sub.description(
      "run FP32 (native) and a policy on the same windows of real text; print KL, top-1 flips, perplexities and "
      "the largest logit error, averaged over every position of every window");
  sub.add_option("--model,-m", o->model, kModelHelp)->required()->check(kPath);
  sub.add_option("--policy,-p", o->policy, kPolicyHelp)->capture_default_str();
  auto* data = sub.add_option("--data,-d", o->data,
                               "train|validation|test (all corpora), <corpus>/<split> (austen, kjv, web, brown, "
                               "jargon), a .tok shard, a .npy token array (1-D int32/int64/uint16/uint32) or an "
                               "llm.c token shard (.bin)")
                   ->capture_default_str();
  sub.add_option("--text", o->text,
                 "a UTF-8 text file instead of --data, tokenized on the fly with the model's tokenizer (--tokenizer)")
      ->check(kPath)
      ->excludes(data);
  sub.add_option("--seqs,-n", o->seqs, "windows, spread evenly over the data")->capture_default_str()->check(CLI::Range(1, kEvalMaxSeqs));
  sub.add_option("--ctx,-T", o->ctx, "tokens per window (default: the model's context)")->check(CLI::Range(1, kEvalMaxCtx));
  sub.add_option("--tokenizer,-t", o->tokenizer, "tokenizer of the data (default: bytes for V = 256, gpt2 for V = 50257)");
  add_out(sub, o->out, "write DIR/results.csv, DIR/results.json, DIR/manifest.json (atomically)");
  add_figures(sub);
  auto dev = std::make_shared<DeviceArgs>();
  add_device(sub, *dev);
  add_threads(sub);
  add_progress(sub);
  return [o, dev] {
    EvalOptions e = *o;
    e.progress = shared().progress_mode();
    e.device = dev->device == "cpu" ? "cpu" : dev->device + "/" + dev->attention;
    e.forward = device_forward(*dev);
    const EvalResult r = run_eval(e);
    std::string text = r.report;
    if (!e.out.empty()) text += fmt::format("wrote {0}/results.csv, {0}/results.json, {0}/manifest.json\n", e.out);
    std::fwrite(text.data(), 1, text.size(), stdout);
    report_figures(e.out);
    return 0;
  };
}

}  // namespace mantis::cli
