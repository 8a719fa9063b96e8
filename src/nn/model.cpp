#include "nn/model.h"

#include "nn/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>

#include "core/format.h"
#include "core/philox.h"

namespace mantis {

namespace {

const char* arch_name(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama"; }

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

// Largest value a size field may take: keeps every product of two or three of them (V·C, L·H·C,
// the byte count of a tensor) far inside int64, so later size arithmetic cannot overflow.
constexpr int kMaxDim = 1 << 24;

}  // namespace

void validate(const ModelConfig& c) {
  const char* a = arch_name(c.arch);
  if (c.arch != Arch::gpt2 && c.arch != Arch::llama)
    throw InputError(fmt::format("model config: arch {} unknown (gpt2, llama)", int(c.arch)));
  const std::pair<const char*, int> sizes[] = {{"vocab", c.vocab},   {"ctx", c.ctx}, {"layers", c.layers},
                                                {"heads", c.heads},   {"kv_heads", c.kv_heads},
                                                {"dim", c.dim},       {"hidden", c.hidden}};
  for (auto& [name, v] : sizes) {
    if (v <= 0) throw InputError(fmt::format("model config ({}): {} = {} must be positive", a, name, v));
    if (v > kMaxDim) throw InputError(fmt::format("model config ({}): {} = {} exceeds {}", a, name, v, kMaxDim));
  }
  if (c.dim % c.heads != 0)
    throw InputError(fmt::format("model config ({}): dim {} is not divisible by heads {}", a, c.dim, c.heads));
  if (c.heads % c.kv_heads != 0)
    throw InputError(fmt::format("model config ({}): heads {} is not divisible by kv_heads {}", a, c.heads, c.kv_heads));
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
    throw InputError(fmt::format("model config ({}): norm_eps = {} must be positive and finite", a, c.norm_eps));
  if (c.arch == Arch::gpt2) {
    if (c.kv_heads != c.heads)
      throw InputError(fmt::format("model config (gpt2): kv_heads {} must equal heads {} (no grouped-query attention)",
                                   c.kv_heads, c.heads));
    if (!c.tied) throw InputError("model config (gpt2): tied = false, but gpt2 always ties the output to wte");
  } else {
    if (c.head_size() % 2 != 0)
      throw InputError(fmt::format("model config (llama): head size dim/heads = {}/{} = {} must be even for RoPE",
                                   c.dim, c.heads, c.head_size()));
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
      throw InputError(fmt::format("model config (llama): rope_theta = {} must be positive and finite", c.rope_theta));
  }
}

namespace {

// The parameters before the layers, those of one layer (names without the "<prefix><l>." part,
// layer 0) and those after: parameter_infos expands them, parameter_count counts them without
// expanding L.
struct InfoTable {
  std::vector<ParamInfo> head, layer, tail;
  const char* prefix;
};

InfoTable info_table(const ModelConfig& c) {
  validate(c);
  const int64_t V = c.vocab, T = c.ctx, C = c.dim, H = c.hidden, HS = c.head_size(), KV = int64_t(c.kv_heads) * HS;
  const int NH = c.heads, NKV = c.kv_heads;
  auto p = [](const char* name, std::vector<int64_t> shape, Role role, bool bias = false, int blocks = 0,
              int64_t rows = 0) { return ParamInfo{name, std::move(shape), -1, role, bias, blocks, rows}; };
  if (c.arch == Arch::gpt2)
    return {{p("wte", {V, C}, Role::tok_emb), p("wpe", {T, C}, Role::pos_emb)},
            {p("ln_1.weight", {C}, Role::norm1),
             p("ln_1.bias", {C}, Role::norm1, true),
             p("attn.c_attn.weight", {3 * C, C}, Role::attn_qkv, false, 3 * NH, HS),
             p("attn.c_attn.bias", {3 * C}, Role::attn_qkv, true, 3 * NH, HS),
             p("attn.c_proj.weight", {C, C}, Role::attn_proj),
             p("attn.c_proj.bias", {C}, Role::attn_proj, true),
             p("ln_2.weight", {C}, Role::norm2),
             p("ln_2.bias", {C}, Role::norm2, true),
             p("mlp.c_fc.weight", {H, C}, Role::mlp_fc),
             p("mlp.c_fc.bias", {H}, Role::mlp_fc, true),
             p("mlp.c_proj.weight", {C, H}, Role::mlp_proj),
             p("mlp.c_proj.bias", {C}, Role::mlp_proj, true)},
            {p("ln_f.weight", {C}, Role::norm_f), p("ln_f.bias", {C}, Role::norm_f, true)},
            "h."};
  InfoTable t{{p("tok_embeddings", {V, C}, Role::tok_emb)},
              {p("attention_norm", {C}, Role::norm1),
               p("attention.wq", {C, C}, Role::wq, false, NH, HS),
               p("attention.wk", {KV, C}, Role::wk, false, NKV, HS),
               p("attention.wv", {KV, C}, Role::wv, false, NKV, HS),
               p("attention.wo", {C, C}, Role::attn_proj),
               p("ffn_norm", {C}, Role::norm2),
               p("feed_forward.w1", {H, C}, Role::mlp_gate),
               p("feed_forward.w3", {H, C}, Role::mlp_up),
               p("feed_forward.w2", {C, H}, Role::mlp_proj)},
              {p("norm", {C}, Role::norm_f)},
              "layers."};
  if (!c.tied) t.tail.push_back(p("output", {V, C}, Role::lm_head));
  return t;
}

__int128 values_of(const std::vector<ParamInfo>& s) {
  __int128 n = 0;
  for (auto& info : s) {
    __int128 k = 1;
    for (int64_t d : info.shape) k *= d;
    n += k;
  }
  return n;
}

}  // namespace

std::vector<ParamInfo> parameter_infos(const ModelConfig& c) {
  InfoTable t = info_table(c);
  std::vector<ParamInfo> s = std::move(t.head);
  for (int l = 0; l < c.layers; ++l)
    for (const ParamInfo& info : t.layer) {
      s.push_back(info);
      s.back().name = fmt::format("{}{}.{}", t.prefix, l, info.name);
      s.back().layer = l;
    }
  s.insert(s.end(), t.tail.begin(), t.tail.end());
  return s;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  for (ParamInfo& info : parameter_infos(c)) s.emplace_back(std::move(info.name), std::move(info.shape));
  return s;
}

ParameterCount parameter_count(const ModelConfig& c) {
  const InfoTable t = info_table(c);
  const __int128 tensors = __int128(t.head.size() + t.tail.size()) + __int128(c.layers) * __int128(t.layer.size());
  const __int128 values = values_of(t.head) + values_of(t.tail) + __int128(c.layers) * values_of(t.layer);
  auto sat = [](__int128 x) { return int64_t(std::min<__int128>(x, INT64_MAX)); };
  return {sat(tensors), sat(values)};
}

void validate(const Model& m) {
  const auto shapes = parameter_shapes(m.cfg);  // validates the configuration
  std::set<std::string> expected;
  for (auto& [name, shape] : shapes) {
    expected.insert(name);
    auto it = m.params.find(name);
    if (it == m.params.end()) throw InputError(fmt::format("tensor {}: missing", name));
    const Tensor& t = it->second;
    if (t.shape != shape)
      throw InputError(fmt::format("tensor {}: shape {}, expected {}", name, shape_str(t.shape), shape_str(shape)));
    if (int64_t(t.data.size()) != t.numel())
      throw InputError(fmt::format("tensor {}: holds {} values, shape {} needs {}", name, t.data.size(),
                                   shape_str(t.shape), t.numel()));
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw InputError(fmt::format("tensor {}: non-finite value {} at flat index {}", name, t.data[i], i));
  }
  for (auto& [name, t] : m.params)
    if (!expected.count(name))
      throw InputError(fmt::format("tensor {}: unexpected for arch {} (layers {}, tied {})", name,
                                   arch_name(m.cfg.arch), m.cfg.layers, m.cfg.tied));
  validate(m.lora, m.cfg);
}

Model init_model(const ModelConfig& c, uint64_t seed) {
  Model m{c, {}, {}};
  const auto infos = parameter_infos(c);
  const double proj_std = 0.02 / std::sqrt(2.0 * c.layers);
  for (size_t p = 0; p < infos.size(); ++p) {
    const ParamInfo& info = infos[p];
    Tensor t{info.shape, {}};
    t.data.resize(size_t(t.numel()));
    if (info.shape.size() == 1) {  // norm weights 1, biases 0
      std::fill(t.data.begin(), t.data.end(), info.bias ? 0.0f : 1.0f);
    } else {
      const bool residual_out = info.role == Role::attn_proj || info.role == Role::mlp_proj;
      const double stdev = info.role == Role::pos_emb ? 0.01 : residual_out ? proj_std : 0.02;
      for (size_t i = 0; i < t.data.size(); ++i) {
        const double u1 = double((random_word(seed, p, 2 * i) >> 8) + 1) * 0x1p-24;  // (0, 1]
        const double u2 = double(random_word(seed, p, 2 * i + 1) >> 8) * 0x1p-24;    // [0, 1)
        t.data[i] = float(stdev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
      }
    }
    m.params.emplace(info.name, std::move(t));
  }
  return m;
}

}  // namespace mantis
