// forward — see forward.h: the two model graphs, in the manner of llm.c's train_gpt2.c (a shape
// comment on every buffer); the operations live in linear, norm, activation and attention.
#include "nn/forward.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/lora.h"
#include "nn/norm.h"
#include "nn/params.h"
#include "nn/streams.h"
#include "nn/tape.h"

namespace mantis {

using Eigen::Index;

namespace {

using namespace detail;

// The model functions' two LAMP hooks: activation_fix(l, A, W, bias, y) after the mlp.fc GEMM
// (σ: `activation`) and norm_fix(l, A, W, bias, γ) after a projection whose output y is added to
// the residual stream x.
// No-ops unless the policy asks (and for the binary64 reference, which takes no LAMP).
template <class T>
auto lamp_hooks(const PolicyPlan& pol, ForwardStats* stats, Site activation, bool gelu_tanh, T eps, const Matrix<T>& x,
                Matrix<T>& y) {
  auto activation_fix = [&pol, stats, activation, gelu_tanh](int l, const Matrix<T>& A, const auto& w, const T* bias,
                                                            Matrix<T>& out) {
    if constexpr (std::is_same_v<T, float>)
      if (const auto& spec = pol.policy().lamp_activation) {
        const uint64_t n = lamp_activation_fix(*spec, pol.lamp_activation(), A, w, bias, out, activation, gelu_tanh);
        if (stats) stats->act_selected[size_t(l)] += n, stats->act_entries[size_t(l)] += uint64_t(out.size());
      }
  };
  auto norm_fix = [&pol, stats, eps, &x, &y](int l, const Matrix<T>& A, const auto& w, const T* bias, const T* gamma) {
    if constexpr (std::is_same_v<T, float>)
      if (const auto& spec = pol.policy().lamp_layernorm) {
        const uint64_t n = lamp_layernorm_fix(*spec, pol.lamp_layernorm(), A, w, bias, x, y, gamma, eps);
        if (stats) stats->ln_selected[size_t(l)] += n, stats->ln_entries[size_t(l)] += uint64_t(y.size());
      }
  };
  return std::pair{activation_fix, norm_fix};
}

// attention_forward at layer l, reporting its health and LAMP's counts into stats (if given).
template <class T>
void attention(const PolicyPlan& pol, ForwardStats* stats, int l, const Eigen::Ref<const Matrix<T>>& q,
               const Eigen::Ref<const Matrix<T>>& k, const Eigen::Ref<const Matrix<T>>& v, Index NH, Index NKV,
               Index HS, Matrix<T>& out, std::vector<Matrix<T>>* probs) {
  AttentionHealth h;
  if (stats)
    h = {&stats->health_at(Site::attn_qk, l), &stats->health_at(Site::softmax, l), &stats->health_at(Site::attn_pv, l)};
  const uint64_t n = attention_forward<T>(pol, l, q, k, v, NH, NKV, HS, out, probs, h);
  const uint64_t T_ = uint64_t(q.rows());
  if (stats && pol.policy().lamp)
    stats->lamp_selected[size_t(l)] += n, stats->lamp_entries[size_t(l)] += uint64_t(NH) * T_ * (T_ + 1) / 2;
}

// LAMP's activation and norm closed forms recompute projections from the base weights alone.
void check_lora_lamp(const Model& m, const PolicyPlan& pol) {
  if (!m.lora.params.empty() && (pol.policy().lamp_activation || pol.policy().lamp_layernorm))
    throw InputError("LoRA adapters with lamp_activation / lamp_layernorm: their recomputation ignores the adapters "
                     "(merge the adapters first: merge_lora)");
}

// ---------------------------------------------------------------------------------------------
// the two models

template <class T>
Matrix<T> gpt2_forward(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& pol, Tape<T>* tape,
                       ForwardStats* stats) {
  const ModelConfig& cfg = m.cfg;
  const Index T_ = Index(tokens.size()), C = cfg.dim, NH = cfg.heads, HS = cfg.head_size(), H = cfg.hidden,
              V = cfg.vocab;
  const T eps = T(cfg.norm_eps);
  const Weights<T> W(m);
  const LoraViews<T> lora(m);  // adapters (lora.h), added after their sites
  check_lora_lamp(m, pol);
  const auto& wte = W(Role::tok_emb);  // [V,C]
  const auto& wpe = W(Role::pos_emb);  // [maxT,C]

  Matrix<T> x(T_, C);       // [T,C] the residual stream
  Matrix<T> xn(T_, C);      // [T,C] normalised x
  Matrix<T> qkv(T_, 3 * C); // [T,3C] q | k | v
  Matrix<T> att(T_, C);     // [T,C] attention output, heads side by side
  Matrix<T> y(T_, C);       // [T,C] a projection's output, added to x
  Matrix<T> hid(T_, H);     // [T,H] MLP hidden activations
  for (Index t = 0; t < T_; ++t) x.row(t) = wte.row(tokens[size_t(t)]) + wpe.row(t);
  if (tape) tape->layers.assign(size_t(cfg.layers), {});
  auto [act_lamp, ln_lamp] = lamp_hooks<T>(pol, stats, Site::gelu, cfg.gelu_tanh, eps, x, y);
  auto health = [stats](Site s, int l) { return stats ? &stats->health_at(s, l) : nullptr; };

  for (int l = 0; l < cfg.layers; ++l) {
    LayerTape<T>* lt = tape ? &tape->layers[size_t(l)] : nullptr;
    const auto &ln1w = W(Role::norm1, l), &ln1b = W.bias(Role::norm1, l);  // [C]
    const auto &wqkv = W(Role::attn_qkv, l), &bqkv = W.bias(Role::attn_qkv, l);  // [3C,C], [3C]
    const auto &wo = W(Role::attn_proj, l), &bo = W.bias(Role::attn_proj, l);  // [C,C], [C]
    const auto &ln2w = W(Role::norm2, l), &ln2b = W.bias(Role::norm2, l);  // [C]
    const auto &wfc = W(Role::mlp_fc, l), &bfc = W.bias(Role::mlp_fc, l);  // [H,C], [H]
    const auto &wpr = W(Role::mlp_proj, l), &bpr = W.bias(Role::mlp_proj, l);  // [C,H], [C]

    if (lt) lt->x_in = x;
    norm_forward<T>(pol.at(Site::ln, l), norm_stream(l, 0), x, ln1w.data(), ln1b.data(), eps, xn, health(Site::ln, l));
    site_gemm<T>(pol.at(Site::attn_qkv, l), xn, wqkv, true, qkv, qkv_stream(l, 0), T(1), bqkv.data(),
                 health(Site::attn_qkv, l));
    lora.forward(Role::attn_qkv, l, xn, qkv);
    attention<T>(pol, stats, l, qkv.leftCols(C), qkv.middleCols(C, C), qkv.rightCols(C), NH, NH, HS, att,
                 lt ? &lt->probs : nullptr);
    if (lt) {
      lt->xn1 = xn;
      lt->q = qkv.leftCols(C), lt->k = qkv.middleCols(C, C), lt->v = qkv.rightCols(C);
      lt->att = att;
    }
    site_gemm<T>(pol.at(Site::attn_proj, l), att, wo, true, y, attn_proj_stream(l), T(1), bo.data(),
                 health(Site::attn_proj, l));
    lora.forward(Role::attn_proj, l, att, y);
    ln_lamp(l, att, wo, bo.data(), ln2w.data());
    x += y;
    if (lt) lt->x_mid = x;
    norm_forward<T>(pol.at(Site::ln, l), norm_stream(l, 1), x, ln2w.data(), ln2b.data(), eps, xn, health(Site::ln, l));
    site_gemm<T>(pol.at(Site::mlp_fc, l), xn, wfc, true, hid, fc_stream(l, 0), T(1), bfc.data(),
                 health(Site::mlp_fc, l));
    lora.forward(Role::mlp_fc, l, xn, hid);
    act_lamp(l, xn, wfc, bfc.data(), hid);
    if (lt) lt->xn2 = xn, lt->pre = hid;
    gelu_forward<T>(pol.at(Site::gelu, l), activation_stream(Site::gelu, l), cfg.gelu_tanh, hid, health(Site::gelu, l),
                    lt ? &lt->aux : nullptr);
    if (lt) lt->act = hid;
    site_gemm<T>(pol.at(Site::mlp_proj, l), hid, wpr, true, y, mlp_proj_stream(l), T(1), bpr.data(),
                 health(Site::mlp_proj, l));
    lora.forward(Role::mlp_proj, l, hid, y);
    if (pol.policy().lamp_layernorm)  // the next norm: ln_1 of layer l+1, or ln_f
      ln_lamp(l, hid, wpr, bpr.data(), (l + 1 < cfg.layers ? W(Role::norm1, l + 1) : W(Role::norm_f)).data());
    x += y;
  }

  const auto &lnfw = W(Role::norm_f), &lnfb = W.bias(Role::norm_f);  // [C]
  norm_forward<T>(pol.at(Site::ln), norm_stream(-1, 0), x, lnfw.data(), lnfb.data(), eps, xn, health(Site::ln, -1));
  if (tape) tape->x_final = x, tape->xnf = xn;
  Matrix<T> logits(T_, V);  // [T,V]
  site_gemm<T>(pol.at(Site::lm_head), xn, wte, true, logits, lm_head_stream(), T(1), nullptr, health(Site::lm_head, -1));
  return logits;
}

template <class T>
Matrix<T> llama_forward(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& pol, Tape<T>* tape,
                        ForwardStats* stats) {
  const ModelConfig& cfg = m.cfg;
  const Index T_ = Index(tokens.size()), C = cfg.dim, NH = cfg.heads, NKV = cfg.kv_heads, HS = cfg.head_size(),
              KVC = NKV * HS, H = cfg.hidden, V = cfg.vocab;
  const T eps = T(cfg.norm_eps);
  const Weights<T> W(m);
  const LoraViews<T> lora(m);  // adapters (lora.h), added after their sites
  check_lora_lamp(m, pol);
  const auto& emb = W(Role::tok_emb);  // [V,C]

  Matrix<T> rcos, rsin;    // [T, HS/2] RoPE's angles
  rope_tables<T>(T_, HS, double(cfg.rope_theta), rcos, rsin);
  Matrix<T> x(T_, C);      // [T,C] the residual stream
  Matrix<T> xn(T_, C);     // [T,C] normalised x
  Matrix<T> q(T_, C);      // [T,C] queries, NH heads
  Matrix<T> k(T_, KVC);    // [T,NKV·HS] keys
  Matrix<T> v(T_, KVC);    // [T,NKV·HS] values
  Matrix<T> att(T_, C);    // [T,C] attention output, heads side by side
  Matrix<T> y(T_, C);      // [T,C] a projection's output, added to x
  Matrix<T> gate(T_, H);   // [T,H] w1·x, then silu(w1·x) ⊙ w3·x
  Matrix<T> up(T_, H);     // [T,H] w3·x
  for (Index t = 0; t < T_; ++t) x.row(t) = emb.row(tokens[size_t(t)]);
  if (tape) tape->layers.assign(size_t(cfg.layers), {}), tape->rcos = rcos, tape->rsin = rsin;
  auto [act_lamp, ln_lamp] = lamp_hooks<T>(pol, stats, Site::silu, false, eps, x, y);
  auto health = [stats](Site s, int l) { return stats ? &stats->health_at(s, l) : nullptr; };

  for (int l = 0; l < cfg.layers; ++l) {
    LayerTape<T>* lt = tape ? &tape->layers[size_t(l)] : nullptr;
    const auto& anorm = W(Role::norm1, l);  // [C]
    const auto& wq = W(Role::wq, l);        // [C,C]
    const auto& wk = W(Role::wk, l);        // [NKV·HS,C]
    const auto& wv = W(Role::wv, l);        // [NKV·HS,C]
    const auto& wo = W(Role::attn_proj, l); // [C,C]
    const auto& fnorm = W(Role::norm2, l);  // [C]
    const auto& w1 = W(Role::mlp_gate, l);  // [H,C]
    const auto& w3 = W(Role::mlp_up, l);    // [H,C]
    const auto& w2 = W(Role::mlp_proj, l);  // [C,H]

    if (lt) lt->x_in = x;
    norm_forward<T>(pol.at(Site::ln, l), norm_stream(l, 0), x, anorm.data(), nullptr, eps, xn, health(Site::ln, l));
    const SitePlan& pqkv = pol.at(Site::attn_qkv, l);
    site_gemm<T>(pqkv, xn, wq, true, q, qkv_stream(l, 0), T(1), nullptr, health(Site::attn_qkv, l));
    site_gemm<T>(pqkv, xn, wk, true, k, qkv_stream(l, 1), T(1), nullptr, health(Site::attn_qkv, l));
    site_gemm<T>(pqkv, xn, wv, true, v, qkv_stream(l, 2), T(1), nullptr, health(Site::attn_qkv, l));
    lora.forward(Role::wq, l, xn, q);
    lora.forward(Role::wk, l, xn, k);
    lora.forward(Role::wv, l, xn, v);
    rope_forward<T>(q, NH, HS, rcos, rsin);
    rope_forward<T>(k, NKV, HS, rcos, rsin);
    attention<T>(pol, stats, l, q, k, v, NH, NKV, HS, att, lt ? &lt->probs : nullptr);
    if (lt) lt->xn1 = xn, lt->q = q, lt->k = k, lt->v = v, lt->att = att;
    site_gemm<T>(pol.at(Site::attn_proj, l), att, wo, true, y, attn_proj_stream(l), T(1), nullptr,
                 health(Site::attn_proj, l));
    lora.forward(Role::attn_proj, l, att, y);
    ln_lamp(l, att, wo, nullptr, fnorm.data());
    x += y;
    if (lt) lt->x_mid = x;
    norm_forward<T>(pol.at(Site::ln, l), norm_stream(l, 1), x, fnorm.data(), nullptr, eps, xn, health(Site::ln, l));
    const SitePlan& pfc = pol.at(Site::mlp_fc, l);
    site_gemm<T>(pfc, xn, w1, true, gate, fc_stream(l, 0), T(1), nullptr, health(Site::mlp_fc, l));
    lora.forward(Role::mlp_gate, l, xn, gate);
    act_lamp(l, xn, w1, nullptr, gate);
    site_gemm<T>(pfc, xn, w3, true, up, fc_stream(l, 1), T(1), nullptr, health(Site::mlp_fc, l));
    lora.forward(Role::mlp_up, l, xn, up);
    if (lt) lt->xn2 = xn, lt->pre = gate, lt->up = up;
    silu_forward<T>(pol.at(Site::silu, l), activation_stream(Site::silu, l), gate, up, health(Site::silu, l),
                    lt ? &lt->aux : nullptr);
    if (lt) lt->act = gate;
    site_gemm<T>(pol.at(Site::mlp_proj, l), gate, w2, true, y, mlp_proj_stream(l), T(1), nullptr,
                 health(Site::mlp_proj, l));
    lora.forward(Role::mlp_proj, l, gate, y);
    if (pol.policy().lamp_layernorm)  // the next norm: attention_norm of layer l+1, or the final norm
      ln_lamp(l, gate, w2, nullptr, (l + 1 < cfg.layers ? W(Role::norm1, l + 1) : W(Role::norm_f)).data());
    x += y;
  }

  const auto& fnorm = W(Role::norm_f);  // [C]
  norm_forward<T>(pol.at(Site::ln), norm_stream(-1, 0), x, fnorm.data(), nullptr, eps, xn, health(Site::ln, -1));
  if (tape) tape->x_final = x, tape->xnf = xn;
  Matrix<T> logits(T_, V);  // [T,V]
  const auto& out = W(cfg.tied ? Role::tok_emb : Role::lm_head);  // [V,C]
  site_gemm<T>(pol.at(Site::lm_head), xn, out, true, logits, lm_head_stream(), T(1), nullptr, health(Site::lm_head, -1));
  return logits;
}

}  // namespace

// What forward<T> refuses before compiling the policy, as InputErrors (forward.h).
void detail::check_tokens(const Model& m, std::span<const int32_t> tokens) {
  eigen_single_threaded();
  const ModelConfig& c = m.cfg;
  validate(c);  // model.h: sizes, divisibility, even RoPE head size, ...
  if (tokens.empty()) throw InputError("forward: empty token sequence");
  if (tokens.size() > size_t(c.ctx))
    throw InputError(fmt::format("forward: sequence of {} tokens is longer than the context ({})", tokens.size(), c.ctx));
  for (size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      throw InputError(fmt::format("forward: token {} at position {} is outside the vocabulary [0, {})", tokens[t], t,
                                   c.vocab));
}

namespace {

// ... and what it refuses of a compiled policy.
template <class T>
void check_plan(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& plan) {
  const ModelConfig& c = m.cfg;
  if (!(plan.config() == c)) throw InputError("forward: the policy plan was compiled for another model configuration");
  for (int l = -1; l < c.layers; ++l)
    for (Site site : {Site::attn_qk, Site::softmax, Site::attn_pv})
      if (plan.at(site, l).random && Index(tokens.size()) > kMaxRandomRows)
        throw InputError(fmt::format("forward: stochastic rounding at {} is keyed per query row and allows at most "
                                     "{} tokens; this sequence has {}", to_string(site), kMaxRandomRows, tokens.size()));
  if constexpr (std::is_same_v<T, double>)
    if (!plan.policy().forward_is_native()) {
      std::string d = describe(plan.policy());
      d.pop_back();  // the last newline; the others become "; " (one line of error)
      std::replace(d.begin(), d.end(), '\n', ';');
      throw InputError(fmt::format("forward<double> is the binary64 reference and takes only the native policy; "
                                   "this one sets {}", d));
    }
}

}  // namespace

template <class T>
Matrix<T> forward(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& plan, ForwardStats* stats) {
  check_tokens(m, tokens);
  check_plan<T>(m, tokens, plan);
  const ModelConfig& c = m.cfg;
  if (stats)
    for (auto* v : {&stats->lamp_selected, &stats->lamp_entries, &stats->act_selected, &stats->act_entries,
                    &stats->ln_selected, &stats->ln_entries})
      v->assign(size_t(c.layers), 0);
  if (stats) stats->health.assign(size_t(kSiteCount) * size_t(c.layers + 1), SiteHealth{});
  return c.arch == Arch::gpt2 ? gpt2_forward<T>(m, tokens, plan, nullptr, stats)
                              : llama_forward<T>(m, tokens, plan, nullptr, stats);
}

template <class T>
Matrix<T> forward(const Model& m, std::span<const int32_t> tokens, const Policy& policy, ForwardStats* stats) {
  check_tokens(m, tokens);  // first: its errors before the policy's
  return forward<T>(m, tokens, PolicyPlan(policy, m.cfg), stats);
}

namespace detail {
template <class T>
Matrix<T> forward_tape(const Model& m, std::span<const int32_t> tokens, const PolicyPlan& plan, Tape<T>& tape) {
  check_tokens(m, tokens);
  check_plan<T>(m, tokens, plan);
  return m.cfg.arch == Arch::gpt2 ? gpt2_forward<T>(m, tokens, plan, &tape, nullptr)
                                  : llama_forward<T>(m, tokens, plan, &tape, nullptr);
}
template <class T>
Matrix<T> forward_tape(const Model& m, std::span<const int32_t> tokens, const Policy& policy, Tape<T>& tape) {
  check_tokens(m, tokens);
  return forward_tape<T>(m, tokens, PolicyPlan(policy, m.cfg), tape);
}
template Matrix<float> forward_tape<float>(const Model&, std::span<const int32_t>, const Policy&, Tape<float>&);
template Matrix<double> forward_tape<double>(const Model&, std::span<const int32_t>, const Policy&, Tape<double>&);
template Matrix<float> forward_tape<float>(const Model&, std::span<const int32_t>, const PolicyPlan&, Tape<float>&);
template Matrix<double> forward_tape<double>(const Model&, std::span<const int32_t>, const PolicyPlan&,
                                             Tape<double>&);
}  // namespace detail

Matrix<float> forward_on(const ForwardFn& fn, const Model& m, std::span<const int32_t> tokens, const Policy& policy,
                         ForwardStats* stats) {
  if (!fn) return forward<float>(m, tokens, policy, stats);
  check_tokens(m, tokens);  // its errors before the policy's, as forward<float>
  return fn(m, tokens, PolicyPlan(policy, m.cfg), stats);
}

template Matrix<float> forward<float>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
template Matrix<double> forward<double>(const Model&, std::span<const int32_t>, const Policy&, ForwardStats*);
template Matrix<float> forward<float>(const Model&, std::span<const int32_t>, const PolicyPlan&, ForwardStats*);
template Matrix<double> forward<double>(const Model&, std::span<const int32_t>, const PolicyPlan&, ForwardStats*);

}  // namespace mantis
