// fuzz_policy — a precision policy's TOML (nn/policy.h policy_from_toml) and, for a short input
// without '/', a policy spec (policy_from_spec: "native", "lamp:<μ>"). A policy that loads is
// compiled for a tiny GPT-2 and a tiny LLaMA model (PolicyPlan: Policy::check, every site's plan)
// and runs their forward pass on four tokens, where every setting it validated must be usable.
#include <cstdint>
#include <vector>

#include "nn/forward.h"
#include "nn/policy.h"
#include "fuzz.h"

using namespace mantis;

namespace {

void use(const Policy& p) {
  static const Model models[] = {init_model(fuzz::tiny_config(Arch::gpt2), 1),
                                 init_model(fuzz::tiny_config(Arch::llama), 1)};
  const int32_t tokens[] = {1, 5, 0, 15};
  (void)describe(p);
  for (const Model& m : models)
    fuzz::refused([&] {
      const PolicyPlan plan(p, m.cfg);
      (void)forward<float>(m, tokens, plan);
    });
}

}  // namespace

MANTIS_FUZZ_TARGET(policy) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::refused([&] { use(policy_from_toml(text, "fuzz.toml")); });
  if (size <= 64 && text.find('/') == std::string::npos) fuzz::refused([&] { use(policy_from_spec(text)); });
  return 0;
}
