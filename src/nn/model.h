// model — transformer configurations and their parameters as named tensors.
//
// Two families, sized by config:
//   gpt2  : learned positions, pre-LN LayerNorm, GELU (exact erf or tanh), causal multi-head
//           attention, tied embeddings.
//   llama : RMSNorm, SwiGLU, RoPE, grouped-query attention, optionally untied output.
// Parameters live in one map from name to a row-major float tensor. Linear weights are stored
// [out, in] (y = x·Wᵀ + b), whatever the checkpoint's layout; checkpoint readers transpose.
// Dimension alphabet (llm.c style): V vocab, T context, C model width, L layers, NH heads,
// NKV key/value heads, HS head size = C/NH, H MLP hidden width.
//
// Names (gpt2), per layer l:
//   wte [V,C]  wpe [T,C]  ln_f.weight [C]  ln_f.bias [C]
//   h.l.ln_1.weight [C]  h.l.ln_1.bias [C]  h.l.attn.c_attn.weight [3C,C]  h.l.attn.c_attn.bias [3C]
//   h.l.attn.c_proj.weight [C,C]  h.l.attn.c_proj.bias [C]  h.l.ln_2.weight [C]  h.l.ln_2.bias [C]
//   h.l.mlp.c_fc.weight [H,C]  h.l.mlp.c_fc.bias [H]  h.l.mlp.c_proj.weight [C,H]  h.l.mlp.c_proj.bias [C]
// Names (llama), per layer l:
//   tok_embeddings [V,C]  norm [C]  output [V,C] (only when untied)
//   layers.l.attention_norm [C]  layers.l.attention.wq [C,C]  layers.l.attention.wk [NKV·HS,C]
//   layers.l.attention.wv [NKV·HS,C]  layers.l.attention.wo [C,C]  layers.l.ffn_norm [C]
//   layers.l.feed_forward.w1 [H,C] (gate)  layers.l.feed_forward.w3 [H,C] (up)  layers.l.feed_forward.w2 [C,H] (down)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mantis {

enum class Arch : uint8_t { gpt2, llama };

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int vocab = 50257;      // V
  int ctx = 1024;         // T, the longest sequence
  int layers = 12;        // L
  int heads = 12;         // NH
  int kv_heads = 12;      // NKV (gpt2: = heads)
  int dim = 768;          // C
  int hidden = 3072;      // H
  bool gelu_tanh = false; // gpt2: "gelu_new" (tanh approximation) instead of exact erf
  bool tied = true;       // output projection = token embedding
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;  // llama

  int head_size() const { return dim / heads; }
  bool operator==(const ModelConfig&) const = default;
};

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// LoRA adapters on a model's projection weights (nn/lora.h: their forward, backward, merge).
// Empty unless a fine-tuning run attaches them; the base parameters are then frozen.
struct Adapters {
  int rank = 0;        // r (0: no adapters)
  double alpha = 0;    // the adapter's output is scaled by alpha / r
  // "<weight>.lora_A" [r,in] and "<weight>.lora_B" [out,r] for each adapted weight [out,in]
  std::map<std::string, Tensor> params;
};

struct Model {
  ModelConfig cfg;
  std::map<std::string, Tensor> params;
  Adapters lora;
};

// Throws InputError naming the field unless the configuration is consistent.
void validate(const ModelConfig& c);

// What a parameter is to the graphs (forward.h), whatever its checkpoint name.
enum class Role : uint8_t {
  tok_emb,   // wte, tok_embeddings (also the output projection when tied)
  pos_emb,   // wpe
  attn_qkv,  // gpt2's fused c_attn: rows q | k | v
  wq, wk, wv,
  attn_proj, // c_proj, wo
  mlp_fc,    // gpt2's c_fc
  mlp_gate,  // llama's w1
  mlp_up,    // llama's w3
  mlp_proj,  // gpt2's mlp.c_proj, llama's w2
  norm1,     // ln_1, attention_norm
  norm2,     // ln_2, ffn_norm
  norm_f,    // ln_f, norm
  lm_head,   // llama's untied output
};
constexpr int kRoleCount = 15;

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int layer = -1;     // −1: outside the layers
  Role role = Role::tok_emb;
  bool bias = false;  // a Linear's or LayerNorm's bias (else its weight)
  // How the rows (a 1-D bias: the values) split into attention heads: head_blocks consecutive
  // blocks of head_rows = HS rows, block b holding head b's rows; gpt2's c_attn has 3·NH blocks
  // (q heads 0..NH−1, then the k heads, then the v heads), wq NH, wk and wv NKV (grouped-query:
  // query head h reads key/value block h / (NH/NKV)). 0 for every other parameter.
  int head_blocks = 0;
  int64_t head_rows = 0;
};

// Every parameter the configuration requires, in a fixed order (checkpoints, optimizer state).
std::vector<ParamInfo> parameter_infos(const ModelConfig& c);
// Their names and shapes, in the same order.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& c);
// How many tensors and values parameter_shapes(c) lists, computed without listing them (so a
// reader can compare a configuration with a file before allocating anything proportional to it);
// saturated at INT64_MAX.
struct ParameterCount {
  int64_t tensors = 0, values = 0;
};
ParameterCount parameter_count(const ModelConfig& c);
// Throws InputError naming the offending tensor: missing, unexpected, wrong shape, NaN/inf.
void validate(const Model& m);

// A freshly initialised model, GPT-2's recipe: weights N(0, 0.02) (wpe N(0, 0.01)), the residual
// output projections (attn.c_proj, mlp.c_proj, wo, w2) N(0, 0.02/√(2L)), norm weights 1, biases 0.
// Normal deviates by Box–Muller from Philox words (seed, stream = the tensor's index in
// parameter_shapes, index 2i and 2i+1 for element i), rounded to binary32: the same bits on
// every machine and thread count.
Model init_model(const ModelConfig& c, uint64_t seed);

}  // namespace mantis
