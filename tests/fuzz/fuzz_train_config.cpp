// fuzz_train_config — a training configuration (train/config.h load_train_config: [model], [data],
// [train], [optimizer], [precision], [activation_quant], [controller], [lora]). A configuration
// that loads has its policy spec loaded and checked against its model (what the loop does first).
#include "nn/policy.h"
#include "train/config.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(train_config) {
  const std::string path = fuzz::put("train.toml", data, size);
  fuzz::refused([&] {
    const TrainConfig c = load_train_config(path);
    (void)c.hash();
    policy_from_spec(c.policy).check(c.model);
  });
  return 0;
}
