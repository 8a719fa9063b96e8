// mantis logits | eval — run a model on tokens under a precision policy.
//
// eval: FP32 ground truth (the native policy) and the policy under test on the same windows of
// real text; metrics.h's numbers averaged over every position of every window.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "common.h"
#include "io/dataset.h"
#include "nn/forward.h"
#include "mantis_config.h"
#include "mantis_git.h"
#include "nn/metrics.h"
#include "nn/policy.h"
#include "core/round_array.h"
#include "exp/study.h"
#include "io/tokenizer.h"

namespace mantis::cli {

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

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string num(double x) { return std::isnan(x) ? "nan" : fmt::format("{:.9g}", x); }

ojson metrics_json(const MetricsAccumulator& m) {
  const auto j = json_number;
  return {{"positions", m.positions()}, {"kl_mean", j(m.mean_kl())},   {"flip_rate", j(m.flip_rate())},
          {"flips", m.flips()},         {"ppl_ref", j(m.ppl_ref())},   {"ppl_test", j(m.ppl_test())},
          {"max_abs_logit_error", j(m.max_abs_error())}, {"nonfinite_positions", m.nonfinite_positions()}};
}

std::unique_ptr<Tokenizer> tokenizer_for(const EvalArgs& a, const ModelConfig& c) {
  if (!a.tokenizer.empty()) return make_tokenizer(a.tokenizer);
  if (c.vocab == 256) return make_tokenizer("bytes");
  if (c.vocab == int(kGpt2EndOfText) + 1) return make_tokenizer("gpt2");
  throw InputError(fmt::format("cannot tell the tokenizer of a model with vocabulary {}: pass --tokenizer gpt2|bytes",
                               c.vocab));
}

}  // namespace

int run_logits(const LogitsArgs& a) {
  apply_threads(a.threads);
  if (a.tokens.empty() == a.tokens_file.empty()) throw InputError("give exactly one of --tokens and --tokens-file");
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

int run_eval(const EvalArgs& a) {
  const Stopwatch total;
  apply_threads(a.threads);
  const std::string started = utc_now();
  const Policy policy = policy_from_spec(a.policy);
  const Model model = load_model(a.model);
  policy.check(model.cfg);
  const int ctx = a.ctx == 0 ? model.cfg.ctx : a.ctx;
  if (ctx < 1 || ctx > model.cfg.ctx)
    throw InputError(fmt::format("--ctx {} is outside 1..{} (the model's context)", ctx, model.cfg.ctx));
  const auto tok = tokenizer_for(a, model.cfg);
  if (int64_t(tok->vocab_size()) > model.cfg.vocab)
    throw InputError(fmt::format("tokenizer '{}' has {} tokens but the model's vocabulary is {}", tok->id(),
                                 tok->vocab_size(), model.cfg.vocab));
  const TokenData data = load_tokens(a.data, *tok, data_root());
  const auto starts = window_starts(data.tokens.size(), size_t(a.seqs), size_t(ctx) + 1);
  const double load_s = total.seconds();

  MetricsAccumulator all;
  HealthTable health, health_ref;  // the policy's and the FP32 reference's range events
  ojson seqs = ojson::array();
  double ref_s = 0, test_s = 0;
  const bool progress = !a.quiet && stderr_is_tty();
  for (size_t w = 0; w < starts.size(); ++w) {
    std::vector<int32_t> in(static_cast<size_t>(ctx)), target(static_cast<size_t>(ctx));  // [T] inputs, next tokens
    for (int t = 0; t < ctx; ++t) {
      in[size_t(t)] = int32_t(data.tokens[starts[w] + size_t(t)]);
      target[size_t(t)] = int32_t(data.tokens[starts[w] + size_t(t) + 1]);
    }
    Stopwatch sw;
    ForwardStats st_ref, st;
    const Matrix<float> ref = forward<float>(model, in, Policy{}, &st_ref);  // [T, V] FP32 ground truth
    ref_s += sw.seconds();
    sw = Stopwatch{};
    const Matrix<float> test = forward<float>(model, in, policy, &st);   // [T, V]
    test_s += sw.seconds();
    health.add(st, model.cfg.layers), health_ref.add(st_ref, model.cfg.layers);
    MetricsAccumulator one;
    one.add(ref, test, target);
    all.add(ref, test, target);
    ojson s = metrics_json(one);
    s["start"] = starts[w];
    seqs.push_back(s);
    if (progress)
      fmt::print(stderr, "\reval: window {}/{}  KL {:.3e}  ppl {:.3f} / {:.3f}   ", w + 1, starts.size(), all.mean_kl(),
                 all.ppl_ref(), all.ppl_test());
  }
  if (progress) fmt::print(stderr, "\n");

  const std::string pol = policy_text(policy);
  fmt::print("model        {} ({}, L={}, C={}, NH={}, V={}, T={})\n", a.model,
             model.cfg.arch == Arch::gpt2 ? "gpt2" : "llama", model.cfg.layers, model.cfg.dim, model.cfg.heads,
             model.cfg.vocab, model.cfg.ctx);
  fmt::print("policy       {}\n", a.policy);
  std::string indented = pol;
  for (size_t p = 0; (p = indented.find('\n', p)) != std::string::npos; p += 14) indented.replace(p, 1, "\n             ");
  fmt::print("             {}\n", indented);
  fmt::print("data         {} ({} tokens, tokenizer {}): {} windows of {} tokens + 1 target\n", a.data,
             data.tokens.size(), tok->id(), starts.size(), ctx);
  fmt::print("{:<26}{:>16}{:>16}\n", "", "reference FP32", "policy");
  fmt::print("{:<26}{:>16.6f}{:>16.6f}\n", "perplexity", all.ppl_ref(), all.ppl_test());
  fmt::print("{:<26}{:>16}{:>16.6e}\n", "KL(ref || policy), nats", "", all.mean_kl());
  fmt::print("{:<26}{:>16}{:>16}\n", "top-1 flips", "",
             fmt::format("{:.4f}% ({}/{})", 100 * all.flip_rate(), all.flips(), all.positions()));
  fmt::print("{:<26}{:>16}{:>16.6e}\n", "max |logit error|", "", all.max_abs_error());
  fmt::print("{:<26}{:>16.3f}{:>16.3f}\n", "forward time (s)", ref_s, test_s);
  if (all.nonfinite_positions())
    fmt::print("NON-FINITE LOGITS at {} of {} positions: KL, perplexity and max error are reported as inf "
               "(the site health below shows where values left the format's range)\n",
               all.nonfinite_positions(), all.positions());
  if (!health_ref.at.empty()) fmt::print("site health, FP32 reference (overflows, NaNs, infinities):\n{}", health_ref.table());
  if (!health.at.empty()) fmt::print("site health, policy (overflows, NaNs, infinities):\n{}", health.table());

  if (!a.out.empty()) {
    std::error_code ec;
    fs::create_directories(a.out, ec);
    if (ec || !fs::is_directory(a.out, ec)) throw InputError(fmt::format("cannot create directory {}", a.out));
    const std::string csv_head =
        "model,policy,data,seqs,ctx,positions,kl_mean,flip_rate,flips,ppl_ref,ppl_test,max_abs_logit_error,"
        "nonfinite_positions,overflow,nan,inf,seconds_ref,seconds_policy\n";
    auto quote = [](const std::string& s) {
      std::string q = "\"";
      for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
      return q + "\"";
    };
    const std::string csv =
        csv_head + fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f}\n", quote(a.model),
                               quote(a.policy), quote(a.data), starts.size(), ctx, all.positions(), num(all.mean_kl()),
                               num(all.flip_rate()), all.flips(), num(all.ppl_ref()), num(all.ppl_test()),
                               num(all.max_abs_error()), all.nonfinite_positions(), health.total().overflow,
                               health.total().nan, health.total().inf, ref_s, test_s);
    ojson results;
    results["summary"] = metrics_json(all);
    results["summary"]["sequences"] = all.sequences();
    results["sequences"] = seqs;
    results["health"] = health.json();
    results["health_reference"] = health_ref.json();
    ojson man;
    man["mantis_version"] = MANTIS_VERSION;
    man["git_commit"] = MANTIS_GIT_COMMIT;
    man["command"] = a.command;
    man["started_utc"] = started;
    man["threads"] = num_threads();
    man["config"] = {{"model", a.model},
                     {"model_config", config_json(model.cfg)},
                     {"policy", a.policy},
                     {"policy_description", pol},
                     {"data", a.data},
                     {"tokenizer", tok->id()},
                     {"seqs", a.seqs},
                     {"ctx", ctx},
                     {"window_rule", "window i starts at i*floor((n - (ctx+1)) / (seqs - 1)) tokens; inputs "
                                     "tokens[start, start+ctx), targets shifted by one"},
                     {"window_starts", starts}};
    if (fs::is_regular_file(a.policy, ec)) man["config"]["policy_sha256"] = sha256_file(a.policy);
    man["seed"] = policy_seeds(policy);
    man["model_files"] = model_files_json(a.model);
    ojson sources = ojson::array();
    for (auto& s : data.sources)
      sources.push_back({{"name", s.name}, {"file", s.origin}, {"sha256", s.sha256}, {"tokens", s.tokens}});
    man["data"] = {{"tokens", data.tokens.size()}, {"sources", sources}};
    man["timings_s"] = {{"load", load_s}, {"reference_forward", ref_s}, {"policy_forward", test_s},
                        {"total", total.seconds()}};
    write_result_set(a.out, {{"results.csv", csv}, {"results.json", results.dump(1) + "\n"}}, man);
    fmt::print("wrote {0}/results.csv, {0}/results.json, {0}/manifest.json\n", a.out);
  }
  return 0;
}

}  // namespace mantis::cli
