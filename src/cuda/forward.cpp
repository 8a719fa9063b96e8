// forward (cuda) — see forward.h. The graph follows nn/forward.cpp line for line (llm.c style:
// a shape comment on every buffer); keep the two in step.
#include "cuda/forward.h"

#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "cuda/nn_ops.h"
#include "cuda/health.h"
#include "cuda/site.h"
#include "nn/attention.h"  // rope_tables
#include "nn/params.h"     // Weights (the parameter checks)
#include "nn/tape.h"       // check_tokens
#include "nn/streams.h"

namespace mantis::gpu {

namespace {

size_t slot_key(Role r, int layer, bool bias) { return (size_t(layer + 1) * kRoleCount + size_t(r)) * 2 + bias; }

}  // namespace

DeviceModel::DeviceModel(const Model& m) : cfg_(m.cfg), has_lora_(!m.lora.params.empty()) {
  validate(m.cfg);
  const std::vector<ParamInfo> infos = parameter_infos(m.cfg);
  const detail::Weights<float> checked(m);  // its InputErrors: missing or mis-shaped parameters
  slot_.assign(size_t(m.cfg.layers + 1) * kRoleCount * 2, -1);
  for (const ParamInfo& info : infos) {
    slot_[slot_key(info.role, info.layer, info.bias)] = int(arrays_.size());
    arrays_.emplace_back(m.params.at(info.name).data);
  }
}

const float* DeviceModel::operator()(Role r, int layer) const {
  const int i = slot_[slot_key(r, layer, false)];
  if (i < 0) throw std::logic_error(fmt::format("DeviceModel: no parameter of role {} at layer {}", int(r), layer));
  return arrays_[size_t(i)].get();
}
const float* DeviceModel::bias(Role r, int layer) const {
  const int i = slot_[slot_key(r, layer, true)];
  return i < 0 ? nullptr : arrays_[size_t(i)].get();
}

void check_forward(const ModelConfig& c, bool has_lora, std::span<const int32_t> tokens, const PolicyPlan& plan,
                   AttentionKernel kernel) {
  Model shape_only;
  shape_only.cfg = c;
  detail::check_tokens(shape_only, tokens);
  if (!(plan.config() == c)) throw InputError("forward: the policy plan was compiled for another model configuration");
  for (int l = -1; l < c.layers; ++l)
    for (Site site : {Site::attn_qk, Site::softmax, Site::attn_pv})
      if (plan.at(site, l).random && int64_t(tokens.size()) > kMaxRandomRows)
        throw InputError(fmt::format("forward: stochastic rounding at {} is keyed per query row and allows at most "
                                     "{} tokens; this sequence has {}", to_string(site), kMaxRandomRows, tokens.size()));
  if (has_lora) throw InputError("--device cuda: LoRA adapters are not on the GPU (merge them first: merge_lora)");
  if (plan.policy().lamp_activation || plan.policy().lamp_layernorm)
    throw InputError("--device cuda: [lamp_activation] and [lamp_layernorm] are not on the GPU (only [lamp] is)");
  for (int l = 0; l < c.layers; ++l)
    attention_check(plan, l, size_t(c.heads), size_t(c.arch == Arch::gpt2 ? c.heads : c.kv_heads), size_t(c.head_size()),
                    kernel);
}

Matrix<float> forward(const DeviceModel& m, std::span<const int32_t> tokens, const PolicyPlan& pol, ForwardStats* stats,
                      AttentionKernel kernel) {
  const ModelConfig& cfg = m.config();
  check_forward(cfg, m.has_lora(), tokens, pol, kernel);
  const bool gpt2 = cfg.arch == Arch::gpt2;
  const size_t T = tokens.size(), C = size_t(cfg.dim), NH = size_t(cfg.heads), HS = size_t(cfg.head_size()),
               NKV = gpt2 ? NH : size_t(cfg.kv_heads), KVC = NKV * HS, H = size_t(cfg.hidden), V = size_t(cfg.vocab);
  const float eps = float(cfg.norm_eps);
  if (stats) {
    for (auto* v : {&stats->lamp_selected, &stats->lamp_entries, &stats->act_selected, &stats->act_entries,
                    &stats->ln_selected, &stats->ln_entries})
      v->assign(size_t(cfg.layers), 0);
  }
  const Stream s = Stream::create();
  // [kSiteCount × (layers + 1)] the site health (ForwardStats' layout), counted on the device
  const size_t nhealth = stats ? size_t(kSiteCount) * size_t(cfg.layers + 1) : 0;
  Array<SiteHealth> health(nhealth);
  if (nhealth) health.upload(std::vector<SiteHealth>(nhealth).data(), nhealth);
  auto hp = [&](Site site, int l) {
    return nhealth ? health.get() + size_t(site) * size_t(cfg.layers + 1) + size_t(l + 1) : nullptr;
  };
  Array<int32_t> tok(std::vector<int32_t>(tokens.begin(), tokens.end()));  // [T]
  Array<float> x(T * C);        // [T,C] the residual stream
  Array<float> xn(T * C);       // [T,C] normalised x
  Array<float> scratch(T * C);  // [T,C] a norm's rounded input
  Array<float> qkv(gpt2 ? T * 3 * C : 0);  // [T,3C] gpt2: q | k | v
  Array<float> q(T * C);        // [T,C] queries, NH heads
  Array<float> k(T * KVC);      // [T,NKV·HS] keys
  Array<float> v(T * KVC);      // [T,NKV·HS] values
  Array<float> att(T * C);      // [T,C] attention output, heads side by side
  Array<float> y(T * C);        // [T,C] a projection's output, added to x
  Array<float> hid(T * H);      // [T,H] gpt2's MLP hidden activations; llama's gate
  Array<float> up(gpt2 ? 0 : T * H);  // [T,H] llama: w3·x
  Array<float> logits(T * V);   // [T,V]
  Array<uint64_t> counts(NH * T);  // [NH,T] LAMP's selections of one layer
  Array<float> rcos, rsin;      // [T, HS/2] RoPE's angles (llama), computed as the CPU does
  if (!gpt2) {
    Matrix<float> c_, s_;
    detail::rope_tables<float>(Eigen::Index(T), Eigen::Index(HS), double(cfg.rope_theta), c_, s_);
    rcos = Array<float>(std::vector<float>(c_.data(), c_.data() + c_.size()));
    rsin = Array<float>(std::vector<float>(s_.data(), s_.data() + s_.size()));
  }

  embed(tok.get(), m(Role::tok_emb), gpt2 ? m(Role::pos_emb) : nullptr, x.get(), T, C, s);
  for (int l = 0; l < cfg.layers; ++l) {
    norm(pol.at(Site::ln, l), norm_stream(l, 0), x.get(), m(Role::norm1, l), m.bias(Role::norm1, l), eps, xn.get(),
         scratch.get(), T, C, s, hp(Site::ln, l));
    if (gpt2) {
      site_gemm(pol.at(Site::attn_qkv, l), xn.get(), m(Role::attn_qkv, l), true, qkv.get(), T, 3 * C, C, qkv_stream(l, 0),
                1.0f, m.bias(Role::attn_qkv, l), s, hp(Site::attn_qkv, l));
      columns(qkv.get(), 3 * C, 0, q.get(), T, C, s);
      columns(qkv.get(), 3 * C, C, k.get(), T, C, s);
      columns(qkv.get(), 3 * C, 2 * C, v.get(), T, C, s);
    } else {
      const SitePlan& pqkv = pol.at(Site::attn_qkv, l);
      SiteHealth* hq = hp(Site::attn_qkv, l);
      site_gemm(pqkv, xn.get(), m(Role::wq, l), true, q.get(), T, C, C, qkv_stream(l, 0), 1.0f, nullptr, s, hq);
      site_gemm(pqkv, xn.get(), m(Role::wk, l), true, k.get(), T, KVC, C, qkv_stream(l, 1), 1.0f, nullptr, s, hq);
      site_gemm(pqkv, xn.get(), m(Role::wv, l), true, v.get(), T, KVC, C, qkv_stream(l, 2), 1.0f, nullptr, s, hq);
      rope(q.get(), T, NH, HS, rcos.get(), rsin.get(), s);
      rope(k.get(), T, NKV, HS, rcos.get(), rsin.get(), s);
    }
    const uint64_t sel = attention(pol, l, q.get(), k.get(), v.get(), T, NH, NKV, HS, att.get(), kernel, counts.get(), s,
                                   {hp(Site::attn_qk, l), hp(Site::softmax, l), hp(Site::attn_pv, l)});
    if (stats && pol.policy().lamp)
      stats->lamp_selected[size_t(l)] += sel, stats->lamp_entries[size_t(l)] += uint64_t(NH) * T * (T + 1) / 2;
    site_gemm(pol.at(Site::attn_proj, l), att.get(), m(Role::attn_proj, l), true, y.get(), T, C, C, attn_proj_stream(l),
              1.0f, m.bias(Role::attn_proj, l), s, hp(Site::attn_proj, l));
    add(x.get(), y.get(), T * C, s);
    norm(pol.at(Site::ln, l), norm_stream(l, 1), x.get(), m(Role::norm2, l), m.bias(Role::norm2, l), eps, xn.get(),
         scratch.get(), T, C, s, hp(Site::ln, l));
    if (gpt2) {
      site_gemm(pol.at(Site::mlp_fc, l), xn.get(), m(Role::mlp_fc, l), true, hid.get(), T, H, C, fc_stream(l, 0), 1.0f,
                m.bias(Role::mlp_fc, l), s, hp(Site::mlp_fc, l));
      gelu(pol.at(Site::gelu, l), activation_stream(Site::gelu, l), cfg.gelu_tanh, hid.get(), T * H, s,
           hp(Site::gelu, l));
    } else {
      const SitePlan& pfc = pol.at(Site::mlp_fc, l);
      SiteHealth* hf = hp(Site::mlp_fc, l);
      site_gemm(pfc, xn.get(), m(Role::mlp_gate, l), true, hid.get(), T, H, C, fc_stream(l, 0), 1.0f, nullptr, s, hf);
      site_gemm(pfc, xn.get(), m(Role::mlp_up, l), true, up.get(), T, H, C, fc_stream(l, 1), 1.0f, nullptr, s, hf);
      silu(pol.at(Site::silu, l), activation_stream(Site::silu, l), hid.get(), up.get(), T * H, s, hp(Site::silu, l));
    }
    site_gemm(pol.at(Site::mlp_proj, l), hid.get(), m(Role::mlp_proj, l), true, y.get(), T, C, H, mlp_proj_stream(l),
              1.0f, m.bias(Role::mlp_proj, l), s, hp(Site::mlp_proj, l));
    add(x.get(), y.get(), T * C, s);
  }
  norm(pol.at(Site::ln), norm_stream(-1, 0), x.get(), m(Role::norm_f), m.bias(Role::norm_f), eps, xn.get(),
       scratch.get(), T, C, s, hp(Site::ln, -1));
  const float* out = m(gpt2 || cfg.tied ? Role::tok_emb : Role::lm_head);  // [V,C]
  site_gemm(pol.at(Site::lm_head), xn.get(), out, true, logits.get(), T, V, C, lm_head_stream(), 1.0f, nullptr, s,
            hp(Site::lm_head, -1));
  s.synchronize();
  if (nhealth) {
    stats->health.resize(nhealth);
    health.download(stats->health.data(), nhealth);
  }
  Matrix<float> result(static_cast<Eigen::Index>(T), static_cast<Eigen::Index>(V));  // [T,V]
  logits.download(result.data(), T * V);
  return result;
}

ForwardFn forward_fn(AttentionKernel kernel) {
  struct Cache {
    const Model* model = nullptr;
    std::unique_ptr<DeviceModel> dm;
  };
  auto cache = std::make_shared<Cache>();
  return [cache, kernel](const Model& m, std::span<const int32_t> tokens, const PolicyPlan& plan, ForwardStats* stats) {
    if (cache->model != &m) cache->dm = std::make_unique<DeviceModel>(m), cache->model = &m;
    return forward(*cache->dm, tokens, plan, stats, kernel);
  };
}

}  // namespace mantis::gpu
