// config — a training run's configuration: the TOML form (experiments/train-*.toml) and its checks.
//   out = "DIR"
//   [model]      arch (gpt2 | llama), layers, heads, kv_heads, dim, hidden, ctx, gelu_tanh, tied,
//                norm_eps, rope_theta, init_seed; or init = "PATH" alone: start from a checkpoint
//                (anything io/checkpoint.h load_model reads, the path as given, relative to the
//                working directory) with a fresh optimizer at step 0. Its ModelConfig is the
//                run's, so no other [model] key may stand beside `init` (refused, one line), and
//                its vocabulary must be the tokenizer's. The loaded model's model_sha256 becomes
//                part of the configuration's hash, so a resume refuses a changed init.
//   [data]       tokenizer, train, validation (corpora, io/dataset.h)
//   [train]      steps, batch, accum, lr, min_lr, warmup, grad_clip, seed, val_every, val_seqs,
//                checkpoint_every
//   [optimizer]  name (the registry's, optim/optimizer.h; default adamw) and that optimizer's keys
//   [precision]  policy (policy_from_spec)
//   [activation_quant]  bits, block, rounding, seed, or scheme (a scaled format) (nn/backward.h SavedQuant)
//   [controller] name (gnmr | random | static | oracle), the GNMR keys (train/gnmr.h), seed; and
//                [controller.recover]: the recovery path — the [activation_quant] keys, policy
//                (train/routing.h)
//   [lora]       rank, alpha (0: = rank), units (default all four: "attn.qkv", "attn.proj", "mlp.fc",
//                "mlp.proj"), seed (the adapters' init, default 1): fine-tune low-rank adapters
//                (nn/lora.h) on the [model] init checkpoint, which [lora] requires; its weights stay
//                frozen and only the adapters are optimised, clipped and checkpointed
//                (adapters.safetensors). A unit's gradient norm (units.csv, the controllers) is
//                then its adapters'.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "nn/backward.h"
#include "nn/lora.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/routing.h"

namespace mantis {

struct TrainConfig {
  ModelConfig model;
  uint64_t init_seed = 1;
  std::string tokenizer = "bytes", train_data = "train", val_data = "validation";
  uint64_t steps = 100;
  int batch = 8, accum = 1;
  Schedule schedule;  // lr, min_lr, warmup (steps is set from `steps`)
  double grad_clip = 1.0;
  OptimizerOptions optimizer;  // [optimizer]: the registry's name and that optimizer's keys
  uint64_t seed = 1;
  uint64_t val_every = 0;  // 0: only after the last step
  int val_seqs = 16;
  uint64_t checkpoint_every = 0;  // 0: only after the last step
  std::string policy = "native";  // policy_from_spec
  SavedQuant act_quant;           // bits 0: none
  ControllerConfig controller;    // [controller] (train/routing.h); name empty: none
  std::optional<LoraSpec> lora;   // [lora]: adapters on the init model, base frozen
  uint64_t lora_seed = 1;
  std::string out;                // output directory (the CLI may override)
  std::string init;               // [model] init (empty: init_model(model, init_seed))
  std::string init_sha256;        // model_sha256 of the init model
  std::shared_ptr<const Model> init_model;  // the init model as loaded
  std::string text, path;         // the TOML source and its path
  // SHA-256 of `text`; with an init, of `text` + "\n[model] init sha256 " + init_sha256.
  std::string hash() const;
};

// Parses the TOML form (experiments/train-*.toml); unknown tables or keys are InputErrors naming
// the key and the file.
TrainConfig train_config_from_toml(const std::string& text, const std::string& path);
TrainConfig load_train_config(const std::string& path);

}  // namespace mantis
