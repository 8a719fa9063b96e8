// checkpoint — reading and writing model parameters.
//
// Readers (every one validates header, sizes and dtypes and names the offending tensor):
//   * Hugging Face GPT-2: a directory with model.safetensors + config.json (keys with or without
//     the `transformer.` prefix; Conv1D weights stored [in, out] are transposed; activation
//     "gelu_new" = tanh GELU; lm_head tied);
//   * Hugging Face LLaMA / Mistral (model_type "llama", "mistral"): config.json + safetensors;
//     q_proj and k_proj rows are permuted back from HF's rotate_half order to the consecutive-pair
//     RoPE of nn/attention.h; options the graph cannot compute (rope_scaling, biases, a head_dim
//     other than hidden/heads, hidden_act other than silu) are refused; a sliding_window shorter
//     than max_position_embeddings caps the context to it (where the two attentions agree);
//   * Hugging Face checkpoints may be sharded: model.safetensors.index.json's weight_map names
//     the shard (a file in the same directory) of every tensor; F32, BF16 and F16 convert exactly;
//   * llm.c's gpt2_124M.bin layout (fp32, version 3; padded vocabulary rows dropped);
//   * llama2.c's checkpoint layout (7 int32 header, fp32 tensors; negative vocab = untied);
//   * the project's own: model.safetensors + config.json written by save_model.
// Writers: the project's own format, and Hugging Face's layout, atomically (temp files + rename).
#pragma once

#include <string>

#include "nn/model.h"

namespace mantis {

// PATH is a checkpoint file or a directory holding model.safetensors + config.json.
Model load_model(const std::string& path);
// The config.json save_model writes for this configuration.
std::string model_config_json(const ModelConfig& c);
// A config.json alone, as load_model reads it (the project's own or Hugging Face GPT-2's).
ModelConfig load_model_config(const std::string& path);
// The identity of a model as loaded, whatever file format it came from: SHA-256 (lower-case hex)
// of the text "mantis model v1\n", the configuration's fields (arch vocab ctx layers heads
// kv_heads dim hidden gelu_tanh tied, norm_eps and rope_theta as binary32 bit patterns in hex), then
// per parameter in parameter_shapes order "NAME [SHAPE] SHA-256(its binary32 bytes)\n".
std::string model_sha256(const Model& m);
// Writes DIR/model.safetensors and DIR/config.json (creating DIR), atomically.
void save_model(const Model& m, const std::string& dir);
// Writes DIR/model.safetensors (F32, __metadata__ format "pt") and DIR/config.json as transformers
// saves GPT2LMHeadModel (transformer.* names, Conv1D weights [in, out], no lm_head) or
// LlamaForCausalLM (model.* names, q/k rows in HF's rotate_half order, lm_head when untied),
// atomically; load_model reads it back bit for bit.
void save_model_hf(const Model& m, const std::string& dir);
// The config.json save_model_hf writes for this configuration.
std::string hf_config_json_text(const ModelConfig& c);

}  // namespace mantis
