// mantis optim replay — one optimizer on a recorded gradient stream (exp/replay.h has the exact
// contract): final parameters to OUT, state bytes (and Gefen's periods and codebook) reported.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common.h"
#include "exp/replay.h"

namespace mantis::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct OptimArgs {
  std::string action;
  ReplayOptions replay;
  bool json = false;
  std::vector<std::pair<std::string, CLI::Option*>> keyed;  // [optimizer] key → its flag
  std::map<std::string, double> values;
};

int run_replay(OptimArgs& a) {
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
      "(no schedule, no clipping) and writes the final parameters (contract: src/exp/replay.h)");
  ReplayOptions& o = a->replay;
  sub.add_option("action", a->action, "replay")->required()->check(CLI::IsMember({"replay"}));
  sub.add_option("--optimizer", o.optimizer, "the registry's name (optim/optimizer.h)")->required();
  sub.add_option("--params", o.params, "binary32 parameters by name (safetensors)")->required()->check(kPath);
  sub.add_option("--grads", o.grads, "the gradients t.<step>.<param> (safetensors)")->required()->check(kPath);
  sub.add_option("--steps", o.steps, "number of steps N (G holds steps 0..N-1)")->required();
  add_out(sub, o.out, "final parameters (safetensors, F32, P's names and order)");
  sub.add_option("--lr", o.lr, "constant learning rate (default 1e-3)");
  for (auto [flag, key] : {std::pair{"--beta1", "beta1"}, {"--beta2", "beta2"}, {"--eps", "eps"},
                           {"--weight-decay", "weight_decay"}})
    a->keyed.push_back({key, sub.add_option(flag, a->values[key],
                                            fmt::format("the optimizer's [optimizer] key {} (default: its own)", key))});
  sub.add_option("--config", o.config, "model config.json: P must be its parameters; roles known")->check(kPath);
  add_json(sub, a->json, "print one JSON object (optimizer, steps, state_bytes, params, bytes_per_param[, periods, codebook])");
  add_threads(sub);
  return [a] { return run_replay(*a); };
}

}  // namespace mantis::cli
