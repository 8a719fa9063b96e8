// mantis optim replay|synth|list — one optimizer on a recorded gradient stream (exp/replay.h has
// the exact contract): final parameters to OUT, state bytes (and Gefen's periods and codebook)
// reported; synth writes structured random replay inputs for a model; list names the optimizers.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common.h"
#include "exp/replay.h"
#include "io/checkpoint.h"

namespace mantis::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct OptimArgs {
  std::string action;
  ReplayOptions replay;
  bool json = false;
  std::vector<std::pair<std::string, CLI::Option*>> keyed;  // [optimizer] key → its flag
  std::map<std::string, double> values;
  uint64_t seed = 1;
  std::string write_config;
  CLI::Option *optimizer = nullptr, *params = nullptr, *grads = nullptr, *steps = nullptr;
};

void require(const CLI::Option* o, const std::string& action) {
  if (!o->count()) throw InputError(fmt::format("optim {}: {} is required", action, o->get_name()));
}

int run_synth(const OptimArgs& a) {
  for (auto* o : {a.params, a.grads}) require(o, "synth");
  SynthOptions s;
  const std::string& c = a.replay.config;
  if (c.empty()) throw InputError("optim synth: --config CONFIG.json or gpt2-124m is required");
  s.model = c == "gpt2-124m" ? ModelConfig{} : load_model_config(c);  // ModelConfig's defaults: GPT-2 small
  s.steps = a.steps->count() ? a.replay.steps : 1;
  s.seed = a.seed, s.params = a.replay.params, s.grads = a.replay.grads, s.config_out = a.write_config;
  synth_replay_inputs(s);
  fmt::print("wrote {} ({} parameters) and {} ({} steps){}\n", s.params, parameter_count(s.model).values, s.grads,
             s.steps, s.config_out.empty() ? "" : " and " + s.config_out);
  return 0;
}

int run_replay(OptimArgs& a) {
  for (auto* o : {a.optimizer, a.params, a.grads, a.steps}) require(o, "replay");
  ReplayOptions o = a.replay;
  for (auto& [key, opt] : a.keyed)
    if (opt->count()) o.values[key] = a.values[key];
  const ReplayResult r = replay(o);
  if (a.json) {
    ojson j;
    j["optimizer"] = r.optimizer;
    j["steps"] = r.steps;
    j["state_bytes"] = r.state_bytes;
    j["params"] = r.params;
    j["bytes_per_param"] = r.bytes_per_param;
    if (!r.codebook.empty()) {
      j["periods"] = ojson::object();
      for (auto& [name, period] : r.periods) j["periods"][name] = period;
      j["codebook"] = r.codebook;
    }
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{}: {} steps on {} parameters; state {} bytes ({:.4f} per parameter){}\n", r.optimizer, r.steps,
               r.params, r.state_bytes, r.bytes_per_param, o.out.empty() ? "" : "; final parameters in " + o.out);
  }
  return 0;
}

}  // namespace

Runner setup_optim(CLI::App& sub) {
  auto a = std::make_shared<OptimArgs>();
  sub.description(
      "optimizers on recorded gradients: `mantis optim replay --optimizer NAME --params P.safetensors --grads "
      "G.safetensors --steps N --out OUT.safetensors` runs step t on G's tensors t.<t>.<param> at a constant lr "
      "(no schedule, no clipping) and writes the final parameters (contract: src/exp/replay.h). `mantis optim synth "
      "--config CONFIG.json|gpt2-124m --params P --grads G [--steps N --seed S --write-config C]` writes structured "
      "random inputs for a model; `mantis optim list` names the registered optimizers");
  ReplayOptions& o = a->replay;
  sub.add_option("action", a->action, "replay, synth or list")
      ->required()
      ->check(CLI::IsMember({"replay", "synth", "list"}));
  a->optimizer = sub.add_option("--optimizer", o.optimizer, "replay: the registry's name (optim/optimizer.h)");
  a->params = sub.add_option("--params", o.params, "binary32 parameters by name (safetensors; synth: written)")->check(kPath);
  a->grads = sub.add_option("--grads", o.grads, "the gradients t.<step>.<param> (safetensors; synth: written)")->check(kPath);
  a->steps = sub.add_option("--steps", o.steps, "number of steps N (G holds steps 0..N-1; synth default 1)");
  sub.add_option("--seed", a->seed, "synth: the Philox seed")->capture_default_str();
  sub.add_option("--write-config", a->write_config, "synth: also write the model's config.json here")->check(kPath);
  add_out(sub, o.out, "final parameters (safetensors, F32, P's names and order)");
  sub.add_option("--lr", o.lr, "constant learning rate (default 1e-3)");
  for (auto [flag, key] : {std::pair{"--beta1", "beta1"}, {"--beta2", "beta2"}, {"--eps", "eps"},
                           {"--weight-decay", "weight_decay"}})
    a->keyed.push_back({key, sub.add_option(flag, a->values[key],
                                            fmt::format("the optimizer's [optimizer] key {} (default: its own)", key))});
  sub.add_option("--config", o.config,
                 "replay: model config.json (P must be its parameters; roles known); synth: a config.json or gpt2-124m")
      ->check(kPath);
  add_json(sub, a->json, "print one JSON object (optimizer, steps, state_bytes, params, bytes_per_param[, periods, codebook])");
  add_threads(sub);
  return [a] {
    if (a->action == "list") {
      for (auto& e : optimizers()) fmt::print("{}\t{}\n", e.name, e.description);
      return 0;
    }
    return a->action == "synth" ? run_synth(*a) : run_replay(*a);
  };
}

}  // namespace mantis::cli
