#include "exp/eval.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "core/file.h"
#include "exp/manifest.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/windows.h"
#include "nn/forward.h"
#include "nn/metrics.h"
#include "nn/policy.h"

namespace mantis {

namespace {

namespace fs = std::filesystem;

ojson config_json(const ModelConfig& c) {
  return {{"arch", c.arch == Arch::gpt2 ? "gpt2" : "llama"},
          {"vocab", c.vocab},
          {"ctx", c.ctx},
          {"layers", c.layers},
          {"heads", c.heads},
          {"kv_heads", c.kv_heads},
          {"dim", c.dim},
          {"hidden", c.hidden},
          {"gelu_tanh", c.gelu_tanh},
          {"tied", c.tied}};
}

// The seeds of every randomly rounding entry ("attn.qk", "layer.3.attn.qk"): the run's randomness.
ojson policy_seeds(const Policy& p) {
  ojson seeds = ojson::object();
  auto add = [&](const std::string& name, const SitePolicy& s) {
    if (!s.is_native() && (s.rounding == Rounding::sr || s.rounding == Rounding::sre)) seeds[name] = s.seed;
  };
  for (int i = 0; i < kSiteCount; ++i) add(to_string(Site(i)), p.all[i]);
  for (auto& [key, s] : p.layer) add(fmt::format("layer.{}.{}", key.first, to_string(key.second)), s);
  return seeds;
}

std::string policy_text(const Policy& p) {
  std::string d = describe(p);
  while (!d.empty() && d.back() == '\n') d.pop_back();
  return d;
}

std::string num(double x) { return std::isnan(x) ? "nan" : fmt::format("{:.9g}", x); }

ojson metrics_json(const MetricsAccumulator& m) {
  const auto j = json_number;
  return {{"positions", m.positions()}, {"kl_mean", j(m.mean_kl())},   {"flip_rate", j(m.flip_rate())},
          {"flips", m.flips()},         {"ppl_ref", j(m.ppl_ref())},   {"ppl_test", j(m.ppl_test())},
          {"max_abs_logit_error", j(m.max_abs_error())}, {"nonfinite_positions", m.nonfinite_positions()}};
}

std::string csv_quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

EvalResult run_eval(const EvalOptions& o) {
  const Stopwatch total;
  const std::string started = utc_now();
  // Checked as signed numbers, before any conversion (seqs = -1 was read as 2^64 − 1 windows).
  if (o.seqs < 1 || o.seqs > kEvalMaxSeqs)
    throw InputError(fmt::format("--seqs {} is outside 1..{}", o.seqs, kEvalMaxSeqs));
  if (o.ctx < 0 || o.ctx > kEvalMaxCtx)
    throw InputError(fmt::format("--ctx {} is outside 1..{} (or 0: the model's context)", o.ctx, kEvalMaxCtx));
  const Policy policy = policy_from_spec(o.policy);
  const Model model = load_model(o.model);
  policy.check(model.cfg);
  const int ctx = o.ctx == 0 ? model.cfg.ctx : o.ctx;
  if (ctx < 1 || ctx > model.cfg.ctx)
    throw InputError(fmt::format("--ctx {} is outside 1..{} (the model's context)", ctx, model.cfg.ctx));
  const auto tok = tokenizer_for_model(o.tokenizer, model.cfg.vocab, "--tokenizer", o.model);
  // Every id is checked against the tokenizer's vocabulary here (dataset.h), which is no larger
  // than the model's (tokenizer_for_model): no id outside it reaches a forward pass.
  const TokenData data = o.text.empty() ? load_tokens(o.data, *tok) : load_text_tokens(o.text, *tok);
  const std::string data_name = o.text.empty() ? o.data : o.text;  // what the report and the CSV call it
  const auto starts = window_starts(data.tokens.size(), size_t(o.seqs), size_t(ctx) + 1);
  const double load_s = total.seconds();

  MetricsAccumulator all;
  HealthTable health, health_ref;  // the policy's and the FP32 reference's range events
  ojson seqs = ojson::array();
  double ref_s = 0, test_s = 0;
  {
    Progress progress("eval", starts.size(), o.progress, "windows");
    for (size_t w = 0; w < starts.size(); ++w) {
      const Window win = window_at(data.tokens, starts[w], ctx);
      Stopwatch sw;
      ForwardStats st_ref, st;
      const Matrix<float> ref = forward_on(o.forward, model, win.inputs, Policy{}, &st_ref);  // [T, V] FP32 ground truth
      ref_s += sw.seconds();
      sw = Stopwatch{};
      const Matrix<float> test = forward_on(o.forward, model, win.inputs, policy, &st);  // [T, V]
      test_s += sw.seconds();
      health.add(st, model.cfg.layers), health_ref.add(st_ref, model.cfg.layers);
      MetricsAccumulator one;
      one.add(ref, test, win.targets);
      all.add(ref, test, win.targets);
      ojson s = metrics_json(one);
      s["start"] = starts[w];
      seqs.push_back(s);
      progress.update(w + 1, fmt::format("KL {:.3e}  ppl {:.3f} / {:.3f}", all.mean_kl(), all.ppl_ref(), all.ppl_test()));
    }
  }

  EvalResult r;
  const std::string pol = policy_text(policy);
  std::string& t = r.report;
  t += fmt::format("model        {} ({}, L={}, C={}, NH={}, V={}, T={})\n", o.model,
                   model.cfg.arch == Arch::gpt2 ? "gpt2" : "llama", model.cfg.layers, model.cfg.dim, model.cfg.heads,
                   model.cfg.vocab, model.cfg.ctx);
  t += fmt::format("policy       {}\n", o.policy);
  if (o.device != "cpu") t += fmt::format("device       {}\n", o.device);
  std::string indented = pol;
  for (size_t p = 0; (p = indented.find('\n', p)) != std::string::npos; p += 14) indented.replace(p, 1, "\n             ");
  t += fmt::format("             {}\n", indented);
  t += fmt::format("data         {}{} ({} tokens, tokenizer {}): {} windows of {} tokens + 1 target\n",
                   o.text.empty() ? "" : "text ", data_name, data.tokens.size(), tok->id(), starts.size(), ctx);
  t += fmt::format("{:<26}{:>16}{:>16}\n", "", "reference FP32", "policy");
  t += fmt::format("{:<26}{:>16.6f}{:>16.6f}\n", "perplexity", all.ppl_ref(), all.ppl_test());
  t += fmt::format("{:<26}{:>16}{:>16.6e}\n", "KL(ref || policy), nats", "", all.mean_kl());
  t += fmt::format("{:<26}{:>16}{:>16}\n", "top-1 flips", "",
                   fmt::format("{:.4f}% ({}/{})", 100 * all.flip_rate(), all.flips(), all.positions()));
  t += fmt::format("{:<26}{:>16}{:>16.6e}\n", "max |logit error|", "", all.max_abs_error());
  t += fmt::format("{:<26}{:>16.3f}{:>16.3f}\n", "forward time (s)", ref_s, test_s);
  if (all.nonfinite_positions())
    t += fmt::format("NON-FINITE LOGITS at {} of {} positions: KL, perplexity and max error are reported as inf "
                     "(the site health below shows where values left the format's range)\n",
                     all.nonfinite_positions(), all.positions());
  if (!health_ref.at.empty()) t += fmt::format("site health, FP32 reference (overflows, NaNs, infinities):\n{}", health_ref.table());
  if (!health.at.empty()) t += fmt::format("site health, policy (overflows, NaNs, infinities):\n{}", health.table());

  r.results["summary"] = metrics_json(all);
  r.results["summary"]["sequences"] = all.sequences();
  r.results["sequences"] = seqs;
  r.results["health"] = health.json();
  r.results["health_reference"] = health_ref.json();

  ojson& man = r.manifest;
  man = manifest_header("mantis eval");
  man["started_utc"] = started;
  man["config"] = {{"model", o.model},
                   {"model_config", config_json(model.cfg)},
                   {"policy", o.policy},
                   {"policy_description", pol},
                   {o.text.empty() ? "data" : "text", data_name},
                   {"tokenizer", tok->id()},
                   {"seqs", o.seqs},
                   {"ctx", ctx},
                   {"window_rule", "window i starts at i*floor((n - (ctx+1)) / (seqs - 1)) tokens; inputs "
                                   "tokens[start, start+ctx), targets shifted by one"},
                   {"window_starts", starts}};
  if (o.device != "cpu") man["config"]["device"] = o.device;  // (absent: the CPU, as before the GPU existed)
  std::error_code ec;
  if (fs::is_regular_file(o.policy, ec)) man["config"]["policy_sha256"] = sha256_file(o.policy);
  man["seed"] = policy_seeds(policy);
  man["seeds"] = man["seed"];
  man["model_files"] = model_files_json(o.model);
  man["data"] = {{"tokens", data.tokens.size()}, {"sources", data_sources_json(data)}};

  man["timings_s"] = {{"load", load_s}, {"reference_forward", ref_s}, {"policy_forward", test_s},
                      {"total", total.seconds()}};

  if (!o.out.empty()) {
    fs::create_directories(o.out, ec);
    if (ec || !fs::is_directory(o.out, ec)) throw InputError(fmt::format("cannot create directory {}", o.out));
    const std::string csv_head =
        "model,policy,data,seqs,ctx_tokens,positions,kl_mean_nats,flip_rate,flips,ppl_ref,ppl_test,"
        "max_abs_logit_error,nonfinite_positions,overflow,nan,inf,ref_seconds,policy_seconds\n";
    const std::string csv =
        csv_head + fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f}\n", csv_quote(o.model),
                               csv_quote(o.policy), csv_quote(data_name), starts.size(), ctx, all.positions(),
                               num(all.mean_kl()), num(all.flip_rate()), all.flips(), num(all.ppl_ref()),
                               num(all.ppl_test()), num(all.max_abs_error()), all.nonfinite_positions(),
                               health.total().overflow, health.total().nan, health.total().inf, ref_s, test_s);
    write_result_set(o.out, {{"results.csv", csv}, {"results.json", r.results.dump(1) + "\n"}}, man);
  }
  return r;
}

}  // namespace mantis
